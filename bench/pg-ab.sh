#!/usr/bin/env bash
# The PostgreSQL backend's lock cycle (or renew) for two leasehold builds and
# the hand-written lease row, interleaved, with what each costs the database.
#
#   bench/pg-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]
#
# Each round runs, in turn, one `leasehold serve --store $PG` of each build
# (a fresh schema, dropped after) and `leasehold-bench --target pgrow`, with
# the same clients and mode, and prints one line per run: ops/s, p99, and per
# operation the database's transactions (pg_stat_database.xact_commit) and
# WAL bytes (pg_current_wal_lsn()) over the whole run (warm-up included,
# divided by the operations of the whole run, estimated from the rate), and
# the CPU each process used (every PostgreSQL process on this host, the
# leasehold server, the load generator), and the load average. The servers
# are stopped by their PIDs on exit.
#
# Environment (all optional): PG=postgres://postgres@127.0.0.1:5432/test
# ROUNDS=3 CLIENTS=64 MODE=cycle SHAPE=unary CONNECTIONS=8 DURATION=5
# WARMUP=1 ROW_CONNECTIONS=16 TARGETS="before after row" SERVE_ARGS=""
# WALINSPECT=1: also print, on stderr, where each leasehold run's WAL went
# (pg_walinspect, by relation and record type, per operation), read before
# its schema is dropped. Other sessions writing to the database meanwhile
# count too.
set -euo pipefail

