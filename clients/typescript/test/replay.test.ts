// A replayed grant (the same owner and request id) gets no local deadline it
// cannot prove: the same cases as the Rust (client_guard.rs) and Python
// (test_sync.py, test_async.py) clients' replay tests, so the three cannot
// drift apart.

import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { after, before, describe, it } from "node:test";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { createClient, type Lease, UnavailableError } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

/**
 * Fails every renewal (unary Renew or the Session stream that carries them) at
 * the client. The acquires below wait (`waitMs: 1`) so that they are unary
 * calls, not operations of the stream this cuts.
 */
const cutRenewals: Interceptor = (next) => async (req) => {
  if (req.method.name === "Renew" || req.method.name === "Session") {
    throw new ConnectError("renewals cut by the test", Code.Unavailable);
  }
  return next(req);
};

for (const transport of ["grpc", "grpc-web"] as const) {
  describe(`replayed grants over ${transport}`, () => {
    let server: TestServer;
    let n = 0;
    const key = (name: string): string => `replay:${transport}:${name}:${++n}`;

    before(async () => {
      server = await startServer();
    });
    after(async () => {
      await server.close();
    });

    it("a replay of a caller-supplied request id is of unknown age: with renewals cut it is never valid", async () => {
      const k = key("supplied");
      // Another process (or an earlier run) was granted the term with R1.
      const worker = createClient({ baseUrl: server.baseUrl, transport, owner: "graph-a" });
      const first = await worker.acquire(k, { ttlMs: 3_000, requestId: "R1" });
      const late = createClient({ baseUrl: server.baseUrl, transport, owner: "graph-a", interceptors: [cutRenewals] });
      try {
        // The grant may be nearly over on the server: the send time of this
        // acquire proves nothing about it, and no renewal gets through.
        const outcome = await late.acquire(k, { ttlMs: 3_000, requestId: "R1", waitMs: 1 }).then(
          (lease): Lease | Error => lease,
          (err: unknown): Lease | Error => (err instanceof Error ? err : new Error(String(err))),
        );
        if (outcome instanceof Error) {
          assert.ok(outcome instanceof UnavailableError, `expected UnavailableError, got ${String(outcome)}`);
          assert.match(outcome.message, /could not confirm the grant/);
        } else {
          assert.equal(outcome.replayed, true);
          assert.equal(outcome.isValid(), false, "a replayed grant of unknown age was trusted");
          await outcome.suspend().catch(() => undefined);
        }
      } finally {
        await first.release();
        worker.close();
        late.close();
      }
    });

    it("a replay of its own made-up request id keeps the first attempt's send time as the basis", async () => {
      const k = key("generated");
      let firstSent: number | undefined;
      let acquires = 0;
      // The first Acquire reaches the server and is granted, but its reply is
      // "lost" 300 ms later, so the client retries with the same request id.
      const loseFirstReply: Interceptor = (next) => async (req) => {
        if (req.method.name !== "Acquire") return next(req);
        acquires += 1;
        if (acquires > 1) return next(req);
        firstSent = performance.now();
        await next(req);
        await new Promise((r) => setTimeout(r, 300));
        throw new ConnectError("reply lost by the test", Code.Unavailable);
      };
      const lh = createClient({ baseUrl: server.baseUrl, transport, owner: "graph-b", interceptors: [loseFirstReply, cutRenewals] });
      try {
        const lease = await lh.acquire(k, { ttlMs: 1_500, waitMs: 1 });
        assert.equal(acquires, 2, "the lost reply was retried");
        assert.equal(lease.replayed, true);
        // Its own request id: the grant came after the first send, so the
        // lease is valid now, on that basis...
        assert.ok(lease.isValid(), `lost: ${lease.lossReason}`);
        // ...and no longer than the first send's TTL less the margin
        // (1 350 ms), not the retry's, which came 300 ms later.
        const deadline = (firstSent ?? 0) + 1_500 - 150;
        await new Promise((r) => setTimeout(r, Math.max(0, deadline + 30 - performance.now())));
        assert.equal(lease.isValid(), false, "the deadline rests on a later send than the first");
        assert.equal(lease.lossReason, "deadline");
      } finally {
        lh.close();
      }
    });
  });
}
