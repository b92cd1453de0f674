// End to end: fences above 2^53 from a real server, which calls each
// transport makes, an unreachable server, and a process that can exit.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Interceptor } from "@connectrpc/connect";
import { BusyError, createClient, UnavailableError } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const HIGH_WATER = 2n ** 53n + 1n; // 9007199254740993: a number cannot hold it

/** Runs one SQL statement on a stopped server's database, with Python's
 * sqlite3 module (Python is on every machine this suite runs on; the sqlite3
 * command-line tool is not). */
function sql(dbPath: string, statement: string): void {
  execFileSync("python3", [
    "-c",
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit(); c.close()",
    dbPath,
    statement,
  ]);
}

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const addr = srv.address();
  await new Promise<void>((r) => srv.close(() => r()));
  if (addr === null || typeof addr === "string") throw new Error("no port");
  return addr.port;
}

describe("fences above 2^53 from a real server", () => {
  let server: TestServer;
  before(async () => {
    // Start once so the server creates its schema, then raise its fence
    // high-water mark while it is stopped, and start it again on that database.
    const first = await startServer();
    await first.stop();
    sql(first.dbPath, `UPDATE meta SET value = ${HIGH_WATER} WHERE name = 'fence_high_water'`);
    server = await startServer(join(first.dbPath, ".."));
  });
  after(async () => {
    await server.close();
  });

  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`round-trip exactly over ${transport}: grant, renew, check, busy, release`, async () => {
      const a = createClient({ baseUrl: server.baseUrl, transport, owner: "a" });
      const b = createClient({ baseUrl: server.baseUrl, transport, owner: "b" });
      const k = `high:${transport}`;
      const lease = await a.acquire(k, { ttlMs: 600 });
      assert.equal(typeof lease.fence, "bigint");
      assert.ok(lease.fence > HIGH_WATER, `${lease.fence} > ${HIGH_WATER}`);
      // Renewals and checks present the fence back: a fence rounded through
      // number would be refused as stale.
      await new Promise((r) => setTimeout(r, 900));
      assert.ok(lease.isValid(), `lost: ${lease.lossReason}`);
      assert.equal(await lease.gate(), lease.fence);
      const busy = await b.acquire(k, { ttlMs: 600 }).catch((e: unknown) => e);
      assert.ok(busy instanceof BusyError, String(busy));
      assert.equal(busy.fence, lease.fence);
      const ended = await lease.release();
      assert.equal(ended.fence, lease.fence);
      const next = await b.acquire(k, { ttlMs: 600 });
      assert.equal(next.previous?.fence, lease.fence);
      assert.ok(next.fence > lease.fence);
      await next.release();
      a.close();
      b.close();
    });
  }
});

describe("which calls each transport makes", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server.close();
  });

  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`over ${transport}`, async () => {
      const seen: string[] = [];
      const count: Interceptor = (next) => async (req) => {
        seen.push(req.method.name);
        return next(req);
      };
      const lh = createClient({ baseUrl: server.baseUrl, transport, interceptors: [count] });
      const one = await lh.acquire(`calls:${transport}:1`, { ttlMs: 600 });
      const two = await lh.acquire(`calls:${transport}:2`, { ttlMs: 600 });
      await new Promise((r) => setTimeout(r, 700));
      await one.gate();
      await two.gate();
      assert.ok(one.isValid() && two.isValid());
      await one.release();
      await two.release();
      const n = (name: string): number => seen.filter((s) => s === name).length;
      if (transport === "grpc") {
        // Both grants, every renewal, check and release of both leases on one shared stream.
        assert.equal(n("Session"), 1, seen.join(","));
        assert.equal(n("Acquire") + n("Renew") + n("Check") + n("Release"), 0, seen.join(","));
      } else {
        assert.equal(n("Acquire"), 2);
        assert.equal(n("Session"), 0, seen.join(","));
        assert.ok(n("Renew") >= 2, seen.join(","));
        assert.equal(n("Check"), 2);
        assert.equal(n("Release"), 2);
      }
      lh.close();
    });
  }
});

describe("an unreachable server", () => {
  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`is UnavailableError over ${transport}`, async () => {
      const port = await freePort();
      const lh = createClient({ baseUrl: `http://127.0.0.1:${port}`, transport });
      await assert.rejects(lh.acquire("k", { ttlMs: 300 }), UnavailableError);
      lh.close();
    });
  }
});

describe("a process using the client", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server.close();
  });

  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`exits on its own after releasing over ${transport} (no timer or stream keeps it alive)`, async () => {
      const index = new URL("../src/index.js", import.meta.url).href;
      const script = `
        import { createClient } from ${JSON.stringify(index)};
        const lh = createClient({ baseUrl: ${JSON.stringify(server.baseUrl)}, transport: ${JSON.stringify(transport)} });
        const lease = await lh.acquire("exit:${transport}", { ttlMs: 3000 });
        await lease.gate();
        await lease.release();
        console.log("released " + lease.fence);
      `;
      const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      child.stderr.on("data", (d: Buffer) => (out += d.toString()));
      const code = await new Promise<number | null>((resolve) => {
        const timer = setTimeout(() => {
          child.kill("SIGKILL");
          resolve(-1);
        }, 5_000);
        child.once("exit", (c) => {
          clearTimeout(timer);
          resolve(c);
        });
      });
      assert.equal(code, 0, `the process did not exit cleanly within 5 s: ${out}`);
      assert.match(out, /^released \d+/);
    });
  }
});

describe("a server restart", () => {
  for (const transport of ["grpc", "grpc-web"] as const) {
    it(`keeps a held lease over ${transport}: renewals reconnect (a new Session stream on grpc)`, async () => {
      let server = await startServer();
      const dir = join(server.dbPath, "..");
      const addr = server.baseUrl.replace("http://", "");
      const seen: string[] = [];
      const count: Interceptor = (next) => async (req) => {
        seen.push(req.method.name);
        return next(req);
      };
      const lh = createClient({ baseUrl: server.baseUrl, transport, interceptors: [count] });
      try {
        const lease = await lh.acquire(`restart:${transport}`, { ttlMs: 3_000 });
        await lease.gate();
        await server.stop();
        server = await startServer(dir, addr);
        // A restart gives live terms their full TTL again; renewals retry
        // until one gets through on a new connection.
        await new Promise((r) => setTimeout(r, 1_500));
        assert.ok(lease.isValid(), `lost: ${lease.lossReason}`);
        assert.equal(await lease.gate(), lease.fence);
        const ended = await lease.release();
        assert.equal(ended.end, "released");
        if (transport === "grpc") {
          assert.ok(seen.filter((m) => m === "Session").length >= 2, `a new stream was opened: ${seen.join(",")}`);
        }
      } finally {
        lh.close();
        await server.close();
      }
    });
  }
});
