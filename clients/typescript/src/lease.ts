// A held term of a key: renews itself in the background and knows when it
// can no longer be sure it holds the key.

import {
  ListToolCallsRequest_Filter,
  type Lease as PbLease,
  type ToolCall as PbToolCall,
} from "./gen/leasehold/v1/leasehold_pb.js";
import {
  endsTheTerm,
  fromCallError,
  InvalidArgumentError,
  LeaseholdError,
  LeaseLostError,
  type LossReason,
  msToNumber,
  PermissionDeniedError,
  UnavailableError,
} from "./errors.js";
import type { Endpoints } from "./endpoints.js";
import { type Ended, toEnded } from "./lifecycle.js";
import type { Grant, Handoff, LeaseOps, Term } from "./ops.js";
import { jitterRenewal, now, retryPause, sleep, type Timing, validFor } from "./timing.js";
import {
  outcomeToWire,
  runToolCalls,
  toRecord,
  type ToolCallRecord,
  type ToolCallRequest,
  type ToolOutcome,
  type ToolResult,
  type ToolRunner,
} from "./tools.js";

/** How many times a release is sent when the server is unreachable. */
const RELEASE_ATTEMPTS = 3;

/** The turn options of {@link Lease.runToolCalls}. */
export interface ToolCallOptions {
  /**
   * The turn the calls belong to (the provider's turn or message id, a
   * counter: up to 256 bytes, no control characters). A duplicate is then
   * looked for within (key, turn, call id) only. Default: none (an id is
   * checked against every turn).
   */
  turn?: string;
  /** Also treat an id declared in any earlier turn as a duplicate (the calls are still recorded in `turn`). */
  acrossTurns?: boolean;
}

const utf8 = new TextEncoder();

/** A turn as the server takes it, refused here before anything is sent. */
function checkTurn(turn: string): string {
  if (typeof turn !== "string") throw new InvalidArgumentError(`turn must be a string, not ${typeof turn}`);
  if (utf8.encode(turn).length > 256) throw new InvalidArgumentError("turn must be at most 256 bytes");
  // Unicode Cc, as the server's check (char::is_control).
  if (/[\u0000-\u001f\u007f-\u009f]/.test(turn)) {
    throw new InvalidArgumentError("turn must not contain control characters");
  }
  return turn;
}

export { type Ended, toEnded } from "./lifecycle.js";

/** What the client hands a new lease. */
export interface LeaseInit {
  /** The client's servers, for the tool-call ledger. */
  readonly endpoints: Endpoints;
  /** Renew, Check and Release (failing over between the servers). */
  readonly ops: LeaseOps;
  readonly timing: Timing;
  readonly reply: Grant;
  /**
   * The local time of the first Acquire attempt when the grant surely came
   * after it (a fresh grant, or a replay of a request id made up by this
   * client); undefined when the grant's age is unknown (a replay of a
   * caller-supplied request id), so the lease trusts nothing until a renewal
   * it sent is answered.
   */
  readonly sentAt: number | undefined;
}

/**
 * A held term of a key. Renews itself in the background (every ttl/3,
 * jittered) and keeps a local deadline: the send time of the last successful
 * renewal plus the TTL, less a safety margin, on the local monotonic clock.
 *
 * `signal` aborts the moment the lease stops being valid: a renewal or check
 * refused (stale fence, wrong lease id), the local deadline passed, or the
 * lease was released or suspended. It never un-aborts, and a lease whose
 * signal aborted is never valid again.
 */
