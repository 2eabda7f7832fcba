"""Access grants: who may call which tools, with which arguments (DESIGN sections 2 step 4 and 8).

Owns the frozen grant types of the snapshot: :class:`Subject` (exactly one of
agent, team, human or scope), :class:`Rate` (a token-bucket rate such as
``"10/minute"``) and :class:`Grant`. Each is checked in its constructor, so a
grant that exists is a valid one: a JSON Schema that is not itself valid is a
:class:`~bastion.errors.ConfigError` here, never a surprise at call time.

Deciding a call against the grants is ``policy/decide.py``; reading them from
TOML is ``policy/load.py``. This module never reads files, never holds
mutable state, and never puts a setting's value (schemas included) into an
error message: only key paths and defects.
"""

from __future__ import annotations

import copy
import enum
import fnmatch
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators

from bastion.errors import ConfigError
from bastion.policy.approval_rules import ApprovalRule

__all__ = ["Grant", "Rate", "Subject", "SubjectKind", "check_arguments_schema"]

_GRANT_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
_RATE = re.compile(r"^\s*([0-9]+)\s*/\s*(second|minute|hour|day)\s*$")
_PERIOD_S = {"second": 1.0, "minute": 60.0, "hour": 3600.0, "day": 86400.0}
# A bucket larger than this is a typo, not a limit.
_MAX_RATE_TOKENS = 1_000_000
_DIALECTS: dict[str, type[jsonschema.protocols.Validator]] = {
    str(cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id")).rstrip("#"): cls
    for cls in (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
}


class SubjectKind(enum.StrEnum):
    """What a grant's subject names; the TOML key of the subject is the kind's value."""

    AGENT = "agent"
    TEAM = "team"
    HUMAN = "human"
    SCOPE = "scope"


@dataclass(frozen=True)
class Subject:
    """Who a grant is for: one kind and one name. ``"*"`` (every agent) exists only for agents."""

    kind: SubjectKind
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a grant's {self.kind.value} must be a non-empty string")
        if self.name != self.name.strip():
            raise ConfigError(f"a grant's {self.kind.value} must not start or end with whitespace")
        if self.name == "*" and self.kind is not SubjectKind.AGENT:
            raise ConfigError(f'"*" is allowed only for agent, not for {self.kind.value}')

    def covers(self, *, agent: str, team: str | None, human: str | None, scopes: Collection[str]) -> bool:
        """Whether a principal with these attributes is this subject (absent attributes match nothing)."""
        if self.kind is SubjectKind.AGENT:
            return self.name == "*" or self.name == agent
        if self.kind is SubjectKind.TEAM:
            return team is not None and team == self.name
        if self.kind is SubjectKind.HUMAN:
            return human is not None and human == self.name
        return self.name in scopes

    def __str__(self) -> str:
        return f"{self.kind.value}={self.name}"


@dataclass(frozen=True)
class Rate:
    """A token bucket: ``tokens`` calls at most per ``period_s``, refilled continuously."""

    tokens: int
    period_s: float

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int):
            raise ConfigError("a rate's count must be an integer")
        if not 1 <= self.tokens <= _MAX_RATE_TOKENS:
            raise ConfigError(f"a rate's count must be between 1 and {_MAX_RATE_TOKENS}")
        if not self.period_s > 0:
            raise ConfigError("a rate's period must be positive")

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"N/second"``, ``"N/minute"``, ``"N/hour"`` or ``"N/day"``. Raises :class:`ConfigError`."""
        match = _RATE.match(text)
        if match is None:
            raise ConfigError('a rate must look like "10/minute" (second, minute, hour or day)')
        return cls(tokens=int(match.group(1)), period_s=_PERIOD_S[match.group(2)])

    @property
    def refill_per_s(self) -> float:
        return self.tokens / self.period_s


@dataclass(frozen=True, eq=False)
class Grant:
    """One ``[[grants]]`` entry: a subject may call some tools of some servers.

    ``resources`` (globs over upstream resource URIs and URI templates) and
    ``prompts`` (globs over upstream prompt names) extend the grant to those
    surfaces (issue 9); a grant may name only them, then ``tools`` is empty.

    ``servers`` are server table names, ``namespaces`` are namespaces; a call is
    covered when its server is in ``servers`` or its namespace is in
    ``namespaces`` (at least one of the two is non-empty), and its upstream tool
    name matches one of ``tools`` (``fnmatch`` globs, case-sensitive).
    ``arguments_schema`` (JSON Schema, ``$schema`` honoured, 2020-12 by
    default, ``format`` asserted) must accept the call's arguments (and a
    ``prompts/get``'s). ``rate`` is an obligation on every call, read, get and
    completion the grant allows, ``require_execution_id`` on every call.
    Whether the servers exist is checked by the snapshot.

    Raises:
        ConfigError: empty or malformed fields, or a schema that is not valid JSON Schema.
    """

    name: str
    subject: Subject
    tools: tuple[str, ...]
    servers: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    arguments_schema: Mapping[str, Any] | None = None
    require_execution_id: bool = False
    rate: Rate | None = None
    # Issue 9: patterns over upstream resource URIs and URI templates, and over upstream prompt names.
    resources: tuple[str, ...] = ()
    prompts: tuple[str, ...] = ()
    # Issue 27: a call this grant allows waits for one of these approvers' yes.
    approval: ApprovalRule | None = None
    _validator: jsonschema.protocols.Validator | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "resources", tuple(self.resources))
        object.__setattr__(self, "prompts", tuple(self.prompts))
        object.__setattr__(self, "servers", frozenset(self.servers))
        object.__setattr__(self, "namespaces", frozenset(self.namespaces))
        if not _GRANT_NAME.match(self.name) and not _is_positional_name(self.name):
            raise ConfigError(f"grant name {self.name!r} must match ^[a-zA-Z0-9_.-]{{1,64}}$")
        where = f"grant {self.name}"
        if not self.tools and not self.resources and not self.prompts:
            raise ConfigError(f'{where}: tools must not be empty (use ["*"] for every tool)')
        for pattern in (*self.tools, *self.resources, *self.prompts):
            if not isinstance(pattern, str) or not pattern or pattern != pattern.strip():
                raise ConfigError(f"{where}: every tool pattern must be a non-empty string without spaces")
        if not self.servers and not self.namespaces:
            raise ConfigError(f"{where}: name at least one server (servers) or namespace (namespaces)")
        if not isinstance(self.require_execution_id, bool):
            raise ConfigError(f"{where}: require_execution_id must be a boolean")
        if self.arguments_schema is not None:
            # The grant keeps its own deep copy: the caller's dict may change, the snapshot may not.
            schema = copy.deepcopy(dict(self.arguments_schema))
            try:
                validator = _compile_schema(schema)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc.message}") from None
            object.__setattr__(self, "_validator", validator)
            object.__setattr__(self, "arguments_schema", _freeze(copy.deepcopy(schema)))

    def covers_target(self, server: str, namespace: str, tool: str) -> bool:
        """Whether this grant names the server (or namespace) and a pattern matches the upstream tool name."""
        if server not in self.servers and namespace not in self.namespaces:
            return False
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)

    def covers_resource(self, server: str, namespace: str, uri: str) -> bool:
        """Whether this grant names the server (or namespace) and a pattern matches the URI or template."""
        if server not in self.servers and namespace not in self.namespaces:
            return False
        return any(fnmatch.fnmatchcase(uri, pattern) for pattern in self.resources)

    def covers_prompt(self, server: str, namespace: str, prompt: str) -> bool:
        """Whether this grant names the server (or namespace) and a pattern matches the prompt name."""
        if server not in self.servers and namespace not in self.namespaces:
            return False
        return any(fnmatch.fnmatchcase(prompt, pattern) for pattern in self.prompts)

    def argument_violation(self, arguments: Mapping[str, Any]) -> str | None:
        """``None`` when the arguments satisfy the schema (or there is none), else the failing schema path.

        The answer names a place in the schema (configuration), never a value
        from the arguments. A schema that cannot be evaluated (an unresolvable
        ``$ref``) counts as a violation: fail closed.
        """
        if self._validator is None:
            return None
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        except Exception as exc:
            # Any failure to evaluate the schema refuses the call: fail closed (DESIGN section 9).
            return f"<schema could not be evaluated: {type(exc).__name__}>"
        if error is None:
            return None
        return _schema_path(error)


def _is_positional_name(name: str) -> bool:
    # Grants without a ``name`` are called after their position in the file.
    return re.fullmatch(r"grants\[[0-9]+\]", name) is not None


def check_arguments_schema(schema: Mapping[str, Any]) -> None:
    """Check that ``schema`` is a valid JSON Schema (by its ``$schema``, 2020-12 by default).

    Raises:
        ConfigError: naming the place in the schema and the metaschema rule it breaks, never a value.
    """
    _compile_schema(dict(schema))


def _compile_schema(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    cls: type[jsonschema.protocols.Validator] = jsonschema.Draft202012Validator
    if "$schema" in schema:
        # An unknown dialect would silently fall back to another one's rules: refuse it.
        dialect = schema["$schema"]
        found = _DIALECTS.get(dialect.rstrip("#")) if isinstance(dialect, str) else None
        if found is None:
            raise ConfigError(
                "arguments_schema.$schema names an unknown dialect "
                "(draft-04, -06, -07, 2019-09 or 2020-12 metaschema URIs)"
            )
        cls = found
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        # The metaschema's own message quotes schema values: name the place and the rule only.
        place = "/".join(str(part) for part in exc.path) or "(root)"
        raise ConfigError(
            f"arguments_schema is not a valid JSON Schema at {place} (rule: {exc.validator})"
        ) from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _schema_path(error: jsonschema.exceptions.ValidationError) -> str:
    return "/".join(str(part) for part in error.schema_path) or str(error.validator)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
