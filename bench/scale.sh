#!/usr/bin/env bash
# Scale: 1,000,000 live leases in one leasehold server.
#
# Starts leasehold on a fresh database under a temp dir, runs
# `leasehold-bench --mode scale` (loads LEASES leases, EXPIRING of them ending
# at one instant, and times Acquire around that instant), then reports the
# server's resident memory, stops it, and times a restart on the same file
# (until it listens again). The server is stopped by its PID on exit.
#
# Environment (all optional): LEASES=1000000 EXPIRING=100000 CLIENTS=64
# PROBE_CLIENTS=8 KEEP=1 (keep the temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-scale.XXXXXX")
LEASES=${LEASES:-1000000}
EXPIRING=${EXPIRING:-100000}
CLIENTS=${CLIENTS:-64}
PROBE_CLIENTS=${PROBE_CLIENTS:-8}

# shellcheck source=bench/peers.sh
source "$ROOT/bench/peers.sh"

cleanup() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "building leasehold (release)"
(cd "$ROOT" && cargo build --release --quiet)
TARGET_DIR=$("$ROOT/scripts/cargo-target-dir")
BIN="$TARGET_DIR/release/leasehold"
BENCH="$TARGET_DIR/release/leasehold-bench"
DB="$WORK/leasehold/leasehold.db"

start_leasehold "$DB"
log "loading $LEASES leases ($EXPIRING expiring at once) with $CLIENTS clients"
"$BENCH" --mode scale --leases "$LEASES" --expiring "$EXPIRING" --clients "$CLIENTS" \
  --probe-clients "$PROBE_CLIENTS" --json >"$WORK/scale.json"
rss_loaded=$(rss_kib "$LEASEHOLD_PID")

log "stopping the server (SIGTERM) and restarting it on the same file"
kill -TERM "$LEASEHOLD_PID"
wait "$LEASEHOLD_PID" 2>/dev/null || true
PIDS=()
db_bytes=$(du -cb "$DB"* | tail -1 | cut -f1)
t0=$(date +%s.%N)
start_leasehold "$DB"
t1=$(date +%s.%N)
rss_restarted=$(rss_kib "$LEASEHOLD_PID")

echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
echo "bench: $(cat "$WORK/scale.json")"
awk -v l="$LEASES" -v a="$rss_loaded" -v r="$rss_restarted" -v d="$db_bytes" -v t0="$t0" -v t1="$t1" 'BEGIN {
  printf "leases: %d\n", l
  printf "server RSS after load and expiry: %.0f MiB (%.0f bytes a lease)\n", a / 1024, a * 1024 / l
  printf "database size: %.0f MiB\n", d / 1048576
  printf "restart until listening: %.2f s\n", t1 - t0
  printf "server RSS after restart: %.0f MiB\n", r / 1024
}'
