"""Wake the calls of this gateway waiting on an approval request when it is decided (issue 27).

One :class:`ApprovalWaiters` per gateway (never module state: two gateways in
one process are two replicas). A decision taken here wakes at once; one taken
at another replica arrives through the change feed (``approval_decided``,
``propagation/follower.py``), with the waiter's own bounded re-read of the
store behind both. A wake is only a hint: the waiter reads the store.
"""

from __future__ import annotations

import anyio

__all__ = ["ApprovalWaiters"]


class ApprovalWaiters:
    """The events of the calls waiting here, by approval id."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}

    def wake(self, approval_id: str) -> None:
        """A decision on ``approval_id`` may have landed: its waiter reads the store again."""
        event = self._events.pop(approval_id, None)
        if event is not None:
            event.set()

    async def wait(self, approval_id: str, timeout_s: float) -> None:
        """Return when woken for ``approval_id`` or after ``timeout_s``, whichever comes first."""
        event = self._events.setdefault(approval_id, anyio.Event())
        try:
            with anyio.move_on_after(timeout_s):
                await event.wait()
        finally:
            if self._events.get(approval_id) is event and not event.is_set():
                del self._events[approval_id]

    def __len__(self) -> int:
        return len(self._events)
