// The ownership lifecycle (#15) against a real server, over both
// transports: lock-delay, handoff, quarantine, history and watch.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  BusyError,
  CompactedError,
  createClient,
  type HistoryEntry,
  type Lease,
  LeaseholdClient,
  LeaseholdError,
  LeaseLostError,
  QuarantinedError,
  ReservedError,
  UnavailableError,
  type WatchEvent,
} from "../src/index.js";
import { startServer, type TestServer, waitFor } from "./server.js";

const TRANSPORTS = ["grpc", "grpc-web"] as const;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Acquires `key` in a child process that then exits without releasing (no
 * suspend on dispose), as a crashed worker; returns the fence. The term
 * expires at its TTL.
 */
async function crashHolding(baseUrl: string, key: string, options: Record<string, unknown>): Promise<bigint> {
  const index = new URL("../src/index.js", import.meta.url).href;
  const script = `
    import { createClient } from ${JSON.stringify(index)};
    const lh = createClient({ baseUrl: ${JSON.stringify(baseUrl)} });
    const lease = await lh.acquire(${JSON.stringify(key)}, ${JSON.stringify(options)});
    console.log(String(lease.fence));
    process.exit(0);
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  assert.equal(code, 0, out);
  return BigInt(out.trim());
}

/**
 * SIGSTOPs the server and waits until it has really stopped (kill() returns
 * before a thread running on another core is stopped).
 */
async function freeze(server: TestServer): Promise<void> {
  server.freeze();
  const stopped = (): boolean => {
    const stat = readFileSync(`/proc/${server.pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 1).trim().split(" ")[0] === "T";
  };
  await waitFor(stopped, 5000, "the server to stop");
}

/** Takes the next `n` events of a watch's iterator. */
async function take(events: AsyncIterator<WatchEvent>, n: number): Promise<WatchEvent[]> {
  const got: WatchEvent[] = [];
  while (got.length < n) {
    const r = await events.next();
    if (r.done === true) throw new Error(`the watch ended after ${got.length} events`);
    got.push(r.value);
  }
  return got;
}

