"""What an operator sees of each governed request: its metrics and its access line (DESIGN 11, #25).

One :class:`CallTelemetry` per gateway process. ``call.py`` reports each
``tools/call`` once, when it ends (whatever the way out); ``methods.py``
reports ``resources/read``, ``prompts/get`` and ``completion/complete`` the
same way. Each report counts into :class:`~bastion.metrics.CallMetrics` and,
unless ``gateway.access_log = false`` or the ``bastion.access`` logger is off,
writes one structured line on that logger: agent, method, server, tool,
outcome, reason, durations, call and execution ids, the evidence session and
seq of the call's last entry. Never an argument, a result or a credential.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bastion.errors import BastionError
from bastion.metrics import CallMetrics
from bastion.policy.snapshot import GatewaySettings
from bastion.tracing import Tracing, set_outcome, trace_id_of_current

__all__ = ["ACCESS_LOGGER", "CallTelemetry", "outcome_of_error"]

#: The logger of the access lines: ``logging.getLogger(ACCESS_LOGGER).setLevel(WARNING)`` silences it.
ACCESS_LOGGER = "bastion.access"

access_logger = logging.getLogger(ACCESS_LOGGER)


def outcome_of_error(error: BaseException | None) -> tuple[str, str]:
    """``(outcome, reason)`` of a request that ended with ``error`` and recorded no outcome itself."""
    if error is None:
        return "completed", ""
    if isinstance(error, BastionError):
        return "refused", error.reason.value
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return "cancelled", ""
    return "error", type(error).__name__


class CallTelemetry:
    def __init__(
        self,
        metrics: CallMetrics,
        settings: Callable[[], GatewaySettings],
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.metrics = metrics
        self._settings = settings
        self.tracing = tracing

    def tool_call(
        self,
        agent: str,
        *,
        server: str,
        tool: str,
        outcome: str,
        reason: str,
        total_s: float,
        upstream_s: float | None,
        call_id: str,
        execution_id: str | None,
        evidence_session_id: str | None,
        seq: int | None,
    ) -> None:
        settings = self._settings()
        label = self.metrics.agents.label(agent, settings.metrics_agents)
        trace_id = trace_id_of_current() if self.tracing is not None else None
        exemplar = {"trace_id": trace_id} if trace_id is not None else None
        self.metrics.observe_call(server, tool, label, outcome, reason, total_s, upstream_s, exemplar)
        if settings.access_log and access_logger.isEnabledFor(logging.INFO):
            access_logger.info(
                "tools/call",
                extra={
                    "agent": agent,
                    "method": "tools/call",
                    "server": server,
                    "tool": tool,
                    "outcome": outcome,
                    "reason": reason or None,
                    "duration_ms": round(total_s * 1000, 3),
                    "upstream_ms": None if upstream_s is None else round(upstream_s * 1000, 3),
                    "call_id": call_id,
                    "execution_id": execution_id,
                    "evidence_session_id": evidence_session_id,
                    "seq": seq,
                    "trace_id": trace_id,
                },
            )

    async def request(
        self, method: str, agent: str, run: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run one governed resources/prompts/completion request and report it."""
        in_flight = self.metrics.in_flight_of(method)
        in_flight.inc()
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            if self.tracing is None:
                return await run()
            with self.tracing.call_span(method, None, {"mcp.method.name": method}) as span:
                try:
                    return await run()
                finally:
                    outcome, reason = outcome_of_error(sys.exc_info()[1])
                    set_outcome(span, outcome, reason)
        except BaseException as exc:
            error = exc
            raise
        finally:
            total_s = time.perf_counter() - started
            in_flight.dec()
            outcome, reason = outcome_of_error(error)
            self.metrics.observe_request(method, outcome, reason, total_s)
            if self._settings().access_log and access_logger.isEnabledFor(logging.INFO):
                access_logger.info(
                    method,
                    extra={
                        "agent": agent,
                        "method": method,
                        "outcome": outcome,
                        "reason": reason or None,
                        "duration_ms": round(total_s * 1000, 3),
                        "trace_id": None,
                    },
                )
