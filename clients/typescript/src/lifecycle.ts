// The ownership lifecycle as plain values (a key's state, its reservation,
// its history, ownership events) and the Watch stream that yields events.

import {
  type EndedTerm,
  type Event as PbEvent,
  Event_Kind,
  type HistoryEntry as PbHistoryEntry,
  type HistoryResponse,
  type Lease as PbLease,
  ListFilter,
  type Reservation as PbReservation,
  Reservation_Kind,
  TermEnd,
  type WatchResponse,
} from "./gen/leasehold/v1/leasehold_pb.js";
import { fromCallError, InvalidArgumentError, type LeaseholdError, msToNumber, parseU64, UnavailableError } from "./errors.js";
import type { LeaseholdRpc } from "./ops.js";

/** How a term of a key ended. */
export interface Ended {
  readonly fence: bigint;
  readonly owner: string;
  readonly end: "released" | "suspended" | "expired";
  /** Server wall-clock milliseconds since the Unix epoch. */
  readonly endedAtMs: number;
  /**
   * In a lease's `previous`: that term's holder handed the key to this
   * lease's owner (`handOff`), rather than it being taken in a race.
   */
  readonly handedOff: boolean;
}

function endName(end: TermEnd): Ended["end"] {
  // The server sends nothing else; reading an unknown end as "expired" errs
  // towards treating the key as recoverable (as the Rust client does).
  return end === TermEnd.RELEASED ? "released" : end === TermEnd.SUSPENDED ? "suspended" : "expired";
}

export function toEnded(e: EndedTerm): Ended {
  return {
    fence: e.fence,
    owner: e.owner,
    end: endName(e.end),
    endedAtMs: msToNumber(e.endedAtMs),
    handedOff: e.handedOff,
  };
}

/** Who alone may take a free key, and until when. */
export interface Reservation {
  /** `"lock_delay"` (after an expiry: nobody) or `"handoff"` (only `successor`). */
  readonly kind: "lock_delay" | "handoff";
  /** The term whose end made the reservation. */
  readonly afterFence: bigint;
  /** For a handoff: the owner the key is kept for. */
  readonly successor: string;
  /** Server wall-clock milliseconds since the Unix epoch. */
  readonly untilMs: number;
}

/** A key's live term as `get`/`list` show it (never its lease id). */
export interface LiveTerm {
  readonly fence: bigint;
  readonly owner: string;
  readonly ttlMs: number;
  readonly acquiredAtMs: number;
  readonly expiresAtMs: number;
}

/** What the server knows about a key (`get`, `list`, `unquarantine`). */
export interface KeyState {
  readonly key: string;
  /** The live term, if the key is held. */
  readonly lease: LiveTerm | undefined;
  /** The last ended term, if any. */
  readonly lastEnded: Ended | undefined;
  /** No live term, the last one expired or was suspended, and not quarantined. */
  readonly recoverable: boolean;
  /** Acquires are refused (QuarantinedError) until `unquarantine`. */
  readonly quarantined: boolean;
  /** Set while the key is free but reserved (lock-delay or handoff). */
  readonly reservation: Reservation | undefined;
}

/** What `serverInfo()` tells of the server. */
export interface ServerInfo {
  /** Its release, as `leasehold --version` prints it. */
  readonly version: string;
  /** The revision of `leasehold.v1` it speaks. */
  readonly protocol: number;
  /** Its storage backend: "sqlite" or "postgres". */
  readonly backend: string;
  /** Whether this client can speak to it (`protocol >= PROTOCOL`). */
  readonly compatible: boolean;
}

/** One page of `list`. */
export interface KeyPage {
  readonly keys: readonly KeyState[];
  /** Pass as `pageToken` for the next page; empty at the end. */
  readonly nextPageToken: string;
}

/** Which keys `list` returns. */
export type ListFilterName = "all" | "live" | "recoverable" | "quarantined";

export function listFilter(name: ListFilterName): ListFilter {
  switch (name) {
    case "all":
      return ListFilter.ALL;
    case "live":
      return ListFilter.LIVE;
    case "recoverable":
      return ListFilter.RECOVERABLE;
    case "quarantined":
      return ListFilter.QUARANTINED;
    default:
      throw new InvalidArgumentError(`filter must be all, live, recoverable or quarantined, not ${String(name)}`);
  }
}

