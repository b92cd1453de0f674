#!/usr/bin/env bash
# The web console in a real headless browser: Debian's Chromium
# (/usr/bin/chromium, `apt-get install chromium`) driven by playwright-core,
# which downloads no browser. Screenshots land in target/console-screenshots/
# (LEASEHOLD_SCREENSHOTS=docs/console refreshes the committed ones).
#
#   LEASEHOLD_BIN=/path/to/leasehold tests/console-browser/test.sh
#
# LEASEHOLD_BIN (required): the leasehold server binary.
# LEASEHOLD_TS_CLIENT (optional): the TypeScript client's directory, with
#   dist/ built (default: clients/typescript, built here if it is not).
# LEASEHOLD_REQUIRE_BROWSER (optional): fail instead of skipping when
#   Chromium is missing (CI sets it).
set -euo pipefail
cd "$(dirname "$0")"

if [[ ! -x /usr/bin/chromium ]]; then
  if [[ -n "${LEASEHOLD_REQUIRE_BROWSER:-}" ]]; then
    echo "test.sh: /usr/bin/chromium is missing and LEASEHOLD_REQUIRE_BROWSER is set" >&2
    exit 1
  fi
  echo "SKIP: the console browser test needs /usr/bin/chromium (apt-get install -y chromium)"
  exit 0
fi
if [[ -z "${LEASEHOLD_BIN:-}" || ! -x "$LEASEHOLD_BIN" ]]; then
  echo "test.sh: LEASEHOLD_BIN must name the leasehold server binary" >&2
  exit 2
fi
export LEASEHOLD_BIN="$(cd "$(dirname "$LEASEHOLD_BIN")" && pwd)/$(basename "$LEASEHOLD_BIN")"

client="${LEASEHOLD_TS_CLIENT:-../../clients/typescript}"
if [[ ! -f "$client/dist/index.js" ]]; then
  echo "== build the TypeScript client"
  "$client/setup.sh"
  (cd "$client" && npm run --silent build)
fi
export LEASEHOLD_TS_CLIENT="$(cd "$client" && pwd)"

stamp="node_modules/.leasehold-installed"
want="$( (cat package-lock.json; node --version) | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  npm ci --no-audit --no-fund
  echo "$want" > "$stamp"
fi
timeout 120 node run.mjs
