"""The error tree keeps stable, unique reasons and codes in range (STYLE "A test guards the tree")."""

from __future__ import annotations

import bastion
import bastion.errors as errors
from bastion.errors import BastionError, CallRefused, Reason, RequestRejected, UpstreamError


def _concrete() -> list[type[BastionError]]:
    seen: list[type[BastionError]] = []
    stack: list[type[BastionError]] = [BastionError]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            if "reason" in sub.__dict__:
                seen.append(sub)
    return seen


def test_every_concrete_error_has_a_unique_reason() -> None:
    """No two concrete error classes share a reason (one answer, one class)."""
    reasons = [cls.reason for cls in _concrete() if cls is not errors.AttachmentUnproven]
    duplicates = {r for r in reasons if reasons.count(r) > 1}
    assert not duplicates, duplicates
    assert all(isinstance(r, Reason) for r in reasons)


def test_call_refusals_use_the_server_error_range() -> None:
    """Refusals inside a call are HTTP 200 with a code in -32000…-32099 (or -32602 for bad params)."""
    for cls in _concrete():
        if issubclass(cls, CallRefused):
            assert cls.http_status == 200
            assert -32099 <= cls.jsonrpc_code <= -32000 or cls.jsonrpc_code == -32602, cls
        if issubclass(cls, RequestRejected):
            assert 200 <= cls.http_status < 600, cls
        if issubclass(cls, UpstreamError):
            assert -32099 <= cls.jsonrpc_code <= -32000, cls


def test_error_data_names_the_reason_and_never_the_cause() -> None:
    """The wire data carries the reason; the audit-only cause is not rendered."""
    exc = errors.SessionNotFound(cause="foreign")
    assert exc.error_data() == {"reason": "session_not_found"}
    assert exc.cause == "foreign"


def test_curated_public_names() -> None:
    """The package exports exactly its curated names, and errors exports every class it defines."""
    assert sorted(bastion.__all__) == ["BastionError", "Reason", "__version__"]
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert defined - {"Any", "ClassVar"} <= set(errors.__all__) | {"Exception"}
