#!/usr/bin/env bash
# Installs the official TypeScript MCP SDK (pinned in package.json) into tests/e2e/ts_client/node_modules,
# for tests/e2e/test_ts_client.py. Needs Node 18+ and npm; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")"
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
