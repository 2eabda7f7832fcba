"""The command line: bad input is a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

BASTION = [sys.executable, "-m", "bastion.cli.main"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BASTION, *args], capture_output=True, text=True, input=stdin, timeout=60)


def test_check_config_names_the_file_the_key_and_the_defect(tmp_path: Path) -> None:
    """An invalid file is refused with exit 2 and a message naming file, key path and defect."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[servers.notes]\ncommand = "python"\nargs = ["-m", 7]\n')
    result = run("check-config", str(bad))
    assert result.returncode == 2
    assert "bad.toml" in result.stderr and "servers.notes.args[1]" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_bad_config_at_start(tmp_path: Path) -> None:
    """`bastion serve` with an unusable file exits 2 at once, saying why."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[servers.x]\nurl = 'ftp://example/mcp'\n")
    result = run("serve", "--config", str(bad), "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "servers.x.url" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    """A valid file is accepted and its version printed."""
    good = tmp_path / "good.toml"
    good.write_text('[servers.tools]\nurl = "http://127.0.0.1:9/mcp"\n')
    result = run("check-config", str(good))
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout


def test_hash_token_prints_the_sha256() -> None:
    """hash-token prints the digest agents.*.token_sha256 expects, not the token."""
    result = run("hash-token", stdin="secret-token\n")
    assert result.returncode == 0
    assert result.stdout.strip() == hashlib.sha256(b"secret-token").hexdigest()
    assert "secret-token" not in result.stdout


def test_public_key_without_a_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    """Asking for the public key of a gateway that never ran says so."""
    result = run("public-key", "--data-dir", str(tmp_path / "nothing"))
    assert result.returncode == 2
    assert "no signing key" in result.stderr


def test_rotate_key_keeps_the_old_public_key(tmp_path: Path) -> None:
    """Rotation makes a new key active and keeps the old public key for verifying old claims."""
    from bastion.crypto.keys import Keyring

    old = Keyring.open(tmp_path).key_id
    result = run("rotate-key", "--data-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    reopened = Keyring.open(tmp_path)
    assert reopened.key_id != old
    assert old in result.stdout and reopened.key_id in result.stdout
    assert reopened.verifying_key(old).key_id == old


def test_serve_refuses_an_anonymous_agent_on_a_non_loopback_bind(tmp_path: Path) -> None:
    """`bastion serve --host 0.0.0.0` with an anonymous agent exits 2 naming the agent; nothing is served."""
    config = tmp_path / "anon.toml"
    config.write_text('[servers.tools]\nurl = "http://127.0.0.1:9/mcp"\n\n[agents.suite]\nanonymous = true\n')
    result = run(
        "serve",
        "--config",
        str(config),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "d"),
    )
    assert result.returncode == 2
    assert "agents.suite" in result.stderr and "loopback" in result.stderr
    assert "Traceback" not in result.stderr
