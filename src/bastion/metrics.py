"""Prometheus metrics of one gateway process, on its own registry (no process-global collector).

:class:`GatewayMetrics` are gauges read from the gateway when scraped;
:class:`CallMetrics` are the per-call families (issue #25) that
``call_telemetry.py`` feeds. Label values are bounded: servers and tools come
from the catalog (an unknown tool is the one value ``(unknown)``), outcomes
from the execution states, reasons from ``errors.Reason``, and the agent label
is empty unless ``gateway.metrics_agents`` names how many agents get a value
of their own (the rest are ``other``). Children are cached by label tuple, so
a call costs dictionary look-ups, not label-set building.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from bastion.store.commit_stats import CountHistogram

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from bastion.gateway import Gateway

__all__ = ["UNKNOWN_TOOL", "AgentLabels", "CallMetrics", "GatewayMetrics"]

#: The tool label of a call whose tool is not in the catalog (never the name the client sent).
UNKNOWN_TOOL = "(unknown)"
#: The agent label of every agent past the first ``gateway.metrics_agents``.
OTHER_AGENT = "other"
#: Seconds: from half a millisecond (the gateway's own overhead) to the upstream timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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


class AgentLabels:
    """The agent label value: empty (off), the agent's name for the first ``limit`` agents, else other."""

    def __init__(self) -> None:
        self._named: set[str] = set()

    def label(self, agent: str, limit: int) -> str:
        if limit <= 0:
            return ""
        named = self._named
        if agent in named:
            return agent
        if len(named) < limit:
            named.add(agent)
            return agent
        return OTHER_AGENT


class CallMetrics:
    """The per-call families of one gateway process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "bastion_tool_calls",
            "Governed tools/call requests, by server, tool, agent, outcome and reason",
            ["server", "tool", "agent", "outcome", "reason"],
            registry=registry,
        )
        self.call_seconds = Histogram(
            "bastion_tool_call_duration_seconds",
            "Whole governed tools/call, from the gateway's first step to the answer",
            ["server", "tool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_seconds = Histogram(
            "bastion_tool_call_upstream_duration_seconds",
            "The upstream exchange of a governed tools/call (the gateway's overhead is the difference)",
            ["server", "tool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "bastion_refusals",
            "Governed requests refused, by method and reason (rate_limited: rate-limit rejections)",
            ["method", "reason"],
            registry=registry,
        )
        self.requests = Counter(
            "bastion_requests",
            "Governed resources, prompts and completion requests, by method, outcome and reason",
            ["method", "outcome", "reason"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "bastion_request_duration_seconds",
            "Whole governed resources, prompts and completion requests",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "bastion_requests_in_flight",
            "Governed requests being served, by method",
            ["method"],
            registry=registry,
        )
        self.store_write_seconds = Histogram(
            "bastion_store_write_seconds",
            "Durable audit appends (with their execution step): time to commit, group commit included",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.agents = AgentLabels()
        self._children: dict[tuple[str, ...], tuple[Counter, Histogram, Histogram]] = {}
        self._refusal_children: dict[tuple[str, str], Counter] = {}
        self._request_children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}
        self._in_flight_children: dict[str, Gauge] = {}

    def in_flight_of(self, method: str) -> Gauge:
        child = self._in_flight_children.get(method)
        if child is None:
            child = self._in_flight_children[method] = self.in_flight.labels(method)
        return child

    def observe_call(
        self,
        server: str,
        tool: str,
        agent: str,
        outcome: str,
        reason: str,
        total_s: float,
        upstream_s: float | None,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        key = (server, tool, agent, outcome, reason)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.calls.labels(*key),
                self.call_seconds.labels(server, tool),
                self.upstream_seconds.labels(server, tool),
            )
        calls, whole, upstream = children
        calls.inc(exemplar=exemplar)
        whole.observe(total_s, exemplar)
        if upstream_s is not None:
            upstream.observe(upstream_s)
        if outcome == "refused":
            self.refused("tools/call", reason)

    def refused(self, method: str, reason: str) -> None:
        key = (method, reason)
        child = self._refusal_children.get(key)
        if child is None:
            child = self._refusal_children[key] = self.refusals.labels(method, reason)
        child.inc()

    def observe_request(self, method: str, outcome: str, reason: str, total_s: float) -> None:
        key = (method, outcome, reason)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.requests.labels(*key),
                self.request_seconds.labels(method),
            )
        children[0].inc()
        children[1].observe(total_s)
        if outcome == "refused":
            self.refused(method, reason)
