// Storage-side fencing: the application's own database refuses a write from
// a holder whose lease is over, however late the write arrives. One table
// keeps the highest fence that has written each key; every write transaction
// first advances it, and a write whose fence is lower changes nothing and is
// rolled back. (The same SQL as the Rust `leasehold::fence::sqlite`.)

import { AsyncLocalStorage } from "node:async_hooks";

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

/**
 * A fenced transaction ran past its bound, and nothing of it was committed:
 * - `reason: "busy"`: it waited too long for the key's fence (PostgreSQL
 *   `lock_timeout`) or the database's write lock (SQLite's busy timeout):
 *   another transaction holds it, perhaps an earlier owner paused inside its
 *   own fenced write. Retry later.
 * - `reason: "idle"`: PostgreSQL ended this transaction's session because it
 *   sat idle inside the transaction too long (`idle_in_transaction_session_timeout`),
 *   e.g. this process was paused: its writes were rolled back.
 * - `reason: "open"`: a SQLite fenced transaction stayed open longer than its
 *   bound (e.g. this process was paused) and was rolled back instead of committed.
 */
export class FenceTimeoutError extends LeaseholdError {
  readonly key: string;
  readonly reason: "busy" | "idle" | "open";
  constructor(key: string, reason: "busy" | "idle" | "open", detail: string, options?: { cause?: unknown }) {
    super("fence_timeout", `fenced write for key ${JSON.stringify(key)} ${detail}; nothing of it was committed`, options);
    this.name = "FenceTimeoutError";
    this.key = key;
    this.reason = reason;
  }
}

/** One connection: a `pg.Client`, or a `PoolClient` from `pool.connect()`. */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
}

/** A `pg.Pool`: {@link pgFencedWrite} checks one client out of it for the whole transaction. */
export interface PgPool {
  connect(): Promise<PgQueryable & { release(err?: Error | boolean): void }>;
  readonly totalCount: number;
}

/** The bounds of a PostgreSQL fenced transaction, in milliseconds (0 turns one off). */
export interface PgFenceOptions {
  /**
   * How long the fence advance waits for the key's row, locked by another
   * transaction of the key (`SET LOCAL lock_timeout`); then
   * `FenceTimeoutError` "busy". Default {@link PG_LOCK_TIMEOUT_MS}.
   */
  readonly lockTimeoutMs?: number;
  /**
   * How long the transaction may sit idle between statements before the
   * server ends its session and rolls it back (`SET LOCAL
   * idle_in_transaction_session_timeout`): a writer paused inside its
   * transaction stops holding the key's row after this. Default
   * {@link PG_IDLE_TIMEOUT_MS}; keep it below the lock timeout, so a newer
   * writer waits out a paused one instead of failing.
   */
  readonly idleTimeoutMs?: number;
}

/** Default {@link PgFenceOptions.lockTimeoutMs}. */
export const PG_LOCK_TIMEOUT_MS = 10_000;
/** Default {@link PgFenceOptions.idleTimeoutMs}. */
export const PG_IDLE_TIMEOUT_MS = 5_000;

/**
 * PostgreSQL: the bounds of the transaction (`[lockTimeoutMs, idleTimeoutMs]`
 * as text), local to it, and its id: the fence advance below presents the
 * id, so it changes the fence only inside this same transaction.
 */
const PG_BOUND = `SELECT set_config('lock_timeout', $1, true) AS l,
  set_config('idle_in_transaction_session_timeout', $2, true) AS i,
  txid_current()::text AS xid`;

/**
 * PG_ADVANCE that changes nothing unless it runs in transaction `$3`: a
 * "client" that sends each statement on a connection of its own (a pool's
 * `query`) cannot advance the fence in a transaction of its own, which
 * would commit alone.
 */
const PG_ADVANCE_IN = `INSERT INTO leasehold_fence (key, fence) SELECT $1, $2 WHERE txid_current() = $3::bigint
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= leasehold_fence.fence`;

function msSetting(name: string, ms: number | undefined, fallback: number): string {
  const value = ms ?? fallback;
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new InvalidArgumentError(`${name} must be a whole number of milliseconds, at least 0 (got ${value})`);
  }
  return String(value);
}

/** The pg error codes of the bounds (SQLSTATE). */
const LOCK_NOT_AVAILABLE = "55P03";
const IDLE_IN_TRANSACTION_TIMEOUT = "25P03";

function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/**
 * What a failure inside a fenced PostgreSQL transaction is: a bound's
 * error as {@link FenceTimeoutError}, anything else as it was. `ended` is
 * the error the connection reported between statements (the server ending
 * an idle transaction's session arrives with no query running).
 * @internal
 */
