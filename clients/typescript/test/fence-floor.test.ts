// A lock server whose store was reset: its fences start at 1 again, and
// every fenced write of a key the application database had seen is refused
// (StaleFenceError) until the server is started with `--fence-floor` at
// least the highest fence stored, which sqliteFenceFloor / pgFenceFloor
// report. Real servers (LEASEHOLD_BIN), a real SQLite file and, with
// LEASEHOLD_TEST_PG_URL, a schema of its own.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import Database from "better-sqlite3";
import pg from "pg";
import {
  createClient,
  PG_CREATE_TABLE,
  pgFencedWrite,
  pgFenceFloor,
  SQLITE_CREATE_TABLE,
  sqliteFencedWrite,
  sqliteFenceFloor,
  StaleFenceError,
} from "../src/index.js";
import { startServer } from "./server.js";

/** The fences of `times` terms of `key` from a fresh server (`extra` its flags), one after the other. */
async function ownedFences(keys: [string, number][], extra: string[] = []): Promise<bigint[]> {
  const server = await startServer(undefined, "127.0.0.1:0", extra);
  const client = createClient({ baseUrl: server.baseUrl, owner: "app" });
  try {
    const fences: bigint[] = [];
    for (const [key, times] of keys) {
      for (let i = 0; i < times; i++) {
        const lease = await client.acquire(key, { ttlMs: 5_000 });
        fences.push(lease.fence);
        await lease.release();
      }
    }
    return fences;
  } finally {
    client.close();
    await server.close();
  }
}

/** Writes through one server, then a reset one (refused), then one started with the reported floor (written). */
async function resetAndCure(write: (key: string, fence: bigint) => Promise<void>, floorOf: () => Promise<bigint>): Promise<void> {
  assert.equal(await floorOf(), 0n);
  const fences = await ownedFences([
    ["thread-9", 4],
    ["thread-1", 1],
  ]);
  await write("thread-9", fences[3]!);
  await write("thread-1", fences[4]!);
  const floor = await floorOf();
  assert.equal(floor, fences[4]);

  const [reset] = await ownedFences([["thread-9", 1]]);
  assert.ok(reset! < fences[3]!);
  await assert.rejects(write("thread-9", reset!), (e: unknown) => {
    assert.ok(e instanceof StaleFenceError);
    assert.equal(e.highest, fences[3]);
    assert.match(e.message, new RegExp(`fence ${fences[3]} has already written`));
    assert.match(e.message, /--fence-floor/);
    return true;
  });

  const cured = await ownedFences(
    [
      ["thread-9", 1],
      ["thread-1", 1],
    ],
    ["--fence-floor", floor.toString()],
  );
  for (const fence of cured) assert.ok(fence > floor, `fence ${fence} is not above the floor ${floor}`);
  await write("thread-9", cured[0]!);
  await write("thread-1", cured[1]!);
}

describe("a reset lock server and --fence-floor", () => {
  it("SQLite: the floor sqliteFenceFloor reports lets every key write again", async () => {
    const dir = mkdtempSync(join(tmpdir(), "leasehold-floor-"));
    const db = new Database(join(dir, "app.db"));
    try {
      db.exec(SQLITE_CREATE_TABLE);
      db.exec("CREATE TABLE items (session TEXT NOT NULL, fence INTEGER NOT NULL)");
      await resetAndCure(
        async (key, fence) => {
          sqliteFencedWrite(db, key, fence, () => db.prepare("INSERT INTO items VALUES (?, ?)").run(key, fence));
        },
        async () => sqliteFenceFloor(db),
      );
    } finally {
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("SQLite: a database without the fence table is an error, not 0", () => {
    const db = new Database(":memory:");
    try {
      assert.throws(() => sqliteFenceFloor(db), /no such table/);
    } finally {
      db.close();
    }
  });

  const url = process.env.LEASEHOLD_TEST_PG_URL;
  it(
    "PostgreSQL: the floor pgFenceFloor reports lets every key write again",
    { skip: url === undefined || url === "" ? "LEASEHOLD_TEST_PG_URL is not set" : false },
    async () => {
      const schema = `leasehold_ts_${randomBytes(6).toString("hex")}`;
      const conn = new pg.Client({ connectionString: url });
      await conn.connect();
      try {
        await conn.query(`CREATE SCHEMA ${schema}`);
        await conn.query(`SET search_path TO ${schema}`);
        await conn.query(PG_CREATE_TABLE);
        await conn.query("CREATE TABLE items (session TEXT NOT NULL, fence BIGINT NOT NULL)");
        await resetAndCure(
          async (key, fence) => {
            await pgFencedWrite(conn, key, fence, (c) =>
              c.query("INSERT INTO items VALUES ($1, $2)", [key, fence.toString()]),
            );
          },
          () => pgFenceFloor(conn),
        );
      } finally {
        await conn.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
        await conn.end();
      }
    },
  );
});
