"""Server-Sent Events decoding for upstream responses.

Owns: turning a byte-line stream into JSON-RPC message dicts. Events whose
``data`` is empty (priming events, keep-alives) are skipped; an event whose
data is not a JSON object raises ``UpstreamProtocolError``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from bastion.errors import UpstreamProtocolError

__all__ = ["iter_sse_messages"]


async def iter_sse_messages(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if line == "":
            if data:
                payload = "\n".join(data)
                data = []
                try:
                    message = json.loads(payload)
                except ValueError as exc:
                    raise UpstreamProtocolError("upstream sent an SSE event that is not JSON") from exc
                if not isinstance(message, dict):
                    raise UpstreamProtocolError("upstream sent an SSE event that is not a JSON object")
                yield message
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
    if data:
        message = json.loads("\n".join(data))
        if isinstance(message, dict):
            yield message
