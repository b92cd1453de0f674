// Storage-side fencing: the application's own database refuses a write from
// a holder whose lease is over, however late the write arrives. One table
// keeps the highest fence that has written each key; every write transaction
// first advances it, and a write whose fence is lower changes nothing and is
// rolled back. (The same SQL as the Rust `leasehold::fence::sqlite`.)

import { InvalidArgumentError, LeaseholdError } from "./errors.js";

/** SQLite (better-sqlite3, node:sqlite): the table, created once. */
export const SQLITE_CREATE_TABLE = `CREATE TABLE IF NOT EXISTS leasehold_fence (
    key   TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL
)`;

/**
 * SQLite: run inside the write's transaction (`BEGIN IMMEDIATE`) with
 * `{ key, fence }`; one changed row means the fence is current, zero that a
 * higher fence has written (roll back). Bind the fence as a bigint
 * (better-sqlite3 accepts bigint parameters).
 */
export const SQLITE_ADVANCE = `INSERT INTO leasehold_fence (key, fence) VALUES (:key, :fence)
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= leasehold_fence.fence`;

/** PostgreSQL: the table, created once (BIGINT holds every fence leasehold grants). */
export const PG_CREATE_TABLE = `CREATE TABLE IF NOT EXISTS leasehold_fence (
    key   TEXT PRIMARY KEY,
    fence BIGINT NOT NULL
)`;

/**
 * PostgreSQL: run inside the write's transaction with `[key, fence.toString()]`;
 * `rowCount === 1` means the fence is current, 0 that a higher one has written.
 * The upsert locks the row, so concurrent writers are ordered (READ COMMITTED
 * is enough: it is a single-row conditional write).
 */
export const PG_ADVANCE = `INSERT INTO leasehold_fence (key, fence) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= leasehold_fence.fence`;

/** PostgreSQL: the highest fence that has written `$1`. */
export const PG_HIGHEST = "SELECT fence::text AS fence FROM leasehold_fence WHERE key = $1";

/** SQLite: the highest fence that has written any key (as text, so no precision is lost; NULL when none has). */
export const SQLITE_HIGHEST_OF_ALL = "SELECT CAST(max(fence) AS TEXT) AS fence FROM leasehold_fence";

/** PostgreSQL: the highest fence that has written any key (as text; NULL when none has). */
export const PG_HIGHEST_OF_ALL = "SELECT max(fence)::text AS fence FROM leasehold_fence";

/** A fenced write refused: a higher fence has already written the key. */
export class StaleFenceError extends LeaseholdError {
  readonly key: string;
  readonly fence: bigint;
  readonly highest: bigint | undefined;
  constructor(key: string, fence: bigint, highest: bigint | undefined) {
    super(
      "stale_fence",
      `fence ${fence} for key ${JSON.stringify(key)} is stale: fence ${highest ?? "?"} has already written ` +
        "(a newer holder wrote; or, if the lock server's store was reset or replaced, restart it with " +
        "--fence-floor at least the highest fence stored, which sqliteFenceFloor() / pgFenceFloor() " +
        "report: see leasehold's docs/deploy.md)",
    );
    this.name = "StaleFenceError";
    this.key = key;
    this.fence = fence;
    this.highest = highest;
  }
}

/** The part of a `pg` client (`Client` or a checked-out `PoolClient`) this needs. */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
}

/**
 * Runs `work` in a transaction on `client` that first advances the fence of
 * `key`, and commits only if both succeed. Use one connection (not a pool's
 * `query`, which may use a different connection per statement).
 * @throws StaleFenceError when a higher fence has written `key` (nothing is committed).
 */
