#!/usr/bin/env bash
# Every test of leasehold, in one command: the Python and TypeScript clients
# against a real server binary built here, then the Rust workspace (cargo
# test). Installs what the client suites need (a venv for Python, `npm ci`
# for TypeScript and for the OpenCode plugin, whose tests run the pinned
# `opencode serve`); needs only cargo, python3 and node/npm on the machine.
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
# The clients' installs (pip downloads, npm ci compiling better-sqlite3) run
# in the background while cargo builds; each is a no-op when already current.
started=$SECONDS
phase() { echo "== $1 (at $((SECONDS - started)) s)"; }
setup_pids=()
setup_logs=()
for client in python typescript opencode; do
  if [[ -x "clients/$client/setup.sh" ]]; then
    log="$(mktemp "${TMPDIR:-/tmp}/leasehold-setup-$client.XXXXXX")"
    "clients/$client/setup.sh" >"$log" 2>&1 &
    setup_pids+=("$!")
    setup_logs+=("$log")
  fi
done

phase "cargo build (every test target of the workspace)"
cargo test --locked --no-run
# Where cargo put it: CARGO_TARGET_DIR (or a config's build.target-dir)
# moves the whole target directory.
LEASEHOLD_BIN="$(scripts/cargo-target-dir)/debug/leasehold"
export LEASEHOLD_BIN
if [[ ! -x "$LEASEHOLD_BIN" ]]; then
  echo "test.sh: cargo built no server binary at $LEASEHOLD_BIN" >&2
  exit 1
fi
echo "== the clients' server binary: $LEASEHOLD_BIN"

for i in "${!setup_pids[@]}"; do
  if ! wait "${setup_pids[$i]}"; then
    cat "${setup_logs[$i]}" >&2
    echo "test.sh: a client's setup failed (its output is above)" >&2
    exit 1
  fi
  cat "${setup_logs[$i]}"
  rm -f "${setup_logs[$i]}"
done

# opencode (the OpenCode plugin) comes after typescript: it links the
# TypeScript client and uses the dist/ that phase builds.
for client in python typescript opencode; do
  if [[ -x "clients/$client/test.sh" ]]; then
    phase "clients/$client"
    "clients/$client/test.sh"
  fi
done

# The npm packages of the server, packed from the binary just built and
# installed into a fresh project outside the repository (needs the
# TypeScript client built above).
if [[ -x packaging/npm/test.sh && -f clients/typescript/dist/index.js ]]; then
  phase "packaging/npm"
  packaging/npm/test.sh
fi

# The Python wheel of the server (leasehold-server), packed from the same
# binary and installed with the Python client into a fresh venv outside the
# repository; its layout is checked against maturin's (pinned in the
# client's test dependencies, so it needs the venv installed above).
if [[ -x packaging/pypi/test.sh && -x clients/python/.venv/bin/python ]]; then
  phase "packaging/pypi"
  packaging/pypi/test.sh
fi

# The web console in Debian's headless Chromium (skipped, saying SKIP, when
# /usr/bin/chromium is absent, unless LEASEHOLD_REQUIRE_BROWSER is set);
# uses the TypeScript client built above. Saves its screenshots under
# target/console-screenshots/.
if [[ -x tests/console-browser/test.sh ]]; then
  phase "tests/console-browser"
  tests/console-browser/test.sh
fi

# The chaos short runs add a Python worker and two TypeScript workers (one
# per transport) on the clients just installed and built.
if [[ -x clients/python/.venv/bin/python ]]; then
  export LEASEHOLD_CHAOS_PYTHON="$PWD/clients/python/.venv/bin/python"
fi
if [[ -f clients/typescript/dist/index.js ]] && command -v node >/dev/null; then
  LEASEHOLD_CHAOS_NODE="$(command -v node)"
  export LEASEHOLD_CHAOS_NODE
fi
phase "cargo test (every crate of the workspace)"
cargo test --locked
phase "done"
