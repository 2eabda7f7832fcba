"""Read, validate and compile the TOML configuration file (DESIGN section 8).

This module owns the file format documented in ``docs/configuration.md``: it
turns one TOML file (or an already-parsed mapping, for the CLI's demo config)
into a frozen :class:`~bastion.policy.snapshot.Snapshot`, or raises
:class:`~bastion.errors.ConfigError` naming the file, the key path and the
defect. It refuses every unknown key, because a typo must never silently
weaken policy (DESIGN section 9). It must never print or embed in an error the
value of a setting or of an environment variable: values may be credentials.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from bastion.auth.oauth import ClaimRules, OAuthSettings
from bastion.errors import ConfigError
from bastion.ids import AgentId
from bastion.pinning.modes import PIN_KEYS, read_pinning
from bastion.policy.grants import Grant, Rate, Subject, SubjectKind, check_arguments_schema
from bastion.policy.snapshot import (
    MIN_MAX_RESPONSE_BYTES,
    AgentSpec,
    AuthSettings,
    GatewaySettings,
    ProcessScope,
    ServerSpec,
    Snapshot,
    UpstreamKind,
)
from bastion.store.dsn import is_postgres_url
from bastion.workers.attachment import NamespaceRequirement, NamespaceRequirements

__all__ = ["load_snapshot", "snapshot_from_mapping"]

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# RFC 9110 token: the characters a header field name may use.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[^=\x00]+$")
# One pass over the text: ``$$``, ``${NAME}``, or a ``$`` that is neither.
_DOLLAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

_TOP_KEYS = frozenset({"gateway", "servers", "agents", "grants", "auth", "requirements", "store"})
_STORE_KEYS = frozenset({"url"})
_REQUIREMENT_KEYS = frozenset({"agent", "team", "namespaces"})
_AUTH_KEYS = frozenset(
    {
        "resource_url",
        "admin_token_sha256",
        "auditor_token_sha256",
        "oauth",
        "mtls_fingerprint_header",
        "mtls_trusted_proxies",
    }
)
_OAUTH_KEYS = frozenset(
    {
        "issuer",
        "jwks_url",
        "audience",
        "algorithms",
        "leeway_s",
        "agent_claims",
        "agent_prefix",
        "human_claims",
        "team_claim",
        "scope_claims",
        "agent_session_claim",
    }
)
_GATEWAY_KEYS = frozenset(
    {
        "tool_separator",
        "max_body_bytes",
        "allowed_origins",
        "allowed_hosts",
        "transport_session_idle_s",
        "upstream_timeout_s",
        "max_transport_sessions",
        "max_transport_sessions_per_agent",
        "sse_replay_events",
        "sse_replay_bytes",
        "sse_replay_streams",
        "max_header_bytes",
        "max_headers",
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_s",
        "max_connections_per_address",
        "max_unauthenticated_connections_per_address",
        "max_requests_per_agent",
        "metrics_agents",
        "access_log",
        "max_stdio_processes",
        "stdio_spawn_concurrency",
    }
)
_HTTP_KEYS = frozenset({"url", "headers", "era"})
_STDIO_KEYS = frozenset({"command", "args", "env", "cwd", "scope", "max_processes", "process_idle_s"})
_SERVER_KEYS = (
    _HTTP_KEYS | _STDIO_KEYS | PIN_KEYS | {"namespace", "timeout_s", "transparent", "audit_contents"}
)
_SERVER_KEYS |= {"max_response_bytes"}
_AGENT_KEYS = frozenset({"token_sha256", "anonymous"})
_SUBJECT_KEYS = frozenset(kind.value for kind in SubjectKind)
_GRANT_KEYS = _SUBJECT_KEYS | {
    "name",
    "servers",
    "namespaces",
    "tools",
    "resources",
    "prompts",
    "arguments_schema",
    "require_execution_id",
    "rate",
}
_GRANT_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")

_T = TypeVar("_T")


def load_snapshot(path: Path, *, environ: Mapping[str, str] | None = None) -> Snapshot:
    """Read the TOML file at ``path`` and compile it into a :class:`Snapshot`.

    ``version`` is the first 16 hex characters of the SHA-256 of the file's
    bytes; ``${NAME}`` references are resolved from ``environ`` (default
    ``os.environ``). Raises :class:`ConfigError` for an unreadable file, a
    syntax error or any invalid content.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror or type(exc).__name__}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the file is not valid UTF-8 (byte offset {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    version = hashlib.sha256(raw).hexdigest()[:16]
    return snapshot_from_mapping(data, source=path, version=version, environ=environ)


def snapshot_from_mapping(
    data: Mapping[str, Any],
    *,
    source: Path | None,
    version: str,
    environ: Mapping[str, str] | None = None,
) -> Snapshot:
    """Validate an already-parsed configuration mapping and build a :class:`Snapshot`.

    Applies exactly the checks of :func:`load_snapshot`; ``source`` only names
    the file in error messages and on the snapshot. Raises :class:`ConfigError`.
    """
    ctx = _Context(source=source, environ=os.environ if environ is None else environ)
    top = ctx.table(data, "")
    ctx.refuse_unknown(top, _TOP_KEYS, "")
    gateway = _read_gateway(ctx, top.get("gateway"))
    servers = _read_servers(ctx, top.get("servers"))
    agents = _read_agents(ctx, top.get("agents"))
    grants = _read_grants(ctx, top.get("grants"), servers)
    auth = _read_auth(ctx, top.get("auth"))
    requirements = _read_requirements(ctx, top.get("requirements"), servers)
    store_url = _read_store(ctx, top.get("store"))
    return ctx.build(
        Snapshot,
        version=version,
        gateway=gateway,
        servers=servers,
        agents=agents,
        source=source,
        grants=grants,
        auth=auth,
        requirements=requirements,
        store_url=store_url,
    )


# ---------------------------------------------------------------- sections


def _read_requirements(ctx: _Context, value: Any, servers: Mapping[str, ServerSpec]) -> NamespaceRequirements:
    if value is None:
        return NamespaceRequirements()
    if not isinstance(value, list):
        raise ctx.error("requirements", "expected an array of tables ([[requirements]])")
    namespaces_known = {spec.namespace for spec in servers.values()}
    rules = []
    for index, item in enumerate(value):
        key = f"requirements[{index}]"
        table = ctx.table(item, key)
        ctx.refuse_unknown(table, _REQUIREMENT_KEYS, key)
        if ("agent" in table) == ("team" in table):
            raise ctx.error(key, "names exactly one of agent or team")
        if "namespaces" not in table:
            raise ctx.error(f"{key}.namespaces", "missing key")
        namespaces = ctx.string_list(table["namespaces"], f"{key}.namespaces")
        if not namespaces:
            raise ctx.error(f"{key}.namespaces", "must list at least one namespace")
        for position, namespace in enumerate(namespaces):
            if namespace not in namespaces_known:
                raise ctx.error(
                    f"{key}.namespaces[{position}]", f"no configured server has namespace {namespace!r}"
                )
        rules.append(
            ctx.build(
                NamespaceRequirement,
                namespaces=frozenset(namespaces),
                agent=ctx.string(table["agent"], f"{key}.agent") if "agent" in table else None,
                team=ctx.string(table["team"], f"{key}.team") if "team" in table else None,
            )
        )
    return NamespaceRequirements(tuple(rules))


def _read_auth(ctx: _Context, value: Any) -> AuthSettings:
    if value is None:
        return ctx.build(AuthSettings)
    table = ctx.table(value, "auth")
    ctx.refuse_unknown(table, _AUTH_KEYS, "auth")
    resource_url = ctx.string(table["resource_url"], "auth.resource_url") if "resource_url" in table else None
    if resource_url is not None:
        _check_url(ctx, resource_url, "auth.resource_url")
    admin = (
        ctx.string(table["admin_token_sha256"], "auth.admin_token_sha256")
        if "admin_token_sha256" in table
        else None
    )
    auditors = (
        ctx.string_list(table["auditor_token_sha256"], "auth.auditor_token_sha256")
        if "auditor_token_sha256" in table
        else []
    )
    oauth = None
    if "oauth" in table:
        oauth_table = ctx.table(table["oauth"], "auth.oauth")
        ctx.refuse_unknown(oauth_table, _OAUTH_KEYS, "auth.oauth")
        for required in ("issuer", "jwks_url"):
            if required not in oauth_table:
                raise ctx.error(f"auth.oauth.{required}", "missing key")
        claims: dict[str, Any] = {}
        for key in ("agent_claims", "human_claims", "scope_claims"):
            if key in oauth_table:
                claims[key] = tuple(ctx.string_list(oauth_table[key], f"auth.oauth.{key}"))
        for key in ("agent_prefix", "team_claim", "agent_session_claim"):
            if key in oauth_table:
                claims[key] = ctx.string(oauth_table[key], f"auth.oauth.{key}")
        settings: dict[str, Any] = {
            "issuer": ctx.string(oauth_table["issuer"], "auth.oauth.issuer"),
            "jwks_url": ctx.string(oauth_table["jwks_url"], "auth.oauth.jwks_url"),
            "audience": ctx.string(oauth_table["audience"], "auth.oauth.audience")
            if "audience" in oauth_table
            else (resource_url or ""),
            "claims": ctx.build(ClaimRules, **claims),
        }
        if "algorithms" in oauth_table:
            settings["algorithms"] = tuple(
                ctx.string_list(oauth_table["algorithms"], "auth.oauth.algorithms")
            )
        if "leeway_s" in oauth_table:
            settings["leeway_s"] = ctx.number(oauth_table["leeway_s"], "auth.oauth.leeway_s")
        oauth = ctx.build(OAuthSettings, **settings)
    mtls_header = (
        ctx.string(table["mtls_fingerprint_header"], "auth.mtls_fingerprint_header")
        if "mtls_fingerprint_header" in table
        else None
    )
    proxies = (
        ctx.string_list(table["mtls_trusted_proxies"], "auth.mtls_trusted_proxies")
        if "mtls_trusted_proxies" in table
        else []
    )
    return ctx.build(
        AuthSettings,
        resource_url=resource_url,
        admin_token_sha256=admin,
        auditor_token_sha256=tuple(auditors),
        oauth=oauth,
        mtls_fingerprint_header=mtls_header,
        mtls_trusted_proxies=tuple(proxies),
    )


def _read_store(ctx: _Context, value: Any) -> str | None:
    """``[store] url``: where the state lives (``${NAME}`` allowed, for a password); read at start only."""
    if value is None:
        return None
    table = ctx.table(value, "store")
    ctx.refuse_unknown(table, _STORE_KEYS, "store")
    if "url" not in table:
        return None
    url = ctx.interpolate(ctx.string(table["url"], "store.url"), "store.url")
    if not is_postgres_url(url):
        raise ctx.error("store.url", "expected a postgresql:// URL (omit [store] for the SQLite file)")
    return url


def _read_gateway(ctx: _Context, value: Any) -> GatewaySettings:
    if value is None:
        return ctx.build(GatewaySettings)
    table = ctx.table(value, "gateway")
    ctx.refuse_unknown(table, _GATEWAY_KEYS, "gateway")
    kwargs: dict[str, Any] = {}
    if "tool_separator" in table:
        kwargs["tool_separator"] = ctx.string(table["tool_separator"], "gateway.tool_separator")
    for key in (
        "max_body_bytes",
        "max_transport_sessions",
        "max_transport_sessions_per_agent",
        "sse_replay_events",
        "sse_replay_bytes",
        "sse_replay_streams",
        "max_header_bytes",
        "max_headers",
        "max_unauthenticated_connections_per_address",
        "max_requests_per_agent",
        "metrics_agents",
        "max_stdio_processes",
        "stdio_spawn_concurrency",
    ):
        if key in table:
            kwargs[key] = ctx.integer(table[key], f"gateway.{key}")
    if "access_log" in table:
        kwargs["access_log"] = ctx.boolean(table["access_log"], "gateway.access_log")
    if "max_connections_per_address" in table:
        # Its former name (issue #22): it only ever bounded what a peer holds before a credential.
        if "max_unauthenticated_connections_per_address" in table:
            raise ctx.error(
                "gateway.max_connections_per_address",
                "is the former name of max_unauthenticated_connections_per_address: give one",
            )
        kwargs["max_unauthenticated_connections_per_address"] = ctx.integer(
            table["max_connections_per_address"], "gateway.max_connections_per_address"
        )
    for key in (
        "transport_session_idle_s",
        "upstream_timeout_s",
        "header_timeout_s",
        "body_timeout_s",
        "keep_alive_s",
    ):
        if key in table:
            kwargs[key] = ctx.number(table[key], f"gateway.{key}")
    if "allowed_origins" in table:
        origins = ctx.string_list(table["allowed_origins"], "gateway.allowed_origins")
        for index, origin in enumerate(origins):
            _check_origin(ctx, origin, f"gateway.allowed_origins[{index}]")
        kwargs["allowed_origins"] = tuple(origins)
    if "allowed_hosts" in table:
        hosts = ctx.string_list(table["allowed_hosts"], "gateway.allowed_hosts")
        for index, host in enumerate(hosts):
            _check_host(ctx, host, f"gateway.allowed_hosts[{index}]")
        kwargs["allowed_hosts"] = tuple(hosts)
    return ctx.build(GatewaySettings, **kwargs)


def _read_servers(ctx: _Context, value: Any) -> dict[str, ServerSpec]:
    if value is None:
        raise ctx.error("servers", "missing: at least one [servers.NAME] table is required")
    table = ctx.table(value, "servers")
    if not table:
        raise ctx.error("servers", "empty: at least one [servers.NAME] table is required")
    servers: dict[str, ServerSpec] = {}
    for name, server_value in table.items():
        key = _key_path("servers", name)
        if not _SERVER_NAME.match(name):
            raise ctx.error(key, "a server name must match ^[a-zA-Z0-9_-]{1,32}$")
        servers[name] = _read_server(ctx, name, ctx.table(server_value, key), key)
    return servers


def _read_server(ctx: _Context, name: str, table: Mapping[str, Any], key: str) -> ServerSpec:
    ctx.refuse_unknown(table, _SERVER_KEYS, key)
    has_url, has_command = "url" in table, "command" in table
    if has_url and has_command:
        raise ctx.error(key, "has both url and command: a server is either http (url) or stdio (command)")
    if not has_url and not has_command:
        raise ctx.error(key, "missing key: a server needs url (http) or command (stdio)")
    namespace = ctx.string(table["namespace"], f"{key}.namespace") if "namespace" in table else name
    timeout_s = ctx.number(table["timeout_s"], f"{key}.timeout_s") if "timeout_s" in table else None
    transparent = table.get("transparent", False)
    if not isinstance(transparent, bool):
        raise ctx.error(f"{key}.transparent", "must be true or false")
    audit_contents = table.get("audit_contents", False)
    if not isinstance(audit_contents, bool):
        raise ctx.error(f"{key}.audit_contents", "must be true or false")
    bounds: dict[str, Any] = read_pinning(table, key, ctx.source, ctx.error)  # issue 27
    if "max_response_bytes" in table:
        limit = bounds["max_response_bytes"] = ctx.integer(
            table["max_response_bytes"], f"{key}.max_response_bytes"
        )
        if limit < MIN_MAX_RESPONSE_BYTES:
            raise ctx.error(f"{key}.max_response_bytes", f"must be at least {MIN_MAX_RESPONSE_BYTES}")
    if has_url:
        stray = [other for other in sorted(_STDIO_KEYS) if other in table]
        if stray:
            raise ctx.error(f"{key}.{stray[0]}", "only a stdio server (command) takes this key")
        url = ctx.string(table["url"], f"{key}.url")
        _check_url(ctx, url, f"{key}.url")
        headers = _read_headers(ctx, table.get("headers"), f"{key}.headers")
        era = ctx.string(table["era"], f"{key}.era") if "era" in table else "auto"
        if era not in ("auto", "session", "sessionless"):
            raise ctx.error(f"{key}.era", "must be one of auto, session, sessionless")
        return ctx.build(
            ServerSpec,
            name=name,
            namespace=namespace,
            kind=UpstreamKind.HTTP,
            url=url,
            headers=headers,
            era=era,
            timeout_s=timeout_s,
            transparent=transparent,
            audit_contents=audit_contents,
            **bounds,
        )
    stray = [other for other in sorted(_HTTP_KEYS) if other in table]
    if stray:
        raise ctx.error(f"{key}.{stray[0]}", "only an http server (url) takes this key")
    command = ctx.string(table["command"], f"{key}.command")
    if not command:
        raise ctx.error(f"{key}.command", "must not be empty")
    args = ctx.string_list(table["args"], f"{key}.args") if "args" in table else []
    env = _read_env(ctx, table.get("env"), f"{key}.env")
    cwd = ctx.string(table["cwd"], f"{key}.cwd") if "cwd" in table else None
    bounds.update(_read_process_scope(ctx, table, key))
    return ctx.build(
        ServerSpec,
        name=name,
        namespace=namespace,
        kind=UpstreamKind.STDIO,
        command=command,
        args=tuple(args),
        env=env,
        cwd=cwd,
        timeout_s=timeout_s,
        transparent=transparent,
        audit_contents=audit_contents,
        **bounds,
    )


def _read_process_scope(ctx: _Context, table: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A stdio server's ``scope``, ``max_processes`` and ``process_idle_s`` (issue 22)."""
    found: dict[str, Any] = {}
    if "scope" in table:
        scope = ctx.string(table["scope"], f"{key}.scope")
        choices = ", ".join(repr(s.value) for s in ProcessScope)
        if scope not in {s.value for s in ProcessScope}:
            raise ctx.error(
                f"{key}.scope",
                f"must be one of {choices}: who a process of this server belongs to "
                '("shared" only for a server that holds no client state)',
            )
        found["scope"] = ProcessScope(scope)
    if "max_processes" in table:
        found["max_processes"] = ctx.integer(table["max_processes"], f"{key}.max_processes")
        if found["max_processes"] < 1:
            raise ctx.error(f"{key}.max_processes", "must be at least 1")
    if "process_idle_s" in table:
        found["process_idle_s"] = ctx.number(table["process_idle_s"], f"{key}.process_idle_s")
        if not found["process_idle_s"] > 0:
            raise ctx.error(f"{key}.process_idle_s", "must be positive (seconds)")
    return found


def _read_headers(ctx: _Context, value: Any, key: str) -> dict[str, str]:
    if value is None:
        return {}
    table = ctx.table(value, key)
    headers: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, raw in table.items():
        item = _key_path(key, name)
        if not _HEADER_NAME.match(name):
            raise ctx.error(item, "is not a valid HTTP header name")
        if name.lower() in seen:
            raise ctx.error(item, f"repeats header {seen[name.lower()]!r} (header names ignore case)")
        seen[name.lower()] = name
        text = ctx.interpolate(ctx.string(raw, item), item)
        # A CR or LF would let one configured header smuggle another into the request.
        if _CONTROL.search(text):
            raise ctx.error(item, "the value contains a control character (after ${...} substitution)")
        headers[name] = text
    return headers


def _read_env(ctx: _Context, value: Any, key: str) -> dict[str, str]:
    if value is None:
        return {}
    table = ctx.table(value, key)
    env: dict[str, str] = {}
    for name, raw in table.items():
        item = _key_path(key, name)
        if not _ENV_NAME.match(name):
            raise ctx.error(item, "an environment variable name must be non-empty, without '=' or NUL")
        text = ctx.interpolate(ctx.string(raw, item), item)
        if "\x00" in text:
            raise ctx.error(item, "the value contains NUL (after ${...} substitution)")
        env[name] = text
    return env


def _read_agents(ctx: _Context, value: Any) -> list[AgentSpec]:
    if value is None:
        return []
    table = ctx.table(value, "agents")
    agents: list[AgentSpec] = []
    for name, agent_value in table.items():
        key = _key_path("agents", name)
        agent = ctx.table(agent_value, key)
        ctx.refuse_unknown(agent, _AGENT_KEYS, key)
        anonymous = agent.get("anonymous", False)
        if not isinstance(anonymous, bool):
            raise ctx.error(f"{key}.anonymous", "must be true or false")
        if anonymous:
            if "token_sha256" in agent:
                raise ctx.error(f"{key}.token_sha256", "an anonymous agent has no token")
            agents.append(ctx.build(AgentSpec, name=AgentId(name), anonymous=True))
            continue
        if "token_sha256" not in agent:
            raise ctx.error(f"{key}.token_sha256", "missing key: the SHA-256 of the agent's bearer token")
        token_sha256 = ctx.string(agent["token_sha256"], f"{key}.token_sha256")
        agents.append(ctx.build(AgentSpec, name=AgentId(name), token_sha256=token_sha256))
    return agents


def _read_grants(ctx: _Context, value: Any, servers: Mapping[str, ServerSpec]) -> list[Grant]:
    # No ``grants`` key at all is the "no grants declared" mode (policy/decide.py); an empty
    # array is refused, so that "deny everything" and "no grants yet" cannot be confused.
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ctx.error("grants", f"expected an array of tables ([[grants]]), got {_type_name(value)}")
    if not value:
        raise ctx.error(
            "grants",
            "is empty: remove it (no grants declared: every agent may call every tool) or add grants",
        )
    namespaces = {spec.namespace for spec in servers.values()}
    grants: list[Grant] = []
    names: dict[str, str] = {}
    for index, grant_value in enumerate(value):
        key = f"grants[{index}]"
        grant = _read_grant(ctx, ctx.table(grant_value, key), key, servers, namespaces)
        if grant.name in names:
            raise ctx.error(f"{key}.name", f"repeats the name of {names[grant.name]}")
        names[grant.name] = key
        grants.append(grant)
    return grants


def _read_grant(
    ctx: _Context, table: Mapping[str, Any], key: str, servers: Mapping[str, ServerSpec], namespaces: set[str]
) -> Grant:
    ctx.refuse_unknown(table, _GRANT_KEYS, key)
    # (1) Subject: exactly one of agent, team, human, scope.
    kinds = [kind for kind in SubjectKind if kind.value in table]
    if len(kinds) != 1:
        found = ", ".join(kind.value for kind in kinds) or "none"
        raise ctx.error(
            key, f"a grant needs exactly one subject key: agent, team, human or scope (found: {found})"
        )
    kind = kinds[0]
    subject_name = ctx.string(table[kind.value], f"{key}.{kind.value}")
    if not subject_name or subject_name != subject_name.strip():
        raise ctx.error(f"{key}.{kind.value}", "must be a non-empty string without surrounding spaces")
    if subject_name == "*" and kind is not SubjectKind.AGENT:
        raise ctx.error(f"{key}.{kind.value}", '"*" (everyone) is allowed only for agent')
    # (2) Name: optional; a grant without one is called after its place in the file.
    name = key
    if "name" in table:
        name = ctx.string(table["name"], f"{key}.name")
        if not _GRANT_NAME.match(name):
            raise ctx.error(f"{key}.name", "a grant name must match ^[a-zA-Z0-9_.-]{1,64}$")
    # (3) What it covers: servers and/or namespaces that exist, and tool patterns.
    granted_servers = ctx.string_list(table["servers"], f"{key}.servers") if "servers" in table else []
    for position, server in enumerate(granted_servers):
        if server not in servers:
            known = ", ".join(sorted(servers))
            raise ctx.error(f"{key}.servers[{position}]", f"unknown server {server!r} (declared: {known})")
    granted_namespaces = (
        ctx.string_list(table["namespaces"], f"{key}.namespaces") if "namespaces" in table else []
    )
    for position, namespace in enumerate(granted_namespaces):
        if namespace not in namespaces:
            known = ", ".join(sorted(namespaces))
            raise ctx.error(
                f"{key}.namespaces[{position}]", f"unknown namespace {namespace!r} (declared: {known})"
            )
    if not granted_servers and not granted_namespaces:
        raise ctx.error(key, "a grant needs a non-empty servers or namespaces array")
    # Resources and prompts (issue 9): globs over upstream URIs / URI templates and prompt names.
    surfaces: dict[str, list[str]] = {}
    for field in ("resources", "prompts"):
        surfaces[field] = ctx.string_list(table[field], f"{key}.{field}") if field in table else []
        for position, pattern in enumerate(surfaces[field]):
            if not pattern or pattern != pattern.strip():
                raise ctx.error(f"{key}.{field}[{position}]", "must be a non-empty pattern without spaces")
    tools: list[str] = []
    if "tools" not in table and not surfaces["resources"] and not surfaces["prompts"]:
        raise ctx.error(f"{key}.tools", 'missing key: tool names or globs (["*"] for every tool)')
    if "tools" in table:
        tools = ctx.string_list(table["tools"], f"{key}.tools")
        if not tools:
            raise ctx.error(f"{key}.tools", 'must not be empty (["*"] for every tool)')
    for position, pattern in enumerate(tools):
        if not pattern or pattern != pattern.strip():
            raise ctx.error(f"{key}.tools[{position}]", "must be a non-empty name or glob without spaces")
    # (4) Constraints and obligations.
    schema: Mapping[str, Any] | None = None
    if "arguments_schema" in table:
        schema = ctx.table(table["arguments_schema"], f"{key}.arguments_schema")
        try:
            check_arguments_schema(schema)
        except ConfigError as exc:
            raise ctx.error(
                f"{key}.arguments_schema", exc.message.removeprefix("arguments_schema ")
            ) from None
    require_execution_id = (
        ctx.boolean(table["require_execution_id"], f"{key}.require_execution_id")
        if "require_execution_id" in table
        else False
    )
    rate: Rate | None = None
    if "rate" in table:
        try:
            rate = Rate.parse(ctx.string(table["rate"], f"{key}.rate"))
        except ConfigError as exc:
            if exc.data.get("key"):
                raise
            raise ctx.error(f"{key}.rate", exc.message) from None
    return ctx.build(
        Grant,
        name=name,
        subject=Subject(kind, subject_name),
        tools=tuple(tools),
        resources=tuple(surfaces["resources"]),
        prompts=tuple(surfaces["prompts"]),
        servers=frozenset(granted_servers),
        namespaces=frozenset(granted_namespaces),
        arguments_schema=schema,
        require_execution_id=require_execution_id,
        rate=rate,
    )


def _check_url(ctx: _Context, url: str, key: str) -> None:
    # Only the scheme is ever echoed: the rest of a URL may carry credentials.
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:
        raise ctx.error(key, "is not a valid URL") from None
    if parts.scheme not in ("http", "https"):
        raise ctx.error(key, f"scheme must be http or https, got {parts.scheme or 'none'!r}")
    if not hostname:
        raise ctx.error(key, "the URL has no host")


def _check_host(ctx: _Context, host: str, key: str) -> None:
    # The Host header is compared verbatim (case aside): host[:port], or host:* for any port.
    try:
        parts = urlsplit("//" + host.removesuffix(":*"))
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ctx.error(key, "is not a valid host") from None
    if not hostname or parts.path or parts.query or parts.fragment or parts.username or "/" in host:
        raise ctx.error(key, "a host must look like name[:port] or name:* (no scheme, no path)")


def _check_origin(ctx: _Context, origin: str, key: str) -> None:
    # The Origin header is compared verbatim, so anything but scheme://host[:port] never matches.
    try:
        parts = urlsplit(origin.removesuffix(":*"))
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ctx.error(key, "is not a valid origin") from None
    if parts.scheme not in ("http", "https") or not hostname:
        raise ctx.error(key, "an origin must look like http(s)://host[:port]")
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        raise ctx.error(key, "an origin has no path, query, fragment or user (no trailing '/')")


# ---------------------------------------------------------------- plumbing


def _key_path(parent: str, key: str) -> str:
    part = key if _BARE_KEY.match(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{parent}.{part}" if parent else part


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class _Context:
    """Where errors point (the file) and where ``${NAME}`` is looked up."""

    source: Path | None
    environ: Mapping[str, str]

    def error(self, key: str, defect: str) -> ConfigError:
        where = f"{key}: {defect}" if key else defect
        prefix = f"{self.source}: " if self.source is not None else ""
        return ConfigError(f"{prefix}{where}", key=key)

    def build(self, factory: Callable[..., _T], **kwargs: Any) -> _T:
        """Call a snapshot constructor, prefixing the file name to its ConfigError."""
        try:
            return factory(**kwargs)
        except ConfigError as exc:
            prefix = f"{self.source}: " if self.source is not None else ""
            raise ConfigError(f"{prefix}{exc.message}", **exc.data) from None

    def refuse_unknown(self, table: Mapping[str, Any], allowed: frozenset[str], key: str) -> None:
        for name in table:
            if name not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.error(_key_path(key, name), f"unknown key (expected one of: {expected})")

    def table(self, value: Any, key: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a table, got {_type_name(value)}")
        for name in value:
            if not isinstance(name, str):
                raise self.error(key, f"expected string keys, got {_type_name(name)}")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_type_name(value)}")
        return value

    def string_list(self, value: Any, key: str) -> list[str]:
        if not isinstance(value, list | tuple):
            raise self.error(key, f"expected an array of strings, got {_type_name(value)}")
        return [self.string(item, f"{key}[{index}]") for index, item in enumerate(value)]

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"expected a boolean, got {_type_name(value)}")
        return value

    def integer(self, value: Any, key: str) -> int:
        # bool is a subclass of int: ``max_body_bytes = true`` must not read as 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_type_name(value)}")
        return value

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, f"expected a number, got {_type_name(value)}")
        # TOML allows inf and nan; nan compares false with everything and would pass "> 0".
        if not math.isfinite(value):
            raise self.error(key, "expected a finite number, got inf or nan")
        return float(value)

    def interpolate(self, text: str, key: str) -> str:
        """Replace ``${NAME}`` from the environment and ``$$`` with ``$``, in one pass."""

        def substitute(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name = match.group(1)
            if name is None:
                raise self.error(key, "a '$' must start ${NAME} or be doubled as '$$'")
            if name not in self.environ:
                raise self.error(key, f"environment variable {name} is not set")
            resolved = self.environ[name]
            if not resolved:
                raise self.error(key, f"environment variable {name} is empty")
            return resolved

        return _DOLLAR.sub(substitute, text)