BEFORE=${1:?usage: bench/pg-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]}
AFTER=${2:?usage: bench/pg-ab.sh BEFORE_BIN AFTER_BIN [BENCH_BIN]}
BENCH=${3:-$(dirname "$AFTER")/leasehold-bench}
PG=${PG:-postgres://postgres@127.0.0.1:5432/test}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-64}
MODE=${MODE:-cycle}
SHAPE=${SHAPE:-unary}
CONNECTIONS=${CONNECTIONS:-8}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
ROW_CONNECTIONS=${ROW_CONNECTIONS:-16}
TARGETS=${TARGETS:-before after row}
SCHEMA=lh_bench_pg_ab
PORT=${PORT:-7491}
SERVE_ARGS=${SERVE_ARGS:-}
WALINSPECT=${WALINSPECT:-}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/leasehold-pg-ab.XXXXXX")
SERVER=""

cleanup() {
  if [ -n "$SERVER" ] && kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  psql -qX "$PG" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true
  # The hand-written row's schema (leasehold-bench --target pgrow makes it).
  psql -qX "$PG" -c "DROP SCHEMA IF EXISTS leasehold_bench_row CASCADE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Transactions committed in the database so far, and the WAL position.
counters() {
  psql -qXAt "$PG" -c "SELECT xact_commit, pg_current_wal_lsn() FROM pg_stat_database WHERE datname = current_database()"
}

# CPU ticks PostgreSQL has used: every live postgres process, plus what
# the postmaster (the oldest) reaped from backends that exited meanwhile.
# Empty when no PostgreSQL runs on this host.
pg_ticks() {
  local postmaster
  postmaster=$(pgrep -o -x postgres) || return 0
  {
    for pid in $(pgrep -x postgres); do awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null; done
    awk '{print $16 + $17}' "/proc/$postmaster/stat"
  } | awk '{s += $1} END {print s}'
}

# CPU ticks process $1 has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

start_server() {
  psql -qX "$PG" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1
  # shellcheck disable=SC2086
  "$1" serve --store "$PG" --pg-schema "$SCHEMA" --listen "127.0.0.1:$PORT" $SERVE_ARGS \
    >"$WORK/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 100); do
    grep -q '^listening on' "$WORK/server.log" && return 0
    sleep 0.1
  done
  echo "the server did not start:" >&2
  cat "$WORK/server.log" >&2
  exit 1
}

stop_server() {
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
  psql -qX "$PG" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1
}

# WAL since $1 by relation (the first block a record touches) and record
# type, per operation of a run of $2 ops/s: on stderr.
wal_breakdown() {
  psql -qX "$PG" -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null
  echo "WAL by relation and record type, per operation (round $round, $target):" >&2
  psql -qXA -F $'\t' "$PG" >&2 <<SQL
WITH r AS (
    SELECT resource_manager || '/' || record_type AS kind, record_length, fpi_length,
           (regexp_match(block_ref, 'rel \\d+/\\d+/(\\d+)'))[1]::oid AS filenode
    FROM pg_get_wal_records_info('$1', pg_current_wal_lsn())),
ops AS (SELECT $2::float8 * ($DURATION + $WARMUP) AS n)
SELECT coalesce(c.relname, '-') AS relation, r.kind,
       round((count(*) / ops.n)::numeric, 2) AS records_per_op,
       round((sum(r.record_length) / ops.n)::numeric) AS bytes_per_op,
       round((sum(r.fpi_length) / ops.n)::numeric) AS fpi_bytes_per_op
FROM r CROSS JOIN ops
LEFT JOIN pg_class c ON c.relfilenode = r.filenode AND c.relnamespace IN
     (SELECT oid FROM pg_namespace WHERE nspname IN ('$SCHEMA', 'pg_catalog'))
GROUP BY 1, 2, ops.n ORDER BY sum(r.record_length) DESC LIMIT 30;
SQL
}

printf 'round\ttarget\tclients\tops/s\tp99_ms\txacts/op\twal_bytes/op\tpg_us/op\tserver_us/op\tbench_us/op\tload\n'
TIMEFORMAT='%U %S'
for round in $(seq "$ROUNDS"); do
  for target in $TARGETS; do
    common=(--mode "$MODE" -c "$CLIENTS" --duration-secs "$DURATION" --warmup-secs "$WARMUP" --json)
    case $target in
      before | after)
        bin=$BEFORE
        [ "$target" = after ] && bin=$AFTER
        start_server "$bin"
        read -r xacts0 lsn0 < <(counters | tr '|' ' ')
        pg0=$(pg_ticks)
        server0=$(ticks "$SERVER")
        { time "$BENCH" --server "http://127.0.0.1:$PORT" --shape "$SHAPE" \
          --connections "$CONNECTIONS" "${common[@]}" >"$WORK/out.json"; } 2>"$WORK/time"
        server_ticks=$(($(ticks "$SERVER") - server0))
        pg1=$(pg_ticks)
        if [ -n "$WALINSPECT" ]; then
          wal_breakdown "$lsn0" "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ops_per_sec"])' "$WORK/out.json")"
        fi
        stop_server
        ;;
      row)
        read -r xacts0 lsn0 < <(counters | tr '|' ' ')
        pg0=$(pg_ticks)
        { time "$BENCH" --target pgrow --pg "$PG" --connections "$ROW_CONNECTIONS" \
          "${common[@]}" >"$WORK/out.json"; } 2>"$WORK/time"
        server_ticks=""
        sleep 0.2 # the row's backends exit with it: let the postmaster reap them
        pg1=$(pg_ticks)
        ;;
    esac
    sleep 1 # let the backends that closed report their counts
    read -r xacts1 lsn1 < <(counters | tr '|' ' ')
    wal=$(psql -qXAt "$PG" -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
    load=$(cut -d' ' -f1 /proc/loadavg)
    pg_ticks_run=""
    [ -n "$pg0" ] && [ -n "$pg1" ] && pg_ticks_run=$((pg1 - pg0))
    python3 - "$WORK/out.json" "$round" "$target" "$((xacts1 - xacts0))" "$wal" "$load" "$DURATION" "$WARMUP" \
      "$pg_ticks_run" "$server_ticks" "$(tail -1 "$WORK/time")" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
path, rnd, target, xacts, wal, load, dur, warm, pg, server, bench, hz = sys.argv[1:]
r = json.load(open(path))
total = r["ops_per_sec"] * (float(dur) + float(warm)) or 1
# CPU per operation over the whole run (warm-up included, like the rest).
def per_op(ticks):
    return f'{float(ticks) / float(hz) * 1e6 / total:.0f}' if ticks else '-'
bench_s = sum(float(x) for x in bench.split()) if bench.strip() else 0.0
print(f'{rnd}\t{target}\t{r["clients"]}\t{r["ops_per_sec"]:.0f}\t{r["latency_ms"]["p99"]:.1f}'
      f'\t{int(xacts) / total:.2f}\t{float(wal) / total:.0f}'
      f'\t{per_op(pg)}\t{per_op(server)}\t{bench_s * 1e6 / total:.0f}\t{load}'
      + (f'\terrors={r["errors"]}' if r["errors"] else ''))
EOF
  done
done