for (const transport of TRANSPORTS) {
  describe(`the lifecycle over ${transport}`, () => {
    let server: TestServer;
    let lh: LeaseholdClient;
    let n = 0;
    /** A key prefix no other test uses. */
    const fresh = (name: string): string => `${transport}:${name}:${++n}`;

    before(async () => {
      server = await startServer();
      lh = createClient({ baseUrl: server.baseUrl, transport, owner: "tester" });
    });
    after(async () => {
      lh.close();
      await server.close();
    });

    it("refuses a lock-delayed key with a typed ReservedError, and a release skips the delay", async () => {
      const k = fresh("delay");
      const fence = await crashHolding(server.baseUrl, k, { ttlMs: 300, lockDelayMs: 1500, owner: "dead" });
      await sleep(500); // the TTL runs out; the lock-delay does not
      const err = await lh.acquire(k, { ttlMs: 5000 }).then(
        () => assert.fail("acquired a key in its lock-delay"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ReservedError, String(err));
      assert.ok(err instanceof BusyError);
      assert.equal(err.reason, "lock_delay");
      assert.equal(err.fence, fence);
      assert.equal(err.holder, "");
      assert.ok(err.remainingMs > 0 && err.remainingMs <= 1500, String(err.remainingMs));
      const state = await lh.get(k);
      assert.equal(state.lease, undefined);
      assert.equal(state.reservation?.kind, "lock_delay");
      assert.equal(state.reservation?.afterFence, fence);
      // A waiter keeps its place and gets the key once the delay is over.
      await lh.withLease(k, { ttlMs: 5000, waitMs: 5000 }, async (lease) => {
        assert.equal(lease.previous?.end, "expired");
      });
      // Released cleanly: no delay.
      await (await lh.acquire(k, { ttlMs: 5000, lockDelayMs: 5000 })).release();
      await (await lh.acquire(k, { ttlMs: 5000 })).release();
    });

    it("hands a key to the named successor ahead of a waiter", async () => {
      const k = fresh("handoff");
      const worker = await lh.acquire(k, { ttlMs: 5000, owner: "worker" });
      const waited: { lease?: Lease } = {};
      const waiting = lh.acquire(k, { ttlMs: 5000, waitMs: 10_000, owner: "waiter" }).then((l) => (waited.lease = l));
      await sleep(200); // the waiter is queued
      const ended = await worker.handOff("ui", { withinMs: 5000 });
      assert.equal(ended.end, "released");
      const err = await lh.acquire(k, { ttlMs: 5000, owner: "someone-else" }).then(
        () => assert.fail("acquired a key kept for another owner"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof ReservedError, String(err));
      assert.equal(err.reason, "handoff");
      assert.equal(err.successor, "ui");
      const state = await lh.get(k);
      assert.equal(state.reservation?.kind, "handoff");
      assert.equal(state.reservation?.successor, "ui");
      assert.equal(waited.lease === undefined, true, "the waiter got the key before the successor");
      const ui = await lh.acquire(k, { ttlMs: 5000, owner: "ui" });
      assert.equal(ui.previous?.handedOff, true);
      assert.equal(ui.previous?.end, "released");
      assert.equal(ui.previous?.fence, worker.fence);
      await ui.release();
      await waiting;
      assert.equal(waited.lease?.owner, "waiter");
      assert.equal(waited.lease?.previous?.handedOff, false);
      await waited.lease?.release();
    });

    it("hands off a suspended term: the successor recovers it", async () => {
      const k = fresh("handoff-suspend");
      await (await lh.acquire(k, { ttlMs: 5000 })).handOff("ui", { withinMs: 5000, suspend: true });
      const ui = await lh.acquire(k, { ttlMs: 5000, owner: "ui" });
      assert.equal(ui.recovered, true);
      assert.equal(ui.previous?.end, "suspended");
      assert.equal(ui.previous?.handedOff, true);
      await ui.release();
    });

    it("lets withLease's fn hand the key off (no release after it)", async () => {
      const k = fresh("handoff-with");
      const ended = await lh.withLease(k, { ttlMs: 5000 }, (lease) => lease.handOff("ui", { withinMs: 5000 }));
      assert.equal(ended.end, "released");
      const ui = await lh.acquire(k, { ttlMs: 5000, owner: "ui" });
      assert.equal(ui.previous?.handedOff, true);
      await ui.release();
    });

    it("quarantines a key after K failed terms: typed, listed, forced, lifted", async () => {
      const k = fresh("q");
      const prefix = k.slice(0, k.lastIndexOf(":") + 1);
      for (let i = 0; i < 2; i++) await (await lh.acquire(k, { ttlMs: 5000, maxRecoveries: 2 })).suspend();
      const err = await lh.acquire(k, { ttlMs: 5000, maxRecoveries: 2 }).then(
        () => assert.fail("acquired a quarantined key"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof QuarantinedError, String(err));
      assert.ok(!(err instanceof LeaseLostError));
      assert.equal(err.failures, 2);
      assert.equal(err.key, k);
      const state = await lh.get(k);
      assert.equal(state.quarantined, true);
      assert.equal(state.recoverable, false);
      const listed = await lh.list({ prefix, filter: "quarantined" });
      assert.deepEqual(
        listed.keys.map((s) => [s.key, s.quarantined]),
        [[k, true]],
      );
      assert.deepEqual((await lh.list({ prefix, filter: "recoverable" })).keys, []);
      const forced = await lh.acquire(k, { ttlMs: 5000, force: true });
      assert.equal(forced.recovered, true);
      await forced.release();
      const lifted = await lh.unquarantine(k);
      assert.equal(lifted.key, k);
      assert.equal(lifted.quarantined, false);
      assert.deepEqual((await lh.list({ prefix, filter: "quarantined" })).keys, []);
      await (await lh.acquire(k, { ttlMs: 5000 })).release();
    });

    it("pages a key's history newest first, without gaps or repeats", async () => {
      const k = fresh("history");
      const fences: bigint[] = [];
      for (let i = 0; i < 5; i++) {
        const lease = await lh.acquire(k, { ttlMs: 5000, owner: `w${i}` });
        fences.push(lease.fence);
        if (i % 2 === 1) await lease.suspend();
        else await lease.release();
      }
      const seen: HistoryEntry[] = [];
      let before: bigint | undefined;
      let pages = 0;
      for (;;) {
        const page = await lh.history(k, { pageSize: 2, ...(before === undefined ? {} : { before }) });
        pages++;
        assert.ok(page.entries.length <= 2);
        seen.push(...page.entries);
        if (page.nextBefore === undefined) break;
        before = page.nextBefore;
      }
      assert.equal(pages, 3);
      assert.deepEqual(
        seen.map((e) => e.fence),
        [...fences].reverse(),
      );
      assert.deepEqual(
        seen.map((e) => e.end),
        ["released", "suspended", "released", "suspended", "released"],
      );
      assert.ok(seen.every((e) => e.endedAtMs >= e.acquiredAtMs && e.acquiredAtMs > 0));
      const missing = await lh.history(fresh("never")).then(
        () => assert.fail("history of an unknown key"),
        (e: unknown) => e,
      );
      assert.ok(missing instanceof LeaseholdError && missing.code === "not_found", String(missing));
    });

    it("watches grants and releases in order and resumes from nextRevision exactly", async () => {
      const prefix = `${fresh("watch")}/`;
      await (await lh.acquire(`${prefix.slice(0, -1)}-outside`, { ttlMs: 5000 })).release();
      const watch = lh.watch({ prefix });
      await watch.ready;
      const start = watch.nextRevision;
      for (let i = 0; i < 3; i++) {
        await lh.withLease(`${prefix}${i}`, { ttlMs: 5000, owner: `o${i}` }, async () => undefined);
      }
      const it1 = watch[Symbol.asyncIterator]();
      const got = await take(it1, 4);
      assert.deepEqual(
        got.map((e) => [e.key, e.kind]),
        [
          [`${prefix}0`, "granted"],
          [`${prefix}0`, "released"],
          [`${prefix}1`, "granted"],
          [`${prefix}1`, "released"],
        ],
      );
      assert.ok(got[0]!.revision >= start);
      assert.equal(got[0]!.owner, "o0");
      assert.equal(got[0]!.fence, got[1]!.fence);
      assert.ok(got[0]!.atMs > 0);
      const resume = watch.nextRevision;
      assert.equal(resume, got[3]!.revision + 1n);
      await it1.return?.(); // leaving the loop closes the stream
      // Changes while nobody watches are delivered on resume.
      await (await lh.acquire(`${prefix}3`, { ttlMs: 5000 })).suspend();
      const rest: WatchEvent[] = [];
      const again = lh.watch({ prefix, startRevision: resume });
      for await (const e of again) {
        rest.push(e);
        if (rest.length === 4) break;
      }
      assert.deepEqual(
        rest.map((e) => [e.key, e.kind]),
        [
          [`${prefix}2`, "granted"],
          [`${prefix}2`, "released"],
          [`${prefix}3`, "granted"],
          [`${prefix}3`, "suspended"],
        ],
      );
      assert.equal(rest[0]!.revision, resume);
      assert.equal(again.nextRevision, rest[3]!.revision + 1n);
      const revisions = [...got, ...rest].map((e) => e.revision);
      for (let i = 1; i < revisions.length; i++) assert.ok(revisions[i]! > revisions[i - 1]!, String(revisions));
    });

    it("watches one key and sees a crashed holder's expiry", async () => {
      const k = fresh("watch-one");
      const watch = lh.watch({ key: k });
      await watch.ready;
      await (await lh.acquire(`${k}-not`, { ttlMs: 5000 })).release();
      const fence = await crashHolding(server.baseUrl, k, { ttlMs: 300 });
      const events = await take(watch[Symbol.asyncIterator](), 2);
      watch.close();
      assert.deepEqual(
        events.map((e) => [e.kind, e.fence]),
        [
          ["granted", fence],
          ["expired", fence],
        ],
      );
    });

    it("ends a watch's iteration when its signal aborts", async () => {
      const abort = new AbortController();
      const watch = lh.watch({ prefix: fresh("abort"), signal: abort.signal });
      await watch.ready;
      setTimeout(() => abort.abort(), 100);
      const seen: WatchEvent[] = [];
      for await (const e of watch) seen.push(e);
      assert.deepEqual(seen, []);
    });

  });
}

describe("a watch across a server restart", () => {
  for (const transport of TRANSPORTS) {
    it(`resumes exactly from nextRevision over ${transport}`, async () => {
      let server = await startServer();
      const dir = join(server.dbPath, "..");
      const addr = server.baseUrl.replace("http://", "");
      const lh = createClient({ baseUrl: server.baseUrl, transport });
      try {
        const watch = lh.watch({ prefix: "r:" });
        await watch.ready;
        await (await lh.acquire("r:1", { ttlMs: 5000 })).release();
        const events = watch[Symbol.asyncIterator]();
        const first = await take(events, 2);
        await server.stop();
        // The old stream ends, or fails as unavailable; either way it
        // yields nothing more.
        const end = await events.next().then(
          (r) => r,
          (e: unknown) => e,
        );
        if (!(end instanceof UnavailableError)) assert.deepEqual(end, { done: true, value: undefined });
        const resume = watch.nextRevision;
        assert.equal(resume, first[1]!.revision + 1n);
        server = await startServer(dir, addr);
        await (await lh.acquire("r:2", { ttlMs: 5000, waitMs: 5000 })).release();
        const again = lh.watch({ prefix: "r:", startRevision: resume });
        const rest = await take(again[Symbol.asyncIterator](), 2);
        again.close();
        assert.deepEqual(
          rest.map((e) => [e.key, e.kind]),
          [
            ["r:2", "granted"],
            ["r:2", "released"],
          ],
        );
        assert.equal(rest[0]!.revision, resume);
      } finally {
        lh.close();
        await server.close();
      }
    });
  }
});

describe("a compacted revision", () => {
  for (const transport of TRANSPORTS) {
    it(`throws CompactedError with the oldest revision held over ${transport}`, async () => {
      const server = await startServer(undefined, "127.0.0.1:0", ["--event-log-len", "4"]);
      const lh = createClient({ baseUrl: server.baseUrl, transport });
      try {
        for (let i = 0; i < 5; i++) await (await lh.acquire(`c:${i}`, { ttlMs: 5000 })).release(); // ten events
        const stale = lh.watch({ startRevision: 2 });
        const err = await stale.ready.then(
          () => assert.fail("watched a compacted revision"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof CompactedError, String(err));
        assert.ok(err.oldestRevision > 2n && err.oldestRevision <= 10n, String(err.oldestRevision));
        // Iterating throws the same refusal.
        await assert.rejects(async () => {
          for await (const e of stale) assert.fail(`an event from a compacted watch: ${e.revision}`);
        }, CompactedError);
        const watch = lh.watch({ startRevision: err.oldestRevision });
        const [first] = await take(watch[Symbol.asyncIterator](), 1);
        assert.equal(first!.revision, err.oldestRevision);
      } finally {
        lh.close();
        await server.close();
      }
    });
  }
});

describe("a watch of a frozen server", () => {
  for (const transport of TRANSPORTS) {
    it(`fails in time instead of hanging over ${transport}`, async () => {
      const server = await startServer();
      const lh = createClient({ baseUrl: server.baseUrl, transport });
      try {
        await (await lh.acquire("z:1", { ttlMs: 5000 })).release(); // connected
        await freeze(server);
        const started = Date.now();
        const watch = lh.watch({ prefix: "z:", startTimeoutMs: 500 });
        await assert.rejects(watch.ready, (e: unknown) => e instanceof UnavailableError && /no first reply/.test(e.message));
        assert.ok(Date.now() - started < 3000);
      } finally {
        server.thaw();
        lh.close();
        await server.close();
      }
    });
  }
});
