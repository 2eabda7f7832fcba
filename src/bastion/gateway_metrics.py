"""The gauges of one gateway process read from its state when scraped, on the app's own registry.

Transport sessions, catalog size, connected upstreams, degraded, sessionless
evidence scopes, ``bastion_upstream_up{server}`` and reconnects (HTTP and stdio), the
stdio servers' processes (running by scope, spawns, failed starts, crashes, restarts,
refusals at a process bound), the store's
committed write counts, commit times and batch sizes, and the replica lags.
Split from ``metrics.py`` (the per-call families that
``call.py`` feeds through ``call_telemetry.py``) because these read the whole
:class:`~bastion.gateway.Gateway`, which itself depends on the per-call ones;
only ``app.py`` builds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from bastion.policy.snapshot import ProcessScope
from bastion.store.commit_stats import CountHistogram
from bastion.upstream.stdio import StdioUpstream

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from bastion.gateway import Gateway

__all__ = ["GatewayMetrics"]


class GatewayMetrics:
    """Gauges read from the gateway when scraped."""

    def __init__(self, registry: CollectorRegistry, gateway: Gateway) -> None:
        sessions = Gauge(
            "bastion_transport_sessions", "Live session-era transport sessions", registry=registry
        )
        sessions.set_function(lambda: len(gateway.registry))
        tools = Gauge("bastion_tools", "Tools in the surface", registry=registry)
        tools.set_function(lambda: len(gateway.fleet.catalog))
        connected = Gauge("bastion_upstreams_connected", "Upstreams whose transport is up", registry=registry)
        connected.set_function(lambda: sum(1 for h in gateway.fleet.health() if h.connected))
        degraded = Gauge(
            "bastion_store_degraded", "1 while the store cannot write (admissions refused)", registry=registry
        )
        degraded.set_function(lambda: 1 if gateway.health.degraded else 0)
        sessionless = Gauge(
            "bastion_sessionless_agent_sessions",
            "Agent sessions (or agents) with a live shared evidence chain: the sessionless era's clients",
            registry=registry,
        )
        sessionless.set_function(lambda: len(gateway.shared_evidence) if gateway.shared_evidence else 0)
        registry.register(_UpstreamUp(gateway))
        registry.register(_StdioProcesses(gateway))
        registry.register(_StoreWrites(gateway))
        registry.register(_PropagationLag(gateway))


class _UpstreamUp(Collector):
    """``bastion_upstream_up{server}``: 1 while that upstream's transport is up;
    ``bastion_upstream_reconnects_total{server}``: its comebacks (HTTP upstreams: health.py; stdio:
    a process ready again after it crashed or failed to start)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "bastion_upstream_up", "1 while the upstream's transport is up", labels=["server"]
        )
        for health in self._gateway.fleet.health():
            family.add_metric([health.name], 1 if health.connected else 0)
        yield family
        reconnects = CounterMetricFamily(
            "bastion_upstream_reconnects",
            "Times an upstream came back: an HTTP one after an outage its health prober saw, "
            "a stdio process ready again after it crashed or failed to start",
            labels=["server"],
        )
        for name, prober in self._gateway.fleet.probers.items():
            reconnects.add_metric([name], prober.reconnects)
        for name, upstream in _stdio_upstreams(self._gateway):
            reconnects.add_metric([name], upstream.counts.reconnects)
        yield reconnects


def _stdio_upstreams(gateway: Gateway) -> list[tuple[str, StdioUpstream]]:
    return [(n, u) for n, u in gateway.fleet.upstreams.items() if isinstance(u, StdioUpstream)]


#: The counters of ``upstream/stdio_counts.py``: attribute, family name, help.
_PROCESS_COUNTS = (
    ("spawns", "bastion_upstream_process_spawns", "stdio server processes launched (restarts included)"),
    (
        "spawn_failures",
        "bastion_upstream_process_spawn_failures",
        "stdio process starts that failed (launch or handshake)",
    ),
    (
        "crashes",
        "bastion_upstream_process_crashes",
        "stdio processes that ended on their own after being ready",
    ),
    (
        "restarts",
        "bastion_upstream_process_restarts",
        "stdio processes started again after ending or failing",
    ),
)


