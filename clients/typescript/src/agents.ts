// One owner per OpenAI Agents SDK session (`@openai/agents`): `@leasehold/client/agents`.
//
//   import { run, SQLiteSession } from "@leasehold/client/agents";   // was: run from "@openai/agents"
//   const session = new SQLiteSession(chatId, db);                   // a better-sqlite3 or node:sqlite database
//   const result = await run(client, agent, input, { session });
//
// `run` holds the session's lease (key `agents:<session id>`, as the Python
// adapter's) for the whole run: released when it returns, suspended when it throws, so
// the session becomes recoverable. A second run of the session anywhere
// waits up to `waitMs`, then gets `BusyError` before it reads the history,
// calls the model or writes. Each model call is gated (`callModelInputFilter`);
// each session write is refused once the lease is lost: for `SQLiteSession`
// by the database itself in the write's own transaction (the fence advanced
// first), for any other session by `lease.gate()` right before the write.
// `ledgered(tool)` sends a function tool's calls through the session's
// ledger by the SDK's call id, so a call id never runs twice.

import { AsyncLocalStorage } from "node:async_hooks";

import * as agents from "@openai/agents";
import type {
  AgentInputItem,
  FunctionTool,
  NonStreamRunOptions,
  RunResult,
  RunState,
  Session,
  StreamedRunResult,
  StreamRunOptions,
  ToolInputParameters,
} from "@openai/agents";

import type { AcquireOptions, LeaseholdClient } from "./client.js";
import { NotOwnedError } from "./errors.js";
import { SQLITE_CREATE_TABLE, type SqliteConnection, sqliteFencedWrite } from "./fence.js";
import type { Lease } from "./lease.js";
import { answer, ensureHeld, failedRun, ledgerCall, takeover, unknownResult } from "./owning.js";

/** What a call the ledger holds from a lost owner answers the model. */
export const UNKNOWN_RESULT = unknownResult("session");

export { NotOwnedError };

/** How the session is owned: the lease's TTL, how long to wait for a busy session, the key's prefix. */
export interface OwnOptions extends Pick<AcquireOptions, "ttlMs" | "waitMs"> {
  /** Prepended to the session id to make the lease key (default `agents:`). */
  readonly prefix?: string;
  /** The SDK `Runner` whose `run` is called (default: the SDK's `run`, its default runner). */
  readonly runner?: agents.Runner;
}

/** The lease of the owned run this code runs in (inside tools, filters, ...). */
export function currentLease(): Lease {
  const lease = current.getStore();
  if (lease === undefined) throw new NotOwnedError("currentLease(): not inside an owned run");
  return lease;
}

const current = new AsyncLocalStorage<Lease>();

// A SQLiteSession's write transaction and its statements, keyed by symbols
// this module does not export: what an owned run uses, not public API.
const FENCED = Symbol("leasehold.fenced");
const INSERT = Symbol("leasehold.insert");
const POP = Symbol("leasehold.pop");
const CLEAR = Symbol("leasehold.clear");

/** A synchronous SQLite connection (better-sqlite3 `Database`, `node:sqlite` `DatabaseSync`). */
export interface SessionDatabase extends SqliteConnection {
  prepare(sql: string): {
    run(...params: unknown[]): { changes: number | bigint };
    get(...params: unknown[]): unknown;
    all(...params: unknown[]): unknown[];
  };
}

interface Fence {
  readonly key: string;
  readonly lease: Lease;
}

/**
 * The Agents SDK's session on SQLite, in the Python SDK's `SQLiteSession`
 * table layout (`agent_sessions`, `agent_messages`, one JSON item per row;
 * the items are this SDK's own shape). Outside an owned run it is a plain session;
 * inside `run` every write transaction first advances the session's fence
 * (`leasehold_fence`), so a lost owner's late write changes nothing.
 * Give each process its own connection (better-sqlite3 `Database` or
 * `node:sqlite` `DatabaseSync`); WAL mode is the caller's choice.
 */
export class SQLiteSession implements Session {
  readonly sessionId: string;
  readonly #db: SessionDatabase;

