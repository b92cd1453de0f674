#!/usr/bin/env bash
# Installs the OpenCode plugin's dependencies from the lockfile (npm ci):
# the pinned opencode-linux-x64 (the binary of opencode-ai 1.18.33) for the
# tests, and @leasehold/client from ../typescript (a link: that client's own
# setup.sh installs its dependencies, and its build makes its dist/).
# Skipped when node_modules was installed from this very package-lock.json
# by this Node.js, so a second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")"
stamp="node_modules/.leasehold-installed"
want="$( (cat package-lock.json; node --version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
echo "== npm ci (clients/opencode)"
npm ci --no-audit --no-fund
echo "$want" > "$stamp"
