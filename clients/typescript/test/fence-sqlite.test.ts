// sqliteFencedWrite on a real SQLite file (better-sqlite3): a current fence
// commits, a stale one is refused and rolls back, and neither keeps the
// write lock; a connection already in a transaction, or an async `work`,
// is refused.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import Database from "better-sqlite3";
import {
  FenceTimeoutError,
  InvalidArgumentError,
  SQLITE_CREATE_TABLE,
  sqliteFencedWrite,
  StaleFenceError,
} from "../src/index.js";
import { PausedWriter } from "./paused-writer.js";

describe("sqliteFencedWrite", () => {
  let dir: string;
  let one: Database.Database;
  let two: Database.Database;

  before(() => {
    dir = mkdtempSync(join(tmpdir(), "leasehold-fence-"));
    const path = join(dir, "app.db");
    one = new Database(path);
    one.pragma("journal_mode = WAL");
    one.exec(SQLITE_CREATE_TABLE);
    one.exec("CREATE TABLE items (body TEXT NOT NULL)");
    // The second connection never waits for a lock: a held one shows at once.
    two = new Database(path, { timeout: 0 });
  });
  after(() => {
    one.close();
    two.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const bodies = (): string[] => (two.prepare("SELECT body FROM items ORDER BY rowid").all() as { body: string }[]).map((r) => r.body);
  const lockIsFree = (): boolean => {
    try {
      two.exec("BEGIN IMMEDIATE");
      two.exec("ROLLBACK");
      return true;
    } catch {
      return false;
    }
  };

  it("commits a current fence, refuses a stale one with nothing landed, and frees the lock", () => {
    const k = "session:1";
    assert.equal(sqliteFencedWrite(one, k, 5n, () => one.prepare("INSERT INTO items VALUES ('new')").run().changes), 1);
    assert.deepEqual(bodies(), ["new"]);
    assert.ok(lockIsFree());
    assert.throws(
      () => sqliteFencedWrite(one, k, 4n, () => one.prepare("INSERT INTO items VALUES ('late')").run()),
      (e: unknown) => e instanceof StaleFenceError && e.fence === 4n && e.highest === 5n,
    );
    assert.deepEqual(bodies(), ["new"], "the stale writer's row was rolled back");
    assert.equal(one.inTransaction, false);
    assert.ok(lockIsFree());
    sqliteFencedWrite(two, k, 6n, () => two.prepare("INSERT INTO items VALUES ('newer')").run());
    assert.deepEqual(bodies(), ["new", "newer"]);
  });

  it("rolls back when the work throws", () => {
    assert.throws(
      () =>
        sqliteFencedWrite(one, "session:2", 1n, () => {
          one.prepare("INSERT INTO items VALUES ('half')").run();
          throw new Error("the handler failed");
        }),
      /the handler failed/,
    );
    assert.equal(bodies().includes("half"), false);
    assert.equal(one.inTransaction, false);
    assert.ok(lockIsFree());
  });

  it("refuses a connection already in a transaction, and async work", () => {
    one.exec("BEGIN");
    try {
      assert.throws(() => sqliteFencedWrite(one, "session:3", 1n, () => undefined), InvalidArgumentError);
    } finally {
      one.exec("ROLLBACK");
    }
    assert.throws(
      () => sqliteFencedWrite(one, "session:3", 1n, () => Promise.resolve(1)),
      InvalidArgumentError,
    );
    assert.equal(one.inTransaction, false);
    assert.ok(lockIsFree());
  });

  it("an owner paused inside its fenced write: the next owner gets FenceTimeoutError, and the paused commit is refused", async () => {
    const key = "session:paused";
    // The worker writes "items (session, body)": a database of its own.
    const own = join(dir, "paused.db");
    const setup = new Database(own);
    setup.pragma("journal_mode = WAL");
    setup.exec(SQLITE_CREATE_TABLE);
    setup.exec("CREATE TABLE items (session TEXT NOT NULL, body TEXT NOT NULL)");
    setup.close();
    const old = new PausedWriter(["sqlite", own, key, "1", "old", "200"]);
    const next = new Database(own, { timeout: 300 });
    try {
      await old.line(/^inside /);
      old.stop();
      // The paused owner holds the write lock: the next owner's BEGIN waits
      // out its busy timeout, reported as the library's error.
      assert.throws(
        () => sqliteFencedWrite(next, key, 2n, () => next.prepare("INSERT INTO items VALUES (?, 'new')").run(key)),
        (e: unknown) => e instanceof FenceTimeoutError && e.reason === "busy",
      );
      old.resume();
      // Open far past its bound, the paused transaction rolls back instead of committing.
      assert.match(await old.line(/^(ok|error)/), /^error FenceTimeoutError open/);
      sqliteFencedWrite(next, key, 2n, () => next.prepare("INSERT INTO items VALUES (?, 'new')").run(key));
      const rows = next.prepare("SELECT body FROM items ORDER BY rowid").all() as { body: string }[];
      assert.deepEqual(rows.map((r) => r.body), ["new"], "nothing of the paused owner's write landed");
      const stored = next.prepare("SELECT fence FROM leasehold_fence WHERE key = ?").get(key) as { fence: number };
      assert.equal(stored.fence, 2);
    } finally {
      old.kill();
      next.close();
    }
  });
});
