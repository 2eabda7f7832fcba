"""The one error tree of Bastion (STYLE "Errors", DESIGN section 9).

::

    BastionError
    ├─ ConfigError            a configuration file that cannot be used (never reaches the wire)
    ├─ RequestRejected        before dispatch: HTTP status + JSON-RPC error, id null or the request's id
    │  ├─ ParseError (-32700, 400)   InvalidRequest (-32600, 400)   BodyTooLarge (-32600, 413)
    │  ├─ MethodNotFound (-32601, 200)   InvalidParams (-32602, 200)
    │  ├─ OriginForbidden (403)   HostForbidden (421)   NotAcceptable (406)   UnsupportedMediaType (415)
    │  ├─ SessionIdMissing (400)   SessionNotFound (404)   LastEventIdUnknown (400)
    │  ├─ ProtocolVersionMismatch (400)   HeaderMismatch (-32020, 400)   DuplicateHeader (400)
    │  ├─ UnsupportedProtocolVersion (-32022, 400)
    │  ├─ MethodNotAllowed (405)   TooManySessions (503)   WorkerSuperseded (503)
    │  ├─ MissingClientCapability (-32021, 400: a method of an extension the request did not negotiate)
    │  ├─ AgentRequestLimit (429: one agent's requests in progress at its cap)
│  ├─ SessionStoreUnavailable (503)
    │  └─ Unauthenticated (401)   AgentSessionExpired (401)   AgentSessionRevoked (401)
    ├─ CallRefused            inside a call: HTTP 200 + JSON-RPC error in -32000…-32099
    │  ├─ UnknownTool   GrantDenied   InvalidCmcpEnvelope   ArgumentConstraintFailed   RateLimited
    │  ├─ UnknownResource   UnknownPrompt   (issue 9: what is hidden is answered as unknown)
│  ├─ InputRoundUnknown (a requestState this replica does not hold for this agent)
    │  ├─ InputRoundMismatch (-32037: the caller's requestState, presented with another call)
    │  ├─ AttachmentUnproven: NamespaceNotConnected, NamespaceNotAttached, AttachmentContradictory
    │  ├─ ExecutionCollision   ExecutionInFlight   ExecutionReplay(earlier_outcome)   ExecutionIdRequired
    │  ├─ TaskRequired (-32080: the upstream insists on a task, which is not relayed; issue 24)
    │  │  └─ TaskExtensionRequired (-32021: the same, where the server speaks the tasks extension)
    │  └─ ApprovalRefused (issue 27): ApprovalDenied (-32090)   ApprovalTimeout (-32091)
    │     ApprovalCancelled (-32092)   ApprovalMismatch (-32093: another binding's approval)
    │  └─ DefinitionChanged (-32085: the upstream changed this definition; withheld until approved, #27)
    ├─ UpstreamError          UpstreamUnavailable   UpstreamTimeout   UpstreamProtocolError   OutcomeUnknown
    │  └─ UpstreamResponseTooLarge (an UpstreamProtocolError: a message over servers.NAME.max_response_bytes)
    │  └─ UpstreamCapacity (no process for this owner: a process bound is reached; nothing was sent)
    └─ StoreError             StaleEpoch   NotDurable   Conflict   GenerationHeld (start refused)
                              StoreMissing   StoreForeign (start refused: issue #23)

Checks raise; ``transport/`` renders. Every concrete class has a stable
``reason`` (a member of :class:`Reason`), a JSON-RPC code and an HTTP status,
fixed once and never renumbered. Messages never carry secrets: no token, no
raw argument values.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

__all__ = [
    "AgentRequestLimit",
    "AgentSessionExpired",
    "AgentSessionRevoked",
    "ApprovalCancelled",
    "ApprovalDenied",
    "ApprovalMismatch",
    "ApprovalRefused",
    "ApprovalTimeout",
    "ArgumentConstraintFailed",
    "AttachmentContradictory",
    "AttachmentUnproven",
    "BastionError",
    "BodyTooLarge",
    "CallRefused",
    "ConfigError",
    "Conflict",
    "DefinitionChanged",
    "DuplicateHeader",
    "ExecutionCollision",
    "ExecutionIdRequired",
    "ExecutionInFlight",
    "ExecutionReplay",
    "GenerationHeld",
    "GrantDenied",
    "HeaderMismatch",
    "HostForbidden",
    "InputRoundMismatch",
    "InputRoundUnknown",
    "InvalidCmcpEnvelope",
    "InvalidParams",
    "InvalidRequest",
    "LastEventIdUnknown",
    "MethodNotAllowed",
    "MethodNotFound",
    "MissingClientCapability",
    "NamespaceNotAttached",
    "NamespaceNotConnected",
    "NotAcceptable",
    "NotDurable",
    "OriginForbidden",
    "OutcomeUnknown",
    "ParseError",
    "ProtocolVersionMismatch",
    "RateLimited",
    "Reason",
    "RequestRejected",
    "SessionIdMissing",
    "SessionNotFound",
    "SessionStoreUnavailable",
    "StaleEpoch",
    "StoreError",
    "StoreForeign",
    "StoreMissing",
    "TaskExtensionRequired",
    "TaskRequired",
    "TooManySessions",
    "Unauthenticated",
    "UnknownPrompt",
    "UnknownResource",
    "UnknownTool",
    "UnsupportedMediaType",
    "UnsupportedProtocolVersion",
    "UpstreamCapacity",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamResponseTooLarge",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "WorkerSuperseded",
]


class Reason(enum.StrEnum):
    """Stable, machine-readable reasons shared by the wire, the CLI and the audit."""

    CONFIG_INVALID = "config_invalid"
    PARSE_ERROR = "parse_error"
    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    METHOD_NOT_FOUND = "method_not_found"
    INVALID_PARAMS = "invalid_params"
    ORIGIN_FORBIDDEN = "origin_forbidden"
    HOST_FORBIDDEN = "host_forbidden"
    NOT_ACCEPTABLE = "not_acceptable"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    SESSION_ID_MISSING = "session_id_missing"
    SESSION_NOT_FOUND = "session_not_found"
    LAST_EVENT_ID_UNKNOWN = "last_event_id_unknown"
    PROTOCOL_VERSION_MISMATCH = "protocol_version_mismatch"
    UNSUPPORTED_PROTOCOL_VERSION = "unsupported_protocol_version"
    HEADER_MISMATCH = "header_mismatch"
    MISSING_CLIENT_CAPABILITY = "missing_client_capability"
    DUPLICATE_HEADER = "duplicate_header"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TOO_MANY_SESSIONS = "too_many_sessions"
    AGENT_REQUEST_LIMIT = "agent_request_limit"
    WORKER_SUPERSEDED = "worker_superseded"
    SESSION_STORE_UNAVAILABLE = "session_store_unavailable"
    CREDENTIAL_INVALID = "credential_invalid"
    AGENT_SESSION_EXPIRED = "agent_session_expired"
    AGENT_SESSION_REVOKED = "agent_session_revoked"
    UNKNOWN_TOOL = "unknown_tool"
    UNKNOWN_RESOURCE = "unknown_resource"
    UNKNOWN_PROMPT = "unknown_prompt"
    GRANT_DENIED = "grant_denied"
    CMCP_INVALID = "cmcp_invalid"
    ARGUMENT_CONSTRAINT_FAILED = "argument_constraint_failed"
    RATE_LIMITED = "rate_limited"
    REQUIRED_NAMESPACE_NOT_CONNECTED = "required_namespace_not_connected"
    CONNECTED_NAMESPACE_MISSING = "connected_namespace_missing"
    ATTACHMENT_CONTRADICTORY = "attachment_contradictory"
    EXECUTION_COLLISION = "execution_collision"
    EXECUTION_IN_FLIGHT = "execution_in_flight"
    EXECUTION_REPLAY = "execution_replay"
    EXECUTION_ID_REQUIRED = "execution_id_required"
    TASK_REQUIRED = "task_required"
    DEFINITION_CHANGED = "definition_changed"
    INPUT_ROUND_UNKNOWN = "input_round_unknown"
    INPUT_ROUND_MISMATCH = "input_round_mismatch"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_PROTOCOL_ERROR = "upstream_protocol_error"
    OUTCOME_UNKNOWN = "outcome_unknown"
    UPSTREAM_RESPONSE_TOO_LARGE = "upstream_response_too_large"
    UPSTREAM_CAPACITY = "upstream_capacity"
    STORE_ERROR = "store_error"
    STALE_EPOCH = "stale_epoch"
    NOT_DURABLE = "not_durable"
    CONFLICT = "conflict"
    GENERATION_HELD = "generation_held"
    STORE_MISSING = "store_missing"
    STORE_FOREIGN = "store_foreign"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"
    APPROVAL_CANCELLED = "approval_cancelled"
    APPROVAL_MISMATCH = "approval_mismatch"


class BastionError(Exception):
    """Base of every error Bastion raises on purpose.

    ``data`` holds extra machine-readable fields for the JSON-RPC ``error.data``
    object; it must never hold secrets.
    """

    reason: ClassVar[Reason]
    jsonrpc_code: ClassVar[int] = -32603
    http_status: ClassVar[int] = 500
    default_message: ClassVar[str] = "internal error"

    def __init__(self, message: str | None = None, *, cause: str | None = None, **data: Any) -> None:
        self.message = message or self.default_message
        self.data: dict[str, Any] = data
        # The real cause, for the audit and logs only: never rendered on the wire,
        # so that answers that must look alike (unknown vs foreign session) do.
        self.cause = cause
        super().__init__(self.message)

    def error_data(self) -> dict[str, Any]:
        """The JSON-RPC ``error.data`` object: the stable reason plus extra fields."""
        return {"reason": self.reason.value, **self.data}


class ConfigError(BastionError):
    """A configuration file that cannot be used; the message names file, key path and defect."""

    reason = Reason.CONFIG_INVALID
    default_message = "invalid configuration"


# ---------------------------------------------------------------- before dispatch


class RequestRejected(BastionError):
    """Refused before dispatch: rendered with its HTTP status and a JSON-RPC error."""

    http_status = 400
    jsonrpc_code = -32600


class ParseError(RequestRejected):
    reason = Reason.PARSE_ERROR
    jsonrpc_code = -32700
    default_message = "Parse error: body is not valid JSON"


class InvalidRequest(RequestRejected):
    reason = Reason.INVALID_REQUEST
    default_message = "Invalid Request: not a JSON-RPC 2.0 message"


class BodyTooLarge(RequestRejected):
    reason = Reason.BODY_TOO_LARGE
    http_status = 413
    default_message = "Request body too large"


class MethodNotFound(RequestRejected):
    reason = Reason.METHOD_NOT_FOUND
    jsonrpc_code = -32601
    http_status = 200
    default_message = "Method not found"


class InvalidParams(RequestRejected):
    reason = Reason.INVALID_PARAMS
    jsonrpc_code = -32602
    http_status = 200
    default_message = "Invalid params"


class OriginForbidden(RequestRejected):
    reason = Reason.ORIGIN_FORBIDDEN
    http_status = 403
    default_message = "Origin not allowed"


class HostForbidden(RequestRejected):
    """A ``Host`` header this gateway does not answer to (DNS rebinding); 421 as the MCP SDK answers."""

    reason = Reason.HOST_FORBIDDEN
    http_status = 421
    default_message = "Misdirected Request: Host not allowed"


class NotAcceptable(RequestRejected):
    reason = Reason.NOT_ACCEPTABLE
    http_status = 406
    default_message = "Not Acceptable: Accept must include application/json and text/event-stream"


class UnsupportedMediaType(RequestRejected):
    reason = Reason.UNSUPPORTED_MEDIA_TYPE
    http_status = 415
    default_message = "Unsupported Media Type: Content-Type must be application/json"


class SessionIdMissing(RequestRejected):
    reason = Reason.SESSION_ID_MISSING
    default_message = "Bad Request: Mcp-Session-Id header is required"


class SessionNotFound(RequestRejected):
    """Unknown, expired, terminated or foreign: one answer, the audit keeps the cause."""

    reason = Reason.SESSION_NOT_FOUND
    http_status = 404
    jsonrpc_code = -32001
    default_message = "Session not found"


class LastEventIdUnknown(RequestRejected):
    """Unknown, malformed, another session's, or no longer held: one answer, nothing replayed."""

    reason = Reason.LAST_EVENT_ID_UNKNOWN
    default_message = "Bad Request: Last-Event-ID names no stream this session can replay"


