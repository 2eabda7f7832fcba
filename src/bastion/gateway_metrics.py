"""The gauges of one gateway process read from its state when scraped, on the app's own registry.

Transport sessions, catalog size, connected upstreams, degraded, sessionless
evidence scopes, ``bastion_upstream_up{server}`` and reconnects, the store's
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

from bastion.store.commit_stats import CountHistogram

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
        registry.register(_StoreWrites(gateway))
        registry.register(_PropagationLag(gateway))


class _UpstreamUp(Collector):
    """``bastion_upstream_up{server}``: 1 while that upstream's transport is up;
    ``bastion_upstream_reconnects_total{server}``: its comebacks (HTTP upstreams: health.py)."""

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
            "Times an HTTP upstream came back after an outage its health prober saw",
            labels=["server"],
        )
        for name, prober in self._gateway.fleet.probers.items():
            reconnects.add_metric([name], prober.reconnects)
        yield reconnects


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
    any replica ending its sessions here, another replica's policy reload followed (this
    replica's snapshot lag)."""

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
