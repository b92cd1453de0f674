// Failover over several servers on one PostgreSQL database: a lease keeps
// renewing through the next server when one is killed, new acquires go
// there, and a refusal is an answer, not a reason to fail over. The
// two-server tests need LEASEHOLD_TEST_PG_URL (e.g.
// postgres://postgres@127.0.0.1:5432/test) and are skipped only when it is
// unset; each works in its own schema, dropped afterwards.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, it } from "node:test";
import pg from "pg";
import { Endpoints, type Node } from "../src/endpoints.js";
import { BusyError, createClient, InvalidArgumentError, UnavailableError } from "../src/index.js";
import { startServer, type TestServer, waitFor } from "./server.js";

const url = process.env.LEASEHOLD_TEST_PG_URL;
const noPg = url === undefined || url === "" ? "LEASEHOLD_TEST_PG_URL is not set" : false;

/** Two servers on one fresh schema; `done` stops them and drops it. */
async function pair(): Promise<{ a: TestServer; b: TestServer; done: () => Promise<void> }> {
  const schema = `leasehold_fo_${randomBytes(6).toString("hex")}`;
  const store = ["--store", (url ?? "").replace(/^postgresql:/, "postgres:"), "--pg-schema", schema];
  // One after the other: the first applies the schema's migrations.
  const a = await startServer(undefined, "127.0.0.1:0", [], store);
  const b = await startServer(undefined, "127.0.0.1:0", [], store);
  return {
    a,
    b,
    done: async () => {
      await a.close();
      await b.close();
      const admin = new pg.Client({ connectionString: url });
      await admin.connect();
      try {
        await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      } finally {
        await admin.end();
      }
    },
  };
}

for (const transport of ["grpc", "grpc-web"] as const) {
  describe(`failover over ${transport}`, { skip: noPg }, () => {
    it("a lease keeps renewing through the next server after kill -9; a Busy answer does not move on", async () => {
      const { a, b, done } = await pair();
      const lh = createClient({ baseUrl: [a.baseUrl, b.baseUrl], transport, owner: "agent" });
      const other = createClient({ baseUrl: `${a.baseUrl}, ${b.baseUrl}`, transport, owner: "other" });
      try {
        assert.deepEqual(other.baseUrls, [a.baseUrl, b.baseUrl]);
        const lease = await lh.acquire("fo:1", { ttlMs: 1_500 });
        await assert.rejects(other.acquire("fo:1", { ttlMs: 1_500 }), BusyError);
        assert.equal(other.currentBaseUrl, a.baseUrl, "a refusal is an answer");

        await a.kill();
        const before = lease.serverExpiresAtMs;
        await waitFor(() => lease.serverExpiresAtMs > before, 5_000, "a renewal through the second server");
        assert.equal(lh.currentBaseUrl, b.baseUrl);
        assert.equal(lease.signal.aborted, false);
        assert.equal(await lease.gate(), lease.fence);
        const fresh = await other.acquire("fo:2", { ttlMs: 1_500 });
        assert.ok(fresh.fence > lease.fence);
        assert.equal(other.currentBaseUrl, b.baseUrl);
        await fresh.release();
        const busy = await other.acquire("fo:1", { ttlMs: 1_500 }).then(
          () => undefined,
          (err: unknown) => err,
        );
        assert.ok(busy instanceof BusyError && busy.fence === lease.fence, "still held, as the second server sees it");
        assert.equal((await lease.release()).fence, lease.fence);
      } finally {
        lh.close();
        other.close();
        await done();
      }
    });
  });
}

describe("the failover rule", () => {
  const nodes = (...urls: string[]): Node[] => urls.map((u) => ({ url: u }) as Node);
  const down = (node: Node): Promise<string> => Promise.reject(new UnavailableError(`${node.url} refused`));

  it("resends a safe call to the next server, which stays current", async () => {
    const endpoints = new Endpoints(nodes("a", "b", "c"));
    const sent: string[] = [];
    const answer = await endpoints.run("safe", "Get", async (n) => {
      sent.push(n.url);
      return n.url === "a" ? down(n) : n.url;
    });
    assert.equal(answer, "b");
    assert.deepEqual(sent, ["a", "b"]);
    assert.equal(endpoints.current.url, "b");
  });

  it("does not resend an unsafe call, but the next call goes on", async () => {
    const endpoints = new Endpoints(nodes("a", "b"));
    const sent: string[] = [];
    await assert.rejects(
      endpoints.run("unsafe", "BeginToolCalls", (n) => {
        sent.push(n.url);
        return down(n);
      }),
      (err: unknown) => err instanceof UnavailableError && /not resent/.test(err.message),
    );
    assert.deepEqual(sent, ["a"]);
    assert.equal(endpoints.current.url, "b");
  });

  it("takes a refusal as the answer, and names every server when none answers", async () => {
    const endpoints = new Endpoints(nodes("a", "b"));
    await assert.rejects(endpoints.run("safe", "Acquire", () => Promise.reject(new BusyError("held", { key: "k", holder: "x", fence: 1n, remainingMs: 5 }))));
    assert.equal(endpoints.current.url, "a");
    await assert.rejects(
      endpoints.run("safe", "Get", down),
      (err: unknown) => err instanceof UnavailableError && /a refused/.test(err.message) && /b refused/.test(err.message),
    );
  });

  it("takes an array or a comma-separated string of base URLs, and refuses none", () => {
    assert.deepEqual(createClient({ baseUrl: "http://a:1, http://b:2" }).baseUrls, ["http://a:1", "http://b:2"]);
    assert.throws(() => createClient({ baseUrl: " , " }), InvalidArgumentError);
    assert.throws(() => createClient({ baseUrl: ["http://a:1", "b:2"] }), InvalidArgumentError);
  });
});