class ProtocolVersionMismatch(RequestRejected):
    reason = Reason.PROTOCOL_VERSION_MISMATCH
    default_message = "MCP-Protocol-Version does not match the negotiated version"


class UnsupportedProtocolVersion(RequestRejected):
    reason = Reason.UNSUPPORTED_PROTOCOL_VERSION
    jsonrpc_code = -32022
    default_message = "Unsupported protocol version"


class HeaderMismatch(RequestRejected):
    reason = Reason.HEADER_MISMATCH
    jsonrpc_code = -32020
    default_message = "Header does not match the request body"


class MissingClientCapability(RequestRejected):
    """A method of an extension the request did not negotiate (SEP-2575: ``data.requiredCapabilities``)."""

    reason = Reason.MISSING_CLIENT_CAPABILITY
    jsonrpc_code = -32021
    default_message = "Missing required client capability"


class DuplicateHeader(RequestRejected):
    """A header that decides something (Host, Origin, Mcp-Method, Mcp-Name, ...) sent twice (#22)."""

    reason = Reason.DUPLICATE_HEADER
    default_message = "Bad Request: a header that must appear once appears more than once"


class TooManySessions(RequestRejected):
    reason = Reason.TOO_MANY_SESSIONS
    http_status = 503
    default_message = "Service Unavailable: too many transport sessions"


