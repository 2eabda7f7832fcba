"""Prometheus metrics of one gateway process, on its own registry (no process-global collector)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge

if TYPE_CHECKING:
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
