#!/usr/bin/env bash
# The TypeScript client's checks: install from the lockfile (setup.sh), generated code
# up to date with the proto, build, type check, and the test suite against a
# real server.
#
#   LEASEHOLD_BIN=/path/to/leasehold clients/typescript/test.sh
#
# LEASEHOLD_BIN (required): the leasehold server binary the tests start.
# LEASEHOLD_TEST_PG_URL (optional): a PostgreSQL URL for the storage-fence
#   tests, e.g. postgres://postgres@127.0.0.1:5432/test; skipped when unset.
set -euo pipefail
cd "$(dirname "$0")"

if [[ -z "${LEASEHOLD_BIN:-}" ]]; then
  echo "test.sh: LEASEHOLD_BIN is not set; point it at the leasehold server binary" >&2
  exit 2
fi
if [[ ! -x "$LEASEHOLD_BIN" ]]; then
  echo "test.sh: LEASEHOLD_BIN=$LEASEHOLD_BIN is not an executable file" >&2
  exit 2
fi
export LEASEHOLD_BIN="$(cd "$(dirname "$LEASEHOLD_BIN")" && pwd)/$(basename "$LEASEHOLD_BIN")"

./setup.sh
echo "== gen:check"
npm run --silent gen:check
echo "== build"
npm run --silent build
echo "== typecheck and build the tests"
# build:test type-checks src and test under tsconfig.test.json (tsc fails on
# any type error even as it emits): `npm run typecheck` is the same check.
npm run --silent build:test
echo "== test"
node --test --test-concurrency=1 dist-test/test/*.test.js