class _StdioProcesses(Collector):
    """Per stdio server: ``bastion_upstream_processes{server,scope}`` running now (``scope`` is the
    server's, or ``listing`` for the process that builds the catalog in an owned scope), the
    counters above, and ``bastion_upstream_capacity_refusals_total{server,bound}``."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        upstreams = _stdio_upstreams(self._gateway)
        running = GaugeMetricFamily(
            "bastion_upstream_processes",
            "stdio server processes running now, by server and scope (listing: the catalog's own)",
            labels=["server", "scope"],
        )
        for name, upstream in upstreams:
            listing, owned = upstream.processes_running()
            if upstream.scope is ProcessScope.SHARED:
                running.add_metric([name, upstream.scope.value], listing)
            else:
                running.add_metric([name, "listing"], listing)
                running.add_metric([name, upstream.scope.value], owned)
        yield running
        for attribute, family_name, documentation in _PROCESS_COUNTS:
            family = CounterMetricFamily(family_name, documentation, labels=["server"])
            for name, upstream in upstreams:
                family.add_metric([name], getattr(upstream.counts, attribute))
            yield family
        refusals = CounterMetricFamily(
            "bastion_upstream_capacity_refusals",
            "Calls refused upstream_capacity: no process for their owner at a bound (server or gateway)",
            labels=["server", "bound"],
        )
        for name, upstream in upstreams:
            for bound in ("server", "gateway"):
                refusals.add_metric([name, bound], upstream.counts.capacity_refusals[bound])
        yield refusals


class _StoreWrites(Collector):
    """The store's own counts, read at scrape: committed write transactions (one fsync each) and
    the writes they carried (their ratio is the group-commit batch size)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        store = self._gateway.store
        transactions = getattr(store, "committed_transactions", None)
        writes = getattr(store, "committed_writes", None)
        if isinstance(transactions, int):
            family = CounterMetricFamily(
                "bastion_store_transactions", "Committed store write transactions (one fsync each)"
            )
            family.add_metric([], transactions)
            yield family
        if isinstance(writes, int):
            family = CounterMetricFamily(
                "bastion_store_writes", "Store writes committed in those transactions (group commit)"
            )
            family.add_metric([], writes)
            yield family
        for attribute, name, documentation in _STORE_HISTOGRAMS:
            histogram = getattr(store, attribute, None)
            if isinstance(histogram, CountHistogram):
                histogram_family = HistogramMetricFamily(name, documentation)
                histogram_family.add_metric([], histogram.cumulative(), histogram.total)
                yield histogram_family


#: The store's own histograms (store/commit_stats.py), where the store keeps them (SQLite).
_STORE_HISTOGRAMS = (
    ("commit_seconds", "bastion_store_commit_seconds", "Seconds per store COMMIT (its fsync)"),
    ("batch_sizes", "bastion_store_batch_size", "Writes per committed store transaction (group commit)"),
)


class _PropagationLag(Collector):
    """Seconds from a change to its effect here (propagation/follower.py): a revocation made at
    any replica ending its sessions here, another replica's policy reload followed; and how long
    this replica's snapshot has been behind a reload it could not follow (a gauge: such a replica
    records no follow lag at all)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def collect(self) -> Iterator[Metric]:
        follower = self._gateway.follower
        if follower is None:
            return
        for histogram, name, documentation in (
            (
                follower.revocation_lag,
                "bastion_revocation_propagation_seconds",
                "Seconds from a revocation (at any replica) to this replica having ended its sessions",
            ),
            (
                follower.policy_lag,
                "bastion_policy_follow_lag_seconds",
                "Seconds from a policy reload at another replica to this replica's snapshot following it",
            ),
        ):
            family = HistogramMetricFamily(name, documentation)
            family.add_metric([], histogram.cumulative(), histogram.total)
            yield family
        lag = GaugeMetricFamily(
            "bastion_policy_snapshot_lag_seconds",
            "Seconds this replica's policy snapshot has been behind a peer's reload it did not follow "
            "(0 when in step)",
        )
        lag.add_metric([], follower.snapshot_lag_s())
        yield lag
