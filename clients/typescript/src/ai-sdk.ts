// One owner per chat for the AI SDK (`ai` 7): `@leasehold/client/ai-sdk`.
//
//   import { generateText } from "@leasehold/client/ai-sdk";   // was: from "ai"
//   const result = await generateText(client, `chat:${id}`, { model, messages, tools, onFinish });
//   // or, to read the chat as its owner: generateText(client, key, async () => ({ model, messages: await load(id), ... }))
//
// The same arguments as the AI SDK's own `generateText` / `streamText`,
// after the client and the chat's lease key. The call runs as the chat's
// owner: the lease is acquired first (a second run of the chat waits up to
// `waitMs`, then `BusyError`), every step is gated (`prepareStep`), every
// tool's `execute` goes through the chat's ledger (a call id never runs
// twice), the run aborts when the lease is lost (its `abortSignal`), and
// `onFinish` runs after a gate, with `currentLease()` giving the fence for
// a fenced save (`sqliteFencedWrite`, `pgFencedWrite`). The lease is
// released when the run finishes, suspended when it fails or is aborted.
// A `streamText` run keeps its lease until its stream ends, however it is
// consumed (the response, `consumeStream()` after the request is gone).
//
// Resumable streams (`activeStreamId`): `newStreamId()` names the run's
// stream after its term, in the run (the result's `consumeSseStream` runs
// as the owner); the resume route asks `liveStreamId(client, key, stored)`,
// which answers the stored id only while the run that made it still owns
// the chat, so a client never resumes a stream whose run died or lost the
// chat (it would never finish).

import { AsyncLocalStorage } from "node:async_hooks";
import { randomUUID } from "node:crypto";

import * as ai from "ai";
import type { ToolSet } from "ai";

import type { AcquireOptions, LeaseholdClient } from "./client.js";
import { LeaseholdError, NotOwnedError } from "./errors.js";
import type { Lease } from "./lease.js";
import { answer, failedRun, ledgerCall, takeover, unknownResult } from "./owning.js";

/** What a call the ledger holds from a lost owner answers the model. */
export const UNKNOWN_RESULT = unknownResult("chat");

const current = new AsyncLocalStorage<Lease>();

/** The lease of the owned run this code runs in (inside tools, `onFinish`, ...). */
export function currentLease(): Lease {
  const lease = current.getStore();
  if (lease === undefined) throw new NotOwnedError("currentLease(): not inside an owned generateText/streamText run");
  return lease;
}

/** How the chat is owned: the lease's TTL and how long to wait for a busy chat. */
export type OwnOptions = Pick<AcquireOptions, "ttlMs" | "waitMs">;

type GenerateArgs = Parameters<typeof ai.generateText>[0];
type StreamArgs = Parameters<typeof ai.streamText>[0];

/**
 * A run's arguments, or a function that makes them once the lease is held:
 * load the chat's messages there, so that what the run reads is what its
 * owner sees (arguments built before the call were read before the lease,
 * possibly while another run was still writing the chat).
 */
export type Args<A> = A | ((lease: Lease) => A | Promise<A>);

async function made<A extends object>(args: Args<A>, lease: Lease): Promise<A> {
  return typeof args === "function" ? (args as (lease: Lease) => A | Promise<A>)(lease) : args;
}

/** `tools`, each `execute` through the lease's ledger (by the SDK's toolCallId). */
export function ledgered<T extends ToolSet>(tools: T, lease: Lease): T {
  const out: Record<string, unknown> = {};
  for (const [name, tool] of Object.entries(tools)) {
    const execute = (tool as { execute?: (input: unknown, options: { toolCallId: string; abortSignal?: AbortSignal }) => unknown }).execute;
    if (execute === undefined) {
      out[name] = tool;
      continue;
    }
    out[name] = {
      ...tool,
      execute: async (input: unknown, options: { toolCallId: string; abortSignal?: AbortSignal }) => {
        const result = await ledgerCall(lease, options.toolCallId, name, async (signal) => {
          const both = options.abortSignal === undefined ? signal : AbortSignal.any([options.abortSignal, signal]);
          return execute(input, { ...options, abortSignal: both });
        });
        return answer(result, UNKNOWN_RESULT);
      },
    };
  }
  return out as T;
}

/** The run's own arguments, changed to run as the lease's owner. */
function owning<A extends GenerateArgs | StreamArgs>(args: A, lease: Lease): A {
  const prepareStep = args.prepareStep;
  const onFinish = args.onFinish as ((event: unknown) => unknown) | undefined;
  const signal = args.abortSignal === undefined ? lease.signal : AbortSignal.any([args.abortSignal, lease.signal]);
  return {
    ...args,
    tools: args.tools === undefined ? undefined : ledgered(args.tools, lease),
    abortSignal: signal,
    prepareStep: async (options: Parameters<NonNullable<typeof prepareStep>>[0]) => {
      // A step's model call writes nothing; its tools are ledgered, so each
      // call's Begin is refused by the server under a stale fence, and the
      // terminal write (onFinish) asks the server below: a fresh lease
      // passes this gate with no round trip.
      await lease.gate({ storageFenced: true });
      return prepareStep === undefined ? undefined : prepareStep(options as never);
    },
    onFinish:
      onFinish === undefined
        ? undefined
        : async (event: unknown) => {
            await lease.gate();
            await onFinish(event);
          },
  } as A;
}