export class Lease implements AsyncDisposable {
  /** The key held. */
  readonly key: string;
  /** The owner name the term was granted to. */
  readonly owner: string;
  /** The term's fencing token: store it with every write. Never a number. */
  readonly fence: bigint;
  /** The TTL the term was granted with. */
  readonly ttlMs: number;
  /** How the key's previous term ended, if it had one. */
  readonly previous: Ended | undefined;
  /**
   * True when the previous term ended unfinished (expired or suspended): look
   * at `previous` and `unsettledToolCalls` before going on.
   */
  readonly recovered: boolean;
  /** Whether the grant repeated an earlier one for the same request id. */
  readonly replayed: boolean;
  /** How many of the key's tool calls earlier terms left running, as the grant reported it. */
  readonly unsettledToolCalls: number;
  /** Aborted when the lease is lost, released or suspended. Pass it to model calls and tools. */
  readonly signal: AbortSignal;

  readonly #leaseId: string;
  readonly #endpoints: Endpoints;
  readonly #ops: LeaseOps;
  readonly #timing: Timing;
  readonly #abort = new AbortController();
  /** Local monotonic time until which the term is surely held. */
  #deadline: number;
  /** Server wall-clock expiry as last reported (for display only). */
  #expiresAtMs: number;
  #loss: { reason: LossReason; cause?: unknown } | undefined;
  /** Set once release/suspend has started: renewals stop for good. */
  #finished = false;
  #renewTimer: NodeJS.Timeout | undefined;
  #deadlineTimer: NodeJS.Timeout | undefined;
  #failures = 0;

  private constructor(init: LeaseInit, lease: PbLease) {
    this.key = lease.key;
    this.owner = lease.owner;
    this.fence = lease.fence;
    this.ttlMs = init.timing.ttlMs;
    this.#leaseId = lease.leaseId;
    this.#endpoints = init.endpoints;
    this.#ops = init.ops;
    this.#timing = init.timing;
    const previous = init.reply.previous;
    this.previous = previous === undefined ? undefined : toEnded(previous);
    this.recovered = this.previous !== undefined && this.previous.end !== "released";
    this.replayed = init.reply.replayed;
    this.unsettledToolCalls = init.reply.unsettledToolCalls;
    this.signal = this.#abort.signal;
    // Without a known send time the lease trusts nothing until it renews.
    this.#deadline = init.sentAt === undefined ? now() : init.sentAt + validFor(init.timing);
    this.#expiresAtMs = msToNumber(lease.expiresAtMs);
  }

  /** Builds the lease for an Acquire reply and starts its renewal. */
  static async start(init: LeaseInit): Promise<Lease> {
    const pb = init.reply.lease;
    if (pb === undefined) throw new LeaseholdError("internal", "the server's Acquire reply carried no lease");
    const lease = new Lease(init, pb);
    init.ops.hold();
    const t = init.timing;
    // A replay renews at once even with a basis: the term may be near its
    // end on the server, and a renewal makes it last a whole TTL again.
    const firstRenewal = init.sentAt === undefined || init.reply.replayed ? now() : init.sentAt + t.renewEveryMs;
    if (firstRenewal <= now()) {
      // The grant is of unknown age (replayed) or a long wait ate into it:
      // renew now so the deadline rests on a send time we know.
      const error = await lease.#renewOnce(true);
      if (!lease.isValid()) {
        // Refused, or no renewal reached the server: either way this lease
        // cannot be trusted, and an unreachable server's term ends at its TTL.
        const err =
          error instanceof LeaseLostError || error === undefined
            ? lease.#lostError()
            : new UnavailableError(`could not confirm the grant of ${JSON.stringify(lease.key)}: ${error.message}`, {
                cause: error,
              });
        lease.#stop();
        throw err;
      }
    } else {
      lease.#scheduleRenewal(firstRenewal - now());
    }
    lease.#armDeadline();
    return lease;
  }

  /** The term's expiry as the server last reported it (server clock, ms since epoch); for display. */
  get serverExpiresAtMs(): number {
    return this.#expiresAtMs;
  }

  /** Why the lease is not valid, or undefined while it is. */
  get lossReason(): LossReason | undefined {
    this.#checkDeadline();
    return this.#loss?.reason;
  }

