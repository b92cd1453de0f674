#!/usr/bin/env bash
# Measures leasehold against ZooKeeper and etcd in one run, on this machine.
#
# Installs etcd and ZooKeeper from Debian's packages if they are missing,
# starts all three single-node on loopback with their data under a temp dir,
# runs `leasehold-bench` against each (cycle, hot, renew, check at 1, 16 and
# 64 clients), ROUNDS rounds interleaved, and prints a Markdown table with the
# median ops/s, median p99 and the median per-round ratio of each row. Every
# server it started is stopped by its PID on exit.
#
# Environment (all optional):
#   ROUNDS=3  DURATION=10  WARMUP=2  CLIENTS="1 16 64"  MODES="cycle hot renew check"
#   CONNECTIONS=N   share N connections among the clients (default: one each)
#   STREAM=1        leasehold cycle/renew/check over its Session stream (as
#                   etcd's keep-alive already is) instead of unary calls
#   KEEP=1          keep the temp dir (raw JSON lines in results.jsonl, logs)
#   OUT=FILE        also copy results.jsonl there
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-compare.XXXXXX")
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CLIENTS=${CLIENTS:-"1 16 64"}
MODES=${MODES:-"cycle hot renew check"}

# shellcheck source=bench/peers.sh
source "$ROOT/bench/peers.sh"

cleanup() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

install_peers
log "building leasehold and leasehold-bench (release, --features peers)"
build_leasehold
start_leasehold
start_etcd
start_zookeeper
log "servers up: leasehold $LEASEHOLD_PID, etcd $ETCD_PID, zookeeper $ZOOKEEPER_PID; data in $WORK"

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
conn_flag=()
[ -n "${CONNECTIONS:-}" ] && conn_flag=(--connections "$CONNECTIONS")
stream_flag=()
[ "${STREAM:-0}" = 1 ] && stream_flag=(--stream)

for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    for clients in $CLIENTS; do
      for target in leasehold zookeeper etcd; do
        [ "$target" = zookeeper ] && [ "$mode" = renew ] && continue
        log "round $round: $target $mode, $clients clients"
        extra=()
        [ "$target" = leasehold ] && extra=("${stream_flag[@]}")
        if ! "$BENCH" --target "$target" --mode "$mode" --clients "$clients" \
          "${conn_flag[@]}" "${extra[@]}" --duration-secs "$DURATION" --warmup-secs "$WARMUP" \
          --label "$round" --json >>"$RESULTS" 2>>"$WORK/bench.log"; then
          log "  failed (see $WORK/bench.log)"
        fi
      done
    done
  done
done

[ -n "${OUT:-}" ] && cp "$RESULTS" "$OUT"
echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
echo "Each server single-node on loopback; client on the same machine; ${ROUNDS} rounds of ${DURATION} s (after ${WARMUP} s warm-up), interleaved."
echo "Connections: ${CONNECTIONS:-one per client}. Ratios: leasehold ops/s over the peer's, median of the per-round ratios."
echo
"$BENCH" --summarize "$RESULTS"
