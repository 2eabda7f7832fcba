"""``Mcp-Param-*`` headers a 2026-07-28 client sends with ``tools/call`` (issue #8).

A tool whose ``inputSchema`` marks a property with ``x-mcp-header`` has that
argument mirrored in an ``Mcp-Param-<token>`` header, so intermediaries can
route on it. A server must refuse a request whose header and body disagree
(-32020, HTTP 400). Bastion is that server for its clients: it checks the
headers against the tool definition it published, with the SDK's own
comparison so client and gateway agree by construction.

Owns the check only; ``call.py`` calls it once the tool is known, and
``transport/`` renders the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.shared.inbound import validate_mcp_param_headers

from bastion.errors import HeaderMismatch

__all__ = ["check_param_headers"]


def check_param_headers(definition: Mapping[str, Any], arguments: Mapping[str, Any], headers: Any) -> None:
    """Refuse a ``tools/call`` whose ``Mcp-Param-*`` headers disagree with its arguments.

    ``headers`` holds the request's ``Mcp-Param-*`` headers, duplicates kept
    (anything with an ``items()`` of name/value pairs).

    Raises:
        HeaderMismatch: a header is missing, extra, duplicated or different from its argument.
    """
    rejection = validate_mcp_param_headers(definition.get("inputSchema"), arguments, headers)
    if rejection is not None:
        raise HeaderMismatch(f"Header mismatch: {rejection.message}")
