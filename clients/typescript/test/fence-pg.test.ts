// The storage-side fence SQL (PG_ADVANCE via pgFencedWrite) against a real
// PostgreSQL. Needs LEASEHOLD_TEST_PG_URL (e.g.
// postgres://postgres@127.0.0.1:5432/test); skipped only when it is unset.
// Works in its own schema, created and dropped here.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import { PG_CREATE_TABLE, pgFencedWrite, type PgQueryable, StaleFenceError } from "../src/index.js";

const url = process.env.LEASEHOLD_TEST_PG_URL;

describe("storage-side fencing in PostgreSQL", { skip: url === undefined || url === "" ? "LEASEHOLD_TEST_PG_URL is not set" : false }, () => {
  const schema = `leasehold_ts_${randomBytes(6).toString("hex")}`;
  let one: pg.Client;
  let two: pg.Client;

  before(async () => {
    one = new pg.Client({ connectionString: url });
    two = new pg.Client({ connectionString: url });
    await one.connect();
    await two.connect();
    await one.query(`CREATE SCHEMA ${schema}`);
    for (const c of [one, two]) await c.query(`SET search_path TO ${schema}`);
    await one.query(PG_CREATE_TABLE);
    await one.query("CREATE TABLE items (session TEXT NOT NULL, body TEXT NOT NULL, fence BIGINT NOT NULL)");
  });
  after(async () => {
    await one?.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await one?.end();
    await two?.end();
  });

  const insert = (session: string, body: string, fence: bigint) => (c: PgQueryable) =>
    c.query("INSERT INTO items (session, body, fence) VALUES ($1, $2, $3)", [session, body, fence.toString()]);

  it("accepts the current and equal fences, refuses a lower one and rolls its write back", async () => {
    await pgFencedWrite(one, "s1", 5n, insert("s1", "a", 5n));
    await pgFencedWrite(one, "s1", 5n, insert("s1", "b", 5n)); // one holder writes many times
    await pgFencedWrite(two, "s1", 7n, insert("s1", "c", 7n)); // a newer holder
    const err = await pgFencedWrite(one, "s1", 5n, insert("s1", "late", 5n)).catch((e: unknown) => e);
    assert.ok(err instanceof StaleFenceError, String(err));
    assert.equal(err.fence, 5n);
    assert.equal(err.highest, 7n);
    const rows = await one.query("SELECT body FROM items WHERE session = 's1' ORDER BY body");
    assert.deepEqual(
      rows.rows.map((r: { body: string }) => r.body),
      ["a", "b", "c"],
      "the stale write was rolled back",
    );
    // Other keys are independent.
    await pgFencedWrite(one, "s2", 1n, insert("s2", "x", 1n));
  });

  it("keeps fences above 2^53 exact", async () => {
    const big = 2n ** 53n + 1n;
    await pgFencedWrite(one, "big", big, insert("big", "x", big));
    const err = await pgFencedWrite(one, "big", big - 1n, insert("big", "y", big - 1n)).catch((e: unknown) => e);
    assert.ok(err instanceof StaleFenceError, "2^53 is lower than 2^53 + 1, though not as numbers");
    assert.equal(err.highest, big);
    const stored = await one.query("SELECT fence::text AS f FROM leasehold_fence WHERE key = 'big'");
    assert.equal(stored.rows[0]?.f, big.toString());
  });

  it("orders a concurrent newer holder: the older writer blocked behind it is refused", async () => {
    await pgFencedWrite(one, "race", 1n, insert("race", "first", 1n));
    // The newer holder advances the fence inside an open transaction...
    await two.query("BEGIN");
    await two.query("INSERT INTO leasehold_fence (key, fence) VALUES ('race', 2) ON CONFLICT (key) DO UPDATE SET fence = excluded.fence WHERE excluded.fence >= leasehold_fence.fence");
    // ...the old holder's write waits on the row lock, then sees fence 2.
    const late = pgFencedWrite(one, "race", 1n, insert("race", "late", 1n)).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 100));
    await two.query("COMMIT");
    assert.ok((await late) instanceof StaleFenceError);
  });
});