  constructor(sessionId: string, db: SessionDatabase) {
    this.sessionId = sessionId;
    this.#db = db;
    db.exec(`CREATE TABLE IF NOT EXISTS agent_sessions (
    session_id TEXT PRIMARY KEY,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
)`);
    db.exec(`CREATE TABLE IF NOT EXISTS agent_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    message_data TEXT NOT NULL,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    FOREIGN KEY (session_id) REFERENCES agent_sessions (session_id) ON DELETE CASCADE
)`);
    db.exec("CREATE INDEX IF NOT EXISTS idx_agent_messages_session_id ON agent_messages (session_id, id)");
    db.exec(SQLITE_CREATE_TABLE);
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  async getItems(limit?: number): Promise<AgentInputItem[]> {
    const rows = (
      limit === undefined
        ? this.#db.prepare("SELECT message_data FROM agent_messages WHERE session_id = ? ORDER BY id ASC").all(this.sessionId)
        : this.#db
            .prepare("SELECT message_data FROM agent_messages WHERE session_id = ? ORDER BY id DESC LIMIT ?")
            .all(this.sessionId, limit)
            .reverse()
    ) as Array<{ message_data: string }>;
    return rows.map((r) => JSON.parse(r.message_data) as AgentInputItem);
  }

  async addItems(items: AgentInputItem[]): Promise<void> {
    this[FENCED](undefined, () => this[INSERT](items));
  }

  async popItem(): Promise<AgentInputItem | undefined> {
    return this[FENCED](undefined, () => this[POP]());
  }

  async clearSession(): Promise<void> {
    this[FENCED](undefined, () => this[CLEAR]());
  }

  /** Runs `work` in one transaction, fenced when `fence` is given (an owned run's write). @internal */
  [FENCED]<T>(fence: Fence | undefined, work: () => T): T {
    if (fence === undefined) {
      this.#db.exec("BEGIN IMMEDIATE");
      try {
        const out = work();
        this.#db.exec("COMMIT");
        return out;
      } catch (err) {
        if (this.#db.inTransaction !== false) this.#db.exec("ROLLBACK");
        throw err;
      }
    }
    return sqliteFencedWrite(this.#db, fence.key, fence.lease.fence, work);
  }

  [INSERT](items: readonly AgentInputItem[]): void {
    if (items.length === 0) return;
    this.#db.prepare("INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?)").run(this.sessionId);
    const insert = this.#db.prepare("INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)");
    for (const item of items) insert.run(this.sessionId, JSON.stringify(item));
    this.#db
      .prepare("UPDATE agent_sessions SET updated_at = CURRENT_TIMESTAMP WHERE session_id = ?")
      .run(this.sessionId);
  }

  [POP](): AgentInputItem | undefined {
    const row = this.#db
      .prepare("SELECT id, message_data FROM agent_messages WHERE session_id = ? ORDER BY id DESC LIMIT 1")
      .get(this.sessionId) as { id: number | bigint; message_data: string } | undefined;
    if (row === undefined) return undefined;
    this.#db.prepare("DELETE FROM agent_messages WHERE id = ?").run(row.id);
    return JSON.parse(row.message_data) as AgentInputItem;
  }

  [CLEAR](): void {
    this.#db.prepare("DELETE FROM agent_messages WHERE session_id = ?").run(this.sessionId);
    this.#db.prepare("DELETE FROM agent_sessions WHERE session_id = ?").run(this.sessionId);
  }
}

/** The session methods that write (gated, or fenced for a SQLiteSession); any other is passed through. */
const WRITES = new Set([
  "addItems",
  "popItem",
  "clearSession",
  "applyHistoryTransaction",
  "applyHistoryMutations",
  "replaceHistoryWithCompaction",
  "runCompaction",
  "addItemsWithCompactionOwnership",
]);
/** The session methods that read (a local check of the lease first). */
const READS = new Set(["getItems", "getItemsWithCompactionOwnership"]);

/**
 * `session` as the owner of `lease` sees it: reads check the lease locally,
 * writes are refused once it is lost. The same capabilities as `session`
 * (the SDK looks for optional methods by name).
 */
export function ownedSession<S extends Session>(session: S, lease: Lease): S {
  if (session instanceof SQLiteSession) return fencedSqlite(session, lease) as unknown as S;
  return new Proxy(session, {
    get(target, name, receiver) {
      const value: unknown = Reflect.get(target, name, receiver);
      if (typeof name !== "string" || typeof value !== "function") return value;
      const method = value as (...args: unknown[]) => unknown;
      if (WRITES.has(name)) {
        return async (...args: unknown[]) => {
          ensureOwner(lease, session);
          await lease.gate();
          return method.apply(target, args);
        };
      }
      if (READS.has(name)) {
        return async (...args: unknown[]) => {
          ensureOwner(lease, session);
          return method.apply(target, args);
        };
      }
      return method.bind(target);
    },
  });
}

function fencedSqlite(session: SQLiteSession, lease: Lease): Session {
  const fence: Fence = { key: lease.key, lease };
  return {
    getSessionId: async () => session.sessionId,
    getItems: async (limit?: number) => {
      ensureOwner(lease, session);
      return session.getItems(limit);
    },
    addItems: async (items: AgentInputItem[]) => {
      ensureOwner(lease, session);
      session[FENCED](fence, () => session[INSERT](items));
    },
    popItem: async () => {
      ensureOwner(lease, session);
      return session[FENCED](fence, () => session[POP]());
    },
    clearSession: async () => {
      ensureOwner(lease, session);
      session[FENCED](fence, () => session[CLEAR]());
    },
  };
}

function ensureOwner(lease: Lease, session: Session): void {
  const id = (session as { sessionId?: unknown }).sessionId;
  ensureHeld(lease, `session ${JSON.stringify(id ?? lease.key)}`);
}

/**
 * The agents `run` accepts: the SDK's own constraint (its Agent type is
 * invariant in its context and output, so the SDK bounds it loosely).
 */
export type SdkAgent = Parameters<typeof agents.run>[0];

/** `agents.run`'s options (not streamed), with the session required: it names what is owned. */
export type RunOptions<TContext, TAgent extends SdkAgent> = NonStreamRunOptions<TContext, TAgent> & {
  readonly session: Session;
};

/** `agents.run`'s options for a streamed run (`stream: true`), with the session required. */
export type StreamedRunOptions<TContext, TAgent extends SdkAgent> = StreamRunOptions<TContext, TAgent> & {
  readonly session: Session;
};

/** What `run` continues: new input, or a `RunState` resumed after a human approved or rejected its interruptions. */
export type RunInput<TContext, TAgent extends SdkAgent> = string | AgentInputItem[] | RunState<TContext, TAgent>;

/**
 * The Agents SDK's `run(agent, input, options)` as the owner of
 * `options.session`. A session taken over from a lost owner first has the
 * tool calls it left running settled as unknown (a ledgered tool then
 * answers `UNKNOWN_RESULT` for such a call id instead of running it).
 *
 * With `stream: true` the lease is held until the stream's run ends, however
 * (or whether) the stream is read: `completed` then resolves once the lease
 * is released, or rejects with the leasehold error when it was lost
 * (suspended when the run failed); cancelling the stream aborts the run.
 * @throws BusyError (another run owns the session), LeaseLostError (lost
 *   mid-run: never the SDK's wrapper around it), and whatever run throws.
 */
export async function run<TAgent extends SdkAgent, TContext = undefined>(
  client: LeaseholdClient,
  agent: TAgent,
  input: RunInput<TContext, TAgent>,
  options: RunOptions<TContext, TAgent>,
  own?: OwnOptions,
): Promise<RunResult<TContext, TAgent>>;
export async function run<TAgent extends SdkAgent, TContext = undefined>(
  client: LeaseholdClient,
  agent: TAgent,
  input: RunInput<TContext, TAgent>,
  options: StreamedRunOptions<TContext, TAgent>,
  own?: OwnOptions,
): Promise<StreamedRunResult<TContext, TAgent>>;
export async function run<TAgent extends SdkAgent, TContext = undefined>(
  client: LeaseholdClient,
  agent: TAgent,
  input: RunInput<TContext, TAgent>,
  options: RunOptions<TContext, TAgent> | StreamedRunOptions<TContext, TAgent>,
  own: OwnOptions = {},
): Promise<RunResult<TContext, TAgent> | StreamedRunResult<TContext, TAgent>> {
  const key = `${own.prefix ?? "agents:"}${await options.session.getSessionId()}`;
  const lease = await client.acquire(key, { ttlMs: own.ttlMs, waitMs: own.waitMs });
  const runner = own.runner ?? agents;
  return current.run(lease, async () => {
    try {
      const session = ownedSession(options.session, lease);
      if (options.session instanceof SQLiteSession) {
        // The fence is recorded before anything is read: from here on an
        // earlier owner's late write is refused by the database.
        options.session[FENCED]({ key, lease }, () => undefined);
      }
      await takeover(lease);
      const filter = options.callModelInputFilter;
      // A SQLiteSession's writes (and a ledgered tool's Begin) carry the
      // fence to a store that refuses a stale one, so a fresh lease passes
      // the model-call gate with no round trip; any other session's do not,
      // so there the gate asks the server each time.
      const storageFenced = options.session instanceof SQLiteSession;
      const gated: typeof filter = async (args) => {
        await lease.gate({ storageFenced });
        return filter === undefined ? args.modelData : filter(args);
      };
      const signal = options.signal === undefined ? lease.signal : AbortSignal.any([options.signal, lease.signal]);
      const owned = { session, callModelInputFilter: gated, signal };
      if (options.stream === true) {
        const streamed = await runner.run(agent, input, { ...options, ...owned, stream: true });
        return heldUntilDone(streamed, lease);
      }
      const result = await runner.run(agent, input, { ...options, ...owned, stream: false });
      await lease.release();
      return result;
    } catch (err) {
      throw await failedRun(lease, err);
    }
  });
}

/**
 * `result` whose `completed` (and `error`) tell the run's end as the
 * owner sees it: the lease released after a run that ended well, suspended
 * (and the leasehold error behind the SDK's wrapper reported) after one that
 * did not. The run goes on whether or not the stream is read.
 */
function heldUntilDone<TContext, TAgent extends SdkAgent>(
  result: StreamedRunResult<TContext, TAgent>,
  lease: Lease,
): StreamedRunResult<TContext, TAgent> {
  let failure: unknown;
  const completed = result.completed.then(
    () => lease.release(),
    async (err: unknown) => {
      failure = await failedRun(lease, err);
      throw failure;
    },
  );
  // The SDK lets a caller never await `completed`; so does this.
  completed.catch(() => undefined);
  return new Proxy(result, {
    get(target, name) {
      if (name === "completed") return completed;
      if (name === "error") return failure ?? target.error;
      // The result keeps its state in private fields: methods and getters run on the target itself.
      const value: unknown = Reflect.get(target, name, target);
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/**
 * The same function tool, its calls through the owned session's ledger by
 * the SDK's call id: an id already begun on the session is not run again;
 * its stored output is returned instead (`UNKNOWN_RESULT` for a call a lost
 * owner never settled). Only inside `run`.
 */
export function ledgered<TContext, TParameters extends ToolInputParameters, TResult>(
  tool: FunctionTool<TContext, TParameters, TResult>,
): FunctionTool<TContext, TParameters, TResult> {
  const invoke = tool.invoke;
  return {
    ...tool,
    invoke: async (runContext, input, details) => {
      const lease = current.getStore();
      if (lease === undefined) throw new NotOwnedError(`tool ${tool.name} is ledgered but ran outside an owned run`);
      const callId = details?.toolCall?.callId;
      if (callId === undefined) return invoke(runContext, input, details);
      const result = await ledgerCall(lease, callId, tool.name, () => invoke(runContext, input, details));
      return answer(result, UNKNOWN_RESULT) as string | TResult;
    },
  };
}
