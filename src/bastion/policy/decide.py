"""The grant decision for one ``tools/call``, and what each principal sees (DESIGN section 2 step 4).

Owns :func:`decide` (deny by default: a call is allowed only when a grant of
the snapshot in force covers it), :func:`visible_tools` (``tools/list``
shows only what the principal may call) and :class:`RateLimiter`, the token
buckets behind grant ``rate`` limits. The limiter is an object the gateway
owns, never process-global state.

**No grants declared.** A snapshot without any ``[[grants]]`` keeps the
behaviour from before grants existed: every authenticated agent may call
every tool, and the decision says so (:attr:`DecisionBasis.NO_GRANTS_DECLARED`)
so the audit can tell. Once one grant is declared, everything not granted is
refused.

This module decides; it never renders an answer, never logs, and never puts
an argument value into an error (only tool names, grant names and schema paths).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bastion.auth.principal import Principal
from bastion.errors import ArgumentConstraintFailed, ExecutionIdRequired, GrantDenied, RateLimited
from bastion.policy.approval_rules import ApprovalRule
from bastion.policy.grants import Grant, Rate
from bastion.policy.snapshot import Snapshot

__all__ = [
    "CatalogEntry",
    "DecisionBasis",
    "GrantDecision",
    "RateLimiter",
    "SurfaceKind",
    "decide",
    "decide_surface",
    "rate_limited",
    "server_visible",
    "surface_reachable",
    "surface_visible",
    "tool_visible",
    "visible_tools",
]


class DecisionBasis(enum.StrEnum):
    """Why a call was allowed: by named grants, or because the snapshot declares none."""

    GRANT = "grant"
    NO_GRANTS_DECLARED = "no_grants_declared"


@dataclass(frozen=True)
class GrantDecision:
    """An allowed call. ``grants`` names every grant that allowed it, in file order.

    ``require_execution_id`` is true when any of those grants requires one;
    the call path refuses with ``ExecutionIdRequired`` when the call has none.
    """

    basis: DecisionBasis
    grants: tuple[str, ...]
    require_execution_id: bool
    policy_version: str
    # The rate limits of the allowing grants: taken by ``decide`` from an in-memory limiter,
    # or, when it is given none, by the caller from the store (``policy/shared_limits.py``).
    limits: tuple[tuple[str, Rate], ...] = ()
    # Issue 27: the first allowing grant (file order) that requires approval, and its rule.
    approval: tuple[str, ApprovalRule] | None = None

    @property
    def grant(self) -> str | None:
        """The first grant that allowed the call (``None`` when no grants are declared)."""
        return self.grants[0] if self.grants else None


class CatalogEntry(Protocol):
    """What :func:`visible_tools` reads from a tool of the surface (``upstream.fleet.ToolEntry`` fits)."""

    @property
    def server(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def upstream_name(self) -> str: ...


_E = TypeVar("_E", bound=CatalogEntry)


# Buckets are keyed by grant, its rate, agent, server and upstream tool: a reload that
# keeps a grant's name and rate keeps its buckets; one that changes the rate starts afresh.
_BucketKey = tuple[str, int, float, str, str, str]


class RateLimiter:
    """Token buckets for grant rate limits, one per grant, agent, server and tool.

    Owned by one gateway; two gateways in one process have two limiters. It
    holds the limit per process; the gateway takes its tokens from the store
    instead (``policy/shared_limits.py``), so that replicas share them. Time is the
    ``now`` passed in (monotonic seconds), so tests need no sleeps.

    Memory is bounded by ``max_buckets``: refilled buckets are forgotten (that
    changes no decision); when every bucket is still live, a call that needs a
    new bucket is refused (``RateLimited``, cause ``limiter_full``) rather than
    forgetting a live one, which would refill it.
    """

    def __init__(self, *, max_buckets: int = 100_000) -> None:
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        self._max_buckets = max_buckets
        # key -> (tokens left, time of last update)
        self._buckets: dict[_BucketKey, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(
        self, limits: Sequence[tuple[str, Rate]], agent: str, server: str, tool: str, now: float
    ) -> None:
        """Take one token from every bucket in ``limits``, or from none.

        Raises:
            RateLimited: some bucket is empty; ``retry_after_s`` says when it has a token again.
        """
        if not limits:
            return
        with self._lock:
            keys = [(name, rate.tokens, rate.period_s, agent, server, tool) for name, rate in limits]
            held = [self._level(key, rate, now) for key, (_, rate) in zip(keys, limits, strict=True)]
            for (name, rate), (level, _) in zip(limits, held, strict=True):
                if level < 1.0:
                    raise rate_limited(tool, name, rate, round((1.0 - level) / rate.refill_per_s, 3))
            fresh = sum(1 for key in keys if key not in self._buckets)
            if len(self._buckets) + fresh > self._max_buckets:
                self._prune(now)
                if len(self._buckets) + fresh > self._max_buckets:
                    # Forgetting a live bucket would refill it: refuse rather than allow more.
                    raise RateLimited(
                        "Rate limit exceeded: too many active rate-limit buckets",
                        cause="limiter_full",
                        tool=tool,
                        retry_after_s=1.0,
                    )
            for key, (level, stamp) in zip(keys, held, strict=True):
                self._buckets[key] = (level - 1.0, stamp)

    def refund(
        self, limits: Sequence[tuple[str, Rate]], agent: str, server: str, tool: str, now: float
    ) -> None:
        """Give back the token :meth:`take` took for a call refused before its send (capped at capacity)."""
        with self._lock:
            for name, rate in limits:
                key = (name, rate.tokens, rate.period_s, agent, server, tool)
                if key in self._buckets:
                    level, stamp = self._level(key, rate, now)
                    self._buckets[key] = (min(float(rate.tokens), level + 1.0), stamp)

    @property
    def bucket_count(self) -> int:
        """Buckets held now (for metrics and tests)."""
        return len(self._buckets)

    def _level(self, key: _BucketKey, rate: Rate, now: float) -> tuple[float, float]:
        """Tokens in the bucket at ``now``, and the time that level is as of."""
        held = self._buckets.get(key)
        if held is None:
            return float(rate.tokens), now
        tokens, then = held
        # A clock that steps back refills nothing, and time already counted is never counted twice.
        if now <= then:
            return tokens, then
        return min(float(rate.tokens), tokens + (now - then) * rate.refill_per_s), now

    def _prune(self, now: float) -> None:
        # A full bucket is the same as no bucket: forgetting it changes no decision.
        for key, (tokens, then) in list(self._buckets.items()):
            capacity, period_s = key[1], key[2]
            if tokens + max(0.0, now - then) * capacity / period_s >= capacity:
                del self._buckets[key]


def rate_limited(tool: str, grant: str, rate: Rate, retry_after_s: float) -> RateLimited:
    """The refusal of a call whose grant's bucket is empty (one wording, whichever limiter refused)."""
    return RateLimited(
        f"Rate limit exceeded for {tool}: grant {grant} allows {rate.tokens} per {rate.period_s:g} s",
        tool=tool,
        grant=grant,
        retry_after_s=retry_after_s,
    )


