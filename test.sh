#!/usr/bin/env bash
# Every test of leasehold, in one command: the Python and TypeScript clients
# against a real server binary built here, then the Rust workspace (cargo
# test). Installs what the client suites need (a venv for Python, `npm ci`
# for TypeScript); needs only cargo, python3 and node/npm on the machine.
#
# PostgreSQL-backed tests read LEASEHOLD_TEST_POSTGRES (the Rust suites) and
# LEASEHOLD_TEST_PG_URL (the clients' storage-fence tests); both default to
# the local server at 127.0.0.1:5432, user postgres, database test.
set -euo pipefail
cd "$(dirname "$0")"

export LEASEHOLD_TEST_POSTGRES="${LEASEHOLD_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
export LEASEHOLD_TEST_PG_URL="${LEASEHOLD_TEST_PG_URL:-$LEASEHOLD_TEST_POSTGRES}"

# Build every Rust test target first (the server binary included), so the
# client suites can run against it before the Rust tests themselves: those
# include the chaos runs, which add worker processes on the Python and
# TypeScript clients once those are installed and built.
echo "== cargo build (every test target of the workspace)"
cargo test --locked --no-run
export LEASEHOLD_BIN="$PWD/target/debug/leasehold"

for client in python typescript; do
  if [[ -x "clients/$client/test.sh" ]]; then
    echo "== clients/$client"
    "clients/$client/test.sh"
  fi
done

# The chaos short runs add a Python worker and two TypeScript workers (one
# per transport) on the clients just installed and built.
if [[ -x clients/python/.venv/bin/python ]]; then
  export LEASEHOLD_CHAOS_PYTHON="$PWD/clients/python/.venv/bin/python"
fi
if [[ -f clients/typescript/dist/index.js ]] && command -v node >/dev/null; then
  LEASEHOLD_CHAOS_NODE="$(command -v node)"
  export LEASEHOLD_CHAOS_NODE
fi
echo "== cargo test (every crate of the workspace)"
cargo test --locked
