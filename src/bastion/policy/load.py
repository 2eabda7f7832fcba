"""Read, validate and compile the TOML configuration file (DESIGN section 8).

This module owns the file format documented in ``docs/configuration.md``: it
turns one TOML file (or an already-parsed mapping, for the CLI's demo config)
into a frozen :class:`~bastion.policy.snapshot.Snapshot`, or raises
:class:`~bastion.errors.ConfigError` naming the file, the key path and the
defect. It refuses every unknown key, because a typo must never silently
weaken policy (DESIGN section 9). It must never print or embed in an error the
value of a setting or of an environment variable: values may be credentials.

``[gateway]``, ``[servers.NAME]``, ``[agents.NAME]``, ``[store]``, ``[auth]`` and
``[auth.oauth]`` are typed models (``policy/tables.py``: types, unknown and missing
keys, each error at its key path); what their values mean, and ``[[grants]]`` and
``[[requirements]]``, are checked here. ``policy/load_context.py`` holds what both
share: the file errors name, key paths, type names, ``${NAME}``.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bastion.auth.oauth import ClaimRules, OAuthSettings
from bastion.errors import ConfigError
from bastion.ids import AgentId
from bastion.pinning.modes import read_pinning
from bastion.policy.approval_rules import read_approval_rule, read_approvers
from bastion.policy.grants import Grant, Rate, Subject, SubjectKind, check_arguments_schema
from bastion.policy.load_context import LoadContext as _Context
from bastion.policy.load_context import key_path as _key_path
from bastion.policy.load_context import type_name as _type_name
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
from bastion.policy.tables import AgentTable, AuthTable, GatewayTable, ServerTable, StoreTable, read_table
from bastion.store.dsn import is_postgres_url
from bastion.workers.attachment import NamespaceRequirement, NamespaceRequirements

__all__ = ["load_snapshot", "snapshot_from_mapping"]

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")
# RFC 9110 token: the characters a header field name may use.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[^=\x00]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

_TOP_KEYS = frozenset({"gateway", "servers", "agents", "grants", "auth", "requirements", "store"})
_REQUIREMENT_KEYS = frozenset({"agent", "team", "namespaces"})
_HTTP_KEYS = frozenset({"url", "headers", "era"})
_STDIO_KEYS = frozenset({"command", "args", "env", "cwd", "scope", "max_processes", "process_idle_s"})
_SERVER_KEYS = frozenset(ServerTable.model_fields)
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
    "approval",
}
_GRANT_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


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
    table = read_table(ctx, AuthTable, value, "auth")
    resource_url = table.resource_url
    if resource_url is not None:
        _check_url(ctx, resource_url, "auth.resource_url")
    oauth = None
    if table.oauth is not None:
        oauth_table = table.oauth.given()
        claims: dict[str, Any] = {}
        for key in ("agent_claims", "human_claims", "scope_claims"):
            if key in oauth_table:
                claims[key] = tuple(oauth_table[key])
        for key in ("agent_prefix", "team_claim", "agent_session_claim"):
            if key in oauth_table:
                claims[key] = oauth_table[key]
        settings: dict[str, Any] = {
            "issuer": table.oauth.issuer,
            "jwks_url": table.oauth.jwks_url,
            "audience": oauth_table.get("audience", resource_url or ""),
            "claims": ctx.build(ClaimRules, **claims),
        }
        if "algorithms" in oauth_table:
            settings["algorithms"] = tuple(oauth_table["algorithms"])
        if "leeway_s" in oauth_table:
            settings["leeway_s"] = oauth_table["leeway_s"]
        oauth = ctx.build(OAuthSettings, **settings)
    approvers = (
        read_approvers(table.approvers, "auth.approvers", ctx.error) if table.approvers is not None else {}
    )
    return ctx.build(
        AuthSettings,
        approvers=approvers,
        resource_url=resource_url,
        admin_token_sha256=table.admin_token_sha256,
        auditor_token_sha256=tuple(table.auditor_token_sha256 or ()),
        oauth=oauth,
        mtls_fingerprint_header=table.mtls_fingerprint_header,
        mtls_trusted_proxies=tuple(table.mtls_trusted_proxies or ()),
    )


def _read_store(ctx: _Context, value: Any) -> str | None:
    """``[store] url``: where the state lives (``${NAME}`` allowed, for a password); read at start only."""
    if value is None:
        return None
    table = read_table(ctx, StoreTable, value, "store")
    if table.url is None:
        return None
    url = ctx.interpolate(table.url, "store.url")
    if not is_postgres_url(url):
        raise ctx.error("store.url", "expected a postgresql:// URL (omit [store] for the SQLite file)")
    return url


def _read_gateway(ctx: _Context, value: Any) -> GatewaySettings:
    if value is None:
        return ctx.build(GatewaySettings)
    kwargs = read_table(ctx, GatewayTable, value, "gateway").given()
    if "max_connections_per_address" in kwargs:
        # Its former name (issue #22): it only ever bounded what a peer holds before a credential.
        if "max_unauthenticated_connections_per_address" in kwargs:
            raise ctx.error(
                "gateway.max_connections_per_address",
                "is the former name of max_unauthenticated_connections_per_address: give one",
            )
        kwargs["max_unauthenticated_connections_per_address"] = kwargs.pop("max_connections_per_address")
    if "allowed_origins" in kwargs:
        for index, origin in enumerate(kwargs["allowed_origins"]):
            _check_origin(ctx, origin, f"gateway.allowed_origins[{index}]")
        kwargs["allowed_origins"] = tuple(kwargs["allowed_origins"])
    if "allowed_hosts" in kwargs:
        for index, host in enumerate(kwargs["allowed_hosts"]):
            _check_host(ctx, host, f"gateway.allowed_hosts[{index}]")
        kwargs["allowed_hosts"] = tuple(kwargs["allowed_hosts"])
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
    # A key of the other kind is named as such, whatever its value (before any type is checked).
    stray = [other for other in sorted(_STDIO_KEYS if has_url else _HTTP_KEYS) if other in table]
    if stray:
        takes = "only a stdio server (command)" if has_url else "only an http server (url)"
        raise ctx.error(f"{key}.{stray[0]}", f"{takes} takes this key")
    fields = read_table(ctx, ServerTable, table, key).given()
    namespace = fields.get("namespace", name)
    timeout_s = fields.get("timeout_s")
    transparent = fields.get("transparent", False)
    audit_contents = fields.get("audit_contents", False)
    bounds: dict[str, Any] = read_pinning(table, key, ctx.source, ctx.error)  # issue 27
    if "max_response_bytes" in fields:
        limit = bounds["max_response_bytes"] = fields["max_response_bytes"]
        if limit < MIN_MAX_RESPONSE_BYTES:
            raise ctx.error(f"{key}.max_response_bytes", f"must be at least {MIN_MAX_RESPONSE_BYTES}")
    if has_url:
        url = fields["url"]
        _check_url(ctx, url, f"{key}.url")
        headers = _read_headers(ctx, fields.get("headers"), f"{key}.headers")
        era = fields.get("era", "auto")
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
    command = fields["command"]
    if not command:
        raise ctx.error(f"{key}.command", "must not be empty")
    args = fields.get("args", [])
    env = _read_env(ctx, fields.get("env"), f"{key}.env")
    cwd = fields.get("cwd")
    bounds.update(_read_process_scope(ctx, fields, key))
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
        raw = ctx.table(agent_value, key)
        ctx.refuse_unknown(raw, frozenset(AgentTable.model_fields), key)
        if raw.get("anonymous") is True and "token_sha256" in raw:
            # A token beside anonymous = true is the defect, whatever its value.
            raise ctx.error(f"{key}.token_sha256", "an anonymous agent has no token")
        agent = read_table(ctx, AgentTable, raw, key).given()
        if agent.get("anonymous", False):
            agents.append(ctx.build(AgentSpec, name=AgentId(name), anonymous=True))
            continue
        if "token_sha256" not in agent:
            raise ctx.error(f"{key}.token_sha256", "missing key: the SHA-256 of the agent's bearer token")
        agents.append(ctx.build(AgentSpec, name=AgentId(name), token_sha256=agent["token_sha256"]))
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
    approval = (
        read_approval_rule(table["approval"], f"{key}.approval", ctx.error) if "approval" in table else None
    )
    return ctx.build(
        Grant,
        approval=approval,
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