def decide(
    snapshot: Snapshot,
    principal: Principal,
    server: str,
    namespace: str,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    now: float,
    limiter: RateLimiter | None,
    has_execution_id: bool = True,
) -> GrantDecision:
    """Decide one call of upstream tool ``tool`` on ``server`` (``namespace``) by ``principal``.

    ``tool`` is the upstream tool name (what grant patterns match), not the
    namespaced name of the surface. ``now`` is monotonic seconds, for rate limits.
    With ``limiter=None`` no token is taken here: the decision's ``limits`` are
    the caller's to take (from the store, shared by replicas) before it goes on.

    Raises:
        GrantDenied: no grant of this principal covers the server and tool.
        ArgumentConstraintFailed: grants cover the tool, but every one's ``arguments_schema`` refuses.
        ExecutionIdRequired: an allowing grant requires an execution id and the call has none
            (checked before any rate-limit token is spent: a refused call spends nothing).
        RateLimited: an allowing grant's rate limit for this agent and tool is spent.
    """
    version = snapshot.version
    # (1) No grants declared: the compatibility mode (module docstring).
    if not snapshot.grants:
        return GrantDecision(DecisionBasis.NO_GRANTS_DECLARED, (), False, version)

    # (2) Deny by default: only grants for this principal, server and tool count.
    covering = [
        g for g in _for_principal(snapshot.grants, principal) if g.covers_target(server, namespace, tool)
    ]
    if not covering:
        raise GrantDenied(
            f"Denied by policy: no grant allows {tool} on {server}",
            tool=tool,
            server=server,
            policy_version=version,
        )

    # (3) Argument constraints: a grant allows only the arguments its schema accepts.
    allowing: list[Grant] = []
    first_violation: tuple[str, str] | None = None
    for grant in covering:
        violation = grant.argument_violation(arguments)
        if violation is None:
            allowing.append(grant)
        elif first_violation is None:
            first_violation = (grant.name, violation)
    if not allowing:
        assert first_violation is not None
        raise ArgumentConstraintFailed(
            f"Arguments for {tool} do not satisfy grant {first_violation[0]}",
            tool=tool,
            grant=first_violation[0],
            schema_path=first_violation[1],
            policy_version=version,
        )

    # (4) Obligations of every allowing grant hold: a broader grant never lifts a narrower one's
    #     rate limit or execution_id requirement.
    requires_id = any(g.require_execution_id for g in allowing)
    if requires_id and not has_execution_id:
        raise ExecutionIdRequired(tool=tool, server=server, policy_version=version)
    limits = [(g.name, g.rate) for g in allowing if g.rate is not None]
    if limiter is not None:
        try:
            limiter.take(limits, str(principal.agent), server, tool, now)
        except RateLimited as exc:
            exc.data["policy_version"] = version
            raise
    # An approval one allowing grant requires is not lifted by another that requires none.
    approval = next(((g.name, g.approval) for g in allowing if g.approval is not None), None)
    return GrantDecision(
        DecisionBasis.GRANT,
        tuple(g.name for g in allowing),
        requires_id,
        version,
        tuple(limits),
        approval,
    )