  /**
   * Whether the lease may act, by a local check with no round trip: not
   * refused, not released, and the local deadline has not passed.
   */
  isValid(): boolean {
    this.#checkDeadline();
    return this.#loss === undefined;
  }

  /**
   * Proves with a round trip (`Check`) that the fence is still the key's live
   * term. It neither extends the term nor revives a lost lease.
   * @throws LeaseLostError when the lease is lost or the server says the fence is stale;
   *   UnavailableError when the server cannot be reached in time.
   */
  async verify(): Promise<void> {
    // A passed deadline is final here (see the README), so it is checked too.
    this.#ensureValid();
    try {
      await this.#ops.check(this.key, this.fence, this.#timing.rpcTimeoutMs);
    } catch (err) {
      throw this.#judge(fromCallError(err, "Check"));
    }
  }

  /**
   * The continuation gate: call it before each model request and each
   * terminal write. A local check, then {@link verify}, then the local check
   * again. Returns the fence to store with the write.
   *
   * `storageFenced: true` says that every write the gate guards carries the
   * fence to a store that refuses a stale one itself (a fenced SQLite or
   * PostgreSQL transaction, the ledger's Begin): then a fresh lease (its
   * local deadline ahead, no renewal failed since the last success) answers
   * locally, with no round trip, because the server cannot have ended the
   * term before that deadline and the store refuses a late write anyway.
   * @throws LeaseLostError; UnavailableError.
   */
  async gate(options: { storageFenced?: boolean } = {}): Promise<bigint> {
    this.#ensureValid();
    if (options.storageFenced === true && this.#fresh()) return this.fence;
    await this.verify();
    this.#ensureValid();
    return this.fence;
  }

  /**
   * Ends the term as finished, presenting its fence and lease id (it can
   * never end someone else's term).
   * @throws LeaseLostError when the term was already lost, or the server
   *   refuses the release as stale; UnavailableError when the server could
   *   not be reached after a few attempts (the term then expires at its TTL).
   */
  release(): Promise<Ended> {
    return this.#finish(false);
  }

  /** Ends the term as unfinished, so the key is listed as recoverable. Throws as {@link release}. */
  suspend(): Promise<Ended> {
    return this.#finish(true);
  }

  /**
   * Ends the term (as unfinished with `suspend`) and keeps the key for the
   * owner `successor` for `withinMs` (default 30 s, at most 10 min): only
   * that owner's acquire gets it, ahead of every waiter; others get
   * {@link ReservedError}. The successor's lease shows `previous.handedOff`.
   * Once `withinMs` runs out, anyone may take the key.
   * @throws as {@link release}; InvalidArgumentError for an empty successor.
   */
  handOff(successor: string, options: { withinMs?: number; suspend?: boolean } = {}): Promise<Ended> {
    const withinMs = options.withinMs ?? 30_000;
    if (successor === "") return Promise.reject(new InvalidArgumentError("handOff needs a successor owner name"));
    if (!Number.isSafeInteger(withinMs) || withinMs < 0) {
      return Promise.reject(new InvalidArgumentError(`withinMs must be a non-negative integer, not ${withinMs}`));
    }
    return this.#finish(options.suspend ?? false, { successor, withinMs });
  }

  /**
   * For `await using`: suspends the term if it was neither released nor
   * suspended (best effort; errors are swallowed). Call `release()` when the
   * work is done.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#finished) return;
    try {
      await this.suspend();
    } catch {
      // Lost or unreachable: the term ends at its TTL either way.
    }
  }

  /**
   * Runs one turn's tool calls through the server's ledger: registers them
   * (before any side effect), runs only the new ones (up to `concurrency` at
   * a time), settles each as it finishes, and returns one result per call in
   * the given order. A call id the ledger already holds (or repeated in the
   * turn) is not run again: its stored outcome comes back with `reused`.
   * If the lease is lost meanwhile, runners see `signal` abort, nothing more
   * is settled, and this throws LeaseLostError.
   *
   * `turn` names the turn, for models that reuse call ids in every turn
   * (`call_0`): an id is then a duplicate only within that turn (an id
   * reused in a new turn runs again), unless `acrossTurns` (an id declared
   * in any turn is reused, not run). Without a turn, an id from any earlier
   * turn is a duplicate.
   * @throws LeaseLostError; InvalidArgumentError for a malformed turn; UnavailableError.
   */
  runToolCalls(
    calls: readonly ToolCallRequest[],
    runner: ToolRunner,
    options: ToolCallOptions & { concurrency?: number } = {},
  ): Promise<ToolResult[]> {
    const turn = options.turn ?? "";
    const acrossTurns = options.acrossTurns ?? false;
    return runToolCalls(
      {
        fence: this.fence,
        turn,
        signal: this.signal,
        ensureValid: () => {
          this.#ensureValid();
          checkTurn(turn);
        },
        register: (c) => this.#register(c, turn, acrossTurns),
        settle: (id, outcome) => this.settleToolCall(id, outcome, { turn }),
        lostError: () => this.#lostError(),
      },
      calls,
      runner,
      options.concurrency ?? Number.POSITIVE_INFINITY,
    );
  }

  /**
   * Records a call's outcome under this lease's fence; the first terminal
   * outcome wins and the winning record is returned. A recoverer settles the
   * calls a dead holder left running, usually as `{ state: "unknown" }`
   * (with the record's `turn`). Without `turn`, settles the one call with
   * this id, whatever its turn.
   * @throws InvalidArgumentError when no turn is named and the id was begun
   *   in several turns (the lease stays valid); LeaseholdError "not_found"
   *   for an id the ledger does not hold (in that turn); LeaseLostError when
   *   the fence is refused.
   */
  async settleToolCall(callId: string, outcome: ToolOutcome, options: { turn?: string } = {}): Promise<ToolCallRecord> {
    const wire = outcomeToWire(outcome);
    const turn = checkTurn(options.turn ?? "");
    const request = {
      key: this.key,
      fence: this.fence,
      leaseId: this.#leaseId,
      callId,
      outcome: wire.state,
      result: wire.result,
      turn,
    };
    try {
      // On the Session stream when the server takes it there; resent on
      // another server (see FailoverOps).
      const reply = await this.#ops.settleToolCall(request, this.#timing.rpcTimeoutMs);
      if (reply.call === undefined) throw new LeaseholdError("internal", "SettleToolCall reply carried no call");
      return toRecord(reply.call);
    } catch (err) {
      throw this.#judgeLedger(fromCallError(err, "SettleToolCall"));
    }
  }

  /** The key's tool calls, in order of registration (only those still running with `unsettled`). */
  async listToolCalls(options: { unsettled?: boolean } = {}): Promise<ToolCallRecord[]> {
    const request = {
      key: this.key,
      filter: options.unsettled === true ? ListToolCallsRequest_Filter.UNSETTLED : ListToolCallsRequest_Filter.ALL,
    };
    try {
      const reply = await this.#endpoints.run("safe", "ListToolCalls", (n) =>
        n.rpc.listToolCalls(request, { timeoutMs: this.#timing.rpcTimeoutMs }),
      );
      return reply.calls.map(toRecord);
    } catch (err) {
      throw fromCallError(err, "ListToolCalls");
    }
  }

  toString(): string {
    // The lease id is a secret capability: never shown.
    return `Lease(${JSON.stringify(this.key)}, fence ${this.fence}, owner ${JSON.stringify(this.owner)})`;
  }

  // ---- internals ----

  async #beginBatch(calls: readonly ToolCallRequest[], turn: string, acrossTurns: boolean) {
    const request = {
      key: this.key,
      fence: this.fence,
      leaseId: this.#leaseId,
      calls: calls.map((c) => ({ callId: c.callId, name: c.name, inputDigest: c.inputDigest ?? "" })),
      turn,
      acrossTurns,
    };
    try {
      // On the Session stream when the server takes it there; never resent
      // on another server (see FailoverOps).
      return await this.#ops.beginToolCalls(request, this.#timing.rpcTimeoutMs);
    } catch (err) {
      throw this.#judgeLedger(fromCallError(err, "BeginToolCalls"));
    }
  }

  async #register(
    calls: readonly ToolCallRequest[],
    turn: string,
    acrossTurns: boolean,
  ): Promise<{ known: PbToolCall[]; fresh: PbToolCall[] }> {
    if (calls.length === 0) return { known: [], fresh: [] };
    const reply = await this.#beginBatch(calls, turn, acrossTurns);
    if (!reply.duplicate) return { known: [], fresh: reply.calls };
    // All or nothing: nothing was recorded. Register the new ones alone.
    const known = reply.calls;
    const fresh = calls.filter((c) => !known.some((k) => k.callId === c.callId));
    if (fresh.length === 0) return { known, fresh: [] };
    const again = await this.#beginBatch(fresh, turn, acrossTurns);
    if (again.duplicate) {
      // Only this term's holder can register calls, so another process
      // holds this fence and lease id.
      throw new UnavailableError(
        `tool calls ${JSON.stringify(again.duplicateCallIds)} were registered concurrently by another holder of this term`,
      );
    }
    return { known, fresh: again.calls };
  }

