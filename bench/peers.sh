# Shared helpers for bench/compare.sh and bench/scale.sh: install and start
# the servers on loopback, with data under $WORK, and stop each by its PID.
# Source it; it expects ROOT (the repository) and WORK (a temp dir) to be set.

PIDS=()

# PIN="SERVER_CPUS:BENCH_CPUS" (taskset lists, e.g. PIN=0:1): every server
# runs on the first CPUs and the load generator on the others, so the two
# do not compete for cores. Unset: nothing is pinned.
PIN_SERVER=()
PIN_BENCH=()
if [ -n "${PIN:-}" ]; then
  PIN_SERVER=(taskset -c "${PIN%%:*}")
  PIN_BENCH=(taskset -c "${PIN#*:}")
fi

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  done
  PIDS=()
}

# Waits until something accepts TCP connections on 127.0.0.1:$1.
wait_port() {
  local port=$1 name=$2
  for _ in $(seq 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "$name did not open port $port; see $WORK/$name.log"
  return 1
}

install_peers() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  [ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} from Debian's packages"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # The Debian packages start system services on install; ours must own the ports.
  for unit in etcd zookeeper; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$unit" 2>/dev/null; then
      log "stopping the system $unit service (it holds the port)"
      systemctl stop "$unit" || true
    fi
  done
}

# Builds the leasehold binary with the peers' clients (etcd-client compiles
# its protos and needs protoc: use one on PATH, or the one cargo vendored).
build_leasehold() {
  if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null; then
    (cd "$ROOT" && cargo fetch --quiet)
    PROTOC=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/protoc-bin-vendored-linux-x86_64-*/bin/protoc 2>/dev/null | head -1)
    if [ -z "$PROTOC" ]; then
      log "no protoc found; installing protobuf-compiler"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null
      PROTOC=$(command -v protoc)
    fi
    export PROTOC
  fi
  (cd "$ROOT" && cargo build --release --quiet -p leasehold-server && cargo build --release --quiet -p leasehold-bench --features peers)
  local target_dir
  target_dir=$("$ROOT/scripts/cargo-target-dir")
  BIN="$target_dir/release/leasehold"
  BENCH="$target_dir/release/leasehold-bench"
}

start_leasehold() {
  local db=${1:-$WORK/leasehold/leasehold.db}
  mkdir -p "$(dirname "$db")"
  # LEASEHOLD_SERVE_ARGS: extra `serve` flags (e.g. "--writer-spin-us 400").
  # shellcheck disable=SC2086
  "${PIN_SERVER[@]}" "$BIN" serve --listen 127.0.0.1:7420 --db "$db" ${LEASEHOLD_SERVE_ARGS:-} \
    >"$WORK/leasehold.out" 2>"$WORK/leasehold.log" &
  LEASEHOLD_PID=$!
  PIDS+=("$LEASEHOLD_PID")
  wait_port 7420 leasehold
}

start_etcd() {
  mkdir -p "$WORK/etcd"
  "${PIN_SERVER[@]}" etcd --name bench --data-dir "$WORK/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster bench=http://127.0.0.1:2380 \
    --auto-compaction-mode revision --auto-compaction-retention 10000 \
    --logger zap --log-outputs "$WORK/etcd.log" &
  ETCD_PID=$!
  PIDS+=("$ETCD_PID")
  wait_port 2379 etcd
}

start_zookeeper() {
  mkdir -p "$WORK/zookeeper/data"
  # maxClientCnxns=0: the default (60 per address) would refuse 64 clients on loopback.
  cat >"$WORK/zookeeper/zoo.cfg" <<EOF
tickTime=2000
dataDir=$WORK/zookeeper/data
clientPort=2181
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok
EOF
  "${PIN_SERVER[@]}" java -Dzookeeper.log.dir="$WORK" -Dzookeeper.root.logger=WARN,CONSOLE \
    -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$WORK/zookeeper/zoo.cfg" \
    >"$WORK/zookeeper.log" 2>&1 &
  ZOOKEEPER_PID=$!
  PIDS+=("$ZOOKEEPER_PID")
  wait_port 2181 zookeeper
}

# VmRSS of a process, in KiB.
rss_kib() {
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}