export function pgFenceError(key: string, err: unknown, ended: unknown): unknown {
  if (err instanceof LeaseholdError) return err;
  if (sqlState(err) === LOCK_NOT_AVAILABLE) {
    return new FenceTimeoutError(key, "busy", "waited too long for the key's fence (another transaction holds it)", { cause: err });
  }
  if (sqlState(err) === IDLE_IN_TRANSACTION_TIMEOUT || sqlState(ended) === IDLE_IN_TRANSACTION_TIMEOUT) {
    return new FenceTimeoutError(key, "idle", "sat idle in its transaction too long and the server ended it", {
      cause: ended ?? err,
    });
  }
  return err;
}

/**
 * Runs the bounds' statement, then the fence advance, on `client` inside a
 * transaction it has begun: throws StaleFenceError, or InvalidArgumentError
 * when the statements did not share one transaction.
 * @internal
 */
export async function pgAdvanceBounded(
  client: PgQueryable,
  key: string,
  fence: bigint,
  options: PgFenceOptions = {},
): Promise<void> {
  const lock = msSetting("lockTimeoutMs", options.lockTimeoutMs, PG_LOCK_TIMEOUT_MS);
  const idle = msSetting("idleTimeoutMs", options.idleTimeoutMs, PG_IDLE_TIMEOUT_MS);
  const bound = (await client.query(PG_BOUND, [lock, idle])).rows[0] as { xid: string };
  const advanced = await client.query(PG_ADVANCE_IN, [key, fence.toString(), bound.xid]);
  if (advanced.rowCount === 1) return;
  const row = (await client.query(PG_HIGHEST, [key])).rows[0] as { fence?: string } | undefined;
  const highest = row?.fence === undefined ? undefined : BigInt(row.fence);
  if (highest !== undefined && highest > fence) throw new StaleFenceError(key, fence, highest);
  // Not stale, yet nothing changed: the advance ran outside the transaction
  // BEGIN opened, on another connection.
  throw new InvalidArgumentError(
    "pgFencedWrite's statements ran on more than one connection: pass a pg.Pool, a pg.Client or a client from pool.connect(), not something that picks a connection per query",
  );
}

function isPool(db: PgQueryable | PgPool): db is PgPool {
  const d = db as { connect?: unknown; totalCount?: unknown; release?: unknown };
  return typeof d.connect === "function" && typeof d.totalCount === "number" && typeof d.release !== "function";
}

/** For each connection, the end of the last fenced write queued on it. */
const queued = new WeakMap<object, Promise<unknown>>();
/** The connections whose fenced write is running in this async context. */
const inside = new AsyncLocalStorage<ReadonlySet<object>>();

interface Events {
  on?(event: "error", listener: (err: unknown) => void): unknown;
  removeListener?(event: "error", listener: (err: unknown) => void): unknown;
}

/** One fenced transaction on one connection, nothing else on it meanwhile. */
async function fencedOn<T>(
  client: PgQueryable,
  key: string,
  fence: bigint,
  work: (client: PgQueryable) => Promise<T>,
  options: PgFenceOptions,
): Promise<T> {
  // pg emits an error that arrives with no query running (the server ending
  // an idle transaction's session) on the client, where an unheard "error"
  // would end the process: heard here, and reported as the bound it is.
  let ended: unknown;
  const heard = (err: unknown): void => {
    ended ??= err;
  };
  const events = client as Events;
  events.on?.call(client, "error", heard);
  try {
    await client.query("BEGIN");
    try {
      await pgAdvanceBounded(client, key, fence, options);
      const held = new Set(inside.getStore() ?? []);
      held.add(client);
      const out = await inside.run(held, () => work(client));
      await client.query("COMMIT");
      return out;
    } catch (err) {
      // A failed ROLLBACK (a broken connection) must not hide why the write
      // failed; PostgreSQL rolls back a connection's open transaction anyway.
      await client.query("ROLLBACK").catch(() => undefined);
      throw pgFenceError(key, err, ended);
    }
  } finally {
    events.removeListener?.call(client, "error", heard);
  }
}

/**
 * Runs `work` in a transaction that first advances the fence of `key`, and
 * commits only if both succeed; `work` must send its statements through the
 * client it is given.
 *
 * `db` is one connection (a `pg.Client`, or a client from `pool.connect()`)
 * or a `pg.Pool`, from which one client is checked out for the whole
 * transaction and released after. Fenced writes on one connection run one
 * after another (pg would otherwise interleave their statements into one
 * transaction); other queries sent on that connection meanwhile would still
 * land inside the transaction, so do not share it with code that does. A
 * fenced write on a connection inside `work` of one on the same connection
 * is refused (it would wait for itself).
 *
 * The transaction is bounded ({@link PgFenceOptions}): the fence advance
 * waits at most `lockTimeoutMs` for the key's row, and a transaction idle
 * longer than `idleTimeoutMs` (this process paused) is ended by the server.
 * @throws StaleFenceError when a higher fence has written `key` (nothing is committed);
 *   FenceTimeoutError when a bound ran out (nothing is committed);
 *   InvalidArgumentError for a nested write, a bad bound, or statements that
 *   did not run on one connection.
 */
