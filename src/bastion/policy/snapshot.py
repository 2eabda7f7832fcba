"""The immutable, versioned configuration snapshot (DESIGN section 8).

A :class:`Snapshot` is built once from a validated TOML file by
``policy/load.py`` and never changes afterwards; a reload builds a new one.
Every object here is frozen and checked in its constructor, so a snapshot
that exists is a snapshot that is valid. This module never reads files.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from bastion.auth.oauth import OAuthSettings
from bastion.errors import ConfigError
from bastion.ids import AgentId
from bastion.pinning.modes import PinChanged, PinMode
from bastion.policy.grants import Grant
from bastion.workers.attachment import NamespaceRequirements

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "MIN_MAX_RESPONSE_BYTES",
    "TOOL_NAME_RULE",
    "AgentSpec",
    "AuthSettings",
    "GatewaySettings",
    "ProcessScope",
    "ServerSpec",
    "Snapshot",
    "UpstreamKind",
]

# The strictest rule that common clients apply to tool names.
TOOL_NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NAMESPACE_RULE = re.compile(r"^[a-zA-Z0-9-]{1,32}$|^[a-zA-Z0-9_-]{1,32}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class UpstreamKind(enum.StrEnum):
    HTTP = "http"
    STDIO = "stdio"


class ProcessScope(enum.StrEnum):
    """Who a stdio server's process belongs to (issue 22): never two principals unless ``SHARED``."""

    # One process per client transport session; a sessionless request's is its agent session's.
    TRANSPORT_SESSION = "transport_session"
    # One process per agent session (or per agent, for a token without one), in both eras.
    AGENT_SESSION = "agent_session"
    # One process for every client: only for a server the operator knows holds no client state.
    SHARED = "shared"


