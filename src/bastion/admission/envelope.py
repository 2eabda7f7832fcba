"""The ``params._cmcp`` envelope of a ``tools/call`` (DESIGN sections 1-3, seed 000).

The caller may carry ``execution_id`` and ``workflow_id`` in ``params._cmcp``.
This module validates them and hands back the params without ``_cmcp``, so the
upstream never sees the envelope. Rules, each refused with
:class:`~bastion.errors.InvalidCmcpEnvelope` whose data names the field:

1. ``_cmcp``, when present, is a JSON object;
2. it holds no key but ``execution_id`` and ``workflow_id``;
3. each present value is a string of 1..128 visible ASCII characters
   (0x21-0x7E); ``null`` is not a string.

The two ids stay independent: neither is derived from the other. Missing ids
are legal and read as ``None``; nothing is synthesized. This module never
mutates its input and never echoes caller values in an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import InvalidCmcpEnvelope
from bastion.ids import ExecutionId, WorkflowId

__all__ = ["CMCP_KEY", "CmcpEnvelope", "read_envelope"]

CMCP_KEY = "_cmcp"
_ID_RULE = re.compile(r"[\x21-\x7e]{1,128}")
_MAX_ID_LENGTH = 128


@dataclass(frozen=True, slots=True)
class CmcpEnvelope:
    """The validated caller-supplied correlation ids of one call; ``None`` when absent."""

    execution_id: ExecutionId | None = None
    workflow_id: WorkflowId | None = None


def read_envelope(params: Mapping[str, Any]) -> tuple[CmcpEnvelope, dict[str, Any]]:
    """Validate ``params._cmcp`` and return it with a new params dict that lacks ``_cmcp``.

    Raises :class:`InvalidCmcpEnvelope` with ``data = {"field": ..., "problem": ...}``.
    """
    stripped = {key: value for key, value in params.items() if key != CMCP_KEY}
    if CMCP_KEY not in params:
        return CmcpEnvelope(), stripped
    raw = params[CMCP_KEY]
    # (1) an object
    if not isinstance(raw, Mapping):
        raise InvalidCmcpEnvelope(field=CMCP_KEY, problem="not_an_object")
    # (2) no unknown keys: an unknown key may be a caller's misspelt execution_id,
    # and ignoring it would admit the call without the protection it asked for.
    if any(key not in ("execution_id", "workflow_id") for key in raw):
        raise InvalidCmcpEnvelope(field=CMCP_KEY, problem="unknown_key")
    # (3) each id
    execution_id = _read_id(raw, "execution_id")
    workflow_id = _read_id(raw, "workflow_id")
    return (
        CmcpEnvelope(
            execution_id=None if execution_id is None else ExecutionId(execution_id),
            workflow_id=None if workflow_id is None else WorkflowId(workflow_id),
        ),
        stripped,
    )


def _read_id(envelope: Mapping[str, Any], key: str) -> str | None:
    if key not in envelope:
        return None
    value = envelope[key]
    field = f"{CMCP_KEY}.{key}"
    if not isinstance(value, str):
        raise InvalidCmcpEnvelope(field=field, problem="not_a_string")
    if not value:
        raise InvalidCmcpEnvelope(field=field, problem="empty")
    if len(value) > _MAX_ID_LENGTH:
        raise InvalidCmcpEnvelope(field=field, problem="too_long")
    if not _ID_RULE.fullmatch(value):
        raise InvalidCmcpEnvelope(field=field, problem="invalid_character")
    return value
