// One owner per Mastra thread (`@mastra/core`): `@leasehold/client/mastra`.
//
//   import { own, ledgered } from "@leasehold/client/mastra";
//   const agent = own(new Agent({ ..., memory, tools: { shell: ledgered(shell) } }), lh);  // was: new Agent(...)
//   await agent.generate(message, { memory: { thread: chatId, resource: userId } });
//
// A run of the owned agent (`generate`, `stream`) on a memory thread holds
// the thread's lease (key `mastra:<thread id>`) from before memory is read
// until the run ends: released when it finishes, suspended when it fails or
// is aborted. A second run of the thread anywhere waits up to `waitMs`, then
// gets `BusyError` before it reads, calls the model or writes: Mastra's own
// cross-process thread lease fails open (a run goes ahead when its lease
// backend cannot be reached); this one fails closed. Every step is gated
// (`prepareStep`), the run aborts when the lease is lost (`abortSignal`),
// every memory write of the run (the storage's memory domain, which the
// history processor and `saveMessages` write through) checks the lease and is
// gated, and a run whose lease was lost never reports success. Tools
// wrapped in `ledgered` go through the thread's ledger by Mastra's
// tool-call id, so a call id never runs twice.
//
// Mastra's signals runtime (`sendSignal`, `sendMessage`, queued follow-ups)
// elects a thread's runner across processes with the pubsub's lease
// provider: `leased(pubsub, lh)` makes it leasehold's (`LeaseholdLeaseProvider`),
// which fails closed where Mastra's own fail open.
//
// Mastra's workflow runs (`ownWorkflows(mastra, lh)`): a run's `start`,
// `resume`, `restart` (and their stream and async forms) hold the run's
// lease while they execute, so boot-time recovery
// (`restartAllActiveWorkflowRuns`) re-drives only the runs whose owner is
// gone, each in one process, and a lost owner's snapshot writes are refused.

import { AsyncLocalStorage } from "node:async_hooks";

import type { Agent } from "@mastra/core/agent";
import type { LeaseProvider, PubSub } from "@mastra/core/events";
import type { Mastra } from "@mastra/core/mastra";

import type { AcquireOptions, LeaseholdClient } from "./client.js";
import { BusyError, LeaseholdError, NotOwnedError, ReservedError } from "./errors.js";
import type { Lease } from "./lease.js";
import { answer, ensureHeld, failedRun, ledgerCall, lostInstead, takeover, unknownResult } from "./owning.js";

/** What a call the ledger holds from a lost owner answers the model. */
export const UNKNOWN_RESULT = unknownResult("thread");

/** How threads are owned: the lease's TTL, how long to wait for a busy thread, the key's prefix. */
export interface OwnOptions extends Pick<AcquireOptions, "ttlMs" | "waitMs"> {
  /** Prepended to the thread id to make the lease key (default `mastra:`). */
  readonly prefix?: string;
}

export { NotOwnedError };

interface Run {
  readonly thread: string;
  readonly lease: Lease;
}

const current = new AsyncLocalStorage<Run>();

/** The lease of the owned run this code runs in (inside tools, processors, ...). */
export function currentLease(): Lease {
  const run = current.getStore();
  if (run === undefined) throw new NotOwnedError("currentLease(): not inside an owned run");
  return run.lease;
}

/** The part of a run's options this reads and changes. */
interface RunOptions {
  memory?: { thread?: string | { id: string } };
  abortSignal?: AbortSignal;
  prepareStep?: (args: never) => unknown;
  onFinish?: (event: never) => unknown;
  onError?: (event: never) => unknown;
  onAbort?: (event: never) => unknown;
}

/** The part of a Mastra memory this reaches: its storage's memory domain, where every write lands. */
interface StoredMemory {
  readonly storage?: { getStore(domain: "memory"): Promise<object | undefined> };
}

/**
 * The memory domain's writes: a write inside an owned run checks the lease
 * and is gated (the message-history processor, `saveMessages`, working
 * memory all write through the domain). Reads and writes outside any
 * owned run pass through.
 */
