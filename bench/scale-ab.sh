#!/usr/bin/env bash
# The mass-expiry tail of two leasehold builds, interleaved in one run.
#
#   bench/scale-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]
#
# For each round, starts each server binary in turn on a fresh database under
# a temp dir, runs `leasehold-bench --mode scale` against it (LEASES live
# leases, EXPIRING of them ending at one instant, Acquire timed around that
# instant by PROBE_CLIENTS clients), stops it, and prints one line per run:
# Acquire p50/p99/max within [expiry - 0.5 s, expiry + 3 s] and the p99 and
# max before it, and how many of the writer's commits took over 50 ms (from
# the server's metrics). Then the per-round ratio of the max (before / after)
# and their median. The servers are stopped by their PIDs on exit.
#
# Environment (all optional): ROUNDS=2 LEASES=200000 EXPIRING=100000
# CLIENTS=64 PROBE_CLIENTS=8 KEEP=1 (keep the temp dir).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-scale-ab.XXXXXX")
BEFORE=${1:?usage: bench/scale-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]}
AFTER=${2:?usage: bench/scale-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]}
BENCH=${3:-$(dirname "$AFTER")/leasehold-bench}
ROUNDS=${ROUNDS:-2}
LEASES=${LEASES:-200000}
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

: >"$WORK/runs.tsv"
for round in $(seq "$ROUNDS"); do
  for which in before after; do
    BIN=$BEFORE
    [ "$which" = after ] && BIN=$AFTER
    db="$WORK/$which-$round/leasehold.db"
    mkdir -p "$(dirname "$db")"
    "$BIN" serve --listen 127.0.0.1:7420 --metrics-listen 127.0.0.1:7421 --db "$db" \
      >"$WORK/leasehold.out" 2>"$WORK/leasehold.log" &
    PIDS+=("$!")
    wait_port 7420 leasehold
    log "round $round, $which: $LEASES leases, $EXPIRING expiring at once"
    "$BENCH" --mode scale --leases "$LEASES" --expiring "$EXPIRING" --clients "$CLIENTS" \
      --probe-clients "$PROBE_CLIENTS" --json >"$WORK/$which-$round.json" 2>>"$WORK/bench.log"
    # The writer's commit times (the checkpoint, if the writer runs it, is in them).
    python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:7421/metrics").read().decode())' \
      >"$WORK/$which-$round.metrics"
    stop_all
    python3 - "$round" "$which" "$WORK/$which-$round.json" "$WORK/$which-$round.metrics" >>"$WORK/runs.tsv" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[3]))
w, b = r["latency_ms"], r["details"]["acquire_before_expiry_ms"]
buckets = {}
for line in open(sys.argv[4]):
    m = re.match(r'leasehold_commit_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
    if m:
        buckets[m.group(1)] = int(m.group(2))
over = buckets.get("+Inf", 0) - buckets.get("0.05", 0)
print(f'{sys.argv[1]}\t{sys.argv[2]}\t{w["p50"]}\t{w["p99"]}\t{w["max"]}\t{b["p99"]}\t{b["max"]}\t{r["errors"]}\t{buckets.get("+Inf", 0)}\t{over}')
PY
  done
done

echo
echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "$LEASES leases, $EXPIRING expiring at once; Acquire latency (ms) within [expiry - 0.5 s, expiry + 3 s]"
echo
python3 - "$WORK/runs.tsv" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
print("| round | build | p50 | p99 | max | p99 before | max before | errors | commits | commits > 50 ms |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print("| " + " | ".join(r) + " |")
ratios = []
for rnd in sorted({r[0] for r in rows}):
    m = {r[1]: float(r[4]) for r in rows if r[0] == rnd}
    if m.get("after"):
        ratios.append(m["before"] / m["after"])
if ratios:
    print(f"\nmax before / max after, per round: {', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}")
PY