  #term(): Term {
    return { key: this.key, fence: this.fence, leaseId: this.#leaseId };
  }

  #lostError(): LeaseLostError {
    const loss = this.#loss ?? { reason: "deadline" as const };
    const why =
      loss.reason === "deadline"
        ? "no renewal succeeded before the local deadline, so the server may have expired it"
        : loss.reason === "ended"
          ? "it was released or suspended"
          : loss.reason === "permission_denied"
            ? "the server refused its lease id"
            : `the server refused it (${loss.reason})`;
    return new LeaseLostError(
      `the lease on key ${JSON.stringify(this.key)} (fence ${this.fence}) is lost: ${why}`,
      { key: this.key, fence: this.fence, reason: loss.reason },
      { cause: loss.cause },
    );
  }

  #checkDeadline(): void {
    if (this.#loss === undefined && now() >= this.#deadline) this.#lose("deadline");
  }

  /** Valid, and no renewal has failed since the last one that succeeded. */
  #fresh(): boolean {
    return this.isValid() && this.#failures === 0;
  }

  #ensureValid(): void {
    this.#checkDeadline();
    if (this.#loss !== undefined) throw this.#lostError();
  }

  /** Marks the lease lost for good, stops renewing and aborts `signal`. */
  #lose(reason: LossReason, cause?: unknown): void {
    if (this.#loss !== undefined) return;
    this.#loss = { reason, cause };
    this.#clearTimers();
    this.#abort.abort(this.#lostError());
  }

  /** Turns an answer about the term into a loss where it is one. */
  #judge(err: LeaseholdError): LeaseholdError {
    if (!endsTheTerm(err)) return err;
    const reason: LossReason =
      err instanceof LeaseLostError ? err.reason : err instanceof PermissionDeniedError ? "permission_denied" : "unknown";
    this.#lose(reason, err);
    return this.#lostError();
  }

  /**
   * {@link #judge} for a tool-call ledger answer: only a stale fence or a
   * wrong lease id ends the term. An invalid argument or an unknown call id
   * is about the call (an over-long result, an id begun in several turns
   * settled without its turn), not about the term.
   */
  #judgeLedger(err: LeaseholdError): LeaseholdError {
    if (err instanceof LeaseLostError || err instanceof PermissionDeniedError) return this.#judge(err);
    return err;
  }

  #clearTimers(): void {
    if (this.#renewTimer !== undefined) clearTimeout(this.#renewTimer);
    if (this.#deadlineTimer !== undefined) clearTimeout(this.#deadlineTimer);
    this.#renewTimer = undefined;
    this.#deadlineTimer = undefined;
  }

  #stop(): void {
    this.#clearTimers();
    if (!this.#finished) {
      this.#finished = true;
      this.#ops.unhold();
    }
  }

  /** Fires at the local deadline (it re-arms if a renewal moved it). Unref'd. */
  #armDeadline(): void {
    if (this.#loss !== undefined || this.#finished) return;
    if (this.#deadlineTimer !== undefined) clearTimeout(this.#deadlineTimer);
    const wait = Math.max(0, this.#deadline - now());
    this.#deadlineTimer = setTimeout(() => {
      this.#deadlineTimer = undefined;
      this.#checkDeadline();
      if (this.#loss === undefined) this.#armDeadline();
    }, wait + 1);
    this.#deadlineTimer.unref();
  }

  #scheduleRenewal(inMs: number): void {
    if (this.#loss !== undefined || this.#finished) return;
    if (this.#renewTimer !== undefined) clearTimeout(this.#renewTimer);
    this.#renewTimer = setTimeout(() => {
      this.#renewTimer = undefined;
      void this.#renewOnce(true);
    }, Math.max(0, inMs));
    this.#renewTimer.unref();
  }

  /** One renewal; returns the error it met, if any (for the first renewal of a grant). */
  async #renewOnce(reschedule: boolean): Promise<LeaseholdError | undefined> {
    if (this.#loss !== undefined || this.#finished) return undefined;
    const t = this.#timing;
    const sent = now();
    try {
      const lease = await this.#ops.renew(this.#term(), t.ttlMs, t.rpcTimeoutMs);
      if (this.#loss !== undefined || this.#finished) return undefined;
      this.#failures = 0;
      this.#deadline = Math.max(this.#deadline, sent + validFor(t));
      this.#expiresAtMs = msToNumber(lease.expiresAtMs);
      this.#armDeadline();
      this.#scheduleRenewal(sent + jitterRenewal(t.renewEveryMs) - now());
      return undefined;
    } catch (err) {
      if (this.#finished) return undefined;
      const judged = this.#judge(fromCallError(err, "Renew"));
      if (judged instanceof LeaseLostError) return judged;
      this.#failures += 1;
      // Transient: retry with jittered, growing pauses.
      if (reschedule) this.#scheduleRenewal(retryPause(t, this.#failures));
      return judged;
    }
  }

  async #finish(suspend: boolean, handoff?: Handoff): Promise<Ended> {
    if (this.#finished) {
      throw new LeaseLostError(
        `the lease on key ${JSON.stringify(this.key)} (fence ${this.fence}) was already released or suspended`,
        { key: this.key, fence: this.fence, reason: "ended" },
      );
    }
    // Stop renewing first, so no renewal races the release.
    this.#clearTimers();
    const prior = this.#loss;
    this.#lose("ended");
    try {
      if (prior !== undefined && prior.reason !== "deadline") {
        // Refused for good: the server already said this term is over.
        this.#loss = prior;
        throw this.#lostError();
      }
      // After a deadline loss the term may still be live on the server:
      // releasing it (with fence and lease id) is safe and frees the key.
      for (let attempt = 1; ; attempt++) {
        try {
          return toEnded(await this.#ops.release(this.#term(), suspend, this.#timing.rpcTimeoutMs, handoff));
        } catch (err) {
          const mapped = fromCallError(err, "Release");
          if (mapped instanceof UnavailableError && attempt < RELEASE_ATTEMPTS) {
            await sleep(retryPause(this.#timing, attempt + 1));
            continue;
          }
          if (endsTheTerm(mapped)) {
            this.#loss = {
              reason:
                mapped instanceof LeaseLostError
                  ? mapped.reason
                  : mapped instanceof PermissionDeniedError
                    ? "permission_denied"
                    : "unknown",
              cause: mapped,
            };
            throw this.#lostError();
          }
          throw mapped;
        }
      }
    } finally {
      this.#stop();
    }
  }
}
