// The sessions this server runs, each under its leasehold lease: taken
// before a run reads its history, renewed by the client while it runs,
// released when the session goes idle, suspended (so it is listed as
// recoverable) when the run failed or was aborted.

import { BusyError, type Lease, type LeaseholdClient } from "@leasehold/client";
import { SessionBusyError } from "./errors.js";
import type { Settings } from "./options.js";

interface Held {
  readonly lease: Lease;
  /** The run errored or was aborted: end the term as unfinished. */
  failed: boolean;
  /** Set once the term is being ended; a new run waits for it, then takes a new term. */
  ending: Promise<void> | undefined;
}

export class SessionLeases {
  readonly #lh: LeaseholdClient;
  readonly #settings: Settings;
  readonly #held = new Map<string, Held>();
  readonly #onLost: (sessionID: string) => void;

  /** `onLost`: the lease of a running session was lost (not ended here). */
  constructor(lh: LeaseholdClient, settings: Settings, onLost: (sessionID: string) => void) {
    this.#lh = lh;
    this.#settings = settings;
    this.#onLost = onLost;
  }

  key(sessionID: string): string {
    return this.#settings.keyPrefix + sessionID;
  }

  /** The lease this server holds on the session, while it is valid and not being ended. */
  held(sessionID: string): Lease | undefined {
    const h = this.#held.get(sessionID);
    return h !== undefined && h.ending === undefined && h.lease.isValid() ? h.lease : undefined;
  }

  /**
   * The session's lease: the one held, else a new term, waiting up to
   * `waitMs` for another server's run to end.
   * `promptSaved`: the caller is a run whose prompt is already saved (the
   * busy error says so).
   * @throws SessionBusyError when another server still runs it; the
   *   client's errors (UnavailableError, QuarantinedError, …) otherwise.
   */
  async take(sessionID: string, waitMs: number, { promptSaved = false }: { promptSaved?: boolean } = {}): Promise<Lease> {
    const current = this.#held.get(sessionID);
    if (current?.ending !== undefined) await current.ending;
    else if (current !== undefined && current.lease.isValid()) return current.lease;
    let lease: Lease;
    try {
      lease = await this.#lh.acquire(this.key(sessionID), {
        ttlMs: this.#settings.ttlMs,
        waitMs,
        ...(this.#settings.owner !== undefined ? { owner: this.#settings.owner } : {}),
      });
    } catch (err) {
      if (err instanceof BusyError) throw new SessionBusyError(sessionID, err.holder, err.remainingMs, waitMs, promptSaved);
      throw err;
    }
    const held: Held = { lease, failed: false, ending: undefined };
    // A newer term taken meanwhile (a race of two runs in this process) wins; end this one.
    const raced = this.#held.get(sessionID);
    if (raced !== undefined && raced.ending === undefined && raced.lease.isValid()) {
      await lease.release().catch(() => undefined);
      return raced.lease;
    }
    this.#held.set(sessionID, held);
    lease.signal.addEventListener("abort", () => {
      if (held.ending === undefined) this.#onLost(sessionID);
    });
    return lease;
  }

  /** The session's run errored or was aborted: its term ends suspended. */
  markFailed(sessionID: string): void {
    const h = this.#held.get(sessionID);
    if (h !== undefined) h.failed = true;
  }

  /** Ends the session's term (released, or suspended after a failure); a no-op when none is held. */
  end(sessionID: string): Promise<void> {
    const h = this.#held.get(sessionID);
    if (h === undefined) return Promise.resolve();
    if (h.ending !== undefined) return h.ending;
    h.ending = (async () => {
      try {
        if (h.lease.isValid()) await (h.failed ? h.lease.suspend() : h.lease.release());
      } catch {
        // Lost meanwhile or unreachable: the term expires on its own, and an
        // expired term is listed as recoverable, which is the safe side.
      } finally {
        if (this.#held.get(sessionID) === h) this.#held.delete(sessionID);
      }
    })();
    return h.ending;
  }

  /** Ends every term: suspended, since the server stops with its runs unfinished. */
  async endAll(): Promise<void> {
    for (const h of this.#held.values()) h.failed = true;
    await Promise.all([...this.#held.keys()].map((id) => this.end(id)));
  }
}
