"""Namespace attachment health per client transport session (DESIGN section 2 step 5 and section 6, seed 004).

For one client transport session and one namespace, two facts are kept apart:

- ``connected``: the upstream transport of that namespace is up;
- ``attached``: that namespace's tools are in this session's tool surface
  (the session's last ``tools/list`` included them).

A mutating call (a tool not annotated ``readOnlyHint``) is refused while any
namespace required of its caller lacks attachment proof, with one of three
distinct, typed conditions (:func:`check_attachment`):

1. ``attachment_contradictory``: the evidence disagrees with itself (two
   sources saying opposite things of one fact). Checked first: a
   contradiction cannot be trusted to say which of the others it is.
2. ``required_namespace_not_connected``: not connected, or never observed
   connected (absent proof is not proof). An upstream that was attached and
   then died is an outage, reported here, not a contradiction (issue #11).
3. ``connected_namespace_missing``: connected, but not in this session's
   surface (or the session never listed its tools).

Read-only calls pass. The sanctioned recovery is :meth:`AttachmentTracker.reattach`:
re-initialize this session's upstream session and refresh its surface,
through the gateway's own callback. Nothing here ever kills a process.

:class:`AttachmentTracker` is per gateway (no process-global state) and
in-memory: it is fed events by the gateway and consulted on the call path
without I/O. Session *ownership* records in the store are written from the
changes it returns (:func:`persist_surface_change`).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bastion.errors import (
    AttachmentContradictory,
    AttachmentUnproven,
    NamespaceNotAttached,
    NamespaceNotConnected,
)
from bastion.ids import Epoch, WorkerId
from bastion.store.base import Store

__all__ = [
    "AttachmentEvidence",
    "AttachmentTracker",
    "Fact",
    "NamespaceRequirement",
    "NamespaceRequirements",
    "Observation",
    "Reattach",
    "Source",
    "SurfaceChange",
    "check_attachment",
    "condition_of",
    "owner_ref",
    "persist_surface_change",
    "session_ref_of_key",
    "sessionless_ref",
    "transport_session_ref",
]


class Fact(enum.StrEnum):
    CONNECTED = "connected"
    ATTACHED = "attached"


class Source(enum.StrEnum):
    """Where an observation came from; two sources disagreeing on one fact is a contradiction."""

    UPSTREAM_EVENTS = "upstream_events"  # connected / disconnected events from the upstream
    UPSTREAM_HEALTH = "upstream_health"  # the upstream's health, read when the evidence is built
    SESSION_SURFACE = "session_surface"  # what the session's last tools/list included


@dataclass(frozen=True, slots=True)
class Observation:
    source: Source
    fact: Fact
    value: bool


@dataclass(frozen=True, slots=True)
class AttachmentEvidence:
    """What is known of one namespace for one session. ``None``: never observed (unproven)."""

    namespace: str
    connected: bool | None
    attached: bool | None
    sources: tuple[Observation, ...] = ()

    @classmethod
    def observed(cls, namespace: str, observations: Iterable[Observation]) -> AttachmentEvidence:
        """Evidence from observations: a fact is the value its sources agree on, else ``None``.

        Disagreement is kept in ``sources``; :func:`condition_of` reports it.
        """
        kept = tuple(observations)
        return cls(namespace, _agreed(kept, Fact.CONNECTED), _agreed(kept, Fact.ATTACHED), kept)

    def contradictions(self) -> tuple[str, ...]:
        """Why this evidence disagrees with itself (empty when it does not)."""
        found = []
        for fact, value in ((Fact.CONNECTED, self.connected), (Fact.ATTACHED, self.attached)):
            seen = {o.value for o in self.sources if o.fact is fact}
            if len(seen) > 1:
                found.append(f"sources disagree on {fact.value}")
            elif seen and value is not None and value not in seen:
                found.append(f"{fact.value} disagrees with its source")
        # Attached yet not connected is an outage (the surface is older than the failure), not
        # evidence that disagrees with itself: condition_of reports it as not connected (issue #11).
        return tuple(found)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "connected": _proof(self.connected),
            "attached": _proof(self.attached),
            "condition": _condition_value(condition_of(self)),
            "contradictions": list(self.contradictions()),
            "sources": [
                {"source": o.source.value, "fact": o.fact.value, "value": o.value} for o in self.sources
            ],
        }


def condition_of(evidence: AttachmentEvidence) -> type[AttachmentUnproven] | None:
    """The typed condition ``evidence`` is in, or ``None`` when it proves attachment."""
    # (1) Contradictory evidence proves nothing, and is named as such.
    if evidence.contradictions():
        return AttachmentContradictory
    # (2) Not connected, or connection never observed.
    if evidence.connected is not True:
        return NamespaceNotConnected
    # (3) Connected, but not (or not provably) in this session's surface.
    if evidence.attached is not True:
        return NamespaceNotAttached
    return None


_PRECEDENCE: tuple[type[AttachmentUnproven], ...] = (
    AttachmentContradictory,
    NamespaceNotConnected,
    NamespaceNotAttached,
)


def check_attachment(
    required_namespaces: Collection[str],
    evidence_by_namespace: Mapping[str, AttachmentEvidence],
    *,
    tool_read_only: bool,
) -> None:
    """Refuse a mutating call while a required namespace lacks attachment proof (DESIGN §2 step 5).

    Every required namespace is classified; the error raised is the most
    severe condition present (contradictory, then not connected, then
    missing), and its data lists every namespace's condition, so no condition
    hides another. A namespace with no evidence at all is unproven: not
    connected.

    Raises:
        AttachmentContradictory: some required namespace's evidence disagrees with itself.
        NamespaceNotConnected: some required namespace is not (provably) connected.
        NamespaceNotAttached: some required namespace is connected but missing from the surface.
    """
    if tool_read_only:
        return  # read-only calls are never gated (DESIGN section 6)
    failing: dict[str, tuple[type[AttachmentUnproven], AttachmentEvidence]] = {}
    for namespace in sorted(set(required_namespaces)):
        evidence = evidence_by_namespace.get(namespace) or AttachmentEvidence(namespace, None, None)
        condition = condition_of(evidence)
        if condition is not None:
            failing[namespace] = (condition, evidence)
    if not failing:
        return
    worst = next(c for c in _PRECEDENCE if any(found is c for found, _ in failing.values()))
    named = sorted(ns for ns, (found, _) in failing.items() if found is worst)
    raise worst(
        f"{worst.default_message}: {', '.join(named)}",
        namespaces=named,
        namespace_conditions={
            ns: {
                "condition": found.reason.value,
                "connected": _proof(evidence.connected),
                "attached": _proof(evidence.attached),
            }
            for ns, (found, evidence) in failing.items()
        },
    )


# ---------------------------------------------------------------- which namespaces are required


@dataclass(frozen=True, slots=True)
class NamespaceRequirement:
    """``namespaces`` are required of one agent, or of every agent of one team (exactly one of the two)."""

    namespaces: frozenset[str]
    agent: str | None = None
    team: str | None = None

    def __post_init__(self) -> None:
        if (self.agent is None) == (self.team is None):
            raise ValueError("a namespace requirement names exactly one of agent or team")
        if not self.namespaces or any(not ns for ns in self.namespaces):
            raise ValueError("a namespace requirement lists at least one non-empty namespace")


@dataclass(frozen=True, slots=True)
class NamespaceRequirements:
    """Every requirement of the snapshot in force; a caller's set is the union of those naming it."""

    rules: tuple[NamespaceRequirement, ...] = ()

    def required_for(self, agent: str, team: str | None) -> frozenset[str]:
        required: set[str] = set()
        for rule in self.rules:
            if rule.agent == agent or (team is not None and rule.team == team):
                required |= rule.namespaces
        return frozenset(required)


