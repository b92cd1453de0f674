// What the framework adapters (ai-sdk, langgraph, agents) share: taking a
// key over from a lost owner, reporting a loss instead of the abort it
// caused, and one tool call through the ledger. Internal: not a subpath
// export of the package.

import { LeaseholdError, LeaseLostError } from "./errors.js";
import type { Lease } from "./lease.js";

/** What a call the ledger holds from a lost owner answers the model; `of` names what was owned. */
export function unknownResult(of: string): string {
  return `leasehold: this tool call was begun by an earlier owner of the ${of}, which was lost before it recorded a result; whether it ran is unknown`;
}

/** What a second call with an id still running answers the model. */
export const ALREADY_RUNNING = "leasehold: this tool call is already running; it was not started again";

/** A key taken over from a lost owner: the calls it left running are settled as unknown. */
export async function takeover(lease: Lease): Promise<void> {
  if (lease.unsettledToolCalls === 0) return;
  for (const call of await lease.listToolCalls({ unsettled: true })) {
    await lease.settleToolCall(call.callId, { state: "unknown" }, { turn: call.turn });
  }
}

/**
 * The local check every adapter makes before it reads or writes for a run:
 * throws the loss once the lease is no longer held (no round trip).
 * `what` names what was owned, for the message (`session "s1"`).
 */
export function ensureHeld(lease: Lease, what: string): void {
  const reason = lease.lossReason;
  if (reason !== undefined) {
    throw new LeaseLostError(`the run lost ${what} (${reason}): it may not use it any more`, {
      key: lease.key,
      fence: lease.fence,
      reason,
    });
  }
}

/**
 * What a run that failed with `err` throws, its lease then suspended (a key
 * left mid-run is for a recoverer): the leasehold error behind `err` (a
 * framework wraps what a hook or store throws), else the loss when the lease
 * was lost (the abort or refusal it caused is not the news), else `err`.
 * The report is taken before suspending: a suspended lease reads as lost.
 */
export async function failedRun(lease: Lease, err: unknown): Promise<unknown> {
  let reported: unknown;
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof LeaseholdError) {
      reported = e;
      break;
    }
  }
  reported ??= await lostInstead(lease, err);
  await lease.suspend().catch(() => undefined);
  return reported;
}

/** A run that failed after its lease was lost reports the loss, not the abort or refusal it caused. */
export async function lostInstead(lease: Lease, err: unknown): Promise<unknown> {
  if (lease.lossReason === undefined) return err;
  try {
    await lease.verify();
  } catch (lost) {
    return lost;
  }
  return err;
}

const decoder = new TextDecoder();

/** One call as the ledger answered it: run now (`fresh`), or an earlier outcome. */
export type Ledgered =
  | { readonly kind: "fresh"; readonly value: unknown }
  | { readonly kind: "stored"; readonly value: unknown }
  | { readonly kind: "failed"; readonly message: string }
  | { readonly kind: "unknown" }
  | { readonly kind: "running" };

/**
 * Runs `execute` as tool call `callId` through the lease's ledger: an id
 * already begun on the key is not run again, its stored outcome comes back.
 * What is stored is `stored(value)` as JSON (by default the value itself).
 */
export async function ledgerCall(
  lease: Lease,
  callId: string,
  name: string,
  execute: (signal: AbortSignal) => Promise<unknown>,
  stored: (value: unknown) => unknown = (value) => value,
): Promise<Ledgered> {
  let fresh: { value: unknown } | undefined;
  const [result] = await lease.runToolCalls([{ callId, name }], async (invocation) => {
    const value = await execute(invocation.signal);
    fresh = { value };
    return JSON.stringify(stored(value) ?? null);
  });
  if (fresh !== undefined && result !== undefined && !result.reused) return { kind: "fresh", value: fresh.value };
  const outcome = result?.outcome;
  if (outcome === undefined || outcome.state === "running") return { kind: "running" };
  if (outcome.state === "unknown") return { kind: "unknown" };
  const text = decoder.decode(outcome.result);
  if (outcome.state === "failed") return { kind: "failed", message: text };
  return { kind: "stored", value: JSON.parse(text) as unknown };
}

/**
 * What a ledgered tool answers for `result`: its value (fresh or stored),
 * the failure rethrown, `unknown` for a lost owner's unsettled call.
 */
export function answer(result: Ledgered, unknown: string): unknown {
  switch (result.kind) {
    case "fresh":
    case "stored":
      return result.value;
    case "failed":
      throw new Error(result.message);
    case "unknown":
      return unknown;
    case "running":
      return ALREADY_RUNNING;
  }
}
