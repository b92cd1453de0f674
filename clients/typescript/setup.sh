#!/usr/bin/env bash
# Installs the TypeScript client's dependencies from the lockfile (npm ci).
# Skipped when node_modules was installed from this very package-lock.json
# by this Node.js, so a second run is a no-op. ./test.sh runs it in the
# background while cargo builds (better-sqlite3 compiles from source here,
# its prebuilt binaries being out of reach).
set -euo pipefail
cd "$(dirname "$0")"
stamp="node_modules/.leasehold-installed"
want="$( (cat package-lock.json; node --version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "== npm ci"
npm ci --no-audit --no-fund
echo "$want" > "$stamp"