def _frozen_map(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


# Comments more often than this would be a stream of their own; rarer ones outlast common timeouts.
_MIN_SSE_KEEPALIVE_S = 0.1
_MAX_SSE_KEEPALIVE_S = 300.0


@dataclass(frozen=True)
class GatewaySettings:
    """Front-door settings. Defaults are the protective ones."""

    tool_separator: str = "__"
    max_body_bytes: int = 1_048_576
    # DNS-rebinding protection (transport/rebinding.py). Empty means the safe default: on a
    # loopback address, the loopback names and origins with that port; elsewhere nothing.
    # Requests with no Origin (non-browser clients) are allowed; a Host is always required.
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    transport_session_idle_s: float = 1800.0
    upstream_timeout_s: float = 60.0
    max_transport_sessions: int = 100_000
    # Each agent's share, so that one agent cannot lock every other agent out (issue #12).
    max_transport_sessions_per_agent: int = 10_000
    # Session-era SSE resumption (session/replay.py): per stream, events and bytes kept for
    # Last-Event-ID; per session, response streams kept (the oldest finished ones go first).
    sse_replay_events: int = 128
    sse_replay_bytes: int = 65_536
    sse_replay_streams: int = 8
    # A POST answer on SSE that has not come after this long gets a comment line, and another
    # each time as long again, so a slow start never trips a client's read timeout (issue 22).
    sse_keepalive_s: float = 5.0
    # Pre-authentication bounds on the HTTP front door (transport/limits.py, issue #12).
    max_header_bytes: int = 16_384
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    # Connections from one address not yet authenticated (issue #22; ``max_connections_per_address``
    # is read as this, its former name); after authentication the caps are the agent's.
    max_unauthenticated_connections_per_address: int = 64
    # Requests one agent may have in progress at one replica (streams included): issue #22.
    max_requests_per_agent: int = 1024
    # Telemetry (issue #25): the agent label of the call metrics (0: none; N: the first N agents
    # seen by name, every later one `other`), and the access line per governed call.
    metrics_agents: int = 0
    access_log: bool = True
    # Owned stdio processes (issue 22): at most this many at once over every server, and at
    # most this many starting (launch and handshake) at once; sized for a 2-core machine.
    max_stdio_processes: int = 64
    stdio_spawn_concurrency: int = 4

    def __post_init__(self) -> None:
        if self.sse_replay_events < 1 or self.sse_replay_streams < 1 or self.sse_replay_bytes < 1024:
            raise ConfigError(
                "gateway.sse_replay_events and sse_replay_streams must be at least 1, "
                "sse_replay_bytes at least 1024"
            )
        if not _MIN_SSE_KEEPALIVE_S <= self.sse_keepalive_s <= _MAX_SSE_KEEPALIVE_S:
            raise ConfigError(
                f"gateway.sse_keepalive_s must be between {_MIN_SSE_KEEPALIVE_S:g} and "
                f"{_MAX_SSE_KEEPALIVE_S:g} (seconds)"
            )
        if not self.tool_separator or not TOOL_NAME_RULE.match(self.tool_separator):
            raise ConfigError("gateway.tool_separator must match ^[a-zA-Z0-9_-]{1,64}$")
        if self.max_body_bytes < 1024:
            raise ConfigError("gateway.max_body_bytes must be at least 1024")
        for key in (
            "transport_session_idle_s",
            "upstream_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
        ):
            if not getattr(self, key) > 0:
                raise ConfigError(f"gateway.{key} must be positive")
        if self.max_transport_sessions < 1:
            raise ConfigError("gateway.max_transport_sessions must be at least 1")
        if not 0 <= self.metrics_agents <= 1000:
            raise ConfigError("gateway.metrics_agents must be between 0 and 1000")
        if self.max_transport_sessions_per_agent < 1:
            raise ConfigError("gateway.max_transport_sessions_per_agent must be at least 1")
        for key, least in (
            ("max_header_bytes", 1024),
            ("max_headers", 8),
            ("max_unauthenticated_connections_per_address", 1),
            ("max_requests_per_agent", 1),
            ("max_stdio_processes", 1),
            ("stdio_spawn_concurrency", 1),
        ):
            if getattr(self, key) < least:
                raise ConfigError(f"gateway.{key} must be at least {least}")


#: An upstream message past this many bytes ends its call (``servers.NAME.max_response_bytes``).
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MIN_MAX_RESPONSE_BYTES = 1024


@dataclass(frozen=True)
class ServerSpec:
    """One upstream MCP server: Streamable HTTP (``url``) or a stdio process (``command``)."""

    name: str
    namespace: str
    kind: UpstreamKind
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: _frozen_map(None))
    # http only: "auto" negotiates (server/discover, else initialize); "session" or
    # "sessionless" pins the era for upstreams that answer both.
    era: str = "auto"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: _frozen_map(None))
    cwd: str | None = None
    timeout_s: float | None = None
    # Transparent mode (issue 9 point 3): tools appear under their own names, no namespace
    # prefix; the namespace still names the server for grants and attachment.
    transparent: bool = False
    # Issue 9: reads, gets and completions of this server keep their parameters and results in the
    # audit entry, not only their digests (an operator's opt-in: contents are otherwise never stored).
    audit_contents: bool = False
    # Issue #13 hardening: the largest upstream message read (a JSON body, an SSE event's data, a
    # stdio line); past it reading stops and that connection is dropped (UpstreamResponseTooLarge).
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    # stdio only (issue 22): who a process belongs to, how many of this server's run at once,
    # and how long an owned process may sit with no call before it is stopped.
    scope: ProcessScope = ProcessScope.TRANSPORT_SESSION
    max_processes: int = 32
    process_idle_s: float = 300.0
    # Issue 27: how this server's definitions are pinned, and what a changed one does (pinning/).
    pinning: PinMode = PinMode.TOFU
    pin_changed: PinChanged = PinChanged.WITHHOLD
    pin_lock_file: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _frozen_map(self.headers))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "args", tuple(self.args))
        if not _NAMESPACE_RULE.match(self.namespace):
            raise ConfigError(f"servers.{self.name}.namespace must match ^[a-zA-Z0-9_-]{{1,32}}$")
        if self.kind is UpstreamKind.HTTP and not self.url:
            raise ConfigError(f"servers.{self.name}: an http server needs url")
        if self.kind is UpstreamKind.STDIO and not self.command:
            raise ConfigError(f"servers.{self.name}: a stdio server needs command")
        if self.era not in ("auto", "session", "sessionless"):
            raise ConfigError(f"servers.{self.name}.era must be auto, session or sessionless")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"servers.{self.name}.timeout_s must be positive")
        if self.max_response_bytes < MIN_MAX_RESPONSE_BYTES:
            raise ConfigError(
                f"servers.{self.name}.max_response_bytes must be at least {MIN_MAX_RESPONSE_BYTES}"
            )
        if self.max_processes < 1:
            raise ConfigError(f"servers.{self.name}.max_processes must be at least 1")
        if not self.process_idle_s > 0:
            raise ConfigError(f"servers.{self.name}.process_idle_s must be positive")