/**
 * The AI SDK's `generateText`, as the owner of `key`. A chat taken over from
 * a lost owner first has the calls it left running settled as unknown.
 * @throws BusyError (another run owns the chat), LeaseLostError (lost mid-run), and whatever generateText throws.
 */
export async function generateText(
  client: LeaseholdClient,
  key: string,
  args: Args<GenerateArgs>,
  options: OwnOptions = {},
): Promise<Awaited<ReturnType<typeof ai.generateText>>> {
  const lease = await client.acquire(key, options);
  return current.run(lease, async () => {
    try {
      await takeover(lease);
      const result = await ai.generateText(owning(await made(args, lease), lease));
      await lease.release();
      return result;
    } catch (err) {
      throw await failedRun(lease, err);
    }
  });
}

/**
 * The AI SDK's `streamText`, as the owner of `key`: the lease is held until
 * the stream ends (finished: released; errored or aborted: suspended).
 * @throws BusyError before the stream starts when another run owns the chat.
 */
export async function streamText(
  client: LeaseholdClient,
  key: string,
  args: Args<StreamArgs>,
  options: OwnOptions = {},
): Promise<ReturnType<typeof ai.streamText>> {
  const lease = await client.acquire(key, options);
  return current.run(lease, async () => {
    let given: StreamArgs;
    try {
      await takeover(lease);
      given = await made(args, lease);
    } catch (err) {
      await lease.suspend().catch(() => undefined);
      throw err;
    }
    const owned = owning(given, lease);
    let ended = false;
    const end = (suspend: boolean): void => {
      if (ended) return;
      ended = true;
      void (suspend ? lease.suspend() : lease.release()).catch(() => undefined);
    };
    const onFinish = owned.onFinish as ((event: unknown) => Promise<void>) | undefined;
    const onError = given.onError as ((event: { error: unknown }) => unknown) | undefined;
    const onAbort = given.onAbort as ((event: unknown) => unknown) | undefined;
    return asOwner(ai.streamText({
      ...owned,
      onFinish: async (event: unknown) => {
        try {
          if (onFinish !== undefined) await onFinish(event);
          end(false);
        } catch (err) {
          end(true);
          throw err;
        }
      },
      onError: async (event: { error: unknown }) => {
        end(true);
        if (onError !== undefined) await onError(event);
      },
      onAbort: async (event: unknown) => {
        end(true);
        if (onAbort !== undefined) await onAbort(event);
      },
    } as StreamArgs), lease);
  });
}

/**
 * The UI-stream methods of `result`, run as the owner: what they call back
 * (`consumeSseStream` above all, where a resumable stream is registered and
 * its id saved) sees the run's lease as `currentLease()`.
 */
function asOwner<R extends object>(result: R, lease: Lease): R {
  const methods = result as unknown as Record<string, unknown>;
  for (const name of ["toUIMessageStream", "toUIMessageStreamResponse", "pipeUIMessageStreamToResponse"]) {
    const method = methods[name];
    if (typeof method !== "function") continue;
    const original = method as (...args: unknown[]) => unknown;
    methods[name] = (...args: unknown[]): unknown => current.run(lease, () => original.apply(result, args));
  }
  return result;
}

/**
 * A resumable stream's id for the owned run (`<fence>.<uuid>`): it names the
 * term that streams it, so {@link liveStreamId} can tell whether that run
 * still owns the chat. Save it as the chat's `activeStreamId` with a fenced
 * write (`sqliteFencedWrite(db, key, currentLease().fence, ...)`).
 * @throws NotOwnedError outside an owned run (pass the lease instead).
 */
export function newStreamId(lease: Lease = currentLease()): string {
  return `${lease.fence}.${randomUUID()}`;
}

/**
 * For the resume route: `activeStreamId` while the run that made it (with
 * {@link newStreamId}) still owns `key`; `null` when there is none, when
 * that run has ended or lost the chat (its process died, or stalled past its
 * TTL: its stream will never finish, and resuming it would hang or replay
 * an abandoned turn), or for an id that `newStreamId` did not make.
 * @throws what `client.get` throws but "not found" (an unknown chat: `null`).
 */
export async function liveStreamId(
  client: LeaseholdClient,
  key: string,
  activeStreamId: string | null | undefined,
): Promise<string | null> {
  if (activeStreamId === null || activeStreamId === undefined) return null;
  const named = /^([0-9]+)\./.exec(activeStreamId);
  if (named === null) return null;
  const fence = BigInt(named[1]!);
  try {
    return (await client.get(key)).lease?.fence === fence ? activeStreamId : null;
  } catch (err) {
    if (err instanceof LeaseholdError && err.code === "not_found") return null;
    throw err;
  }
}
