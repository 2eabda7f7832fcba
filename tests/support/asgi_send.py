"""An ASGI ``send`` that records what a response wrote, for tests of ``transport/channel.py``."""

from __future__ import annotations

from typing import Any

__all__ = ["RecordedSend"]


class RecordedSend:
    """Every message sent, in order; the body written and the response's content type."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def content_type(self) -> bytes:
        return bytes(dict(self.messages[0]["headers"])[b"content-type"])
