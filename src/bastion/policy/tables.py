"""Typed models of the configuration's tables: ``[gateway]``, ``[servers.NAME]``,
``[agents.NAME]``, ``[store]``, ``[auth]`` and ``[auth.oauth]`` (issue 26; ``docs/configuration.md``).

Owns the type of every key of those tables and how a pydantic error becomes a
:class:`ConfigError` that names the file, the key path as the file spells it
(``gateway.allowed_hosts[0]``, ``auth.oauth.issuer``) and the defect in the words
``policy/load.py`` has always used ("expected an integer, got a boolean"). Types are
strict: a boolean is never an integer, ``1.0`` never an integer, ``nan`` never a number.
What a value means (a URL, a host, a name that exists) is still checked by ``load.py``
after the types. An error never carries a value: values may be credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictStr, ValidationError
from pydantic_core import ErrorDetails

from bastion.errors import ConfigError
from bastion.policy.load_context import LoadContext, key_path, type_name

__all__ = ["AgentTable", "AuthTable", "GatewayTable", "OAuthTable", "ServerTable", "StoreTable", "read_table"]

_M = TypeVar("_M", bound="_Table")


def _tuple_as_list(value: Any) -> Any:
    # An already-parsed mapping (the CLI's demo) may hold tuples where TOML has arrays.
    return list(value) if isinstance(value, tuple) else value


StrList = Annotated[list[StrictStr], BeforeValidator(_tuple_as_list)]


class _Table(BaseModel):
    """One TOML table: strict types, no unknown key, frozen once read."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)
    # A key whose wrong type has always had its own words (``transparent``: "must be true or false").
    defects: ClassVar[Mapping[str, str]] = {}
    # Keys an explicit None leaves out (only an already-parsed mapping can say None).
    none_is_absent: ClassVar[frozenset[str]] = frozenset()

    def given(self) -> dict[str, Any]:
        """The keys the file gave, with their checked values (a key it left out is absent)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


# Field order is the order in which the types were always checked, so with several wrong types in
# one table the first one reported stays the same (a type is now reported before a meaning).


class GatewayTable(_Table):
    tool_separator: str | None = None
    max_body_bytes: int | None = None
    max_transport_sessions: int | None = None
    max_transport_sessions_per_agent: int | None = None
    sse_replay_events: int | None = None
    sse_replay_bytes: int | None = None
    sse_replay_streams: int | None = None
    max_header_bytes: int | None = None
    max_headers: int | None = None
    max_unauthenticated_connections_per_address: int | None = None
    max_requests_per_agent: int | None = None
    metrics_agents: int | None = None
    max_stdio_processes: int | None = None
    stdio_spawn_concurrency: int | None = None
    access_log: bool | None = None
    # The former name of max_unauthenticated_connections_per_address (issue #22).
    max_connections_per_address: int | None = None
    transport_session_idle_s: float | None = None
    upstream_timeout_s: float | None = None
    header_timeout_s: float | None = None
    body_timeout_s: float | None = None
    keep_alive_s: float | None = None
    sse_keepalive_s: float | None = None
    allowed_origins: StrList | None = None
    allowed_hosts: StrList | None = None


class ServerTable(_Table):
    """One ``[servers.NAME]`` table: http (``url``) or stdio (``command``), checked by ``load.py``."""

    defects: ClassVar[Mapping[str, str]] = {
        "transparent": "must be true or false",
        "audit_contents": "must be true or false",
    }
    none_is_absent: ClassVar[frozenset[str]] = frozenset({"headers", "env"})

    namespace: str | None = None
    timeout_s: float | None = None
    transparent: bool | None = None
    audit_contents: bool | None = None
    max_response_bytes: int | None = None
    # http
    url: str | None = None
    headers: Any = None  # a table of names and values: all checked by load.py (case, control characters)
    era: str | None = None
    # stdio
    command: str | None = None
    args: StrList | None = None
    env: Any = None  # a table of names and values: all checked by load.py (NUL, ``${NAME}``)
    cwd: str | None = None
    scope: str | None = None
    max_processes: int | None = None
    process_idle_s: float | None = None
    # pinning (issue 27): values checked by pinning/modes.py, with their own messages
    pinning: Any = None
    pin_changed: Any = None
    pin_lock_file: Any = None


class AgentTable(_Table):
    """One ``[agents.NAME]`` table: a token's SHA-256, or ``anonymous = true`` (``load.py`` decides)."""

    defects: ClassVar[Mapping[str, str]] = {"anonymous": "must be true or false"}

    token_sha256: str | None = None
    anonymous: bool | None = None


