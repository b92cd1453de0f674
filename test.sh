#!/usr/bin/env bash
# Every test of leasehold, in one command: the Rust workspace (cargo test),
# then the Python and TypeScript clients against a real server binary built
# here. Installs what the client suites need (a venv for Python, `npm ci`
# for TypeScript); needs only cargo, python3 and node/npm on the machine.
#
# PostgreSQL-backed tests read LEASEHOLD_TEST_POSTGRES (the Rust suites) and
# LEASEHOLD_TEST_PG_URL (the clients' storage-fence tests); both default to
# the local server at 127.0.0.1:5432, user postgres, database test.
set -euo pipefail
cd "$(dirname "$0")"

export LEASEHOLD_TEST_POSTGRES="${LEASEHOLD_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
export LEASEHOLD_TEST_PG_URL="${LEASEHOLD_TEST_PG_URL:-$LEASEHOLD_TEST_POSTGRES}"

echo "== cargo test (every crate of the workspace)"
cargo test --locked

# The same debug build the Rust tests used: no second compile.
echo "== the server binary for the client suites"
cargo build --locked -p leasehold-server --bin leasehold
export LEASEHOLD_BIN="$PWD/target/debug/leasehold"

for client in python typescript; do
  if [[ -x "clients/$client/test.sh" ]]; then
    echo "== clients/$client"
    "clients/$client/test.sh"
  fi
done