@dataclass(frozen=True)
class AgentSpec:
    """An agent allowed to connect with a static bearer token, known only by its SHA-256.

    ``anonymous`` instead names the agent that a request with no ``Authorization`` header is,
    for clients that cannot send one (the conformance suite, a local inspector). It has no
    token; ``bastion serve`` refuses it on a non-loopback bind (``auth/anonymous.py``), and it
    is audited and granted like any other agent.
    """

    name: AgentId
    token_sha256: str | None = None
    anonymous: bool = False

    def __post_init__(self) -> None:
        if self.anonymous:
            if self.token_sha256 is not None:
                raise ConfigError(f"agents.{self.name}: an anonymous agent has no token_sha256")
            return
        if self.token_sha256 is None or not _SHA256_HEX.match(self.token_sha256):
            raise ConfigError(f"agents.{self.name}.token_sha256 must be 64 lowercase hex characters")


@dataclass(frozen=True)
class AuthSettings:
    """How requests are authenticated beyond static agents: admin and auditor credentials, OAuth.

    ``admin_token_sha256`` absent means the admin API is disabled (fail closed).
    ``resource_url`` is this gateway's MCP URL: the OAuth audience, and the
    ``resource`` of its protected-resource metadata.
    """

    resource_url: str | None = None
    admin_token_sha256: str | None = None
    auditor_token_sha256: tuple[str, ...] = ()
    oauth: OAuthSettings | None = None
    # Mutual TLS behind a TLS-terminating proxy: the verified client certificate's SHA-256
    # arrives in this header, believed only from these proxy addresses.
    mtls_fingerprint_header: str | None = None
    mtls_trusted_proxies: tuple[str, ...] = ()
    # Issue 27: approver name -> the SHA-256 of that approver's own token (policy/approval_rules.py).
    approvers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "approvers", MappingProxyType(dict(self.approvers)))
        object.__setattr__(self, "auditor_token_sha256", tuple(self.auditor_token_sha256))
        object.__setattr__(self, "mtls_trusted_proxies", tuple(self.mtls_trusted_proxies))
        if self.mtls_fingerprint_header is not None and not self.mtls_trusted_proxies:
            raise ConfigError("auth.mtls_trusted_proxies must name the proxies allowed to send the header")
        named = [("auth.admin_token_sha256", self.admin_token_sha256)]
        named += [(f"auth.auditor_token_sha256[{i}]", d) for i, d in enumerate(self.auditor_token_sha256)]
        for key, digest in named:
            if digest is not None and not _SHA256_HEX.match(digest):
                raise ConfigError(f"{key} must be 64 lowercase hex characters")
        if self.oauth is not None and not self.resource_url:
            raise ConfigError("auth.resource_url is required when auth.oauth is configured")