export async function pgFencedWrite<T>(
  db: PgQueryable | PgPool,
  key: string,
  fence: bigint,
  work: (client: PgQueryable) => Promise<T>,
  options: PgFenceOptions = {},
): Promise<T> {
  if (isPool(db)) {
    const client = await db.connect();
    let broken = false;
    try {
      return await fencedOn(client, key, fence, work, options);
    } catch (err) {
      // A connection the server ended goes, not back to the pool.
      broken = err instanceof FenceTimeoutError && err.reason === "idle";
      throw err;
    } finally {
      client.release(broken);
    }
  }
  if (inside.getStore()?.has(db) === true) {
    throw new InvalidArgumentError("pgFencedWrite inside a fenced write on the same connection would wait for itself");
  }
  const before = queued.get(db) ?? Promise.resolve();
  const run = before.then(() => fencedOn(db, key, fence, work, options));
  const settled = run.catch(() => undefined);
  queued.set(db, settled);
  try {
    return await run;
  } finally {
    if (queued.get(db) === settled) queued.delete(db);
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

/** The bound of a SQLite fenced transaction. */
export interface SqliteFenceOptions {
  /**
   * The longest the transaction may stay open, from BEGIN to COMMIT: one
   * open longer (this process was paused inside it) is rolled back instead
   * of committed, `FenceTimeoutError` "open". Default
   * {@link SQLITE_OPEN_TIMEOUT_MS}; 0 turns it off. How long BEGIN waits for
   * the write lock is the connection's own busy timeout (better-sqlite3's
   * `timeout` option, 5 s by default; `node:sqlite`'s `timeout`).
   */
  readonly timeoutMs?: number;
}

/** Default {@link SqliteFenceOptions.timeoutMs}. */
export const SQLITE_OPEN_TIMEOUT_MS = 10_000;

/** Whether a SQLite driver's error is SQLITE_BUSY (or SQLITE_BUSY_*): the write lock is held elsewhere. */
function sqliteBusy(err: unknown): boolean {
  const e = err as { code?: unknown; errcode?: unknown; message?: unknown } | null;
  if (e === null || typeof e !== "object") return false;
  // better-sqlite3: code "SQLITE_BUSY"/"SQLITE_BUSY_SNAPSHOT"...; node:sqlite: errcode 5 (| extended << 8).
  if (typeof e.code === "string" && e.code.startsWith("SQLITE_BUSY")) return true;
  if (typeof e.errcode === "number" && (e.errcode & 0xff) === 5) return true;
  return typeof e.message === "string" && /database is locked/i.test(e.message);
}

/**
 * What a failure inside a fenced SQLite transaction is: SQLITE_BUSY as
 * {@link FenceTimeoutError} "busy", anything else as it was.
 * @internal
 */
export function sqliteFenceError(key: string, err: unknown): unknown {
  if (err instanceof LeaseholdError || !sqliteBusy(err)) return err;
  return new FenceTimeoutError(key, "busy", "waited too long for the database's write lock (another transaction holds it)", {
    cause: err,
  });
}

/**
 * Runs `work` in a `BEGIN IMMEDIATE` transaction on `db` that first advances
 * the fence of `key`, and commits only if both succeed. The COMMIT is issued
 * here, explicitly: it does not rely on a driver's own transaction handling
 * (which may not know about a BEGIN sent as plain SQL). `work` is
 * synchronous, as the SQLite drivers are, so nothing else on this
 * connection runs between BEGIN and COMMIT.
 *
 * A transaction open longer than `options.timeoutMs` is rolled back rather
 * than committed: a process paused inside it (SIGSTOP, a stopped VM) held
 * the write lock all along, so no newer fence can have written meanwhile,
 * but its write would land long after its lease ended.
 * @throws StaleFenceError when a higher fence has written `key` (nothing is committed);
 *   FenceTimeoutError when the write lock stayed busy past the connection's
 *   busy timeout, or the transaction stayed open too long (nothing is committed);
 *   InvalidArgumentError when `db` is already inside a transaction (the
 *   fence check would not be atomic with the outer transaction's commit).
 */
export function sqliteFencedWrite<T>(
  db: SqliteConnection,
  key: string,
  fence: bigint,
  work: () => T,
  options: SqliteFenceOptions = {},
): T {
  if (db.inTransaction === true) {
    throw new InvalidArgumentError("sqliteFencedWrite needs a connection outside any transaction");
  }
  const bound = Number(msSetting("timeoutMs", options.timeoutMs, SQLITE_OPEN_TIMEOUT_MS));
  try {
    db.exec("BEGIN IMMEDIATE");
  } catch (err) {
    throw sqliteFenceError(key, err);
  }
  // Monotonic: a paused process's clock runs on while it is stopped.
  const began = performance.now();
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
    const open = performance.now() - began;
    if (bound > 0 && open > bound) {
      throw new FenceTimeoutError(key, "open", `stayed open ${Math.round(open)} ms, past its bound of ${bound} ms, and was rolled back`);
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
    throw sqliteFenceError(key, err);
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