class AgentRequestLimit(RequestRejected):
    """One agent has ``gateway.max_requests_per_agent`` requests in progress here (issue #22)."""

    reason = Reason.AGENT_REQUEST_LIMIT
    http_status = 429
    default_message = "Too Many Requests: this agent has too many requests in progress"


class WorkerSuperseded(RequestRejected):
    """This gateway worker lost its generation to a newer epoch: it answers nothing more."""

    reason = Reason.WORKER_SUPERSEDED
    http_status = 503
    default_message = "Service Unavailable: this gateway worker was superseded"


class SessionStoreUnavailable(RequestRejected):
    """A transport session could not be recorded or read in the store: nothing was opened or served (#10)."""

    reason = Reason.SESSION_STORE_UNAVAILABLE
    http_status = 503
    default_message = "Service Unavailable: the transport session store cannot be reached"


class MethodNotAllowed(RequestRejected):
    reason = Reason.METHOD_NOT_ALLOWED
    http_status = 405
    default_message = "Method Not Allowed"


class Unauthenticated(RequestRejected):
    reason = Reason.CREDENTIAL_INVALID
    http_status = 401
    jsonrpc_code = -32002
    default_message = "Unauthorized: a valid bearer credential is required"


class AgentSessionExpired(RequestRejected):
    reason = Reason.AGENT_SESSION_EXPIRED
    http_status = 401
    jsonrpc_code = -32003
    default_message = "Unauthorized: agent session expired"