function toReservation(r: PbReservation): Reservation {
  return {
    kind: r.kind === Reservation_Kind.HANDOFF ? "handoff" : "lock_delay",
    afterFence: r.afterFence,
    successor: r.successor,
    untilMs: msToNumber(r.untilMs),
  };
}

function toLiveTerm(l: PbLease): LiveTerm {
  return {
    fence: l.fence,
    owner: l.owner,
    ttlMs: msToNumber(l.ttlMs),
    acquiredAtMs: msToNumber(l.acquiredAtMs),
    expiresAtMs: msToNumber(l.expiresAtMs),
  };
}

/** A KeyState from the fields Get, List and Unquarantine replies share. */
export function toKeyState(
  key: string,
  s: {
    lease?: PbLease | undefined;
    lastEnded?: EndedTerm | undefined;
    recoverable: boolean;
    quarantined: boolean;
    reservation?: PbReservation | undefined;
  },
): KeyState {
  return {
    key,
    lease: s.lease === undefined ? undefined : toLiveTerm(s.lease),
    lastEnded: s.lastEnded === undefined ? undefined : toEnded(s.lastEnded),
    recoverable: s.recoverable,
    quarantined: s.quarantined,
    reservation: s.reservation === undefined ? undefined : toReservation(s.reservation),
  };
}

/** One ended term of a key. */
export interface HistoryEntry {
  readonly fence: bigint;
  readonly owner: string;
  readonly acquiredAtMs: number;
  readonly endedAtMs: number;
  readonly end: "released" | "suspended" | "expired";
  /** Tool calls still running when the term ended. */
  readonly unsettledToolCalls: number;
  /** The term was granted to the successor its predecessor named. */
  readonly handedOff: boolean;
}

/** One page of `history`, newest first. */
export interface HistoryPage {
  readonly entries: readonly HistoryEntry[];
  /** Pass as `before` for older entries; undefined at the end. */
  readonly nextBefore: bigint | undefined;
}

function toHistoryEntry(h: PbHistoryEntry): HistoryEntry {
  return {
    fence: h.fence,
    owner: h.owner,
    acquiredAtMs: msToNumber(h.acquiredAtMs),
    endedAtMs: msToNumber(h.endedAtMs),
    end: endName(h.end),
    unsettledToolCalls: h.unsettledToolCalls,
    handedOff: h.handedOff,
  };
}

export function toHistoryPage(r: HistoryResponse): HistoryPage {
  return { entries: r.entries.map(toHistoryEntry), nextBefore: parseU64(r.nextPageToken) };
}

/** What happened to a key. */
export type WatchEventKind = "granted" | "released" | "suspended" | "expired" | "forgotten";

/** One change of a key's ownership, as a watch reports it. */
export interface WatchEvent {
  /** Server-wide, rising in commit order; resume from `revision + 1n`. */
  readonly revision: bigint;
  readonly key: string;
  readonly kind: WatchEventKind;
  /** The new holder's fence (granted), or the ended term's. */
  readonly fence: bigint;
  readonly owner: string;
  /** Server wall-clock milliseconds (for expired: when the TTL ran out). */
  readonly atMs: number;
}

const KINDS: Record<number, WatchEventKind> = {
  [Event_Kind.GRANTED]: "granted",
  [Event_Kind.RELEASED]: "released",
  [Event_Kind.SUSPENDED]: "suspended",
  [Event_Kind.EXPIRED]: "expired",
  [Event_Kind.FORGOTTEN]: "forgotten",
};

function toEvent(e: PbEvent): WatchEvent {
  return {
    revision: e.revision,
    key: e.key,
    kind: KINDS[e.kind] ?? "expired",
    fence: e.fence,
    owner: e.owner,
    atMs: msToNumber(e.atMs),
  };
}

/** Options of {@link LeaseholdClient.watch}. */
export interface WatchOptions {
  /** Exactly this key (instead of a prefix). */
  key?: string;
  /** Every key starting with this (default: every key the caller may read). */
  prefix?: string;
  /** The first revision wanted; 0 (the default) = only what happens from now on. */
  startRevision?: bigint | number;
  /** Aborting it ends the watch (iteration then ends). */
  signal?: AbortSignal;
  /**
   * How long to wait for the server to accept the watch (its first reply)
   * before `ready` (and iteration) fail with UnavailableError. Default 5 s.
   */
  startTimeoutMs?: number;
}