const STORE_WRITES = [
  "saveThread",
  "updateThread",
  "patchThread",
  "updateThreadMetadata",
  "deleteThread",
  "saveMessages",
  "updateMessages",
  "deleteMessages",
  "saveResource",
  "updateResource",
] as const;

type Runner = (messages: unknown, options?: RunOptions) => Promise<unknown>;

const OWNED = Symbol("leasehold.owned");
const gatedStores = new WeakSet<object>();

function threadOf(options: RunOptions | undefined): string | undefined {
  const thread = options?.memory?.thread;
  return thread === undefined ? undefined : typeof thread === "string" ? thread : thread.id;
}

function ensureValid(run: Run): void {
  ensureHeld(run.lease, `thread ${JSON.stringify(run.thread)}`);
}

/**
 * Gates the writes `names` of a storage domain (once per domain object):
 * each write for which `owner` names a lease (the owned run it belongs to)
 * first checks that lease and passes its gate.
 */
function gateWrites(
  store: Record<string, unknown> | undefined,
  names: readonly string[],
  owner: (args: unknown[]) => { lease: Lease; what: string } | undefined,
): void {
  if (store === undefined || gatedStores.has(store)) return;
  gatedStores.add(store);
  for (const name of names) {
    const method = store[name];
    if (typeof method !== "function") continue;
    const write = method as (...args: unknown[]) => Promise<unknown>;
    store[name] = async (...args: unknown[]): Promise<unknown> => {
      const run = owner(args);
      if (run !== undefined) {
        ensureHeld(run.lease, run.what);
        await run.lease.gate();
      }
      return write.apply(store, args);
    };
  }
}

/** Gates the writes of `memory`'s storage domain inside an owned run. */
async function gateMemory(memory: StoredMemory): Promise<void> {
  const store = (await memory.storage?.getStore("memory")) as Record<string, unknown> | undefined;
  gateWrites(store, STORE_WRITES, () => {
    const run = current.getStore();
    return run === undefined ? undefined : { lease: run.lease, what: `thread ${JSON.stringify(run.thread)}` };
  });
}

/** The run's options, changed to run as the lease's owner. */
function owning(options: RunOptions, run: Run, end: (suspend: boolean) => Promise<void>): RunOptions {
  const { lease } = run;
  const prepareStep = options.prepareStep as ((args: unknown) => unknown) | undefined;
  const onFinish = options.onFinish as ((event: unknown) => unknown) | undefined;
  const onError = options.onError as ((event: unknown) => unknown) | undefined;
  const onAbort = options.onAbort as ((event: unknown) => unknown) | undefined;
  return {
    ...options,
    abortSignal: options.abortSignal === undefined ? lease.signal : AbortSignal.any([options.abortSignal, lease.signal]),
    prepareStep: async (args: unknown) => {
      ensureValid(run);
      await lease.gate();
      return prepareStep === undefined ? undefined : prepareStep(args);
    },
    onFinish: async (event: unknown) => {
      try {
        if (onFinish !== undefined) await onFinish(event);
        await end(lease.lossReason !== undefined);
      } catch (err) {
        await end(true);
        throw err;
      }
    },
    onError: async (event: unknown) => {
      await end(true);
      if (onError !== undefined) await onError(event);
    },
    onAbort: async (event: unknown) => {
      await end(true);
      if (onAbort !== undefined) await onAbort(event);
    },
  } as RunOptions;
}

/**
 * The same agent, whose runs on a memory thread own it (changed in place
 * and returned: `generate` and `stream`). A run with no thread is not
 * owned. A thread taken over from a lost owner first has the tool calls it
 * left running settled as unknown.
 * @throws (from a run) BusyError when another run owns the thread; LeaseLostError when the run lost it.
 */