class AgentSessionRevoked(RequestRejected):
    reason = Reason.AGENT_SESSION_REVOKED
    http_status = 401
    jsonrpc_code = -32004
    default_message = "Unauthorized: agent session revoked"


# ---------------------------------------------------------------- inside a call


class CallRefused(BastionError):
    """Refused inside a call: HTTP 200 with a JSON-RPC error in -32000…-32099."""

    http_status = 200
    jsonrpc_code = -32010


class UnknownTool(CallRefused):
    reason = Reason.UNKNOWN_TOOL
    jsonrpc_code = -32602
    default_message = "Unknown tool"


class UnknownResource(CallRefused):
    """No visible upstream serves this URI (MCP's "Resource not found" code)."""

    reason = Reason.UNKNOWN_RESOURCE
    jsonrpc_code = -32002
    default_message = "Resource not found"


class UnknownPrompt(CallRefused):
    reason = Reason.UNKNOWN_PROMPT
    jsonrpc_code = -32602
    default_message = "Unknown prompt"


class GrantDenied(CallRefused):
    reason = Reason.GRANT_DENIED
    jsonrpc_code = -32030
    default_message = "Denied by policy"


class InvalidCmcpEnvelope(CallRefused):
    reason = Reason.CMCP_INVALID
    jsonrpc_code = -32031
    default_message = "Invalid params._cmcp envelope"


class ArgumentConstraintFailed(CallRefused):
    """A grant covers the tool, but the call's arguments break every covering grant's constraints."""

    reason = Reason.ARGUMENT_CONSTRAINT_FAILED
    jsonrpc_code = -32032
    default_message = "Arguments do not satisfy the grant's constraints"


