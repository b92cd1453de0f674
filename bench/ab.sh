#!/usr/bin/env bash
# Interleaved A/B of leasehold builds (or settings) against the SQLite store,
# each run on a fresh server and database file, with medians at the end.
#
#   bench/ab.sh ROUNDS "DIR_A DIR_B ..." "SHAPE:CLIENTS ..." [MODE]
#
# Each DIR holds a `leasehold` (a binary, or a script that execs one with
# extra `serve` flags: `exec /path/leasehold "$@" --writer-spin-us 0`) and a
# `leasehold-bench`. Every round runs every case with every DIR in turn: a
# `leasehold serve` on a new file, then `leasehold-bench --mode MODE --shape
# SHAPE -c CLIENTS --connections 8` for DURATION (default 4) seconds after a
# 1 s warm-up. It prints one line per run (ops/s, p99, the share of CPU the
# hypervisor stole meanwhile, the server's CPU seconds and its commits) and
# the median ops/s of each case and DIR. Loopback only; the servers are
# stopped by their PIDs.
set -euo pipefail

ROUNDS=${1:?usage: bench/ab.sh ROUNDS "DIRS" "SHAPE:CLIENTS ..." [MODE]}
DIRS=${2:?usage}
CASES=${3:?usage}
MODE=${4:-cycle}
DURATION=${DURATION:-4}
PORT=${PORT:-7433}
METRICS_PORT=${METRICS_PORT:-7435}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-ab.XXXXXX")
SERVER=""
cleanup() {
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
commits() {
  curl -s "127.0.0.1:$METRICS_PORT/metrics" | awk '/^leasehold_commits_total/ {print $2}'
}

# One run; prints "ops p99 steal% server_cpu_s commits".
run() {
  local dir=$1 shape=$2 clients=$3
  rm -f "$WORK"/db*
  "$dir/leasehold" serve --db "$WORK/db.sqlite" --listen "127.0.0.1:$PORT" \
    --metrics-listen "127.0.0.1:$METRICS_PORT" >"$WORK/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do
    curl -sf "127.0.0.1:$METRICS_PORT/metrics" >/dev/null 2>&1 && break
    sleep 0.05
  done
  local c0 t0 s0 s1 c1 t1 out
  c0=$(commits)
  t0=$(cpu_ticks "$SERVER")
  read -ra s0 < <(head -1 /proc/stat)
  out=$("$dir/leasehold-bench" --server "http://127.0.0.1:$PORT" --mode "$MODE" \
    --shape "$shape" -c "$clients" --connections 8 --duration-secs "$DURATION" \
    --warmup-secs 1 2>&1 | grep "ops/s" || true)
  read -ra s1 < <(head -1 /proc/stat)
  t1=$(cpu_ticks "$SERVER")
  c1=$(commits)
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + s1[i] - s0[i])); done
  local steal=$((100 * (s1[8] - s0[8]) / (total > 0 ? total : 1)))
  local ops p99
  ops=$(grep -oE "ops/s= *[0-9]+" <<<"$out" | grep -oE "[0-9]+$" || echo 0)
  p99=$(grep -oE "p99=[0-9.]+ms" <<<"$out" || echo "p99=?")
  echo "$ops $p99 steal=${steal}% server_cpu=$(((t1 - t0)))/$(getconf CLK_TCK)s commits=$((c1 - c0))"
}

declare -A RESULTS
for round in $(seq "$ROUNDS"); do
  for case in $CASES; do
    shape=${case%:*}
    clients=${case#*:}
    for dir in $DIRS; do
      line=$(run "$dir" "$shape" "$clients")
      echo "round $round $MODE $shape $clients $(basename "$dir"): $line"
      RESULTS["$case $dir"]+="${line%% *} "
    done
  done
done
echo "--- median ops/s"
for case in $CASES; do
  for dir in $DIRS; do
    values=${RESULTS["$case $dir"]}
    median=$(tr ' ' '\n' <<<"$values" | grep . | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
    echo "$case $(basename "$dir"): $median  (all: $values)"
  done
done
