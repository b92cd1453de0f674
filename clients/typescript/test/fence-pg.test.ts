// The storage-side fence SQL (PG_ADVANCE via pgFencedWrite) against a real
// PostgreSQL. Needs LEASEHOLD_TEST_PG_URL (e.g.
// postgres://postgres@127.0.0.1:5432/test); skipped only when it is unset.
// Works in its own schema, created and dropped here.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import {
  FenceTimeoutError,
  InvalidArgumentError,
  PG_CREATE_TABLE,
  pgFencedWrite,
  type PgQueryable,
  StaleFenceError,
} from "../src/index.js";
import { PausedWriter } from "./paused-writer.js";

const url = process.env.LEASEHOLD_TEST_PG_URL;

describe("storage-side fencing in PostgreSQL", { skip: url === undefined || url === "" ? "LEASEHOLD_TEST_PG_URL is not set" : false }, () => {
  const schema = `leasehold_ts_${randomBytes(6).toString("hex")}`;
  let one: pg.Client;
  let two: pg.Client;
  let pool: pg.Pool;

  before(async () => {
    one = new pg.Client({ connectionString: url });
    two = new pg.Client({ connectionString: url });
    await one.connect();
    await two.connect();
    await one.query(`CREATE SCHEMA ${schema}`);
    for (const c of [one, two]) await c.query(`SET search_path TO ${schema}`);
    await one.query(PG_CREATE_TABLE);
    pool = new pg.Pool({ connectionString: url, max: 4, options: `-c search_path=${schema}` });
    await one.query("CREATE TABLE items (session TEXT NOT NULL, body TEXT NOT NULL, fence BIGINT NOT NULL)");
  });
  after(async () => {
    await one?.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await pool?.end();
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

  const bodiesOf = async (session: string): Promise<string[]> =>
    (await one.query("SELECT body FROM items WHERE session = $1 ORDER BY ctid", [session])).rows.map(
      (r: { body: string }) => r.body,
    );
  const fenceOf = async (key: string): Promise<string | undefined> =>
    ((await one.query("SELECT fence::text AS f FROM leasehold_fence WHERE key = $1", [key])).rows[0] as { f?: string } | undefined)?.f;
  /** Whether some backend waits for a lock (a fence advance queued behind another transaction's row). */
  const someoneWaitsForALock = async (): Promise<boolean> =>
    (await one.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'")).rows[0].n > 0;

  it("through a pg.Pool, a stale writer's work cannot land after a newer fence's (one connection per transaction)", async () => {
    // The older writer (fence 1) is inside its transaction when the newer
    // one (fence 2) starts. Each must be one transaction on one connection:
    // the newer one's advance then waits for the older's commit, and the
    // rows land in fence order. (Statement by statement over the pool, the
    // newer one committed first and the older's row landed after it.)
    const key = "pool";
    let release!: () => void;
    const newerStarted = new Promise<void>((r) => (release = r));
    let newerDone = false;
    const older = pgFencedWrite(pool, key, 1n, async (c) => {
      await newerStarted;
      // Give the newer writer time to finish, or to queue behind this row.
      for (let i = 0; i < 50 && !(await someoneWaitsForALock()) && !newerDone; i++) await new Promise((r) => setTimeout(r, 20));
      await insert(key, "A", 1n)(c);
    });
    const newer = (async () => {
      await new Promise((r) => setTimeout(r, 50));
      const p = pgFencedWrite(pool, key, 2n, insert(key, "B", 2n));
      release();
      await p;
      newerDone = true;
    })();
    await Promise.all([older, newer]);
    assert.deepEqual(await bodiesOf(key), ["A", "B"], "fence 1's row before fence 2's");
    assert.equal(await fenceOf(key), "2");
    // A stale writer through the pool afterwards is refused, nothing landed.
    await assert.rejects(pgFencedWrite(pool, key, 1n, insert(key, "late", 1n)), StaleFenceError);
    assert.deepEqual(await bodiesOf(key), ["A", "B"]);
    assert.equal(pool.idleCount, pool.totalCount, "every checked-out client went back");
  });

  it("refuses a 'client' that sends each statement on another connection, and advances nothing", async () => {
    const key = "spread";
    await pgFencedWrite(one, key, 3n, insert(key, "x", 3n));
    let turn = 0;
    const spread: PgQueryable = { query: (text, values) => [one, two][turn++ % 2]!.query(text, values) };
    await assert.rejects(pgFencedWrite(spread, key, 4n, insert(key, "y", 4n)), InvalidArgumentError);
    for (const c of [one, two]) await c.query("ROLLBACK").catch(() => undefined);
    assert.equal(await fenceOf(key), "3", "the fence did not move outside the transaction");
    assert.deepEqual(await bodiesOf(key), ["x"]);
  });

  it("runs concurrent fenced writes on one shared pg.Client one after another", async () => {
    // Interleaved on one connection, the stale writer's ROLLBACK undid the
    // newer writer's fence advance, and the newer one's row landed outside
    // any transaction.
    const key = "shared";
    const newer = pgFencedWrite(one, key, 2n, async (c) => {
      await new Promise((r) => setTimeout(r, 30));
      await insert(key, "B", 2n)(c);
    });
    const older = pgFencedWrite(one, key, 1n, insert(key, "A", 1n)).catch((e: unknown) => e);
    await newer;
    assert.ok((await older) instanceof StaleFenceError, String(await older));
    assert.deepEqual(await bodiesOf(key), ["B"]);
    assert.equal(await fenceOf(key), "2", "the newer writer's fence is recorded");
    // A nested write on the same connection would wait for itself: refused.
    await assert.rejects(
      pgFencedWrite(one, key, 2n, () => pgFencedWrite(one, key, 2n, insert(key, "C", 2n))),
      InvalidArgumentError,
    );
    assert.deepEqual(await bodiesOf(key), ["B"]);
  });

  it("an owner paused inside its fenced write: the next owner gets FenceTimeoutError, then the server ends the paused transaction and the old commit is refused", async () => {
    const key = "paused";
    const old = new PausedWriter(["pg", url as string, schema, key, "1", "old", "4000"]);
    try {
      const pid = Number((await old.line(/^inside /)).split(" ")[1]);
      old.stop();
      // The next owner's advance waits for the paused transaction's row:
      // bounded, and reported as the library's error.
      const first = await Promise.race([
        pgFencedWrite(two, key, 2n, insert(key, "new", 2n), { lockTimeoutMs: 300 }).then(
          () => "committed",
          (e: unknown) => e,
        ),
        new Promise((r) => setTimeout(() => r("still waiting after 3 s"), 3000)),
      ]);
      assert.ok(first instanceof FenceTimeoutError && first.reason === "busy", String(first));
      // The paused transaction sat idle past its bound: the server ends its session.
      for (let i = 0; i < 150; i++) {
        const alive = await one.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", [pid]);
        if (alive.rowCount === 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      await pgFencedWrite(two, key, 2n, insert(key, "new", 2n));
      old.resume();
      const said = await old.line(/^(ok|error)/);
      assert.match(said, /^error FenceTimeoutError idle/);
      assert.deepEqual(await bodiesOf(key), ["new"], "nothing of the paused owner's write landed");
      assert.equal(await fenceOf(key), "2");
    } finally {
      old.kill();
    }
  });
});
