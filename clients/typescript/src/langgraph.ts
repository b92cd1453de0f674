// One owner per LangGraph.js thread: `@leasehold/client/langgraph`.
//
//   import { own } from "@leasehold/client/langgraph";
//   const graph = own(builder.compile({ checkpointer: SqliteSaver.fromConnString("cp.db") }), lh);
//
// The same rules as the Python adapter (docs/langgraph.md): a run (`invoke`,
// `stream`) holds the lease `langgraph:<thread_id>` from before it reads the
// thread until its stream ends (released; suspended when it fails or is
// cancelled); a second run of the thread waits up to `waitMs`, then
// `BusyError`, and never writes; every checkpoint write checks the lease
// locally, then for `SqliteSaver` (@langchain/langgraph-checkpoint-sqlite)
// and `PostgresSaver` (-checkpoint-postgres), their subclasses, and any
// saver that writes through a better-sqlite3 `db` or a `pg` `pool`, advances
// the fence in the write's own transaction (`leasehold_fence`, the SQL of
// `sqliteFencedWrite` and `pgFencedWrite`), and for any other saver runs
// `lease.gate()` right before the write (`saver.fencedInTransaction` says
// which). A write outside any run (`updateState`,
// `deleteThread`) takes the thread's lease for just that write.

import { AsyncLocalStorage } from "node:async_hooks";

import type { RunnableConfig } from "@langchain/core/runnables";
import {
  BaseCheckpointSaver,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointTuple,
  type PendingWrite,
} from "@langchain/langgraph-checkpoint";

import type { AcquireOptions, LeaseholdClient } from "./client.js";
import {
  FenceTimeoutError,
  PG_CREATE_TABLE,
  pgAdvanceBounded,
  pgFenceError,
  SQLITE_CREATE_TABLE,
  sqliteFencedWrite,
  StaleFenceError,
} from "./fence.js";
import type { Lease } from "./lease.js";
import { InvalidArgumentError, NotOwnedError } from "./errors.js";
import { answer, ledgerCall, takeover, unknownResult } from "./owning.js";

/** The configurable entry that carries a run's lease to its writes. */
export const RUN = "__leasehold_run";

interface Run {
  readonly key: string;
  readonly lease: Lease;
}

export interface OwnOptions extends Pick<AcquireOptions, "ttlMs" | "waitMs"> {
  /** The lease key is `prefix + thread_id` (default `"langgraph:"`). */
  readonly prefix?: string;
}

/** Thrown when a fenced write finds a newer owner's fence in the database (the package's one StaleFenceError). */
export { StaleFenceError };
/** Thrown when a fenced write ran past its bound (a paused writer held the key; the package's one FenceTimeoutError). */
export { FenceTimeoutError };

/** The (key, fence) of the write in progress, for the fenced SQLite handle. */
const scope = new AsyncLocalStorage<{ key: string; fence: bigint }>();

/**
 * Runs `work` as a write presenting `fence` for `key` (what the saver does
 * around each inner write of a fenced saver): exported for tests that
 * present a stale fence past every local check.
 */
export function withFence<T>(key: string, fence: bigint, work: () => T): T {
  return scope.run({ key, fence }, work);
}

function runOf(config: RunnableConfig | undefined): Run | undefined {
  const found = (config?.configurable as Record<string, unknown> | undefined)?.[RUN];
  return found !== null && typeof found === "object" && "lease" in found ? (found as Run) : undefined;
}

interface SqliteDb {
  prepare(sql: string): { run(...args: unknown[]): { changes: number }; get(...args: unknown[]): unknown };
  exec(sql: string): unknown;
  transaction<F extends (...args: never[]) => unknown>(fn: F): F;
  readonly inTransaction: boolean;
}

/** SQL that writes (what the fenced handles put behind the fence). */
const WRITE = /^\s*(INSERT|REPLACE|UPDATE|DELETE)\b/i;

/** A better-sqlite3 `Database`, by what the fenced handle needs of it. */
function isSqliteDb(db: unknown): db is SqliteDb {
  const d = db as Partial<Record<keyof SqliteDb, unknown>> | null;
  return (
    typeof d === "object" &&
    d !== null &&
    typeof d.prepare === "function" &&
    typeof d.exec === "function" &&
    typeof d.transaction === "function" &&
    typeof d.inTransaction === "boolean"
  );
}

