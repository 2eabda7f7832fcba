"""The evidence modules export exactly what they name in __all__."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "bastion.audit.chain",
    "bastion.audit.claim",
    "bastion.audit.errors",
    "bastion.audit.export",
    "bastion.audit.fanout",
    "bastion.audit.tee",
    "bastion.audit.verify",
    "bastion.audit.walk",
    "bastion.cli.verify_cmd",
    "bastion.crypto.jcs",
    "bastion.crypto.keys",
    "bastion.crypto.sign",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_every_public_definition(name: str) -> None:
    """Every name in __all__ exists, and every public class or function defined here is in __all__."""
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__)
    assert all(hasattr(module, item) for item in exported)
    defined = {
        item
        for item, value in vars(module).items()
        if not item.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == name
    }
    assert defined <= exported, defined - exported


def test_verification_errors_are_not_wire_errors() -> None:
    """Offline verification errors stay out of the BastionError tree (no reason clash with errors.py)."""
    from bastion.audit import errors
    from bastion.errors import BastionError

    reasons = set()
    for item in errors.__all__:
        value = getattr(errors, item)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert not issubclass(value, BastionError)
            if "reason" in vars(value):
                assert value.reason not in reasons
                reasons.add(value.reason)
    assert reasons == set(errors.VerificationReason)
