"""Unwrapping anyio's exception groups at the boundary where one failure is expected.

anyio 4 wraps every exception leaving a task group, host body included. Where a
block runs one logical operation, callers expect its own typed error
(``UpstreamError``, ``UpstreamReplied``), not a group: this re-raises the
single leaf, and leaves real multi-failures as groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["single_exception"]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves


@contextlib.contextmanager
def single_exception() -> Iterator[None]:
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from group
        raise
