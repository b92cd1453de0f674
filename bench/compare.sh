#!/usr/bin/env bash
# Measures leasehold against ZooKeeper and etcd in one run, on this machine.
#
# Installs etcd and ZooKeeper from Debian's packages if they are missing,
# starts all three single-node on loopback with their data under a temp dir,
# runs `leasehold-bench` against each (cycle, hot, renew, check at 1, 16 and
# 64 clients), ROUNDS rounds interleaved, and prints a Markdown table with the
# median ops/s, median p99 and the median per-round ratio of each row, then
# the one-client cycle's p50 against the floor of two fdatasyncs measured on
# the database's disk in the same rounds. Every server it started is stopped
# by its PID on exit.
#
# Leasehold runs once per shape (see `leasehold-bench --help`, `--shape`):
#   unary      each client one unary call at a time (a generated stub)
#   session    each client a Session stream of its own, one operation in flight
#   pipelined  the clients of a connection share its Session stream (the Rust
#              client's multiplexer)
# Each peer runs once per row, its clients one operation at a time over the
# same number of shared connections (ZooKeeper sessions, etcd clients), and
# every shape's row is compared with that run.
#
# Environment (all optional):
#   ROUNDS=3  DURATION=10  WARMUP=2  CLIENTS="1 16 64"  MODES="cycle hot renew check"
#   SHAPES="unary session pipelined"   leasehold's shapes, each its own row
#   CONNECTIONS=8   connections the clients share; CONNECTIONS=each: one per client
#   LEASEHOLD_SERVE_ARGS=""   extra flags for `leasehold serve` (e.g. "--writer-spin-us 400")
#   PIN=0:1         servers on CPU 0, the load generator on CPU 1 (taskset lists)
#   STREAM=1        only the pipelined shape (SHAPES=pipelined), as before shapes
#   PEERS="zookeeper etcd"   the peers to run (PEERS="": leasehold alone)
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
if [ "${STREAM:-0}" = 1 ]; then SHAPES=${SHAPES:-pipelined}; fi
SHAPES=${SHAPES:-"unary session pipelined"}
CONNECTIONS=${CONNECTIONS:-8}
PEERS=${PEERS-"zookeeper etcd"}

# shellcheck source=bench/peers.sh
source "$ROOT/bench/peers.sh"

cleanup() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -n "$PEERS" ] && install_peers
log "building leasehold and leasehold-bench (release, --features peers)"
build_leasehold
start_leasehold
for peer in $PEERS; do "start_$peer"; done
log "servers up: leasehold $LEASEHOLD_PID, peers: ${PEERS:-none}; data in $WORK"

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
conn_flag=()
[ "$CONNECTIONS" != each ] && conn_flag=(--connections "$CONNECTIONS")

# One run of the bench; a failure is logged and the run goes on.
run_bench() {
  local what=$1
  shift
  log "round $round: $what"
  if ! "${PIN_BENCH[@]}" "$BENCH" "$@" "${conn_flag[@]}" --duration-secs "$DURATION" --warmup-secs "$WARMUP" \
    --label "$round" --json >>"$RESULTS" 2>>"$WORK/bench.log"; then
    log "  failed (see $WORK/bench.log)"
  fi
}

for round in $(seq "$ROUNDS"); do
  # The one-client cycle's floor: two fdatasyncs on the database's disk.
  case " $MODES " in *" cycle "*)
    run_bench "fsync floor" --mode fsync --fsync-dir "$WORK/leasehold" ;;
  esac
  for mode in $MODES; do
    for clients in $CLIENTS; do
      for shape in $SHAPES; do
        run_bench "leasehold $mode ($shape), $clients clients" \
          --target leasehold --shape "$shape" --mode "$mode" --clients "$clients"
      done
      for peer in $PEERS; do
        [ "$peer" = zookeeper ] && [ "$mode" = renew ] && continue
        run_bench "$peer $mode, $clients clients" --target "$peer" --mode "$mode" --clients "$clients"
      done
    done
  done
done

[ -n "${OUT:-}" ] && cp "$RESULTS" "$OUT"
echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%Y-%m-%d)"
echo "Each server single-node on loopback; client on the same machine${PIN:+ (servers pinned to CPUs ${PIN%%:*}, the load generator to ${PIN#*:})}; ${ROUNDS} rounds of ${DURATION} s (after ${WARMUP} s warm-up), interleaved."
echo "Connections: $CONNECTIONS (shared by the clients; \"each\": one per client). Leasehold shapes: $SHAPES. Ratios: leasehold ops/s over the peer's, median of the per-round ratios."
echo
"$BENCH" --summarize "$RESULTS"
