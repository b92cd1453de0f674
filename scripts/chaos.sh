#!/usr/bin/env bash
# The long chaos run (issue 17, part 2): the real server under kill -9,
# SIGSTOP, wall-clock jumps, a delaying/partitioning/cutting proxy (and, on PostgreSQL, two
# servers on one database with a proxy to the database), then the history
# check. Prints the fault counts and the verdict; exit 0 when clean.
#
#   scripts/chaos.sh                         # 30 minutes on SQLite
#   scripts/chaos.sh --minutes 5 --backend postgres
#   scripts/chaos.sh --minutes 30 --backend sqlite --dir /tmp/chaos-run   # keep files + history.json
#   scripts/chaos.sh --backend private-postgres    # a cluster of its own, crashed and restarted too
#   scripts/chaos.sh --python clients/python/.venv/bin/python   # plus a worker on the Python client
#                                                  # (the venv clients/python/test.sh creates)
#   scripts/chaos.sh --node "$(command -v node)"   # plus two workers on the TypeScript client
#                                                  # (after `npm ci && npm run build` in clients/typescript)
#   scripts/chaos.sh --minutes 2 --fault wall      # only the faults whose name starts with "wall"
#   "$(scripts/cargo-target-dir)"/release/leasehold-chaos --check /tmp/chaos-run/history.json     # re-check a kept history
#
# PostgreSQL: --pg-url, else LEASEHOLD_TEST_PG_URL, else
# postgres://postgres@127.0.0.1:5432/test (a schema of the run's own is
# created and dropped). Builds in release mode first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --release -p leasehold-server --bin leasehold -p leasehold-chaos --bin leasehold-chaos
target_dir="$(scripts/cargo-target-dir)"
export LEASEHOLD_BIN="${LEASEHOLD_BIN:-$target_dir/release/leasehold}"
has_minutes=0
for arg in "$@"; do [[ "$arg" == --minutes* ]] && has_minutes=1; done
if [[ $has_minutes == 0 ]]; then set -- --minutes 30 "$@"; fi
exec "$target_dir/release/leasehold-chaos" "$@"
