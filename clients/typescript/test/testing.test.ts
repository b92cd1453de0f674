// @leasehold/client/testing: the throwaway server users' own tests start.

import assert from "node:assert/strict";
import { chmodSync, existsSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { execFileSync } from "node:child_process";

import { createClient, PROTOCOL } from "../src/index.js";
import { findBinary, IncompatibleServerError, NoServerBinaryError, startTestServer } from "../src/testing.js";

describe("testing: startTestServer", () => {
  it("serves a real server on loopback and deletes its database on close", async () => {
    const server = await startTestServer();
    assert.match(server.baseUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    const lh = createClient({ baseUrl: server.baseUrl });
    const lease = await lh.acquire("k", { ttlMs: 5_000 });
    assert.ok(lease.fence >= 1n);
    await lease.release();
    lh.close();
    assert.ok(existsSync(server.dbPath));
    await server.close();
    assert.ok(!existsSync(server.dbPath));
  });

  it("closes at once with a client left open, not after the server's drain", async () => {
    const server = await startTestServer();
    const lh = createClient({ baseUrl: server.baseUrl });
    try {
      // A client left watching keeps its connection busy, which holds a
      // draining server (an idle one the client closes on GOAWAY).
      await (await lh.acquire("k", { ttlMs: 5_000 })).release();
      const watch = lh.watch({ prefix: "" });
      await watch.ready;
      const watching = (async () => {
        for await (const _ of watch) {
          // left open, as a test that forgets to close its client
        }
      })().catch(() => undefined);
      const started = performance.now();
      await server.close();
      const elapsed = performance.now() - started;
      // A generous bound against the 5 s drain (and the 3 s SIGKILL), not a benchmark.
      assert.ok(elapsed < 2_000, `close took ${Math.round(elapsed)} ms`);
      assert.ok(!existsSync(server.dbPath));
      await watching;
    } finally {
      lh.close();
    }
  });

  it("passes a drain timeout of one's own as given", async () => {
    const server = await startTestServer(["--drain-timeout-ms", "250"]);
    const lh = createClient({ baseUrl: server.baseUrl });
    try {
      await (await lh.acquire("k", { ttlMs: 5_000 })).release();
    } finally {
      lh.close();
      await server.close();
    }
  });

  it("finds leasehold on PATH, and says how to get one when there is none", async () => {
    const saved = { bin: process.env.LEASEHOLD_BIN, path: process.env.PATH };
    const dir = mkdtempSync(join(tmpdir(), "leasehold-path-"));
    try {
      symlinkSync(saved.bin ?? "", join(dir, "leasehold"));
      delete process.env.LEASEHOLD_BIN;
      process.env.PATH = dir;
      assert.equal(findBinary(), join(dir, "leasehold"));
      process.env.PATH = join(dir, "empty");
      await assert.rejects(startTestServer(), (err: unknown) => {
        assert.ok(err instanceof NoServerBinaryError);
        assert.match(err.message, /set LEASEHOLD_BIN/);
        return true;
      });
      process.env.LEASEHOLD_BIN = join(dir, "missing");
      assert.throws(() => findBinary(), /not an executable file/);
    } finally {
      process.env.LEASEHOLD_BIN = saved.bin;
      process.env.PATH = saved.path;
    }
  });

  it("reads the server's version, and refuses a server older than the client by name", async () => {
    const server = await startTestServer();
    const lh = createClient({ baseUrl: server.baseUrl });
    try {
      const info = await lh.serverInfo();
      assert.ok(info.compatible && info.protocol >= PROTOCOL, JSON.stringify(info));
      assert.equal(info.backend, "sqlite");
      assert.ok(execFileSync(process.env.LEASEHOLD_BIN ?? "", ["--version"], { encoding: "utf8" }).includes(info.version));
    } finally {
      lh.close();
      await server.close();
    }

    // A gRPC server that is not leasehold.v1 (an older release looks the
    // same: no ServerInfo) answers every call UNIMPLEMENTED, as grpc does.
    const dir = mkdtempSync(join(tmpdir(), "leasehold-foreign-"));
    const fake = join(dir, "leasehold");
    writeFileSync(
      fake,
      `#!${process.execPath}
const http2 = require("node:http2");
const server = http2.createServer();
server.on("stream", (stream) => stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "12" }, { endStream: true }));
server.listen(0, "127.0.0.1", () => console.log("listening on 127.0.0.1:" + server.address().port));
setTimeout(() => process.exit(0), 30000).unref();
process.on("SIGTERM", () => process.exit(0));
`,
    );
    chmodSync(fake, 0o755);
    const saved = process.env.LEASEHOLD_BIN;
    process.env.LEASEHOLD_BIN = fake;
    try {
      await assert.rejects(startTestServer(), (err: unknown) => {
        assert.ok(err instanceof IncompatibleServerError, String(err));
        assert.match(err.message, /older than this client/);
        assert.match(err.message, new RegExp(`revision ${PROTOCOL}`));
        assert.match(err.message, /leasehold health/);
        return true;
      });
    } finally {
      process.env.LEASEHOLD_BIN = saved;
    }
  });
});
