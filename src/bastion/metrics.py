"""Prometheus metrics of one gateway process, on its own registry (no process-global collector).

:class:`CallMetrics` are the per-call families (issue #25) that
``call_telemetry.py`` feeds. Label values are bounded: servers and tools come
from the catalog (an unknown tool is the one value ``(unknown)``), outcomes
from the execution states, reasons from ``errors.Reason``, and the agent label
is empty unless ``gateway.metrics_agents`` names how many agents get a value
of their own (the rest are ``other``). Children are cached by label tuple, so
a call costs dictionary look-ups, not label-set building.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["UNKNOWN_TOOL", "AgentLabels", "CallMetrics"]

#: The tool label of a call whose tool is not in the catalog (never the name the client sent).
UNKNOWN_TOOL = "(unknown)"
#: The agent label of every agent past the first ``gateway.metrics_agents``.
OTHER_AGENT = "other"
#: Seconds: from half a millisecond (the gateway's own overhead) to the upstream timeout.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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
        # Tasks a governed call created, and how they ended (issue 24, tasks/relay.py).
        self.tasks_created = Counter(
            "bastion_tasks_created",
            "Tasks upstreams created for governed tools/call requests, by server",
            ["server"],
            registry=registry,
        )
        self.tasks_ended = Counter(
            "bastion_tasks_terminal",
            "Tasks that reached a terminal status, by server and status (failed includes a lost task)",
            ["server", "status"],
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

    def task_created(self, server: str) -> None:
        self.tasks_created.labels(server).inc()

    def task_ended(self, server: str, status: str) -> None:
        self.tasks_ended.labels(server, status).inc()

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