class InputRoundUnknown(CallRefused):
    """A retry names a ``requestState`` this replica is not holding for this agent (issue #8).

    Unknown, expired, already used, issued at another replica, or another agent's: one answer.
    """

    reason = Reason.INPUT_ROUND_UNKNOWN
    jsonrpc_code = -32036
    default_message = "Unknown or expired requestState: call the tool again without it"


class InputRoundMismatch(CallRefused):
    """The caller's own ``requestState``, presented with another call than it was issued for (#22).

    Another tool, server, method or other arguments: the round continues only its own call,
    and the token is spent.
    """

    reason = Reason.INPUT_ROUND_MISMATCH
    jsonrpc_code = -32037
    default_message = "This requestState was issued for another call: call again without it"


class RateLimited(CallRefused):
    """A grant allows the call, but its rate limit for this agent and tool is spent."""

    reason = Reason.RATE_LIMITED
    jsonrpc_code = -32033
    default_message = "Rate limit exceeded"


class AttachmentUnproven(CallRefused):
    """A mutating call refused because a required namespace lacks attachment proof."""

    reason = Reason.ATTACHMENT_CONTRADICTORY
    jsonrpc_code = -32040


class NamespaceNotConnected(AttachmentUnproven):
    reason = Reason.REQUIRED_NAMESPACE_NOT_CONNECTED
    jsonrpc_code = -32041
    default_message = "Required namespace is not connected"


class NamespaceNotAttached(AttachmentUnproven):
    reason = Reason.CONNECTED_NAMESPACE_MISSING
    jsonrpc_code = -32042
    default_message = "Connected namespace is missing from this session's tool surface"


class AttachmentContradictory(AttachmentUnproven):
    reason = Reason.ATTACHMENT_CONTRADICTORY
    jsonrpc_code = -32043
    default_message = "Attachment evidence is contradictory"


class ExecutionCollision(CallRefused):
    reason = Reason.EXECUTION_COLLISION
    jsonrpc_code = -32050
    default_message = "execution_id already reserved with a different binding"


class ExecutionInFlight(CallRefused):
    reason = Reason.EXECUTION_IN_FLIGHT
    jsonrpc_code = -32051
    default_message = "execution_id is in flight"


class ExecutionReplay(CallRefused):
    reason = Reason.EXECUTION_REPLAY
    jsonrpc_code = -32052
    default_message = "execution_id already reached a terminal outcome"


class ExecutionIdRequired(CallRefused):
    reason = Reason.EXECUTION_ID_REQUIRED
    jsonrpc_code = -32053
    default_message = "This tool requires params._cmcp.execution_id"


class TaskRequired(CallRefused):
    """The upstream runs this tool only as a task, and this call cannot go as one (issue 24)."""

    reason = Reason.TASK_REQUIRED
    jsonrpc_code = -32080
    default_message = "This tool runs only as a task, and this call cannot be relayed as one"


class TaskExtensionRequired(TaskRequired):
    """A tool that runs only as a task, for a request that did not negotiate the tasks extension its
    server speaks: -32021 with ``data.requiredCapabilities``, the answer the server itself gives."""

    jsonrpc_code = -32021


class DefinitionChanged(CallRefused):
    """The upstream's definition differs from its pin: withheld until an operator approves it (issue 27)."""

    reason = Reason.DEFINITION_CHANGED
    jsonrpc_code = -32085
    default_message = (
        "This definition changed at the upstream and is withheld until an operator approves the change"
    )


# ---------------------------------------------------------------- upstream


class UpstreamError(BastionError):
    """The upstream failed; rendered as a JSON-RPC error inside the call (HTTP 200).

    ``may_have_acted`` says whether the request may have reached the upstream:
    admission releases an execution only when it is ``False``.
    """

    http_status = 200
    jsonrpc_code = -32060
    may_have_acted_default: ClassVar[bool] = True

    def __init__(
        self,
        message: str | None = None,
        *,
        may_have_acted: bool | None = None,
        cause: str | None = None,
        **data: Any,
    ) -> None:
        super().__init__(message, cause=cause, **data)
        self.may_have_acted = self.may_have_acted_default if may_have_acted is None else may_have_acted


