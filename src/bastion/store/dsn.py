"""Store locations as users write them: which engine a location names, and how to show it safely.

A location is either a PostgreSQL URL (``postgresql://`` or ``postgres://``)
or nothing (the SQLite file in the data directory). :func:`redact_dsn` is the
only form of a URL that may reach a log, an error or the audit: its password
is replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["POSTGRES_SCHEMES", "is_postgres_url", "redact_argv", "redact_dsn"]

POSTGRES_SCHEMES = ("postgresql", "postgres")
_SECRET_QUERY_KEYS = frozenset({"password", "sslpassword"})


def is_postgres_url(location: str) -> bool:
    return urlsplit(location).scheme.lower() in POSTGRES_SCHEMES


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password (in the authority or the query) replaced by ``***``."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparsable store URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{hostinfo}"
    query = urlencode(
        [(k, "***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in parse_qsl(parts.query, True)],
        safe="/*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to record: every PostgreSQL URL in it (``URL`` or ``--opt=URL``) redacted."""
    shown = []
    for arg in argv:
        option, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if is_postgres_url(value):
            arg = f"{option}{equals}{redact_dsn(value)}"
        shown.append(arg)
    return shown