export async function pgFencedWrite<T>(
  client: PgQueryable,
  key: string,
  fence: bigint,
  work: (client: PgQueryable) => Promise<T>,
): Promise<T> {
  await client.query("BEGIN");
  try {
    const advanced = await client.query(PG_ADVANCE, [key, fence.toString()]);
    if (advanced.rowCount !== 1) {
      const row = (await client.query(PG_HIGHEST, [key])).rows[0] as { fence?: string } | undefined;
      throw new StaleFenceError(key, fence, row?.fence === undefined ? undefined : BigInt(row.fence));
    }
    const out = await work(client);
    await client.query("COMMIT");
    return out;
  } catch (err) {
    // A failed ROLLBACK (a broken connection) must not hide why the write
    // failed; PostgreSQL rolls back a connection's open transaction anyway.
    await client.query("ROLLBACK").catch(() => undefined);
    throw err;
  }
}

/**
 * The part of a synchronous SQLite connection this needs: better-sqlite3's
 * `Database` and `node:sqlite`'s `DatabaseSync` both fit.
 */
export interface SqliteConnection {
  exec(sql: string): unknown;
  prepare(sql: string): {
    run(...params: unknown[]): { changes: number | bigint };
    get(...params: unknown[]): unknown;
  };
  readonly inTransaction?: boolean;
}

/**
 * Runs `work` in a `BEGIN IMMEDIATE` transaction on `db` that first advances
 * the fence of `key`, and commits only if both succeed. The COMMIT is issued
 * here, explicitly: it does not rely on a driver's own transaction handling
 * (which may not know about a BEGIN sent as plain SQL). `work` is
 * synchronous, as the SQLite drivers are, so nothing else on this
 * connection runs between BEGIN and COMMIT.
 * @throws StaleFenceError when a higher fence has written `key` (nothing is committed);
 *   InvalidArgumentError when `db` is already inside a transaction (the
 *   fence check would not be atomic with the outer transaction's commit).
 */
export function sqliteFencedWrite<T>(db: SqliteConnection, key: string, fence: bigint, work: () => T): T {
  if (db.inTransaction === true) {
    throw new InvalidArgumentError("sqliteFencedWrite needs a connection outside any transaction");
  }
  db.exec("BEGIN IMMEDIATE");
  try {
    const advanced = db.prepare(SQLITE_ADVANCE).run({ key, fence });
    if (Number(advanced.changes) !== 1) {
      const row = db.prepare("SELECT fence FROM leasehold_fence WHERE key = ?").get(key) as
        | { fence?: number | bigint }
        | undefined;
      throw new StaleFenceError(key, fence, row?.fence === undefined ? undefined : BigInt(row.fence));
    }
    const out = work();
    if (out instanceof Promise) {
      throw new InvalidArgumentError("sqliteFencedWrite's work must be synchronous (it returned a Promise)");
    }
    db.exec("COMMIT");
    return out;
  } catch (err) {
    if (db.inTransaction !== false) {
      try {
        db.exec("ROLLBACK");
      } catch {
        // SQLite already rolled back (some errors end the transaction): the work's error is the one to report.
      }
    }
    throw err;
  }
}

/**
 * The highest fence stored in `db`'s fence table for any key (0n when none
 * is): the least `leasehold serve --fence-floor` that lets every key write
 * again after the lock server's store was reset or replaced (its fences
 * start at 1 again). Take the highest over every database that fences
 * writes with this lock server.
 * @throws the driver's error when `db` has no fence table (not the database you meant).
 */
export function sqliteFenceFloor(db: SqliteConnection): bigint {
  const row = db.prepare(SQLITE_HIGHEST_OF_ALL).get() as { fence?: string | null } | undefined;
  return row?.fence == null ? 0n : BigInt(row.fence);
}

/**
 * {@link sqliteFenceFloor} for PostgreSQL: the highest fence stored in the
 * fence table (in `client`'s `search_path`) for any key, 0n when none is.
 * @throws pg's error when there is no fence table.
 */
export async function pgFenceFloor(client: PgQueryable): Promise<bigint> {
  const row = (await client.query(PG_HIGHEST_OF_ALL)).rows[0] as { fence?: string | null } | undefined;
  return row?.fence == null ? 0n : BigInt(row.fence);
}