class UpstreamUnavailable(UpstreamError):
    reason = Reason.UPSTREAM_UNAVAILABLE
    jsonrpc_code = -32060
    may_have_acted_default = False
    default_message = "Upstream unavailable"


class UpstreamTimeout(UpstreamError):
    reason = Reason.UPSTREAM_TIMEOUT
    jsonrpc_code = -32061
    default_message = "Upstream timed out"


class UpstreamProtocolError(UpstreamError):
    reason = Reason.UPSTREAM_PROTOCOL_ERROR
    jsonrpc_code = -32062
    default_message = "Upstream answered with an invalid message"


class UpstreamResponseTooLarge(UpstreamProtocolError):
    """An upstream message (a JSON body, an SSE event's data, a stdio line) passed the server's bound.

    Reading stopped at the bound and that connection (a stdio upstream: its process) was dropped;
    the request was sent, so the upstream may have acted.
    """

    reason = Reason.UPSTREAM_RESPONSE_TOO_LARGE
    jsonrpc_code = -32064
    default_message = "Upstream answered a message larger than the gateway accepts"


class UpstreamCapacity(UpstreamError):
    """No upstream process can be started for this owner: a bound on processes is reached (issue 22).

    Never answered by falling back to another owner's or a shared process; nothing was sent.
    ``data`` names the ``bound`` (``server`` or ``gateway``) and its ``limit``.
    """

    reason = Reason.UPSTREAM_CAPACITY
    jsonrpc_code = -32065
    may_have_acted_default = False
    default_message = "No upstream process is available for this client: a process bound is reached"


class OutcomeUnknown(UpstreamError):
    reason = Reason.OUTCOME_UNKNOWN
    jsonrpc_code = -32063
    default_message = "The upstream may have acted but no result came back"


# ---------------------------------------------------------------- store


class StoreError(BastionError):
    reason = Reason.STORE_ERROR
    http_status = 200
    jsonrpc_code = -32070
    default_message = "Storage error"


class StaleEpoch(StoreError):
    reason = Reason.STALE_EPOCH
    jsonrpc_code = -32071
    default_message = "Write refused: the writer's fencing epoch is stale"


class NotDurable(StoreError):
    reason = Reason.NOT_DURABLE
    jsonrpc_code = -32072
    default_message = "The state transition could not be made durable"


class Conflict(StoreError):
    reason = Reason.CONFLICT
    jsonrpc_code = -32073
    default_message = "Conflicting write"


class GenerationHeld(StoreError):
    """Start-up refused: the generation stayed held by a live worker past this worker's lease."""

    reason = Reason.GENERATION_HELD
    jsonrpc_code = -32074
    default_message = "The generation is held by a live worker"


class StoreMissing(StoreError):
    """Start-up refused: a used data directory lost its store file (deleted or emptied, issue #23)."""

    reason = Reason.STORE_MISSING
    jsonrpc_code = -32075
    default_message = "The store file of a used data directory is missing or empty"


class StoreForeign(StoreError):
    """Start-up refused: the store belongs to another data directory (another signing key, issue #23)."""

    reason = Reason.STORE_FOREIGN
    jsonrpc_code = -32076
    default_message = "The store belongs to another data directory"


# ---------------------------------------------------------------- step-up approval (issue 27)


class ApprovalRefused(CallRefused):
    """A call whose grant requires a named approver's yes did not get one; nothing was sent."""

    default_message = "This call was not approved"


class ApprovalDenied(ApprovalRefused):
    reason = Reason.APPROVAL_DENIED
    jsonrpc_code = -32090
    default_message = "An approver denied this call"


class ApprovalTimeout(ApprovalRefused):
    reason = Reason.APPROVAL_TIMEOUT
    jsonrpc_code = -32091
    default_message = "No approver decided this call in time"


class ApprovalCancelled(ApprovalRefused):
    """The waiting call ended (its client went away) before an approver decided."""

    reason = Reason.APPROVAL_CANCELLED
    jsonrpc_code = -32092
    default_message = "The call ended while it waited for approval"


class ApprovalMismatch(ApprovalRefused):
    """This execution id's approval request is for another binding: never reused for other arguments."""

    reason = Reason.APPROVAL_MISMATCH
    jsonrpc_code = -32093
    default_message = "This execution's approval was asked for other arguments"
