#!/usr/bin/env bash
# Tests the Python client against a leasehold server binary:
#   LEASEHOLD_BIN=target/debug/leasehold clients/python/test.sh [pytest args...]
# Installs what it needs (setup.sh: clients/python/.venv and a 3.12+ venv,
# a no-op when current), checks the generated stubs against the proto and
# the generated sync client (_sync.py) against _async.py, runs ruff and
# mypy --strict, then pytest. Set LEASEHOLD_TEST_PG_URL
# (e.g. postgresql://postgres@127.0.0.1:5432/test) to include PostgreSQL.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -z "${LEASEHOLD_BIN:-}" ]]; then
    echo "test.sh: set LEASEHOLD_BIN to the leasehold server binary (e.g. target/debug/leasehold)" >&2
    exit 2
fi
# Resolved before leaving the caller's directory, so a relative path works.
LEASEHOLD_BIN="$(cd "$(dirname "$LEASEHOLD_BIN")" 2>/dev/null && pwd)/$(basename "$LEASEHOLD_BIN")" || true
export LEASEHOLD_BIN
if [[ ! -x "$LEASEHOLD_BIN" ]]; then
    echo "test.sh: LEASEHOLD_BIN=$LEASEHOLD_BIN is not executable" >&2
    exit 2
fi
cd "$here"

"$here/setup.sh"
py="$here/.venv/bin/python"
venv="$here/.venv"
venv312="$here/.venv-312"

echo "== generated stubs are up to date with proto/"
"$py" scripts/gen_proto.py --check
echo "== _sync.py is up to date with _async.py"
"$py" scripts/unasync.py --check
echo "== ruff"
"$venv/bin/ruff" check --quiet leasehold amplifier_module_hooks_leasehold tests scripts
echo "== mypy --strict"
"$venv/bin/mypy" --strict leasehold amplifier_module_hooks_leasehold
echo "== pytest"
"$py" -m pytest -q "$@"

# sqlite3's autocommit modes exist from Python 3.12 on (setup.sh made the venv).
echo "== pytest (sqlite3 transaction modes, $("$venv312/bin/python" -V))"
"$venv312/bin/python" -m pytest -q tests/test_fence_sqlite_modes.py
