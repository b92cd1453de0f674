// Running a turn's tool calls through the server's ledger, so no call id
// ever runs its tool twice and a new holder knows what was left running.
//
// The loop (the same as the Rust client's `run_tool_calls`): register the
// turn's calls before any side effect, run only the new ones (concurrently,
// up to a limit), settle each as it finishes, and return one result per call
// in the provider's order. A call id the ledger already knows gets its stored
// outcome instead of a second run.

import { type ToolCall as PbToolCall, ToolCallState } from "./gen/leasehold/v1/leasehold_pb.js";
import { InvalidArgumentError, LeaseholdError, msToNumber } from "./errors.js";

/** One tool call of a turn, as the model provider asked for it. */
export interface ToolCallRequest {
  /** The provider's call id (`call_…`, `toolu_…`). */
  callId: string;
  /** The tool's name. */
  name: string;
  /** Optional digest of the input, stored with the call for audits. */
  inputDigest?: string;
}

/** What a runner is given to run one call. */
export interface ToolInvocation {
  readonly call: ToolCallRequest;
  /** The fence the call was registered under: pass it to fenced storage. */
  readonly fence: bigint;
  /**
   * Stable across retries and duplicates: give it to downstream services that
   * deduplicate. It includes the turn, so an id reused in a new turn gets a new key.
   */
  readonly idempotencyKey: string;
  /** The turn the call was registered in ("" when none was named). */
  readonly turn: string;
  /** Aborted when the lease is lost: pass it to the tool's own I/O. */
  readonly signal: AbortSignal;
}

/** How a call ended. */
export type ToolOutcome =
  | { readonly state: "succeeded"; readonly result: Uint8Array }
  | { readonly state: "failed"; readonly result: Uint8Array }
  /** Nobody knows whether its side effects happened (settled by a recoverer). */
  | { readonly state: "unknown" }
  /** Recorded as running by an earlier turn or term and not settled: its outcome is still owed. */
  | { readonly state: "running" };

/**
 * What a runner returns: a payload (string or bytes) for success, or an
 * explicit outcome. A runner that throws settles its call as failed, with the
 * error's message as the payload (unless the lease was lost meanwhile: then
 * nothing is settled and `runToolCalls` throws `LeaseLostError`).
 */
export type ToolRunResult = string | Uint8Array | ToolOutcome;

export type ToolRunner = (invocation: ToolInvocation) => Promise<ToolRunResult>;

/** One call's result, in the provider's call order. */
export interface ToolResult {
  readonly callId: string;
  readonly outcome: ToolOutcome;
  /** True when the outcome came from the ledger (a duplicate id): the runner did not run for it. */
  readonly reused: boolean;
}

/** A ledger entry, as `listToolCalls` and `settleToolCall` return it. */
export interface ToolCallRecord {
  readonly key: string;
  readonly callId: string;
  readonly name: string;
  readonly inputDigest: string;
  /** The fence of the term that began the call. */
  readonly fence: bigint;
  readonly state: "running" | "succeeded" | "failed" | "unknown";
  /** The fence of the term that settled it (0n while running). */
  readonly settledFence: bigint;
  readonly resultDigest: string;
  readonly result: Uint8Array;
  readonly begunAtMs: number;
  readonly settledAtMs: number;
  readonly ordinal: bigint;
  readonly idempotencyKey: string;
  /** The turn the call was begun in ("" when none was named). */
  readonly turn: string;
}

const encoder = new TextEncoder();

export function stateName(state: ToolCallState): ToolCallRecord["state"] {
  switch (state) {
    case ToolCallState.SUCCEEDED:
      return "succeeded";
    case ToolCallState.FAILED:
      return "failed";
    case ToolCallState.UNKNOWN:
      return "unknown";
    default:
      return "running";
  }
}

export function toRecord(c: PbToolCall): ToolCallRecord {
  return {
    key: c.key,
    callId: c.callId,
    name: c.name,
    inputDigest: c.inputDigest,
    fence: c.fence,
    state: stateName(c.state),
    settledFence: c.settledFence,
    resultDigest: c.resultDigest,
    result: c.result,
    begunAtMs: msToNumber(c.begunAtMs),
    settledAtMs: msToNumber(c.settledAtMs),
    ordinal: c.ordinal,
    idempotencyKey: c.idempotencyKey,
    turn: c.turn,
  };
}

export function outcomeOfRecord(c: PbToolCall): ToolOutcome {
  switch (c.state) {
    case ToolCallState.SUCCEEDED:
      return { state: "succeeded", result: c.result };
    case ToolCallState.FAILED:
      return { state: "failed", result: c.result };
    case ToolCallState.UNKNOWN:
      return { state: "unknown" };
    default:
      return { state: "running" };
  }
}

