"""``bastion serve`` on PostgreSQL (issue #10): the store chosen by URL, used, its password never shown.

A real ``bastion serve`` process on the run's throwaway cluster, the store
named three ways (``--store``, ``BASTION_STORE``, ``[store] url`` with a
``${NAME}`` password); the official SDK client makes a governed call; the
rows it wrote are in the database, ``bastion workers --store`` reads the
replica from there, ``bastion audit find --store`` finds an execution's
entries, and the password appears in no output. (The test cluster
trusts local connections, so any password is accepted and none is checked.)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

import anyio
import httpx
import psycopg
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from bastion.cli.audit_find_cmd import run_find
from bastion.cli.workers_cmd import add_workers_parser, run_workers
from tests.e2e.conftest import Upstream, gateway_config
from tests.e2e.issue4_support import answer_of, call, open_session, sdk_client, static_token, toml_dumps
from tests.e2e.test_workers_e2e import _stop as stop_process

pytestmark = pytest.mark.anyio

BIN = Path(sys.executable).parent
PASSWORD = "hunter2-never-logged"


def read_workers(url: str) -> tuple[int, str, str]:
    """``bastion workers --store URL --json``, in process."""
    parser = argparse.ArgumentParser()
    add_workers_parser(parser.add_subparsers(dest="command"))
    out, err = io.StringIO(), io.StringIO()
    code = run_workers(parser.parse_args(["workers", "--store", url, "--json"]), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def with_password(url: str) -> str:
    return url.replace("postgresql:///", f"postgresql://postgres:{PASSWORD}@/", 1)


@pytest.mark.parametrize("how", ["flag", "env", "toml"])
async def test_serve_uses_the_postgres_store_it_is_given(
    how: str, postgres_url: str, tmp_path: Path, tools_upstream: Upstream
) -> None:
    """A call through ``bastion serve`` lands in PostgreSQL, however the URL came; no output shows it."""
    url = with_password(postgres_url)
    config = gateway_config(tmp_path, tools_upstream.url)
    env = {**os.environ, "PGPASSWORD_FOR_TEST": PASSWORD}
    command = [str(BIN / "bastion"), "serve", "--port", "0", "--data-dir", str(tmp_path / "data")]
    if how == "flag":
        command += ["--store", url]
    elif how == "env":
        env["BASTION_STORE"] = url
    else:
        config["store"] = {"url": url.replace(PASSWORD, "${PGPASSWORD_FOR_TEST}")}
    (tmp_path / "gateway.toml").write_text(toml_dumps(config))
    command += ["--config", str(tmp_path / "gateway.toml")]

    stderr_path = tmp_path / "serve.log"
    with stderr_path.open("wb") as stderr, anyio.fail_after(60):
        process = await anyio.open_process(command, env=env, stderr=stderr)
        try:
            assert process.stdout is not None
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
            words = line.decode().split()
            assert words[:2] == ["BASTION", "READY"], line
            async with sdk_client(words[2], static_token("alice")) as client:
                result = await client.call_tool("tools__echo", {"text": "on postgres"})
            assert result.is_error is False
            async with httpx.AsyncClient(timeout=30) as http:
                session_id = await open_session(http, words[2], static_token("alice"))
                with_id = await call(
                    http, words[2], static_token("alice"), session_id, "tools__echo", {"text": "x"},
                    execution_id="pg-find-1",
                )  # fmt: skip
            assert answer_of(with_id)["result"]["isError"] is False
            found_out, found_err = io.StringIO(), io.StringIO()
            found = await anyio.to_thread.run_sync(
                lambda: run_find(
                    tmp_path / "data", "pg-find-1", agent="alice", store_url=url, out=found_out, err=found_err
                )
            )
            code, out, err = await anyio.to_thread.run_sync(read_workers, url)
        finally:
            with anyio.CancelScope(shield=True):
                await stop_process(process)

    assert code == 0, err
    assert found == 0, found_err.getvalue()
    assert "pg-find-1" in found_out.getvalue() and "outcome" in found_out.getvalue()
    [gateway] = [w for w in json.loads(out)["workers"] if w["role"] == "gateway"]
    assert (gateway["generation"], gateway["epoch"]) == ("gateway-0", 1)
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cursor = await conn.execute("SELECT count(*) FROM entries")
        row = await cursor.fetchone()
    assert row is not None and row[0] > 0  # the call's evidence went to PostgreSQL
    assert not (tmp_path / "data" / "bastion.db").exists()  # and nothing to a SQLite file
    assert PASSWORD not in stderr_path.read_text() + out + err + found_out.getvalue() + found_err.getvalue()
