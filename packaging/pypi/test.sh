#!/usr/bin/env bash
# The Python wheel of the server, installed the way a user installs it:
# packs $LEASEHOLD_BIN into the wheel (wheel_from_binary.py), installs it
# with no index into a fresh venv outside the repository, together with the
# Python client (its grpcio and protobuf at the pins of
# clients/python/requirements-test.txt), and there checks that `leasehold
# --version` is the binary's, that `leasehold serve` serves a lease to the
# client, and that a pytest project of its own finds the wheel's binary
# through leasehold.testing (LEASEHOLD_BIN unset). Last, it builds a stand-in
# bin crate with maturin itself (pinned with the client's test dependencies;
# $MATURIN, else clients/python/.venv/bin/maturin) and the same
# pyproject.toml, and checks that our wheel has maturin's layout.
#   LEASEHOLD_BIN=target/debug/leasehold packaging/pypi/test.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
: "${LEASEHOLD_BIN:?set LEASEHOLD_BIN to the server binary to package}"
LEASEHOLD_BIN="$(cd "$(dirname "$LEASEHOLD_BIN")" && pwd)/$(basename "$LEASEHOLD_BIN")"
python="${PYTHON:-python3}"
maturin="${MATURIN:-$root/clients/python/.venv/bin/maturin}"
if [[ ! -x "$maturin" ]]; then
  echo "pypi test: no maturin at $maturin (clients/python/setup.sh installs the pinned one; or set MATURIN)" >&2
  exit 1
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  { echo "pypi test: $python is older than 3.11 (wheel_from_binary.py reads TOML with tomllib); set PYTHON" >&2; exit 1; }
started=$SECONDS
work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "pypi test: $*" >&2
  exit 1
}

# One version: the wheel's (pyproject.toml) is the workspace's (Cargo.toml).
"$python" - "$here/pyproject.toml" "$root/Cargo.toml" <<'PY'
import sys, tomllib
wheel = tomllib.load(open(sys.argv[1], "rb"))["project"]["version"]
workspace = tomllib.load(open(sys.argv[2], "rb"))["workspace"]["package"]["version"]
if wheel != workspace:
    sys.exit(f"pypi test: packaging/pypi/pyproject.toml is {wheel}, the workspace is {workspace}")
PY

wheel="$("$python" "$here/wheel_from_binary.py" "$LEASEHOLD_BIN" "$work/dist")"

"$python" -m venv "$work/venv"
venv="$work/venv"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" install --no-index --no-deps "$wheel"
# The client's pins as constraints (a constraint takes no extras).
sed 's/\[[^]]*\]//' "$root/clients/python/requirements-test.txt" >"$work/constraints.txt"
"${pip[@]}" install -c "$work/constraints.txt" "$root/clients/python" pytest

want="$("$LEASEHOLD_BIN" --version)"
got="$("$venv/bin/leasehold" --version)"
[[ "$got" == "$want" ]] || fail "the venv's leasehold --version said '$got', the binary says '$want'"

# `leasehold serve` from the venv, on a port it picks, driven by the client.
"$venv/bin/leasehold" serve --listen 127.0.0.1:0 --db "$work/serve.db" >"$work/serve.log" 2>&1 &
server_pid=$!
address=""
for _ in $(seq 100); do
  address="$(sed -n 's/^listening on //p' "$work/serve.log")"
  [[ -n "$address" ]] && break
  kill -0 "$server_pid" 2>/dev/null || fail "leasehold serve exited: $(cat "$work/serve.log")"
  sleep 0.1
done
[[ -n "$address" ]] || fail "leasehold serve said nothing in 10 s: $(cat "$work/serve.log")"
"$venv/bin/python" - "$address" <<'PY'
import sys
import leasehold
with leasehold.Client(sys.argv[1], owner="pypi-test") as client:
    lease = client.acquire("session:1", ttl=15.0)
    assert lease.fence >= 1, lease
    lease.release()
PY
kill "$server_pid"
wait "$server_pid" || true
server_pid=""

# A project of its own, outside the repository: leasehold.testing must find
# the wheel's binary on PATH (where pip put it), with LEASEHOLD_BIN unset.
mkdir "$work/project"
cat >"$work/project/conftest.py" <<'PY'
from leasehold.testing import leasehold_server  # noqa: F401 (the fixture)
PY
cat >"$work/project/test_own.py" <<'PY'
import sys
from pathlib import Path

import leasehold
from leasehold.testing import find_binary


