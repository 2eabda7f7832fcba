"""`bastion audit find` reads the store `bastion serve` would use, on either engine (issue #11 point 11)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from store_support import builder, genesis, new_writer

from bastion.cli.main import main
from bastion.ids import EvidenceSessionId
from bastion.store.select import open_store


def _write_two_chains(url: str | None, data_dir: Path) -> None:
    async def write() -> None:
        store = await open_store(url, data_dir)
        try:
            writer = await new_writer(store, "gw-a-20260501T120000Z-abc1234", "gateway-0")
            w = {"worker": writer.worker, "epoch": writer.epoch}
            for name in ("ev_first", "ev_late"):
                chain = EvidenceSessionId(name)
                await store.open_chain(chain, genesis(chain), **w)
                await store.append_entry(chain, builder(chain, execution_id="x", call_id="c1"), **w)
        finally:
            await store.aclose()

    anyio.run(write)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_audit_find_reaches_every_chain_on_either_engine(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --data-dir (SQLite) or --store (PostgreSQL), every chain holding the execution is listed."""
    url = request.getfixturevalue("postgres_url") if engine == "postgres" else None
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _write_two_chains(url, data_dir)
    where = ["--store", url] if url is not None else ["--data-dir", str(data_dir)]
    assert main(["audit", "find", *where, "--execution-id", "x", "--agent", "agent-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 entries carry execution_id 'x' (agent 'agent-1') in 2 evidence session(s)")
    assert "session=ev_first seq=1" in out and "session=ev_late seq=1" in out
    if url is not None:
        assert url.split("@")[0] not in out  # the URL (and its password) is never printed


def test_audit_find_never_creates_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at a data directory without a store, it says so (exit 2) and creates nothing."""
    assert main(["audit", "find", "--data-dir", str(tmp_path), "--execution-id", "x"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