@dataclass(frozen=True)
class Snapshot:
    """One validated configuration, identified by ``version`` (a digest of its source).

    ``grants`` empty means "no grants declared": every authenticated agent may
    call every tool (``policy/decide.py``). Once one grant exists, calls are
    denied unless a grant covers them.
    """

    version: str
    gateway: GatewaySettings
    servers: Mapping[str, ServerSpec]
    agents: tuple[AgentSpec, ...]
    source: Path | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)
    # Namespaces an agent or team requires attached before a mutating call (DESIGN section 6).
    requirements: NamespaceRequirements = field(default_factory=NamespaceRequirements)
    grants: tuple[Grant, ...] = ()
    # ``[store] url``: read once at start (a reload never moves the store); may hold a password.
    store_url: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", MappingProxyType(dict(self.servers)))
        object.__setattr__(self, "agents", tuple(self.agents))
        object.__setattr__(self, "grants", tuple(self.grants))
        sep = self.gateway.tool_separator
        seen: dict[str, str] = {}
        for spec in self.servers.values():
            if sep in spec.namespace:
                raise ConfigError(
                    f"servers.{spec.name}.namespace {spec.namespace!r} contains the tool separator {sep!r}"
                )
            if spec.namespace in seen:
                raise ConfigError(
                    f"servers.{spec.name}.namespace {spec.namespace!r} "
                    f"is already used by servers.{seen[spec.namespace]}"
                )
            seen[spec.namespace] = spec.name
        transparent = [spec.name for spec in self.servers.values() if spec.transparent]
        if len(transparent) > 1:
            raise ConfigError(
                f"servers: only one server may be transparent (unprefixed names would collide): "
                f"{', '.join(sorted(transparent))}"
            )
        if len([a for a in self.agents if a.anonymous]) > 1:
            raise ConfigError("agents: at most one agent may be anonymous")
        self.credential_roles()  # two agents sharing one token included, with both key paths
        self._check_grants()

    def credential_roles(self) -> dict[str, str]:
        """Each configured credential digest, mapped to the key path of the one role it holds.

        Raises:
            ConfigError: one digest holds two roles (an agent token that is also the admin
                or an auditor token, the admin token also an auditor's): that agent would
                administer the gateway or read every agent's evidence (issue #12).
        """
        roles: dict[str, str] = {}
        named = [(f"agents.{a.name}.token_sha256", a.token_sha256) for a in self.agents if a.token_sha256]
        if self.auth.admin_token_sha256 is not None:
            named.append(("auth.admin_token_sha256", self.auth.admin_token_sha256))
        named += [
            (f"auth.auditor_token_sha256[{i}]", d) for i, d in enumerate(self.auth.auditor_token_sha256)
        ]
        named += [(f"auth.approvers.{n}.token_sha256", d) for n, d in self.auth.approvers.items()]
        for where, digest in named:
            held = roles.get(digest)
            if held is not None and not (
                held.startswith("auth.auditor") and where.startswith("auth.auditor")
            ):
                raise ConfigError(f"{where}: the same credential as {held}; one credential, one role")
            roles.setdefault(digest, where)
        return roles

    def _check_grants(self) -> None:
        namespaces = {spec.namespace for spec in self.servers.values()}
        names: set[str] = set()
        for grant in self.grants:
            if grant.name in names:
                raise ConfigError(f"grants: two grants are named {grant.name!r}")
            names.add(grant.name)
            for server in sorted(grant.servers):
                if server not in self.servers:
                    raise ConfigError(f"grant {grant.name}: unknown server {server!r}")
            for namespace in sorted(grant.namespaces):
                if namespace not in namespaces:
                    raise ConfigError(f"grant {grant.name}: unknown namespace {namespace!r}")
            self._check_grant_tool_names(grant)
            for position, approver in enumerate(grant.approval.approvers if grant.approval else ()):
                if approver not in self.auth.approvers:
                    declared = ", ".join(sorted(self.auth.approvers)) or "none"
                    raise ConfigError(
                        f"grant {grant.name}: approval.approvers[{position}] {approver!r} is not declared"
                        f" in [auth.approvers] (declared: {declared})"
                    )

    def _check_grant_tool_names(self, grant: Grant) -> None:
        """A grant names upstream tools; the exposed ``<namespace><sep><tool>`` would match nothing (#26)."""
        sep = self.gateway.tool_separator
        prefixed = {
            spec.namespace + sep
            for spec in self.servers.values()
            if not spec.transparent and (spec.name in grant.servers or spec.namespace in grant.namespaces)
        }
        for pattern in grant.tools:
            for prefix in sorted(prefixed):
                if pattern.startswith(prefix) and len(pattern) > len(prefix):
                    raise ConfigError(
                        f"grant {grant.name}: tools names {pattern!r}, the name clients see; a grant"
                        f" names the tool as its server spells it: {pattern.removeprefix(prefix)!r}"
                    )

    def server_for_namespace(self, namespace: str) -> ServerSpec | None:
        for spec in self.servers.values():
            if spec.namespace == namespace:
                return spec
        return None