def test_a_lease_from_the_server_pip_installed(leasehold_server):
    assert find_binary() == str(Path(sys.prefix) / "bin" / "leasehold")
    with leasehold.Client(leasehold_server.address, owner="pypi-test") as client:
        lease = client.acquire("session:1", ttl=15.0)
        assert lease.fence >= 1
        lease.release()
PY
(cd "$work/project" && env -u LEASEHOLD_BIN PATH="$venv/bin:$PATH" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider)

# maturin's own wheel of a stand-in bin crate (same names, same version,
# same [tool.maturin]) against ours of the stand-in's binary and of the server.
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/pyproject.toml")"
standin="$work/standin"
mkdir -p "$standin/src" "$standin/pypi"
cat >"$standin/Cargo.toml" <<TOML
[package]
name = "leasehold-server"
version = "$version"
edition = "2021"

[[bin]]
name = "leasehold"
path = "src/main.rs"
TOML
echo "fn main() { println!(\"leasehold $version\"); }" >"$standin/src/main.rs"
sed 's|^manifest-path = .*|manifest-path = "../Cargo.toml"|' "$here/pyproject.toml" >"$standin/pypi/pyproject.toml"
(cd "$standin" && cargo generate-lockfile --offline --quiet)
(cd "$standin/pypi" && CARGO_TARGET_DIR="$standin/target" \
  "$maturin" build --release --offline -o "$standin/maturin" >"$work/maturin.log" 2>&1) ||
  fail "maturin build of the stand-in crate failed: $(cat "$work/maturin.log")"
"$python" "$here/wheel_from_binary.py" "$standin/target/release/leasehold" "$standin/ours" >/dev/null
"$venv/bin/python" - "$standin/maturin" "$standin/ours" "$wheel" <<'PY'
import base64, hashlib, sys, zipfile
from pathlib import Path

def only(folder):
    (wheel,) = Path(folder).glob("*.whl")
    return wheel

def read(wheel):
    with zipfile.ZipFile(wheel) as z:
        # maturin adds a CycloneDX SBOM (dist-info/sboms/); our packer does not.
        modes = {i.filename: oct(i.external_attr >> 16) for i in z.infolist() if "/sboms/" not in i.filename}
        text = {n: z.read(n).decode() for n in modes if n.endswith(("/WHEEL", "/METADATA"))}
        # Every file but RECORD is in RECORD, with its digest and size.
        (record,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        listed = {}
        for line in z.read(record).decode().splitlines():
            name, digest, size = line.rsplit(",", 2)
            listed[name] = (digest, size)
        for name in z.namelist():
            data = z.read(name)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            want = ("", "") if name == record else (f"sha256={sha}", str(len(data)))
            if listed.pop(name, None) != want:
                sys.exit(f"pypi test: {wheel.name}: RECORD is wrong about {name}")
        if listed:
            sys.exit(f"pypi test: {wheel.name}: RECORD lists {sorted(listed)}, not in the wheel")
    return modes, text

def fields(wheel_text):
    return sorted(line for line in wheel_text.splitlines() if not line.startswith("Generator:"))

theirs, ours, server = only(sys.argv[1]), only(sys.argv[2]), Path(sys.argv[3])
problems = []
if ours.name != theirs.name:
    problems.append(f"wheel name {ours.name}, maturin's {theirs.name}")
(their_modes, their_text), (our_modes, our_text) = read(theirs), read(ours)
if our_modes != their_modes:
    problems.append(f"files and modes {our_modes}, maturin's {their_modes}")
if read(server)[0] != their_modes:
    problems.append(f"the server wheel's files and modes {read(server)[0]}, maturin's {their_modes}")
for name, text in their_text.items():
    if name.endswith("/METADATA") and our_text.get(name) != text:
        problems.append(f"METADATA {our_text.get(name)!r}, maturin's {text!r}")
    if name.endswith("/WHEEL") and fields(our_text.get(name, "")) != fields(text):
        problems.append(f"WHEEL {our_text.get(name)!r}, maturin's {text!r}")
if problems:
    sys.exit("pypi test: our wheel differs from maturin's:\n  " + "\n  ".join(problems))
PY

size="$(du -m "$wheel" | cut -f1)"
echo "pypi wheel: $(basename "$wheel") (${size} MB) installed outside the repository," \
  "$("$venv/bin/leasehold" --version) ran and served; layout as maturin's ($((SECONDS - started)) s)"
