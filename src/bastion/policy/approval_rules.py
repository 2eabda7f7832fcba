"""Step-up approval in the configuration: who may approve, and which grants need it (issue 27).

Owns two frozen parts of the snapshot and their reading from TOML:
:class:`ApprovalRule`, a grant's ``approval = { approvers = [...], timeout_s,
show_arguments }`` (a call that grant allows waits for one of these approvers'
yes), and the approvers themselves, ``[auth.approvers.NAME] token_sha256``:
named principals, each with a credential of its own that holds the approver
role and no other (``Snapshot.credential_roles``). There is no shared approval
secret. Messages name key paths and defects, never a value of a credential.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import ConfigError

__all__ = ["ApprovalRule", "read_approval_rule", "read_approvers"]

_NAME = re.compile(r"^[a-zA-Z0-9_.@-]{1,64}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_RULE_KEYS = frozenset({"approvers", "timeout_s", "show_arguments"})
_APPROVER_KEYS = frozenset({"token_sha256"})
DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 86400.0

Error = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class ApprovalRule:
    """A grant's approval: one of ``approvers`` must say yes within ``timeout_s``.

    ``show_arguments`` (off unless set: arguments may be private) lets the
    approver see the call's arguments; the binding digest is always shown.
    """

    approvers: tuple[str, ...]
    timeout_s: float = DEFAULT_TIMEOUT_S
    show_arguments: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "approvers", tuple(self.approvers))
        if not self.approvers:
            raise ConfigError("approval.approvers must name at least one approver")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ConfigError(f"approval.timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}")


def read_approval_rule(value: Any, key: str, error: Error) -> ApprovalRule:
    """``value`` (a grant's ``approval`` table) as a rule. Raises :class:`ConfigError` naming ``key``."""
    if not isinstance(value, Mapping):
        raise error(key, "expected a table: { approvers = [...], timeout_s = 300, show_arguments = false }")
    for name in value:
        if name not in _RULE_KEYS:
            raise error(f"{key}.{name}", f"unknown key (expected one of: {', '.join(sorted(_RULE_KEYS))})")
    if "approvers" not in value:
        raise error(f"{key}.approvers", "missing key: the names of [auth.approvers] who may approve")
    approvers = value["approvers"]
    if not isinstance(approvers, list | tuple) or not approvers:
        raise error(f"{key}.approvers", "expected a non-empty array of approver names")
    for position, name in enumerate(approvers):
        if not isinstance(name, str) or not _NAME.match(name):
            raise error(f"{key}.approvers[{position}]", "an approver name must match ^[a-zA-Z0-9_.@-]{1,64}$")
    if len(set(approvers)) != len(approvers):
        raise error(f"{key}.approvers", "names an approver twice")
    timeout_s = value.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s):
        raise error(f"{key}.timeout_s", "expected a finite number of seconds")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise error(f"{key}.timeout_s", f"must be above 0 and at most {MAX_TIMEOUT_S:g} seconds")
    show = value.get("show_arguments", False)
    if not isinstance(show, bool):
        raise error(f"{key}.show_arguments", "expected true or false")
    return ApprovalRule(tuple(approvers), float(timeout_s), show)


def read_approvers(value: Any, key: str, error: Error) -> dict[str, str]:
    """``[auth.approvers]`` as ``{name: token digest}``. Raises :class:`ConfigError` naming the key."""
    if not isinstance(value, Mapping):
        raise error(key, "expected a table of approvers: [auth.approvers.NAME] token_sha256 = ...")
    approvers: dict[str, str] = {}
    for name, table in value.items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise error(where, "an approver name must match ^[a-zA-Z0-9_.@-]{1,64}$")
        if not isinstance(table, Mapping):
            raise error(where, "expected a table with token_sha256")
        for field in table:
            if field not in _APPROVER_KEYS:
                raise error(f"{where}.{field}", "unknown key (expected one of: token_sha256)")
        digest = table.get("token_sha256")
        if not isinstance(digest, str) or not _SHA256_HEX.match(digest):
            raise error(
                f"{where}.token_sha256",
                "missing or malformed: the 64 lowercase hex SHA-256 of the approver's own token",
            )
        approvers[name] = digest
    return approvers
