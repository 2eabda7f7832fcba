#!/usr/bin/env bash
# Installs MCP Inspector (pinned in package.json) into tests/e2e/inspector/node_modules, for
# tests/e2e/test_inspector_cli.py. No lock file: `npm ci` trips on Inspector's optional platform
# packages. It needs Node 22.19+ to run: the test uses the Node that tests/conformance/install.sh
# puts under .conformance/ when the machine's is older.
set -euo pipefail
cd "$(dirname "$0")"
npm install --no-audit --no-fund --loglevel=error --no-package-lock