export function own<A extends Agent>(agent: A, client: LeaseholdClient, options: OwnOptions = {}): A {
  const target = agent as unknown as Record<string | symbol, unknown> & { getMemory(): Promise<unknown> };
  if (target[OWNED] === true) throw new TypeError("this agent is already owned");
  target[OWNED] = true;
  const prefix = options.prefix ?? "mastra:";

  const start = async (runOptions: RunOptions | undefined): Promise<Run | undefined> => {
    const thread = threadOf(runOptions);
    if (thread === undefined) return undefined;
    const present = current.getStore();
    if (present?.thread === thread) return undefined; // a nested run of the same thread: already owned
    const memory = (await target.getMemory()) as StoredMemory | undefined;
    if (memory !== undefined) await gateMemory(memory);
    const lease = await client.acquire(`${prefix}${thread}`, { ttlMs: options.ttlMs, waitMs: options.waitMs });
    try {
      await takeover(lease);
    } catch (err) {
      await lease.suspend().catch(() => undefined);
      throw err;
    }
    return { thread, lease };
  };

  const generate = (target.generate as Runner).bind(agent);
  target.generate = async (messages: unknown, runOptions?: RunOptions): Promise<unknown> => {
    const run = await start(runOptions);
    if (run === undefined) return generate(messages, runOptions);
    return current.run(run, async () => {
      try {
        // generate's own end below releases or suspends: the callbacks need not.
        const result = await generate(messages, owning(runOptions ?? {}, run, async () => undefined));
        ensureValid(run); // a run that lost its lease (its writes refused) never reports success
        await run.lease.release();
        return result;
      } catch (err) {
        throw await failedRun(run.lease, err);
      }
    });
  };

  const stream = (target.stream as Runner).bind(agent);
  target.stream = async (messages: unknown, runOptions?: RunOptions): Promise<unknown> => {
    const run = await start(runOptions);
    if (run === undefined) return stream(messages, runOptions);
    let ended: Promise<void> | undefined;
    // The stream's end lets go of the thread, once; its callbacks wait for it.
    const end = (suspend: boolean): Promise<void> => {
      ended ??= (suspend ? run.lease.suspend() : run.lease.release()).then(
        () => undefined,
        () => undefined,
      );
      return ended;
    };
    return current.run(run, async () => {
      try {
        return await stream(messages, owning(runOptions ?? {}, run, end));
      } catch (err) {
        const reported = err instanceof LeaseholdError ? err : await lostInstead(run.lease, err);
        await end(true);
        throw reported;
      }
    });
  };
  return agent;
}

/** The part of a Mastra tool this wraps. */
interface ExecutingTool {
  readonly id: string;
  execute?: (input: never, context: never) => Promise<unknown>;
}

/**
 * The same tool (changed in place and returned), its calls through the
 * owned thread's ledger by Mastra's tool-call id: an id already begun on
 * the thread is not run again; its stored output is returned instead
 * (`UNKNOWN_RESULT` for a call a lost owner never settled). Only inside an
 * owned run.
 */
export function ledgered<T extends ExecutingTool>(tool: T): T {
  const execute = tool.execute as ((input: unknown, context: unknown) => Promise<unknown>) | undefined;
  if (execute === undefined) return tool;
  const wrapped = async (input: unknown, context: unknown): Promise<unknown> => {
    const run = current.getStore();
    if (run === undefined) throw new NotOwnedError(`tool ${tool.id} is ledgered but ran outside an owned run`);
    const callId = (context as { agent?: { toolCallId?: string } } | undefined)?.agent?.toolCallId;
    if (callId === undefined) return execute(input, context);
    ensureValid(run);
    const result = await ledgerCall(run.lease, callId, tool.id, () => execute(input, context));
    return answer(result, UNKNOWN_RESULT);
  };
  (tool as { execute?: unknown }).execute = wrapped;
  return tool;
}

/** How Mastra's thread leases are kept: the key's prefix, what to do with an error that refused a lease. */
export interface LeaseProviderOptions {
  /**
   * Prepended to Mastra's thread key to make the lease key (default
   * `mastra-thread:`). Mastra joins resource and thread with a NUL, which a
   * lease key may not hold: the key is `<prefix><resource>/<thread>`, each
   * part URI-encoded (so `/` inside a part cannot make two keys one).
   */
  readonly prefix?: string;
  /** How long a transfer keeps the key for its successor (default 10 s). */
  readonly handoffMs?: number;
  /**
   * Called with an error that made `acquireLease` answer "not acquired"
   * (the server unreachable, say): Mastra never sees it, as it would turn a
   * thrown error into "acquired" in some paths.
   */
  readonly onError?: (err: unknown, key: string) => void;
}

