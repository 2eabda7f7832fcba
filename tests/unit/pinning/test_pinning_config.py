"""``servers.NAME.pinning``, ``pin_changed``, ``pin_lock_file`` (issue 27): defaults, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.errors import ConfigError
from bastion.pinning.modes import PinChanged, PinMode
from bastion.policy.load import load_snapshot

SERVER = '[servers.notes]\ncommand = "python"\n'


def _load(tmp_path: Path, extra: str) -> object:
    path = tmp_path / "bastion.toml"
    path.write_text(SERVER + extra, encoding="utf-8")
    return load_snapshot(path, environ={})


def _error(tmp_path: Path, extra: str) -> str:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, extra)
    message = caught.value.message
    assert "\n" not in message and str(tmp_path / "bastion.toml") in message
    return message


def test_pinning_is_on_by_default_and_withholds(tmp_path: Path) -> None:
    """A server that says nothing is pinned on first use, and a changed definition is withheld."""
    spec = _load(tmp_path, "").servers["notes"]  # type: ignore[attr-defined]
    assert spec.pinning is PinMode.TOFU and spec.pin_changed is PinChanged.WITHHOLD
    assert spec.pin_lock_file is None


def test_a_relative_lock_file_is_taken_from_the_configuration_folder(tmp_path: Path) -> None:
    """``pin_lock_file`` is resolved against the configuration file, not the working directory."""
    spec = _load(tmp_path, 'pinning = "lock"\npin_lock_file = "pins.json"\npin_changed = "hide"\n')
    notes = spec.servers["notes"]  # type: ignore[attr-defined]
    assert notes.pin_lock_file == str(tmp_path / "pins.json") and notes.pin_changed is PinChanged.HIDE


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('pinning = "trust"\n', "servers.notes.pinning: must be one of 'tofu', 'lock', 'off'"),
        ("pinning = true\n", "servers.notes.pinning: must be one of"),
        ('pin_changed = "show"\n', "servers.notes.pin_changed: must be one of 'withhold', 'hide'"),
        ('pinning = "lock"\n', "servers.notes.pin_lock_file: missing"),
        ('pin_lock_file = "pins.json"\n', 'servers.notes.pin_lock_file: only a server with pinning = "lock"'),
        ('pinning = "lock"\npin_lock_file = ""\n', "servers.notes.pin_lock_file: must be a non-empty path"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(tmp_path: Path, extra: str, expected: str) -> None:
    """Each bad value is refused with one line that names the key and what it takes."""
    assert expected in _error(tmp_path, extra)