/**
 * A better-sqlite3 handle whose writes, inside a fenced scope, run in one
 * `BEGIN IMMEDIATE` transaction that first advances the fence. The saver's
 * statements are synchronous, so nothing else on the connection can run
 * between the fence and the write.
 */
function fencedDb(db: SqliteDb): SqliteDb {
  let installed = false;
  const fenced = <T>(work: () => T): T => {
    const current = scope.getStore();
    if (current === undefined || db.inTransaction) return work();
    if (!installed) {
      db.exec(SQLITE_CREATE_TABLE);
      installed = true;
    }
    // The helper's transaction: its busy and open bounds (FenceTimeoutError) too.
    return sqliteFencedWrite(db, current.key, current.fence, work);
  };
  return new Proxy(db, {
    get(target, prop, receiver) {
      if (prop === "prepare") {
        return (sql: string) => {
          const stmt = target.prepare(sql);
          if (!WRITE.test(sql)) return stmt;
          return new Proxy(stmt, {
            get(s, p) {
              const value = Reflect.get(s, p, s) as unknown;
              // run, and get/all for a write with RETURNING.
              if ((p === "run" || p === "get" || p === "all") && typeof value === "function") {
                return (...args: unknown[]) => fenced(() => (value as (...a: unknown[]) => unknown).apply(s, args));
              }
              return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(s) : value;
            },
          });
        };
      }
      if (prop === "exec") {
        return (sql: string) => (WRITE.test(sql) ? fenced(() => target.exec(sql)) : target.exec(sql));
      }
      if (prop === "transaction") {
        return <F extends (...args: never[]) => unknown>(fn: F): F => {
          const tx = target.transaction(fn);
          return ((...args: Parameters<F>) => fenced(() => tx(...args))) as F;
        };
      }
      const value = Reflect.get(target, prop, receiver) as unknown;
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/** The part of a `pg` client checked out of a pool that PostgresSaver uses. */
interface PgClient {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }>;
  release(err?: unknown): void;
  on?(event: "error", listener: (err: unknown) => void): unknown;
  removeListener?(event: "error", listener: (err: unknown) => void): unknown;
}

/** The part of a `pg` Pool that PostgresSaver uses. */
interface PgPool {
  connect(): Promise<PgClient>;
  query(text: string, values?: unknown[]): Promise<unknown>;
}

/**
 * A `pg` Pool, by what the fenced handle needs of it and what only a pool
 * has (its counts): a `pg.Client` also has `connect` and `query`, but its
 * `connect` checks out nothing.
 */
function isPgPool(pool: unknown): pool is PgPool {
  const p = pool as Record<string, unknown> | null;
  return (
    typeof p === "object" &&
    p !== null &&
    typeof p.connect === "function" &&
    typeof p.query === "function" &&
    typeof p.totalCount === "number" &&
    typeof p.idleCount === "number"
  );
}

/** The text of a `pg` query given as a string or as `{ text }`. */
function sqlOf(query: unknown): string {
  if (typeof query === "string") return query;
  const text = (query as { text?: unknown } | null)?.text;
  return typeof text === "string" ? text : "";
}

function unfenced(key: string, how: string): InvalidArgumentError {
  return new InvalidArgumentError(
    `a checkpoint write for ${JSON.stringify(key)} ${how}: leasehold fences a PostgreSQL saver's writes ` +
      "only inside a transaction on a client from pool.connect() (BEGIN ... COMMIT), as PostgresSaver writes",
  );
}

/**
 * A `pg` pool whose checked-out clients, inside a fenced scope, advance the
 * fence right after the saver's own `BEGIN`: the fence and the saver's
 * statements commit or roll back together (the saver rolls back on the
 * StaleFenceError thrown here). A write that could not be fenced (through
 * `pool.query`, or on a client outside BEGIN, each its own transaction) is
 * refused rather than let through unchecked.
 */
function fencedPool(pool: PgPool): PgPool {
  let installed: Promise<unknown> | undefined;
  return new Proxy(pool, {
    get(target, prop, receiver) {
      if (prop === "query") {
        return (text: string, values?: unknown[]) => {
          const current = scope.getStore();
          if (current !== undefined && WRITE.test(sqlOf(text))) {
            return Promise.reject(unfenced(current.key, "went through pool.query"));
          }
          return target.query(text, values);
        };
      }
      if (prop === "connect") {
        return async (): Promise<PgClient> => {
          const current = scope.getStore();
          if (current !== undefined) installed ??= target.query(PG_CREATE_TABLE);
          await installed;
          const client = await target.connect();
          if (current === undefined) return client;
          // What the connection reported between statements (the server
          // ending an idle transaction's session), heard while checked out:
          // pg would otherwise end the process with an unheard "error".
          let ended: unknown;
          const heard = (err: unknown): void => {
            ended ??= err;
          };
          client.on?.("error", heard);
          let open = false; // a BEGIN whose fence advanced, not yet ended
          return new Proxy(client, {
            get(c, p) {
              const value = Reflect.get(c, p, c) as unknown;
              if (p === "release" && typeof value === "function") {
                return (err?: unknown) => {
                  client.removeListener?.("error", heard);
                  (value as PgClient["release"]).call(c, err ?? (ended === undefined ? undefined : true));
                };
              }
              if (p !== "query" || typeof value !== "function") {
                return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(c) : value;
              }
              const query = value as PgClient["query"];
              return async (text: string, values?: unknown[]) => {
                const sql = sqlOf(text);
                if (!open && WRITE.test(sql)) throw unfenced(current.key, "ran outside BEGIN");
                try {
                  const out = await query.call(c, text, values);
                  if (/^\s*BEGIN\b/i.test(sql)) {
                    await pgAdvanceBounded(c, current.key, current.fence);
                    open = true;
                  } else if (/^\s*(COMMIT|ROLLBACK|END|ABORT)\b/i.test(sql)) {
                    open = false;
                  }
                  return out;
                } catch (err) {
                  throw pgFenceError(current.key, err, ended);
                }
              };
            },
          });
        };
      }
      const value = Reflect.get(target, prop, receiver) as unknown;
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/** Savers this adapter fences in the write's transaction, by class name: only to refuse one whose handle it does not recognise. */
const FENCEABLE = new Set(["SqliteSaver", "PostgresSaver"]);

/** The class names along `saver`'s prototype chain. */
function classNames(saver: object): string[] {
  const names: string[] = [];
  for (let p = Object.getPrototypeOf(saver) as object | null; p !== null && p !== Object.prototype; p = Object.getPrototypeOf(p) as object | null) {
    const ctor = (p as { constructor?: { name?: unknown } }).constructor;
    if (typeof ctor?.name === "string") names.push(ctor.name);
  }
  return names;
}

/**
 * A saver the database can fence, adopted as a copy on a fenced handle; or
 * undefined (gate-only). Found by what the saver holds, not by its class
 * name, so a subclass of SqliteSaver or PostgresSaver (or any saver that
 * writes through a better-sqlite3 `db` or a `pg` `pool`) is fenced too.
 * @throws TypeError for a SqliteSaver or PostgresSaver (or a subclass) whose
 *   handle is not one this adapter can fence: never a silent gate-only.
 */
function adopt(inner: BaseCheckpointSaver): BaseCheckpointSaver | undefined {
  const copy = (): BaseCheckpointSaver & Record<string, unknown> => {
    const made = Object.create(Object.getPrototypeOf(inner) as object) as BaseCheckpointSaver & Record<string, unknown>;
    Object.assign(made, inner);
    return made;
  };
  const handles = inner as unknown as { db?: unknown; pool?: unknown };
  if (isSqliteDb(handles.db)) {
    const made = copy();
    made.db = fencedDb(handles.db);
    return made;
  }
  if (isPgPool(handles.pool)) {
    const made = copy();
    made.pool = fencedPool(handles.pool);
    return made;
  }
  const known = classNames(inner).find((name) => FENCEABLE.has(name));
  if (known !== undefined) {
    throw new TypeError(
      `${inner.constructor.name} is a ${known} whose database handle (db: a better-sqlite3 Database, ` +
        "pool: a pg Pool) leasehold cannot fence; its writes would only be gated",
    );
  }
  return undefined;
}

/** Every write of a thread under that thread's lease; reads pass through. */
export class LeaseholdSaver extends BaseCheckpointSaver {
  readonly inner: BaseCheckpointSaver;
  readonly fencedInTransaction: boolean;

  constructor(
    inner: BaseCheckpointSaver,
    readonly client: LeaseholdClient,
    readonly options: OwnOptions = {},
  ) {
    super(inner.serde);
    const adopted = adopt(inner);
    this.inner = adopted ?? inner;
    this.fencedInTransaction = adopted !== undefined;
  }

  key(threadId: string): string {
    return `${this.options.prefix ?? "langgraph:"}${threadId}`;
  }

  getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    return this.inner.getTuple(config);
  }

  list(config: RunnableConfig, options?: CheckpointListOptions): AsyncGenerator<CheckpointTuple> {
    return this.inner.list(config, options);
  }

  override getNextVersion(current: number | undefined): number {
    return this.inner.getNextVersion(current);
  }

  /** Records the run's fence before it reads the thread (SqliteSaver, PostgresSaver). */
  async claim(run: Run): Promise<void> {
    if (!this.fencedInTransaction) return;
    const inner = this.inner as unknown as { db?: SqliteDb; pool?: PgPool; setup?: () => unknown };
    await scope.run({ key: run.key, fence: run.lease.fence }, async () => {
      if (isSqliteDb(inner.db)) {
        inner.setup?.(); // SqliteSaver's is synchronous and runs once (PostgresSaver's is the user's to call)
        inner.db.transaction(() => undefined)();
        return;
      }
      const client = await (inner.pool as PgPool).connect();
      try {
        await client.query("BEGIN"); // advances the fence
        await client.query("COMMIT");
      } catch (err) {
        await client.query("ROLLBACK").catch(() => undefined);
        throw err;
      } finally {
        client.release();
      }
    });
  }

  async #write<T>(threadId: string, config: RunnableConfig | undefined, op: () => Promise<T>): Promise<T> {
    const key = this.key(threadId);
    const run = runOf(config);
    if (run !== undefined && run.key === key) return this.#fenced(run, op);
    const lease = await this.client.acquire(key, { ttlMs: this.options.ttlMs, waitMs: this.options.waitMs });
    try {
      return await this.#fenced({ key, lease }, op);
    } finally {
      await lease.release().catch(() => undefined);
    }
  }

  async #fenced<T>(run: Run, op: () => Promise<T>): Promise<T> {
    if (!run.lease.isValid()) await run.lease.verify(); // throws the loss
    if (this.fencedInTransaction) return scope.run({ key: run.key, fence: run.lease.fence }, op);
    await run.lease.gate();
    return op();
  }

  put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const thread = String(config.configurable?.thread_id);
    return this.#write(thread, config, () => this.inner.put(config, checkpoint, metadata, newVersions));
  }

  putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string): Promise<void> {
    const thread = String(config.configurable?.thread_id);
    return this.#write(thread, config, () => this.inner.putWrites(config, writes, taskId));
  }

  deleteThread(threadId: string): Promise<void> {
    return this.#write(threadId, undefined, () => this.inner.deleteThread(threadId));
  }
}

interface Streaming {
  checkpointer?: unknown;
  stream(input: unknown, options?: Record<string, unknown>): Promise<AsyncIterable<unknown>>;
  getState(config: RunnableConfig): Promise<{ next: readonly string[] }>;
}

/**
 * The same compiled graph, whose runs own their thread (the graph is changed
 * in place and returned: its checkpointer is wrapped and `stream`, which
 * `invoke` goes through, holds the lease).
 */
export function own<G extends Streaming>(graph: G, client: LeaseholdClient, options: OwnOptions = {}): G {
  const inner = graph.checkpointer;
  if (!(inner instanceof BaseCheckpointSaver)) {
    throw new TypeError("own() needs a graph compiled with a checkpointer: builder.compile({ checkpointer })");
  }
  if (inner instanceof LeaseholdSaver) throw new TypeError("this graph is already owned");
  const saver = new LeaseholdSaver(inner, client, options);
  graph.checkpointer = saver;
  const stream = graph.stream.bind(graph);
  graph.stream = async (input: unknown, streamOptions: Record<string, unknown> = {}) => {
    const configurable = (streamOptions.configurable ?? {}) as Record<string, unknown>;
    const thread = configurable.thread_id;
    const present = runOf(streamOptions as RunnableConfig);
    if (thread === undefined || (present !== undefined && present.key === saver.key(String(thread)))) {
      return stream(input, streamOptions);
    }
    const key = saver.key(String(thread));
    const lease = await client.acquire(key, { ttlMs: options.ttlMs, waitMs: options.waitMs });
    let inner: AsyncIterable<unknown>;
    try {
      await takeover(lease);
      const run: Run = { key, lease };
      await saver.claim(run);
      const owned = { ...streamOptions, configurable: { ...configurable, [RUN]: run } };
      if (lease.recovered && input !== null && input !== undefined) {
        // A new input on a thread its lost owner left mid-step (a tool call
        // checkpointed, its answer never) would send that call with no
        // output: finish the step first, its calls answered by the ledger
        // (as unknown), then take the input.
        const state = await graph.getState({ configurable: { thread_id: thread } });
        if (state.next.length > 0) {
          for await (const _ of await stream(null, { ...owned, streamMode: "values" })) {
            // drained: the interrupted step and what follows it run to the end
          }
        }
      }
      inner = await stream(input, owned);
    } catch (err) {
      await lease.suspend().catch(() => undefined);
      throw err;
    }
    return toStream(held(inner, lease));
  };
  return graph;
}

/** A ReadableStream (async-iterable, as LangGraph's own) of a generator's values. */
function toStream(gen: AsyncGenerator<unknown>): AsyncIterable<unknown> {
  const stream = new ReadableStream<unknown>({
    async pull(controller) {
      const next = await gen.next();
      if (next.done === true) controller.close();
      else controller.enqueue(next.value);
    },
    async cancel() {
      await gen.return(undefined);
    },
  });
  return stream as unknown as AsyncIterable<unknown>;
}

/** The run's chunks; the lease released when they end, suspended on an error or an early stop. */
async function* held(chunks: AsyncIterable<unknown>, lease: Lease): AsyncGenerator<unknown> {
  let finished = false;
  try {
    for await (const chunk of chunks) yield chunk;
    finished = true;
  } finally {
    await (finished ? lease.release() : lease.suspend()).catch(() => undefined);
  }
}

interface Invocable {
  readonly name: string;
  invoke(input: unknown, config?: RunnableConfig): Promise<unknown>;
}

/**
 * The same tools (for LangGraph's `ToolNode`), each call through the
 * thread's ledger by its tool-call id: an id already begun on the thread
 * (this run, an earlier one, a lost owner) never runs again; its stored
 * content comes back instead, or `UNKNOWN_RESULT` for a call a lost owner
 * never settled. Only inside an owned run (`own`).
 */
export function ledgeredTools<T extends Invocable>(tools: readonly T[]): T[] {
  return tools.map((tool) => {
    const invoke = tool.invoke.bind(tool);
    const wrapped = Object.create(tool as object) as T;
    wrapped.invoke = async (input: unknown, config?: RunnableConfig): Promise<unknown> => {
      const call = input as { id?: string; type?: string };
      if (call === null || typeof call !== "object" || call.type !== "tool_call" || call.id === undefined) {
        return invoke(input, config);
      }
      const run = runOf(config);
      if (run === undefined) throw new NotOwnedError(`tool ${tool.name} is ledgered but ran outside an owned LangGraph run`);
      const result = await ledgerCall(
        run.lease,
        call.id,
        tool.name,
        () => invoke(input, config),
        (fresh) => (fresh as { content?: unknown } | undefined)?.content ?? fresh,
      );
      // A stored answer is a ToolMessage's content: text, as ToolNode gives it.
      if (result.kind === "stored") return typeof result.value === "string" ? result.value : JSON.stringify(result.value);
      return answer(result, UNKNOWN_RESULT);
    };
    return wrapped;
  });
}

/** What a call the ledger holds from a lost owner answers the model. */
export const UNKNOWN_RESULT = unknownResult("thread");