def visible_tools(snapshot: Snapshot, principal: Principal, catalog_entries: Iterable[_E]) -> list[_E]:
    """The entries of the surface this principal may call, in their order (for ``tools/list``).

    A tool is shown when some grant of the principal covers it, whatever its
    argument constraints and rate limits: those are decided per call. With no
    grants declared, every entry is shown.
    """
    entries = list(catalog_entries)
    if not snapshot.grants:
        return entries
    mine = _for_principal(snapshot.grants, principal)
    return [e for e in entries if any(g.covers_target(e.server, e.namespace, e.upstream_name) for g in mine)]


class SurfaceKind(enum.StrEnum):
    """What a resources/prompts decision is about (issue 9): which grant patterns match it."""

    RESOURCE = "resource"  # an upstream resource URI or URI template
    PROMPT = "prompt"  # an upstream prompt name


def surface_visible(
    snapshot: Snapshot, principal: Principal, kind: SurfaceKind, server: str, namespace: str, name: str
) -> bool:
    """Whether this principal may see ``name`` (for list filtering); no grants declared: everything."""
    if not snapshot.grants:
        return True
    return any(_covers(g, kind, server, namespace, name) for g in _for_principal(snapshot.grants, principal))


def tool_visible(snapshot: Snapshot, principal: Principal, server: str, namespace: str, tool: str) -> bool:
    """Whether some grant of this principal covers upstream tool ``tool`` of ``server`` (as
    :func:`visible_tools` shows it); no grants declared: yes."""
    if not snapshot.grants:
        return True
    return any(g.covers_target(server, namespace, tool) for g in _for_principal(snapshot.grants, principal))


def server_visible(snapshot: Snapshot, principal: Principal, server: str, namespace: str) -> bool:
    """Whether some grant of this principal names ``server`` (or its namespace), whatever it then
    allows: the servers whose capabilities and extensions it is told of (issue 24); no grants
    declared: yes."""
    if not snapshot.grants:
        return True
    return any(
        server in g.servers or namespace in g.namespaces for g in _for_principal(snapshot.grants, principal)
    )


def surface_reachable(
    snapshot: Snapshot, principal: Principal, kind: SurfaceKind, server: str, namespace: str
) -> bool:
    """Whether some grant of this principal could show it anything of this kind on ``server``
    (capability advertisement); no grants declared: yes."""
    if not snapshot.grants:
        return True
    return any(
        (server in g.servers or namespace in g.namespaces)
        and bool(g.resources if kind is SurfaceKind.RESOURCE else g.prompts)
        for g in _for_principal(snapshot.grants, principal)
    )


def decide_surface(
    snapshot: Snapshot,
    principal: Principal,
    kind: SurfaceKind,
    server: str,
    namespace: str,
    name: str,
    arguments: Mapping[str, Any] | None = None,
) -> GrantDecision:
    """Decide one read, get or completion of ``name`` (upstream URI, template or prompt name).

    ``arguments`` (a ``prompts/get``'s) must satisfy some covering grant's ``arguments_schema``,
    as a tool call's must. The decision's ``limits`` are the caller's to take (``surface/limits.py``).

    Raises:
        GrantDenied: no grant of this principal covers it (the caller answers "unknown").
        ArgumentConstraintFailed: grants cover it, but every one's ``arguments_schema`` refuses.
    """
    version = snapshot.version
    if not snapshot.grants:
        return GrantDecision(DecisionBasis.NO_GRANTS_DECLARED, (), False, version)
    allowing = [
        g for g in _for_principal(snapshot.grants, principal) if _covers(g, kind, server, namespace, name)
    ]
    if not allowing:
        raise GrantDenied(
            f"Denied by policy: no grant allows {kind.value} on {server}",
            server=server,
            policy_version=version,
        )
    if arguments is not None:
        violations = [(g.name, g.argument_violation(arguments)) for g in allowing]
        if all(violation is not None for _, violation in violations):
            grant, path = violations[0]
            raise ArgumentConstraintFailed(
                f"Arguments for {name} do not satisfy grant {grant}",
                tool=name,
                grant=grant,
                schema_path=path,
                policy_version=version,
            )
        allowing = [g for g, (_, violation) in zip(allowing, violations, strict=True) if violation is None]
    limits = tuple((g.name, g.rate) for g in allowing if g.rate is not None)
    return GrantDecision(DecisionBasis.GRANT, tuple(g.name for g in allowing), False, version, limits)


def _covers(grant: Grant, kind: SurfaceKind, server: str, namespace: str, name: str) -> bool:
    if kind is SurfaceKind.RESOURCE:
        return grant.covers_resource(server, namespace, name)
    return grant.covers_prompt(server, namespace, name)


def _for_principal(grants: Iterable[Grant], principal: Principal) -> list[Grant]:
    return [
        g
        for g in grants
        if g.subject.covers(
            agent=str(principal.agent),
            team=principal.team,
            human=principal.human,
            scopes=principal.scopes,
        )
    ]
