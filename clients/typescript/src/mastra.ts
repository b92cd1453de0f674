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

import { AsyncLocalStorage } from "node:async_hooks";

import type { Agent } from "@mastra/core/agent";

import type { AcquireOptions, LeaseholdClient } from "./client.js";
import { LeaseholdError, NotOwnedError } from "./errors.js";
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

/** Gates the writes of `memory`'s storage domain (once per domain object). */
async function gateMemory(memory: StoredMemory): Promise<void> {
  const store = (await memory.storage?.getStore("memory")) as Record<string, unknown> | undefined;
  if (store === undefined || gatedStores.has(store)) return;
  gatedStores.add(store);
  for (const name of STORE_WRITES) {
    const method = store[name];
    if (typeof method !== "function") continue;
    const write = method as (...args: unknown[]) => Promise<unknown>;
    store[name] = async (...args: unknown[]): Promise<unknown> => {
      const run = current.getStore();
      if (run !== undefined) {
        ensureValid(run);
        await run.lease.gate();
      }
      return write.apply(store, args);
    };
  }
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
