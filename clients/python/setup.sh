#!/usr/bin/env bash
# Installs what the Python client's tests need: clients/python/.venv with the
# pinned test dependencies and the package (editable), and a second venv
# under Python 3.12+ for the sqlite3 transaction-mode tests. Reinstalls only
# when requirements-test.txt or pyproject.toml changed, so a second run is a
# no-op. ./test.sh runs it in the background while cargo builds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

python="${PYTHON:-python3}"
venv="$here/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
    echo "== creating $venv"
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"
stamp="$venv/.leasehold-installed"
want="$(cat requirements-test.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "== installing test dependencies and the package"
    "$py" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$py" -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps -e .
    echo "$want" > "$stamp"
fi

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
    echo "setup.sh: no Python 3.12 or later found (set PYTHON312): sqlite3's autocommit modes are untested" >&2
    exit 1
fi
venv312="$here/.venv-312"
if [[ ! -x "$venv312/bin/python" ]]; then
    "$py312" -m venv "$venv312"
fi
stamp312="$venv312/.leasehold-installed"
if [[ ! -f "$stamp312" || "$(cat "$stamp312")" != "$want" ]]; then
    echo "== installing the package into $venv312"
    # shellcheck disable=SC2046 # one argument per pin
    "$venv312/bin/python" -m pip install --quiet --disable-pip-version-check \
        $(grep -E '^(grpcio|protobuf|pytest|pytest-asyncio)==' requirements-test.txt)
    "$venv312/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
    echo "$want" > "$stamp312"
fi
