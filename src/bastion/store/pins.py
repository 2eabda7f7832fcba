"""Pinned definitions in the store: what every replica enforces (issue 27).

A pin is the digest (``pinning/digest.py``) and the definition of one tool,
prompt or resource template of one server, keyed by ``(server, kind, name)``
with the upstream's own name. Beside the pin the row may hold one *offer*:
a definition the upstream showed that differs from the pin, with its digest,
``pending`` until an operator decides it, or ``rejected``. Approving moves
the offer into the pin; rejecting keeps the pin and marks the offer, so the
same definition is not offered again (a different one is).

Each write is one atomic transaction. :meth:`PinStore.pin_first` is
insert-if-absent, so two replicas that meet a definition at once agree on
one pin (the first committed). A decision enters the change feed
(``pins_changed``, subject: the server) in the transaction that makes it, so
every replica re-admits that server's definitions within the feed's bound.
Unfenced, as agent sessions are: a pin only ever narrows what is exposed
until an operator widens it, and an operator is no replica.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = ["OfferState", "PinKind", "PinRecord", "PinStore"]


class PinKind(enum.StrEnum):
    """What a pinned definition defines."""

    TOOL = "tool"
    PROMPT = "prompt"
    RESOURCE_TEMPLATE = "resource_template"


class OfferState(enum.StrEnum):
    """Where an offered (changed) definition stands."""

    PENDING = "pending"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class PinRecord:
    """One pin, and the changed definition offered against it, if any."""

    server: str
    kind: PinKind
    name: str
    digest: str
    definition: dict[str, Any]
    pinned_at: datetime
    pinned_by: str
    offered_digest: str | None = None
    offered_definition: dict[str, Any] | None = None
    offered_at: datetime | None = None
    offer_state: OfferState | None = None
    decided_at: datetime | None = None
    decided_by: str | None = None


class PinStore(Protocol):
    """The pin table: each write one atomic transaction."""

    async def list_pins(self, *, server: str | None = None) -> list[PinRecord]:
        """Every pin (of ``server``), ordered by server, kind and name."""
        ...

    async def get_pin(self, server: str, kind: PinKind, name: str) -> PinRecord | None: ...

    async def pin_first(
        self, server: str, kind: PinKind, name: str, digest: str, definition: dict[str, Any], *, now: datetime
    ) -> PinRecord:
        """Pin ``definition`` unless a pin exists; returns the pin that holds (the first one committed)."""
        ...

    async def offer_pin(
        self, server: str, kind: PinKind, name: str, digest: str, definition: dict[str, Any], *, now: datetime
    ) -> tuple[PinRecord, bool]:
        """Record a definition that differs from the pin; returns the row and whether the offer is new.

        An offer equal to the pin, or to the offer already held (pending or rejected), changes nothing.
        Raises :class:`~bastion.errors.Conflict` when there is no pin.
        """
        ...

    async def decide_pin(
        self, server: str, kind: PinKind, name: str, digest: str, *, approve: bool, by: str, now: datetime
    ) -> PinRecord:
        """Approve (the offer becomes the pin) or reject the offer whose digest is ``digest``.

        ``digest`` is what the operator saw: a newer offer since, or none, raises
        :class:`~bastion.errors.Conflict`, so nobody approves a definition they did not see.
        The decision enters the change feed in the same transaction.
        """
        ...
