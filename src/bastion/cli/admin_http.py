"""One ``GET`` of the admin API for the commands that read it (``bastion workers``, ``bastion sessions``).

The admin token comes from a file (never the command line, where it would land
in shell history and ``ps``). A refusal prints the API's ``reason: message``;
an unreachable gateway names the address tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import httpx

__all__ = ["AdminArgumentsUnusable", "admin_get", "admin_post", "print_table", "read_secret"]


class AdminArgumentsUnusable(Exception):
    """Arguments or files the command cannot use (exit 2)."""


def admin_get(
    url: str,
    admin_token_file: Path | None,
    path: str,
    *,
    timeout: float,
    http: httpx.Client | None,
    err: TextIO,
) -> dict[str, Any] | None:
    """The JSON object at ``<gateway>/admin/...``, or ``None`` after saying on ``err`` why not."""
    return _admin_request("GET", url, admin_token_file, path, None, timeout=timeout, http=http, err=err)


def admin_post(
    url: str,
    admin_token_file: Path | None,
    path: str,
    body: dict[str, Any],
    *,
    timeout: float,
    http: httpx.Client | None,
    err: TextIO,
) -> dict[str, Any] | None:
    """POST ``body`` to ``<gateway>/admin/...``: its JSON answer, or ``None`` after saying why not."""
    return _admin_request("POST", url, admin_token_file, path, body, timeout=timeout, http=http, err=err)


def _admin_request(
    method: str,
    url: str,
    admin_token_file: Path | None,
    path: str,
    body: dict[str, Any] | None,
    *,
    timeout: float,
    http: httpx.Client | None,
    err: TextIO,
) -> dict[str, Any] | None:
    import httpx

    if admin_token_file is None:
        raise AdminArgumentsUnusable("--url needs --admin-token-file")
    admin_token = read_secret(admin_token_file)
    base = url.rstrip("/").removesuffix("/mcp")
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        if http is None:
            with httpx.Client(timeout=timeout) as client:
                response = client.request(method, base + path, headers=headers, json=body)
        else:
            response = http.request(method, base + path, headers=headers, json=body)
    except httpx.HTTPError as exc:
        print(f"bastion: cannot reach the admin API at {base}: {type(exc).__name__}", file=err)
        return None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        print(f"bastion: the admin API answered {response.status_code} without JSON", file=err)
        return None
    if response.status_code >= 400:
        error = answer.get("error") or {}
        print(f"bastion: {error.get('reason', response.status_code)}: {error.get('message', '')}", file=err)
        return None
    return answer


def read_secret(path: Path, what: str = "admin token") -> str:
    """The one token in ``path``; raises :class:`AdminArgumentsUnusable` naming the file otherwise."""
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AdminArgumentsUnusable(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not secret or any(c.isspace() for c in secret):
        raise AdminArgumentsUnusable(f"the {what} file {path} must hold one token")
    return secret


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """``columns`` upper-cased as the header, then ``rows``, each column padded to its widest cell."""
    cells = [[c.upper() for c in columns], *[list(row) for row in rows]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip(), file=out)
