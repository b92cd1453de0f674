// The lease contract against a real server, over both transports.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  BusyError,
  createClient,
  InvalidArgumentError,
  LeaseholdClient,
  LeaseLostError,
  UnavailableError,
} from "../src/index.js";
import { STREAM_LINGER_MS } from "../src/ops.js";
import { answered, freePort, startServer, type TestServer, waitFor } from "./server.js";

const TRANSPORTS = ["grpc", "grpc-web"] as const;

for (const transport of TRANSPORTS) {
  describe(`leases over ${transport}`, () => {
    let server: TestServer;
    let a: LeaseholdClient;
    let b: LeaseholdClient;
    let n = 0;
    /** A key no other test uses. */
    const key = (name: string): string => `${transport}:${name}:${++n}`;

    before(async () => {
      server = await startServer();
      a = createClient({ baseUrl: server.baseUrl, transport, owner: "graph-a" });
      b = createClient({ baseUrl: server.baseUrl, transport, owner: "graph-b" });
    });
    after(async () => {
      a.close();
      b.close();
      await server.close();
    });

    it("reports the transport it was asked for", () => {
      assert.equal(a.transport, transport);
    });

    it("refuses a held key at once with BusyError naming the holder, fence and time left", async () => {
      const k = key("busy");
      const held = await a.acquire(k, { ttlMs: 5_000 });
      const err = await b.acquire(k, { ttlMs: 5_000 }).then(
        () => assert.fail("acquired a held key"),
        (e: unknown) => e,
      );
      assert.ok(err instanceof BusyError, `expected BusyError, got ${String(err)}`);
      assert.equal(err.holder, "graph-a");
      assert.equal(err.fence, held.fence);
      assert.equal(typeof err.fence, "bigint");
      assert.ok(err.remainingMs > 0 && err.remainingMs <= 5_000, `remainingMs ${err.remainingMs}`);
      assert.equal(err.key, k);
      await held.release();
    });

    it("waits for a held key and gets it when the holder releases", async () => {
      const k = key("wait");
      const first = await a.acquire(k, { ttlMs: 5_000 });
      const waiting = b.acquire(k, { ttlMs: 5_000, waitMs: 5_000 });
      await new Promise((r) => setTimeout(r, 200));
      assert.ok(first.isValid());
      await first.release();
      const second = await waiting;
      assert.ok(second.fence > first.fence, `${second.fence} > ${first.fence}`);
      assert.equal(second.owner, "graph-b");
      assert.equal(second.previous?.end, "released");
      assert.equal(second.previous?.fence, first.fence);
      assert.equal(second.recovered, false);
      await second.release();
    });

    it("a grant that came after a long wait is renewed at once, so it is valid on return", async () => {
      const k = key("late-grant");
      const first = await a.acquire(k, { ttlMs: 5_000 });
      const waiting = b.acquire(k, { ttlMs: 600, waitMs: 3_000 });
      // The wait (700 ms) outlasts the waiter's whole TTL less its margin
      // (540 ms): a deadline resting on the acquire's send time would
      // already have passed.
      await new Promise((r) => setTimeout(r, 700));
      await first.release();
      const second = await waiting;
      assert.ok(second.isValid(), `lost: ${second.lossReason}`);
      assert.equal(second.signal.aborted, false);
      assert.equal(await second.gate(), second.fence);
      await second.release();
    });

    it("release ends the lease: signal aborted, gate refuses, key free, second release refused", async () => {
      const k = key("release");
      const lease = await a.acquire(k, { ttlMs: 5_000 });
      assert.equal(lease.signal.aborted, false);
      assert.equal(await lease.gate(), lease.fence);
      const ended = await lease.release();
      assert.equal(ended.end, "released");
      assert.equal(ended.fence, lease.fence);
      assert.equal(lease.isValid(), false);
      assert.equal(lease.signal.aborted, true);
      await assert.rejects(lease.gate(), (e: unknown) => e instanceof LeaseLostError && e.reason === "ended");
      await assert.rejects(lease.release(), LeaseLostError);
      const next = await b.acquire(k, { ttlMs: 5_000 });
      assert.equal(next.recovered, false);
      await next.release();
    });

    it("suspend leaves the key recoverable: the next holder sees recovered and previous", async () => {
      const k = key("suspend");
      const lease = await a.acquire(k, { ttlMs: 5_000 });
      const ended = await lease.suspend();
      assert.equal(ended.end, "suspended");
      const next = await b.acquire(k, { ttlMs: 5_000 });
      assert.equal(next.recovered, true);
      assert.equal(next.previous?.end, "suspended");
      assert.equal(next.previous?.owner, "graph-a");
      assert.equal(next.previous?.fence, lease.fence);
      assert.equal(next.unsettledToolCalls, 0);
      await next.release();
    });

    it("withLease releases on return and suspends on throw", async () => {
      const k = key("with");
      const out = await a.withLease(k, { ttlMs: 5_000 }, async (lease) => {
        assert.equal(await lease.gate(), lease.fence);
        return "done";
      });
      assert.equal(out, "done");
      const boom = new Error("boom");
      await assert.rejects(
        b.withLease(k, { ttlMs: 5_000 }, async (lease) => {
          assert.equal(lease.previous?.end, "released");
          throw boom;
        }),
        (e: unknown) => e === boom,
      );
      const third = await a.acquire(k, { ttlMs: 5_000 });
      assert.equal(third.previous?.end, "suspended");
      assert.equal(third.previous?.owner, "graph-b");
      assert.equal(third.recovered, true);
      await third.release();
    });

    it("await using suspends a lease that was not released", async () => {
      const k = key("using");
      let fence: bigint;
      {
        await using lease = await a.acquire(k, { ttlMs: 5_000 });
        fence = lease.fence;
        assert.ok(lease.isValid());
      }
      const next = await b.acquire(k, { ttlMs: 5_000 });
      assert.equal(next.previous?.end, "suspended");
      assert.equal(next.previous?.fence, fence);
      await next.release();
    });

    it("renews in the background, so a lease outlives its TTL", async () => {
      const k = key("renew");
      const lease = await a.acquire(k, { ttlMs: 600 });
      const firstExpiry = lease.serverExpiresAtMs;
      await new Promise((r) => setTimeout(r, 1_500));
      assert.ok(lease.isValid(), `lost: ${lease.lossReason}`);
      assert.equal(lease.signal.aborted, false);
      assert.ok(lease.serverExpiresAtMs > firstExpiry, "the server's expiry moved forward");
      assert.equal(await lease.gate(), lease.fence);
      await assert.rejects(b.acquire(k, { ttlMs: 600 }), BusyError);
      await lease.release();
    });

    it("a renewal refused as stale aborts the signal for good", async () => {
      const k = key("stale");
      // Two handles on one term (a replayed grant); ending it through one
      // makes the other's next renewal stale.
      const one = await a.acquire(k, { ttlMs: 600, requestId: "req-stale" });
      const two = await a.acquire(k, { ttlMs: 600, requestId: "req-stale" });
      assert.equal(two.replayed, true);
      assert.equal(two.fence, one.fence);
      await two.release();
      await waitFor(() => one.signal.aborted, 2_000, "the stale renewal to abort the signal");
      assert.ok(one.signal.reason instanceof LeaseLostError);
      assert.equal(one.lossReason, "released");
      assert.equal(one.isValid(), false);
      await assert.rejects(one.gate(), (e: unknown) => e instanceof LeaseLostError && e.reason === "released");
      await assert.rejects(one.verify(), LeaseLostError);
      await new Promise((r) => setTimeout(r, 400));
      assert.equal(one.isValid(), false, "never valid again");
      await assert.rejects(one.release(), LeaseLostError);
    });

    it("answers a storage-fenced gate of a fresh lease locally, and asks the server once a renewal failed", async () => {
      const lease = await a.acquire(key("fresh-gate"), { ttlMs: 10_000, renewEveryMs: 300, rpcTimeoutMs: 300 });
      /** Whether the storage-fenced gate answered while the server is frozen (so without asking it). */
      const answersFrozen = async (): Promise<boolean> => {
        server.freeze();
        try {
          return (await lease.gate({ storageFenced: true })) === lease.fence;
        } catch (err) {
          assert.ok(err instanceof UnavailableError, `the gate failed with ${String(err)}`);
          return false;
        } finally {
          server.thaw();
        }
      };
      server.freeze();
      try {
        // Fresh: answered with no round trip, although the server is frozen.
        assert.equal(await lease.gate({ storageFenced: true }), lease.fence);
        // The plain gate still asks the server, which does not answer.
        await assert.rejects(lease.gate(), UnavailableError);
        // A renewal goes unanswered: no longer fresh, so this gate asks too.
        let asked = false;
        for (let i = 0; i < 20 && !asked; i++) {
          asked = await lease.gate({ storageFenced: true }).then(
            () => false,
            (err: unknown) => err instanceof UnavailableError,
          );
          if (!asked) await new Promise((r) => setTimeout(r, 100));
        }
        assert.ok(asked, "the storage-fenced gate of a lease whose renewal failed asked the frozen server");
        assert.ok(lease.isValid(), "the lease is still valid: only its freshness is in doubt");
      } finally {
        server.thaw();
      }
      // Once a renewal succeeds again, the gate answers locally again (each
      // freeze well after the last thaw: a gate right after a quick
      // thaw-and-freeze was once answered).
      let fresh = false;
      for (let i = 0; i < 20 && !fresh; i++) {
        await new Promise((r) => setTimeout(r, 200));
        fresh = await answersFrozen();
      }
      assert.ok(fresh, "the lease was fresh again after a successful renewal");
      await lease.release();
    });

    it("maps a server refusal of bad input to InvalidArgumentError", async () => {
      await assert.rejects(a.acquire(key("bad-ttl"), { ttlMs: 50 }), InvalidArgumentError);
      await assert.rejects(a.acquire("", { ttlMs: 1_000 }), InvalidArgumentError);
    });

    it("loses the lease when the server freezes past the TTL; the old release is refused after", async () => {
      const k = key("freeze");
      const lease = await a.acquire(k, { ttlMs: 600 });
      assert.ok(lease.isValid());
      const abortedAt: number[] = [];
      lease.signal.addEventListener("abort", () => abortedAt.push(Date.now()));
      const frozenAt = Date.now();
      server.freeze();
      try {
        await waitFor(() => lease.signal.aborted, 3_000, "the lease's signal to abort");
        const after = (abortedAt[0] ?? 0) - frozenAt;
        assert.ok(after <= 600, `aborted ${after} ms after the freeze, later than the TTL`);
        assert.equal(lease.isValid(), false);
        assert.equal(lease.lossReason, "deadline");
        // No round trip is needed to refuse: the gate fails locally, at once.
        const t0 = Date.now();
        await assert.rejects(lease.gate(), (e: unknown) => e instanceof LeaseLostError && e.reason === "deadline");
        assert.ok(Date.now() - t0 < 100, "the gate refused without waiting on the frozen server");
        // Stay frozen past the TTL on the server's clock too.
        await new Promise((r) => setTimeout(r, 400));
      } finally {
        server.thaw();
      }
      await assert.rejects(lease.release(), (e: unknown) => e instanceof LeaseLostError && e.reason === "expired");
      const next = await b.acquire(k, { ttlMs: 5_000, waitMs: 2_000 });
      assert.ok(next.fence > lease.fence);
      assert.equal(next.recovered, true);
      assert.equal(next.previous?.end, "expired");
      await next.release();
    });
  });
}

