"""Why an upstream is down, in words an operator can act on (issue #12, ``/readyz``).

A supervisor that catches a task group's failure holds an exception group
whose text says nothing ("unhandled errors in a TaskGroup"); an HTTP client
error's class name alone ("ConnectError") hides the cause ("Connection
refused"). :func:`describe_failure` names the innermost cause with its text,
and a stdio server's last words on stderr when it left some. It never
includes request bodies, headers or credentials: only exception text and the
upstream's own stderr line, truncated.
"""

from __future__ import annotations

__all__ = ["describe_exit", "describe_failure"]

_MAX_DETAIL = 300


def describe_failure(
    exc: BaseException, *, exit_status: int | None = None, stderr_tail: str | None = None
) -> str:
    """``"<Class>: <text>"`` of the innermost cause, then the exit status and last stderr line if given."""
    cause = _innermost(exc)
    text = str(cause).strip()
    detail = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    return _with_process(detail, exit_status, stderr_tail)


def describe_exit(exit_status: int | None, stderr_tail: str | None) -> str:
    """A process that ended: its exit status and last stderr line."""
    return _with_process("process ended", exit_status, stderr_tail)


def _with_process(detail: str, exit_status: int | None, stderr_tail: str | None) -> str:
    if exit_status is not None:
        detail += f"; process exited with status {exit_status}"
    if stderr_tail:
        detail += f"; last stderr line: {stderr_tail.strip()}"
    return detail[:_MAX_DETAIL]


def _innermost(exc: BaseException) -> BaseException:
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
            continue
        return exc
    return exc