class StoreTable(_Table):
    url: str | None = None


class OAuthTable(_Table):
    issuer: str
    jwks_url: str
    audience: str | None = None
    algorithms: StrList | None = None
    leeway_s: float | None = None
    agent_claims: StrList | None = None
    agent_prefix: str | None = None
    human_claims: StrList | None = None
    team_claim: str | None = None
    scope_claims: StrList | None = None
    agent_session_claim: str | None = None


class AuthTable(_Table):
    resource_url: str | None = None
    admin_token_sha256: str | None = None
    auditor_token_sha256: StrList | None = None
    oauth: OAuthTable | None = None
    mtls_fingerprint_header: str | None = None
    mtls_trusted_proxies: StrList | None = None
    approvers: dict[str, Any] | None = None


def read_table(ctx: LoadContext, model: type[_M], value: Any, key: str) -> _M:
    """``value`` checked as the table ``key`` of type ``model``.

    Raises :class:`ConfigError` for the first defect: an unknown key first (as ever), then a
    missing one, then a wrong type, each at its key path.
    """
    table = ctx.table(value, key)
    ctx.refuse_unknown(table, frozenset(model.model_fields), key)
    _refuse_none(ctx, model, table, key)
    try:
        return model.model_validate(dict(table))
    except ValidationError as exc:
        raise _config_error(ctx, model, key, exc) from None


_ORDER = {"extra_forbidden": 0, "missing": 1}


def _config_error(ctx: LoadContext, model: type[_Table], key: str, exc: ValidationError) -> ConfigError:
    error = min(exc.errors(), key=lambda e: _ORDER.get(e["type"], 2))  # min is stable: file order
    path = key
    for part in error["loc"]:
        path = f"{path}[{part}]" if isinstance(part, int) else key_path(path, str(part))
    loc = error["loc"]
    if len(loc) == 1 and str(loc[0]) in model.defects and error["type"] not in _ORDER:
        return ctx.error(path, model.defects[str(loc[0])])
    return ctx.error(path, _defect(model, error))


def _defect(model: type[_Table], error: ErrorDetails) -> str:
    kind, got = error["type"], type_name(error["input"])
    if kind == "extra_forbidden":
        expected = ", ".join(sorted(_model_at(model, error["loc"][:-1]).model_fields))
        return f"unknown key (expected one of: {expected})"
    if kind == "missing":
        return "missing key"
    if kind == "finite_number":
        return "expected a finite number, got inf or nan"
    words = {
        "int_type": "an integer",
        "float_type": "a number",
        "bool_type": "a boolean",
        "string_type": "a string",
        "list_type": "an array of strings",
        "model_type": "a table",
        "dict_type": "a table",
    }
    if kind in words:
        return f"expected {words[kind]}, got {got}"
    return f"invalid value ({kind})"


def _model_at(model: type[_Table], loc: tuple[int | str, ...]) -> type[_Table]:
    for part in loc:
        inner = _table_of(model.model_fields[str(part)].annotation)
        if inner is None:
            break
        model = inner
    return model


def _table_of(annotation: Any) -> type[_Table] | None:
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, _Table):
            return candidate
    return None


def _expected(model: type[_Table], name: str) -> str:
    """How the error for an explicit None names what was expected at ``name``."""
    kinds = _leaf_types(model.model_fields[name].annotation)
    for kind, words in ((list, "an array of strings"), (bool, "a boolean"), (int, "an integer")):
        if kind in kinds:
            return words
    if float in kinds:
        return "a number"
    if any(isinstance(k, type) and issubclass(k, _Table) for k in kinds):
        return "a table"
    return "a string"


def _leaf_types(annotation: Any) -> set[Any]:
    origin = get_origin(annotation)
    found = {origin} if origin is not None else {annotation}
    for arg in get_args(annotation):
        found |= _leaf_types(arg)
    return found


def _refuse_none(ctx: LoadContext, model: type[_Table], table: Mapping[str, Any], key: str) -> None:
    # An explicit None (possible only in an already-parsed mapping) is a value of the wrong type,
    # never "not given".
    for name, item in table.items():
        if name not in model.model_fields or (item is None and name in model.none_is_absent):
            continue
        if item is None:
            defect = model.defects.get(name) or f"expected {_expected(model, name)}, got {type_name(item)}"
            raise ctx.error(key_path(key, name), defect)
        inner = _table_of(model.model_fields[name].annotation)
        if inner is not None and isinstance(item, Mapping):
            _refuse_none(ctx, inner, item, key_path(key, name))