describe("where Acquire goes", () => {
  it("an Acquire that does not wait rides the Session stream its lease then renews and releases on; one that waits is unary", async () => {
    const metricsAt = `127.0.0.1:${await freePort()}`;
    const counted = await startServer(undefined, "127.0.0.1:0", ["--metrics-listen", metricsAt]);
    // Every call the client starts, by method name (a Session stream is one call).
    const started: string[] = [];
    const client = createClient({
      baseUrl: counted.baseUrl,
      owner: "graph-a",
      interceptors: [
        (next) => async (req) => {
          started.push(req.method.name);
          return await next(req);
        },
      ],
    });
    try {
      const lease = await client.acquire("where:fresh", { ttlMs: 5_000 });
      await lease.gate();
      await lease.release();
      assert.deepEqual(started, ["Session"], "one stream for the grant, the check and the release");
      const counts = async (): Promise<number[]> =>
        Promise.all(["Acquire", "Session.Acquire", "Session.Check", "Session.Release"].map((rpc) => answered(metricsAt, rpc)));
      assert.deepEqual(await counts(), [0, 1, 1, 1]);

      // A waiting Acquire must not hold a slot of the shared stream; its
      // release goes on the stream, still open from the first lease.
      const waited = await client.acquire("where:waited", { ttlMs: 5_000, waitMs: 1_000 });
      await waited.release();
      assert.deepEqual(started, ["Session", "Acquire"]);
      assert.deepEqual(await counts(), [1, 1, 1, 2]);
    } finally {
      client.close();
      await counted.close();
    }
  });

  it("keeps an idle Session stream for the next session a moment, then closes it", async () => {
    const server = await startServer();
    const started: string[] = [];
    const client = createClient({
      baseUrl: server.baseUrl,
      interceptors: [
        (next) => async (req) => {
          started.push(req.method.name);
          return await next(req);
        },
      ],
    });
    try {
      for (let i = 0; i < 3; i++) await (await client.acquire("linger:a", { ttlMs: 5_000 })).release();
      assert.deepEqual(started, ["Session"], "one session after another shares one stream");
      await new Promise((r) => setTimeout(r, STREAM_LINGER_MS + 250));
      await (await client.acquire("linger:a", { ttlMs: 5_000 })).release();
      assert.deepEqual(started, ["Session", "Session"], "the idle stream was closed, and a new one opened");
    } finally {
      client.close();
      await server.close();
    }
  });
});
