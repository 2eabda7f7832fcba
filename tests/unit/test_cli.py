"""The command line: bad input is a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import hashlib
import re
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


def test_serve_off_loopback_needs_allowed_hosts(tmp_path: Path) -> None:
    """`bastion serve --host 0.0.0.0` without gateway.allowed_hosts exits 2: no unsafe default."""
    good = tmp_path / "good.toml"
    good.write_text('[servers.tools]\nurl = "http://127.0.0.1:9/mcp"\n')
    result = run(
        "serve", "--config", str(good), "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert "gateway.allowed_hosts" in result.stderr
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


# ---------------------------------------------------------------- every README command, through `bastion`

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def test_every_readme_command_is_a_bastion_command() -> None:
    """Each operating command the README documents is registered on the real `bastion` parser."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    documented = set(re.findall(r"`bastion ([a-z][a-z-]*)", readme)) | {"serve"}  # `make serve` runs it
    assert {"verify", "audit", "public-key", "agent-session", "workers", "connect"} <= documented
    for command in sorted(documented):
        result = run(command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert f"bastion {command}" in result.stdout


def test_verify_and_audit_join_run_through_the_entry_point() -> None:
    """`bastion verify` with a claim and `bastion audit join` on the vectors exit 0 as the README shows."""
    verified = run(
        "verify",
        str(VECTORS / "bundle_valid.jsonl"),
        "--claim",
        str(VECTORS / "claim_valid.json"),
        "--key",
        str(VECTORS / "audit_pubkey.pem"),
    )
    joined = run("audit", "join", "--execution-id", "exec-7f3a", str(VECTORS / "bundle_valid.jsonl"))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert joined.returncode == 0, joined.stderr
    assert "exec-7f3a" in joined.stdout


def test_workers_reads_a_data_dir_and_public_key_prints_the_key(tmp_path: Path) -> None:
    """`bastion workers --data-dir` reads a real store; `bastion public-key` prints that data dir's PEM."""
    import anyio

    from bastion.crypto.keys import Keyring
    from bastion.store.sqlite import SqliteStore

    async def make_store() -> None:
        async with await SqliteStore.open(tmp_path / "bastion.db"):
            pass

    anyio.run(make_store)
    Keyring.open(tmp_path)
    workers = run("workers", "--data-dir", str(tmp_path))
    key = run("public-key", "--data-dir", str(tmp_path))
    assert workers.returncode == 0, workers.stderr
    assert workers.stdout.split()[0] == "IDENTITY"
    assert key.returncode == 0 and key.stdout.startswith("-----BEGIN PUBLIC KEY-----")


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
