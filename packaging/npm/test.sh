#!/usr/bin/env bash
# The npm packages, installed the way a user installs them: packs them (and
# the TypeScript client) from this checkout, installs the tarballs into a
# fresh npm project outside the repository, and there runs `npx leasehold
# --version`, the launcher's refusal without a binary, and a test of the
# project's own that starts a server with @leasehold/client/testing (which
# finds `leasehold` on PATH: the launcher) and takes a lease through it.
#   LEASEHOLD_BIN=target/debug/leasehold packaging/npm/test.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
: "${LEASEHOLD_BIN:?set LEASEHOLD_BIN to the server binary to package}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$here/pack.sh" "$LEASEHOLD_BIN" "$work/dist" >/dev/null
# The client as npm would ship it (dist is built by clients/typescript/test.sh).
(cd "$root/clients/typescript" && npm pack --silent --ignore-scripts --pack-destination "$work/dist" >/dev/null)

mkdir "$work/project" && cd "$work/project"
npm init -y >/dev/null
npm pkg set type=module >/dev/null
npm install --silent --no-audit --no-fund --prefer-offline "$work"/dist/*.tgz

want="$("$LEASEHOLD_BIN" --version)"
got="$(npx --no-install leasehold --version)"
if [[ "$got" != "$want" ]]; then
  echo "npm test: npx leasehold --version said '$got', the binary says '$want'" >&2
  exit 1
fi

if LEASEHOLD_BINARY="$work/missing" npx --no-install leasehold --version 2>"$work/err"; then
  echo "npm test: the launcher ran with LEASEHOLD_BINARY pointing at nothing" >&2
  exit 1
fi
grep -q "LEASEHOLD_BINARY=$work/missing does not exist" "$work/err"

cat > own.test.mjs <<'JS'
import assert from "node:assert/strict";
import { test } from "node:test";
import { createClient } from "@leasehold/client";
import { startTestServer } from "@leasehold/client/testing";

test("a lease from the server npm installed", async () => {
  const server = await startTestServer();
  const lh = createClient({ baseUrl: server.baseUrl, owner: "npm-test" });
  try {
    const lease = await lh.acquire("session:1");
    assert.ok(lease.fence >= 1n);
    await lease.release();
    assert.equal((await lh.get("session:1")).lastEnded?.end, "released");
  } finally {
    lh.close();
    await server.close();
  }
});
JS
# LEASEHOLD_BIN unset: the helper must find the launcher on PATH, as npm puts it there.
env -u LEASEHOLD_BIN PATH="$PWD/node_modules/.bin:$PATH" node --test own.test.mjs
echo "npm packages: installed outside the repository, $(npx --no-install leasehold --version) ran and served"
