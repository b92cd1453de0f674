#!/usr/bin/env bash
# Tests the Python client against a leasehold server binary:
#   LEASEHOLD_BIN=target/debug/leasehold clients/python/test.sh [pytest args...]
# Creates (or reuses) clients/python/.venv, installs the pinned test
# dependencies and the package, checks the generated stubs against the
# proto, runs ruff and mypy --strict, then pytest. Set LEASEHOLD_TEST_PG_URL
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

python="${PYTHON:-python3}"
venv="$here/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
    echo "== creating $venv"
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"
# Reinstall only when the pins or the package metadata changed.
stamp="$venv/.leasehold-installed"
want="$(cat requirements-test.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "== installing test dependencies and the package"
    "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$py" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps -e .
    echo "$want" > "$stamp"
fi

echo "== generated stubs are up to date with proto/"
"$py" scripts/gen_proto.py --check
echo "== ruff"
"$venv/bin/ruff" check --quiet leasehold tests scripts
echo "== mypy --strict"
"$venv/bin/mypy" --strict leasehold
echo "== pytest"
"$py" -m pytest -q "$@"

# sqlite3's autocommit modes exist from Python 3.12 on: the SQLite fence
# helper's tests run again under the first 3.12+ found (PYTHON312, then
# PATH, then pyenv), in a venv of their own with the same pins.
py312="${PYTHON312:-}"
if [[ -z "$py312" ]]; then
    for candidate in python3.13 python3.12 \
        "$(pyenv root 2>/dev/null)"/versions/3.13*/bin/python \
        "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            py312="$candidate"
            break
        fi
    done
fi
if [[ -z "$py312" ]]; then
    echo "test.sh: no Python 3.12 or later found (set PYTHON312): sqlite3's autocommit modes are untested" >&2
    exit 1
fi
venv312="$here/.venv-312"
if [[ ! -x "$venv312/bin/python" ]]; then
    "$py312" -m venv "$venv312"
fi
stamp312="$venv312/.leasehold-installed"
if [[ ! -f "$stamp312" || "$(cat "$stamp312")" != "$want" ]]; then
    echo "== installing the package into $venv312"
    "$venv312/bin/python" -m pip install --quiet --disable-pip-version-check \
        $(grep -E '^(grpcio|protobuf|pytest|pytest-asyncio)==' requirements-test.txt)
    "$venv312/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
    echo "$want" > "$stamp312"
fi
echo "== pytest (sqlite3 transaction modes, $("$venv312/bin/python" -V))"
"$venv312/bin/python" -m pytest -q tests/test_fence_sqlite_modes.py