# ---------------------------------------------------------------- the tracker


Reattach = Callable[[str, str], Awaitable[Iterable[str]]]
"""``reattach(transport_session_ref, namespace)``: re-initialize that session's upstream session for the
namespace and refresh its tool surface; returns the namespaces now in the surface. Never kills processes."""

HealthProbe = Callable[[str], bool | None]
"""``probe(namespace)``: the upstream's own view of whether it is connected now (``None``: unknown)."""


@dataclass(frozen=True, slots=True)
class SurfaceChange:
    """What one surface update changed for one session: namespaces newly attached, and detached."""

    transport_session_ref: str
    attached: frozenset[str] = frozenset()
    detached: frozenset[str] = frozenset()


@dataclass
class _SessionSurface:
    namespaces: frozenset[str]
    listed_at: datetime | None = None
    owner: object | None = None  # sessionless refs: the principal, so a re-attach can list for it


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class AttachmentTracker:
    """Connection and attachment facts of one gateway, per namespace and per client transport session."""

    reattach_session: Reattach | None = None
    health_probe: HealthProbe | None = None
    clock: Callable[[], datetime] = _utc_now
    _connected: dict[str, bool] = field(default_factory=dict)
    _surfaces: dict[str, _SessionSurface] = field(default_factory=dict)

    # ------------------------------------------------------------------ upstream facts

    def upstream_connected(self, namespace: str) -> None:
        self._connected[namespace] = True

    def upstream_disconnected(self, namespace: str) -> None:
        self._connected[namespace] = False

    # ------------------------------------------------------------------ session facts

    def surface_listed(
        self,
        transport_session_ref: str,
        namespaces: Iterable[str],
        *,
        at: datetime | None = None,
        owner: object | None = None,
    ) -> SurfaceChange:
        """The session's ``tools/list`` just included exactly ``namespaces``' tools; returns what changed.

        ``at`` defaults to the tracker's clock; ``owner`` (kept when omitted) is what a re-attach of a
        sessionless ref lists for.
        """
        now_in = frozenset(namespaces)
        before = self._surfaces.get(transport_session_ref)
        earlier = before.namespaces if before is not None else frozenset()
        if owner is None and before is not None:
            owner = before.owner
        listed_at = at if at is not None else self.clock()
        self._surfaces[transport_session_ref] = _SessionSurface(now_in, listed_at, owner)
        return SurfaceChange(transport_session_ref, now_in - earlier, earlier - now_in)

    def owner_of(self, transport_session_ref: str) -> object | None:
        surface = self._surfaces.get(transport_session_ref)
        return None if surface is None else surface.owner

    def session_closed(self, transport_session_ref: str) -> SurfaceChange:
        """Forget the session; everything it had attached is detached."""
        before = self._surfaces.pop(transport_session_ref, None)
        return SurfaceChange(transport_session_ref, detached=before.namespaces if before else frozenset())

    def sessions(self) -> list[str]:
        return sorted(self._surfaces)

    # ------------------------------------------------------------------ evidence and the gate

    def evidence(self, transport_session_ref: str, namespace: str) -> AttachmentEvidence:
        observations = []
        if namespace in self._connected:
            connected = self._connected[namespace]
            observations.append(Observation(Source.UPSTREAM_EVENTS, Fact.CONNECTED, connected))
        if self.health_probe is not None:
            probed = self.health_probe(namespace)
            if probed is not None:
                observations.append(Observation(Source.UPSTREAM_HEALTH, Fact.CONNECTED, probed))
        surface = self._surfaces.get(transport_session_ref)
        if surface is not None:
            observations.append(
                Observation(Source.SESSION_SURFACE, Fact.ATTACHED, namespace in surface.namespaces)
            )
        return AttachmentEvidence.observed(namespace, observations)

    def check(self, transport_session_ref: str, required: Collection[str], *, tool_read_only: bool) -> None:
        """:func:`check_attachment` on this session's evidence; raises as it does."""
        if tool_read_only:
            return
        evidence = {ns: self.evidence(transport_session_ref, ns) for ns in required}
        check_attachment(required, evidence, tool_read_only=False)

    async def reattach(self, transport_session_ref: str, namespace: str) -> AttachmentEvidence:
        """The sanctioned recovery: re-initialize the upstream session and refresh the session's surface.

        Goes through the gateway's ``reattach_session`` callback only (never
        kills a process, by name or otherwise) and returns the evidence after
        it. Raises :class:`RuntimeError` when no callback was given, and what
        the callback raises (the surface is then left as it was).
        """
        if self.reattach_session is None:
            raise RuntimeError("this gateway has no re-attach path configured")
        surface = await self.reattach_session(transport_session_ref, namespace)
        self.surface_listed(transport_session_ref, surface)
        return self.evidence(transport_session_ref, namespace)

    def describe(self, transport_session_ref: str, namespaces: Iterable[str] = ()) -> dict[str, Any] | None:
        """The session's evidence per namespace (those named, those connected, those in its surface), as JSON.

        ``None`` when the tracker has never seen the session.
        """
        surface = self._surfaces.get(transport_session_ref)
        if surface is None:
            return None
        shown = sorted(set(namespaces) | set(self._connected) | set(surface.namespaces))
        return {
            "transport_session_ref": transport_session_ref,
            "surface_listed_at": None if surface.listed_at is None else surface.listed_at.isoformat(),
            "namespaces": [self.evidence(transport_session_ref, ns).to_json() for ns in shown],
        }


