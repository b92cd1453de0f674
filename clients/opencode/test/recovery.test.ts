// Restart recovery's one-winner rule, in one process against a real lock
// server, where the test controls what each server's scan sees: the real
// `opencode serve` test (two-servers.test.ts) shows one resume after
// kill -9, but only catches two winners when both scans list the key before
// either takes it, which it cannot arrange.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import type { PluginInput } from "@opencode-ai/plugin";
import { createClient, type LeaseholdClient } from "@leasehold/client";
import { ownershipHooks } from "../src/index.js";
import { settings } from "../src/options.js";
import { type Proc, startLeasehold, until } from "./servers.js";

let root: string;
let lock: Proc;
let admin: LeaseholdClient;
const clients: LeaseholdClient[] = [];

/** A stand-in for OpenCode's SDK client: records every resume prompt this "server" sends. */
function server(name: string, resumed: string[]): PluginInput {
  const session = {
    promptAsync: async (args: { path: { id: string } }): Promise<void> => {
      resumed.push(`${name}:${args.path.id}`);
    },
    abort: async (): Promise<void> => undefined,
  };
  return { client: { session } } as unknown as PluginInput;
}

/** A key whose last term was suspended (a run that failed): listed recoverable. */
async function leftUnfinished(prefix: string, session: string): Promise<string> {
  const key = `${prefix}${session}`;
  const lease = await admin.acquire(key, { ttlMs: 5_000, owner: "dead" });
  await lease.suspend();
  assert.equal((await admin.get(key)).recoverable, true);
  return key;
}

function client(): LeaseholdClient {
  const c = createClient({ baseUrl: lock.url });
  clients.push(c);
  return c;
}

before(async () => {
  root = mkdtempSync(join(tmpdir(), "leasehold-opencode-recovery-"));
  lock = await startLeasehold(root);
  admin = createClient({ baseUrl: lock.url });
});

after(async () => {
  for (const c of clients) c.close();
  admin?.close();
  await lock?.stop();
  rmSync(root, { recursive: true, force: true });
});

test("of five servers scanning at once, exactly one resumes an unfinished session", async () => {
  // Each test its own prefix: a session the other left suspended (dispose
  // ends every term suspended) is no part of it.
  const s = settings({ url: lock.url, ttlMs: 5_000, keyPrefix: "five:" }, {});
  const key = await leftUnfinished(s.keyPrefix, "s-five");
  const resumed: string[] = [];
  const hooks = ["a", "b", "c", "d", "e"].map((n) => ownershipHooks(server(n, resumed), client(), s));
  await until("a resume", () => resumed.length > 0);
  await new Promise((r) => setTimeout(r, 300)); // every scan has answered by now
  assert.equal(resumed.length, 1, `resumed by ${resumed.join(", ")}`);
  const st = await admin.get(key);
  assert.ok(st.lease !== undefined, "the winner holds the session while it runs");
  await Promise.all(hooks.map((h) => h.dispose?.()));
});

test("a scan that listed a session before another server resumed and finished it does not resume it again", async () => {
  const s = settings({ url: lock.url, ttlMs: 5_000, keyPrefix: "stale:" }, {});
  const key = await leftUnfinished(s.keyPrefix, "s-stale");
  const resumed: string[] = [];
  // Server b's scan is slow: it lists now, and takes the key only after a
  // has resumed the session and its run went idle (released).
  const stale = await admin.list({ prefix: s.keyPrefix, filter: "recoverable" });
  assert.ok(stale.keys.some((k) => k.key === key));
  const a = ownershipHooks(server("a", resumed), client(), s);
  await until("a's resume", () => resumed.includes("a:s-stale"));
  await a.event?.({ event: { type: "session.idle", properties: { sessionID: "s-stale" } } as never });
  await until("a's run released", async () => (await admin.get(key)).lastEnded?.end === "released");
  const slow = client();
  const lagging = new Proxy(slow, {
    get(target, prop, receiver) {
      if (prop === "list") return async () => stale;
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === "function" ? (v as (...x: unknown[]) => unknown).bind(target) : v;
    },
  });
  const b = ownershipHooks(server("b", resumed), lagging, s);
  await until("b's scan took and ended the key", async () => {
    const h = await admin.history(key);
    return h.entries.length >= 3; // dead's, a's, and b's own
  });
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(resumed, ["a:s-stale"], "the session was resumed twice");
  const st = await admin.get(key);
  assert.equal(st.lease, undefined, "b left the key held");
  assert.equal(st.lastEnded?.end, "released");
  await Promise.all([a, b].map((h) => h.dispose?.()));
});
