#!/usr/bin/env bash
# The OpenCode plugin's checks: install from the lockfile (setup.sh), build,
# type check, and the tests against real `opencode serve` processes and a
# real leasehold server.
#
#   LEASEHOLD_BIN=/path/to/leasehold clients/opencode/test.sh
#
# Needs the TypeScript client built (clients/typescript/test.sh or its
# `npm run build`): it is linked from ../typescript; built here if missing.
# LEASEHOLD_OPENCODE_RUNS: seeded runs per variant (default 3).
set -euo pipefail
cd "$(dirname "$0")"

if [[ -z "${LEASEHOLD_BIN:-}" || ! -x "${LEASEHOLD_BIN}" ]]; then
  echo "test.sh: LEASEHOLD_BIN must name the leasehold server binary" >&2
  exit 2
fi
export LEASEHOLD_BIN="$(cd "$(dirname "$LEASEHOLD_BIN")" && pwd)/$(basename "$LEASEHOLD_BIN")"

../typescript/setup.sh
if [[ ! -f ../typescript/dist/index.js ]]; then
  (cd ../typescript && npm run --silent build)
fi
./setup.sh
echo "== build"
npm run --silent build
echo "== typecheck and build the tests"
npm run --silent build:test
echo "== test"
node --test --test-concurrency=1 dist-test/test/*.test.js