# ---------------------------------------------------------------- session ownership in the store


def transport_session_ref(transport_session_id: str) -> str:
    """A stable, non-secret reference to a transport session, for records and the admin API.

    The ``Mcp-Session-Id`` itself is a bearer of the session and is never
    stored or shown; its SHA-256 prefix is.
    """
    return session_ref_of_key(hashlib.sha256(transport_session_id.encode()).hexdigest())


def session_ref_of_key(key: str) -> str:
    """The reference of the transport session stored under ``key`` (its ``transport_session_key``)."""
    return "ts_" + key[:24]


def sessionless_ref(agent: str, agent_session_id: str | None) -> str:
    """The tracker's reference for one agent's (one agent session's) sessionless requests.

    Each agent gets its own: one agent's surface never proves another's (issue #11 point 8).
    """
    key = f"{agent}\x00{agent_session_id or ''}"
    return "sl_" + hashlib.sha256(key.encode()).hexdigest()[:24]


def owner_ref(transport_session_id: str | None, agent: str, agent_session_id: str | None) -> str:
    """The reference of whoever a request is made for: its transport session, else its agent session."""
    if transport_session_id is not None:
        return transport_session_ref(transport_session_id)
    return sessionless_ref(agent, agent_session_id)


async def persist_surface_change(
    store: Store,
    change: SurfaceChange,
    *,
    worker_for: Callable[[str], WorkerId | None],
    writer: WorkerId,
    epoch: Epoch,
    now: datetime,
) -> None:
    """Write the ownership records a surface change implies, each fenced by ``(writer, epoch)``.

    ``worker_for(namespace)`` names the worker serving that namespace (the
    launched runtime's identity, or the gateway's own for an upstream it did
    not launch); a namespace with none is skipped. Raises :class:`StoreError`
    (:class:`StaleEpoch` for a superseded writer, which writes nothing).
    """
    for namespace in sorted(change.attached):
        worker = worker_for(namespace)
        if worker is not None:
            await store.record_attachment(
                worker, change.transport_session_ref, namespace, now, writer=writer, epoch=epoch
            )
    for namespace in sorted(change.detached):
        worker = worker_for(namespace)
        if worker is not None:
            await store.clear_attachment(
                worker, change.transport_session_ref, namespace, writer=writer, epoch=epoch
            )


def _agreed(observations: tuple[Observation, ...], fact: Fact) -> bool | None:
    values = {o.value for o in observations if o.fact is fact}
    return values.pop() if len(values) == 1 else None


def _proof(value: bool | None) -> bool | str:
    return "unproven" if value is None else value


def _condition_value(condition: type[AttachmentUnproven] | None) -> str | None:
    return None if condition is None else condition.reason.value
