#!/usr/bin/env bash
# Packs the npm packages of the leasehold server from a built binary:
#   packaging/npm/pack.sh BINARY OUTDIR
# leaves OUTDIR/leasehold-<v>.tgz (the `leasehold` command, which finds the
# binary) and OUTDIR/leasehold-server-linux-x64-gnu-<v>.tgz (the binary,
# stripped, for linux x64 glibc). Staged in a temporary directory: the
# checkout is not changed. The version is the workspace's (Cargo.toml).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
binary="$1"
out="$(mkdir -p "$2" && cd "$2" && pwd)"
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$here/../../Cargo.toml")"
for pkg in leasehold leasehold-linux-x64-gnu; do
  found="$(node -p "require('$here/$pkg/package.json').version")"
  if [[ "$found" != "$version" ]]; then
    echo "pack.sh: $pkg/package.json is $found, the workspace is $version" >&2
    exit 1
  fi
done
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp -r "$here/leasehold" "$here/leasehold-linux-x64-gnu" "$stage/"
mkdir -p "$stage/leasehold-linux-x64-gnu/bin"
strip -o "$stage/leasehold-linux-x64-gnu/bin/leasehold" "$binary"
chmod +x "$stage/leasehold-linux-x64-gnu/bin/leasehold"
for pkg in leasehold leasehold-linux-x64-gnu; do
  (cd "$stage/$pkg" && npm pack --silent --pack-destination "$out" >/dev/null)
done
ls "$out"/leasehold-"$version".tgz "$out"/leasehold-server-linux-x64-gnu-"$version".tgz