/**
 * Mastra's `LeaseProvider` (the cross-process thread lease of its signals
 * runtime: `sendSignal`, `sendMessage`, queued follow-ups) on leasehold.
 * Where Mastra's own providers fail open (an unreachable backend, or an
 * error Mastra catches, counts as acquired), this one fails closed: any
 * error answers `{ acquired: false }`. A lease is kept alive by the
 * client's renewer while this process lives (Mastra's `renewLease` reports
 * whether it still is), its term's fence is `lease(key)?.fence`, and
 * `transferLease` is a handoff: the key goes from one run to the next with
 * no moment another process can take it.
 */
export class LeaseholdLeaseProvider implements LeaseProvider {
  readonly #client: LeaseholdClient;
  readonly #prefix: string;
  readonly #handoffMs: number;
  readonly #onError: ((err: unknown, key: string) => void) | undefined;
  /** This process's leases, by Mastra's key. */
  readonly #held = new Map<string, Lease>();
  /** Acquires on their way, by Mastra's key and owner (one request each). */
  readonly #pending = new Map<string, Promise<{ acquired: boolean; owner?: string }>>();

  constructor(client: LeaseholdClient, options: LeaseProviderOptions = {}) {
    this.#client = client;
    this.#prefix = options.prefix ?? "mastra-thread:";
    this.#handoffMs = options.handoffMs ?? 10_000;
    this.#onError = options.onError;
  }

  /** The live lease this process holds on Mastra's `key`, if any (its `fence` for a fenced write). */
  lease(key: string): Lease | undefined {
    const lease = this.#held.get(key);
    if (lease !== undefined && !lease.isValid()) {
      this.#held.delete(key);
      return undefined;
    }
    return lease;
  }

  acquireLease(key: string, owner: string, ttlMs: number): Promise<{ acquired: boolean; owner?: string }> {
    const held = this.lease(key);
    if (held !== undefined) return Promise.resolve({ acquired: held.owner === owner, owner: held.owner });
    const id = JSON.stringify([key, owner]);
    let pending = this.#pending.get(id);
    if (pending === undefined) {
      pending = this.#acquire(key, owner, ttlMs, 0).finally(() => this.#pending.delete(id));
      this.#pending.set(id, pending);
    }
    return pending;
  }

