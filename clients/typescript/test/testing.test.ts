// @leasehold/client/testing: the throwaway server users' own tests start.

import assert from "node:assert/strict";
import { existsSync, mkdtempSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { createClient } from "../src/index.js";
import { findBinary, NoServerBinaryError, startTestServer } from "../src/testing.js";

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
});