/**
 * A running watch: `for await (const e of watch)`, revisions rising. The
 * server stream is opened at once; `await watch.ready` to be sure the server
 * accepted it (so nothing that happens after that is missed) and to see a
 * refusal (CompactedError, UnsupportedError) before iterating; iterating
 * waits for it too. Leaving the loop (`break`, a throw) or `close()` ends the
 * stream; watch again from `nextRevision` to continue with nothing missed and
 * nothing repeated. Iteration ends when the stream ends, or throws when it
 * fails (UnavailableError, ResourceExhaustedError with limit "watch_buffer"
 * for a watcher that fell too far behind).
 */
export class Watch implements AsyncIterable<WatchEvent>, AsyncDisposable {
  /** Settles once the server has accepted the watch (rejects with its refusal). */
  readonly ready: Promise<void>;
  readonly #abort = new AbortController();
  readonly #responses: AsyncIterator<WatchResponse>;
  readonly #start: bigint;
  readonly #queue: WatchEvent[] = [];
  #next: bigint;
  #done = false;
  #closed = false;
  #startTimedOut = false;

  /** @internal Made by {@link LeaseholdClient.watch}. */
  constructor(rpc: LeaseholdRpc, options: WatchOptions) {
    const key = options.key ?? "";
    const prefix = options.prefix ?? "";
    if (key !== "" && prefix !== "") throw new InvalidArgumentError("watch takes a key or a prefix, not both");
    const start = BigInt(options.startRevision ?? 0);
    if (start < 0n) throw new InvalidArgumentError(`startRevision must not be negative, not ${start}`);
    this.#start = start;
    this.#next = start;
    const signal = options.signal;
    if (signal !== undefined) {
      if (signal.aborted) this.close();
      else signal.addEventListener("abort", () => this.close(), { once: true });
    }
    const startTimeoutMs = options.startTimeoutMs ?? 5_000;
    if (!Number.isSafeInteger(startTimeoutMs) || startTimeoutMs <= 0) {
      throw new InvalidArgumentError(`startTimeoutMs must be a positive integer, not ${startTimeoutMs}`);
    }
    const stream = rpc.watch({ key, prefix, startRevision: start }, { signal: this.#abort.signal });
    this.#responses = stream[Symbol.asyncIterator]();
    this.ready = this.#first(startTimeoutMs);
    // A refusal is also thrown by iteration; do not report it as unhandled.
    this.ready.catch(() => undefined);
  }

  /**
   * The `startRevision` that continues exactly after the last event this
   * watch yielded (or after where it started, if it yielded none).
   */
  get nextRevision(): bigint {
    return this.#next;
  }

  async #first(timeoutMs: number): Promise<void> {
    // A server that does not answer in time (frozen, partitioned) must not
    // leave the caller waiting forever.
    const timer = setTimeout(() => {
      this.#startTimedOut = true;
      this.#abort.abort();
    }, timeoutMs);
    timer.unref();
    let first: WatchResponse | undefined;
    try {
      first = await this.#read();
    } catch (err) {
      if (this.#startTimedOut) throw new UnavailableError(`Watch got no first reply within ${timeoutMs} ms`, { cause: err });
      throw err;
    } finally {
      clearTimeout(timer);
    }
    if (first === undefined) {
      if (this.#startTimedOut) throw new UnavailableError(`Watch got no first reply within ${timeoutMs} ms`);
      if (this.#closed) return;
      throw new UnavailableError("the Watch stream ended before it started");
    }
    if (this.#start === 0n) this.#next = first.revision + 1n;
    this.#queue.push(...first.events.map(toEvent));
  }

  async #read(): Promise<WatchResponse | undefined> {
    try {
      const r = await this.#responses.next();
      if (r.done === true) {
        this.#done = true;
        return undefined;
      }
      return r.value;
    } catch (err) {
      this.#done = true;
      if (this.#closed) return undefined;
      const mapped: LeaseholdError = fromCallError(err, "Watch");
      throw mapped;
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<WatchEvent, void, undefined> {
    try {
      await this.ready;
      for (;;) {
        const event = this.#queue.shift();
        if (event !== undefined) {
          this.#next = event.revision + 1n;
          yield event;
          continue;
        }
        if (this.#done || this.#closed) return;
        const response = await this.#read();
        if (response === undefined) return;
        this.#queue.push(...response.events.map(toEvent));
      }
    } finally {
      this.close();
    }
  }

  /** Ends the watch: the server stream is cancelled and iteration ends. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#done = true;
    this.#abort.abort();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}