  /** The lease key of Mastra's `key` (`<resource>\0<thread>`). */
  #keyOf(key: string): string {
    return this.#prefix + key.split("\0").map(encodeURIComponent).join("/");
  }

  async #acquire(key: string, owner: string, ttlMs: number, waitMs: number): Promise<{ acquired: boolean; owner?: string }> {
    try {
      const lease = await this.#client.acquire(this.#keyOf(key), { owner, ttlMs, waitMs });
      this.#held.set(key, lease);
      return { acquired: true, owner };
    } catch (err) {
      if (err instanceof ReservedError) return { acquired: false, owner: err.successor === "" ? undefined : err.successor };
      if (err instanceof BusyError) return { acquired: false, owner: err.holder };
      this.#onError?.(err, key);
      return { acquired: false };
    }
  }

  /** The owner of the live term, by asking the server. @throws what the server call throws (Mastra reads it as "no live owner"). */
  async getLeaseOwner(key: string): Promise<string | undefined> {
    try {
      return (await this.#client.get(this.#keyOf(key))).lease?.owner;
    } catch (err) {
      if (err instanceof LeaseholdError && err.code === "not_found") return undefined; // never held
      throw err;
    }
  }

  async releaseLease(key: string, owner: string): Promise<void> {
    const lease = this.#held.get(key);
    if (lease === undefined || lease.owner !== owner) return;
    this.#held.delete(key);
    await lease.release().catch(() => undefined); // a lost term has nothing left to release
  }

  /** Whether `owner` still holds `key` (the client's renewer keeps it alive; this does not extend it). */
  renewLease(key: string, owner: string, _ttlMs: number): Promise<boolean> {
    return Promise.resolve(this.lease(key)?.owner === owner);
  }

  /** Hands `fromOwner`'s term to `toOwner`: the key is reserved for `toOwner` between the two terms. */
  async transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean> {
    const lease = this.lease(key);
    if (lease === undefined || lease.owner !== fromOwner) return false;
    if (fromOwner === toOwner) return true;
    this.#held.delete(key);
    try {
      await lease.handOff(toOwner, { withinMs: this.#handoffMs });
    } catch (err) {
      this.#onError?.(err, key);
      return false;
    }
    return (await this.#acquire(key, toOwner, ttlMs, 0)).acquired;
  }
}

/**
 * The same pubsub (changed in place and returned), whose thread leases are
 * leasehold's: Mastra's signals runtime asks a pubsub for its lease
 * provider, and this one answers a {@link LeaseholdLeaseProvider}.
 *
 *   const mastra = new Mastra({ pubsub: leased(new EventEmitterPubSub(), lh), agents });  // leasehold: leased(...)
 */
export function leased<P extends PubSub>(
  pubsub: P,
  client: LeaseholdClient,
  options: LeaseProviderOptions = {},
): P & { getLeaseProvider(): LeaseholdLeaseProvider } {
  const provider = new LeaseholdLeaseProvider(client, options);
  const target = pubsub as P & { getLeaseProvider(): LeaseholdLeaseProvider };
  target.getLeaseProvider = () => provider;
  return target;
}

/** How workflow runs are owned: the lease's TTL, how long a start or resume waits for a busy run, the key's prefix. */
export interface WorkflowOwnOptions extends Pick<AcquireOptions, "ttlMs" | "waitMs"> {
  /**
   * Prepended to make the lease key (default `mastra-run:`): the key is
   * `<prefix><workflow id>/<run id>`, each part URI-encoded.
   */
  readonly prefix?: string;
}

interface WorkflowRun {
  readonly workflow: string;
  readonly runId: string;
  readonly lease: Lease;
}

const currentWorkflowRun = new AsyncLocalStorage<WorkflowRun>();

/** The lease of the owned workflow run this code runs in (inside a step). */
export function currentRunLease(): Lease {
  const run = currentWorkflowRun.getStore();
  if (run === undefined) throw new NotOwnedError("currentRunLease(): not inside an owned workflow run");
  return run.lease;
}

/**
 * The workflows domain's writes of a run (the snapshot after each step, step
 * results, run state, the resume claim): inside the owned run of the same
 * workflow and run id, each checks the lease and is gated.
 */
const WORKFLOW_WRITES = ["persistWorkflowSnapshot", "updateWorkflowResults", "updateWorkflowState", "deleteWorkflowRunById"] as const;

/**
 * What executes a run: `start`, `startAsync` and `stream` go through
 * `_start`; `resume`, `resumeAsync`, `resumeStream` through `_resume`;
 * `restart` through `_restart`; `timeTravel` and its stream through
 * `_timeTravel`. Owning these four owns every public way in.
 */
const RUN_ENTRIES = ["_start", "_resume", "_restart", "_timeTravel"] as const;

/** The part of a Mastra workflow run this reaches. */
interface RunObject {
  readonly workflowId: string;
  readonly runId: string;
  cancel(): Promise<void>;
}

/** The part of a Mastra workflow this reaches. */
interface WorkflowObject {
  createRun(options?: object): Promise<RunObject>;
}

/** The part of a Mastra instance this reaches. */
interface MastraObject {
  listWorkflows(): Record<string, unknown>;
  addWorkflow(workflow: unknown, key?: string): void;
  getStorage(): { getStore(domain: "workflows"): Promise<object | undefined> } | undefined;
}

const ownedRuns = new WeakSet<object>();
const ownedWorkflows = new WeakSet<object>();

function sameRun(run: WorkflowRun | undefined, args: unknown[]): run is WorkflowRun {
  const params = args[0] as { workflowName?: unknown; runId?: unknown } | undefined;
  return run !== undefined && params?.runId === run.runId && (params.workflowName ?? run.workflow) === run.workflow;
}

/** Gates the writes of the workflows storage domain for the owned run they belong to. */
async function gateWorkflowStore(mastra: MastraObject): Promise<void> {
  const store = (await mastra.getStorage()?.getStore("workflows")) as Record<string, unknown> | undefined;
  gateWrites(store, WORKFLOW_WRITES, (args) => {
    const run = currentWorkflowRun.getStore();
    return sameRun(run, args) ? { lease: run.lease, what: `workflow run ${JSON.stringify(run.runId)}` } : undefined;
  });
}

/**
 * The same Mastra (changed in place and returned), whose workflow runs own
 * their lease while they execute: a start or resume of a run another
 * process is executing waits up to `waitMs`, then gets `BusyError`; a
 * restart does not wait, so `mastra.restartAllActiveWorkflowRuns()` (the
 * boot-time recovery, which restarts every run storage lists as running,
 * including those a live process is executing) restarts only the runs
 * whose owner is gone, and when several processes recover at once each run
 * goes to one of them. Every snapshot write of an owned run is gated; a run
 * that lost its lease is cancelled and never reports success. A run that
 * ends (succeeded, failed, suspended for input) lets go of the key; one
 * that throws leaves it recoverable.
 *
 *   const mastra = ownWorkflows(new Mastra({ workflows, storage }), lh);  // leasehold: ownWorkflows(...)
 */
export function ownWorkflows<M extends Mastra>(mastra: M, client: LeaseholdClient, options: WorkflowOwnOptions = {}): M {
  const target = mastra as unknown as MastraObject;
  const prefix = options.prefix ?? "mastra-run:";

  const ownRun = (run: RunObject): RunObject => {
    if (ownedRuns.has(run)) return run;
    ownedRuns.add(run);
    const entries = run as unknown as Record<string, (args: unknown) => Promise<unknown>>;
    const key = `${prefix}${encodeURIComponent(run.workflowId)}/${encodeURIComponent(run.runId)}`;
    for (const name of RUN_ENTRIES) {
      const original = entries[name];
      if (typeof original !== "function") continue;
      entries[name] = async (args: unknown): Promise<unknown> => {
        const present = currentWorkflowRun.getStore();
        if (present?.runId === run.runId && present.workflow === run.workflowId) return original.call(run, args);
        await gateWorkflowStore(target);
        const lease = await client.acquire(key, { ttlMs: options.ttlMs, waitMs: name === "_restart" ? 0 : options.waitMs });
        const owned: WorkflowRun = { workflow: run.workflowId, runId: run.runId, lease };
        // A run whose lease is lost stops at its next step instead of running
        // on unowned. Inside the run's context, so the canceled status Mastra
        // then writes is refused like any other write of the lost run (outside
        // it, it would land on the snapshot of whoever took the run over).
        const cancel = (): void => void currentWorkflowRun.run(owned, () => run.cancel()).catch(() => undefined);
        lease.signal.addEventListener("abort", cancel, { once: true });
        return currentWorkflowRun.run(owned, async () => {
          let result: unknown;
          try {
            result = await original.call(run, args);
            ensureHeld(lease, `workflow run ${JSON.stringify(run.runId)}`); // a lost run never reports success
          } catch (err) {
            lease.signal.removeEventListener("abort", cancel);
            throw await failedRun(lease, err);
          }
          lease.signal.removeEventListener("abort", cancel);
          await lease.release().catch(() => undefined); // a term lost just now expires on its own
          return result;
        });
      };
    }
    return run;
  };

  const ownWorkflow = (workflow: unknown): void => {
    const w = workflow as WorkflowObject;
    if (typeof w.createRun !== "function" || ownedWorkflows.has(w)) return;
    ownedWorkflows.add(w);
    const createRun = w.createRun.bind(w);
    w.createRun = async (runOptions?: object): Promise<RunObject> => ownRun(await createRun(runOptions));
  };

  for (const workflow of Object.values(target.listWorkflows())) ownWorkflow(workflow);
  const addWorkflow = target.addWorkflow.bind(target);
  target.addWorkflow = (workflow: unknown, key?: string): void => {
    addWorkflow(workflow, key);
    ownWorkflow(workflow);
  };
  return mastra;
}