/** The wire state and payload of an outcome a runner produced. */
export function outcomeToWire(outcome: ToolOutcome): { state: ToolCallState; result: Uint8Array } {
  switch (outcome.state) {
    case "succeeded":
      return { state: ToolCallState.SUCCEEDED, result: outcome.result };
    case "failed":
      return { state: ToolCallState.FAILED, result: outcome.result };
    case "unknown":
      return { state: ToolCallState.UNKNOWN, result: new Uint8Array() };
    case "running":
      throw new InvalidArgumentError("a call cannot be settled as still running");
  }
}

export function normalizeResult(r: ToolRunResult): ToolOutcome {
  if (typeof r === "string") return { state: "succeeded", result: encoder.encode(r) };
  if (r instanceof Uint8Array) return { state: "succeeded", result: r };
  return r;
}

export function failedOutcome(err: unknown): ToolOutcome {
  const message = err instanceof Error ? err.message : String(err);
  return { state: "failed", result: encoder.encode(message) };
}

/** What the loop needs from a lease. */
export interface ToolHost {
  readonly fence: bigint;
  /** The turn the calls are registered and settled in ("" for none). */
  readonly turn: string;
  readonly signal: AbortSignal;
  ensureValid(): void;
  /** Registers unique calls; returns the ledger's records for those it already held. */
  register(calls: readonly ToolCallRequest[]): Promise<{ known: PbToolCall[]; fresh: PbToolCall[] }>;
  settle(callId: string, outcome: ToolOutcome): Promise<unknown>;
  lostError(): LeaseholdError;
}

/** Runs at most `limit` of `tasks` at a time; rejects on the first failure. */
async function pool<T>(tasks: Array<() => Promise<T>>, limit: number): Promise<T[]> {
  const results: T[] = new Array<T>(tasks.length);
  let next = 0;
  const workers = Array.from({ length: Math.max(1, Math.min(limit, tasks.length)) }, async () => {
    while (next < tasks.length) {
      const i = next++;
      const task = tasks[i];
      if (task !== undefined) results[i] = await task();
    }
  });
  await Promise.all(workers);
  return results;
}

export async function runToolCalls(
  host: ToolHost,
  calls: readonly ToolCallRequest[],
  runner: ToolRunner,
  concurrency: number,
): Promise<ToolResult[]> {
  host.ensureValid();
  const unique: ToolCallRequest[] = [];
  for (const call of calls) {
    if (!unique.some((u) => u.callId === call.callId)) unique.push(call);
  }
  const { known, fresh } = await host.register(unique);
  const freshCalls = unique.filter((c) => !known.some((k) => k.callId === c.callId));
  const keys = new Map(fresh.map((r) => [r.callId, r.idempotencyKey]));

  const tasks = freshCalls.map((call) => async (): Promise<[string, ToolOutcome]> => {
    let outcome: ToolOutcome;
    try {
      outcome = normalizeResult(
        await runner({
          call,
          fence: host.fence,
          idempotencyKey: keys.get(call.callId) ?? "",
          turn: host.turn,
          signal: host.signal,
        }),
      );
    } catch (err) {
      // A runner that stopped because the lease was lost leaves its call
      // recorded as running, for whoever recovers the key.
      if (host.signal.aborted) throw host.lostError();
      outcome = failedOutcome(err);
    }
    if (outcome.state === "running") {
      throw new InvalidArgumentError(`the runner for call ${call.callId} returned state "running"`);
    }
    await host.settle(call.callId, outcome);
    return [call.callId, outcome];
  });

  let lostListener: (() => void) | undefined;
  const lost = new Promise<never>((_, reject) => {
    lostListener = () => reject(host.lostError());
    if (host.signal.aborted) lostListener();
    else host.signal.addEventListener("abort", lostListener, { once: true });
  });
  lost.catch(() => {}); // observed below through the race
  let ran: Array<[string, ToolOutcome]>;
  try {
    ran = await Promise.race([pool(tasks, concurrency), lost]);
  } finally {
    if (lostListener !== undefined) host.signal.removeEventListener("abort", lostListener);
  }
  const ranById = new Map(ran);

  return calls.map((call) => {
    const outcome = ranById.get(call.callId);
    if (outcome !== undefined) return { callId: call.callId, outcome, reused: false };
    const record = known.find((k) => k.callId === call.callId);
    if (record === undefined) {
      throw new LeaseholdError("internal", `call ${call.callId} was neither run nor known to the ledger`);
    }
    return { callId: call.callId, outcome: outcomeOfRecord(record), reused: true };
  });
}
