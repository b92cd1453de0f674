// How a lease's renewals, checks and releases reach the server.
//
// Over "grpc" (HTTP/2) they travel on one pipelined Session stream per
// client, shared by every lease, each operation tagged with an id and matched
// to its response (as the Rust client does). gRPC-Web cannot carry a
// bidirectional stream, so over "grpc-web" they are unary Renew, Check and
// Release calls. Both give the same answers and the same errors.
//
// An Acquire that does not wait goes on the stream too (every revision of
// the protocol takes it there): a stream operation costs about a fifth of a
// unary call in Node (docs/benchmarks.md). One that waits is a unary call,
// so that many waiters cannot fill the stream's window (the server runs at
// most SESSION_WINDOW operations of one stream at once) and hold back the
// renewals that share it.
//
// The ledger's BeginToolCalls and SettleToolCall go on the stream when the
// server speaks protocol revision 2 (ServerInfo, asked once per stream that
// has not broken); an older server gets them as unary calls.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import {
  type AcquireRequestSchema,
  type AcquireResponse,
  BeginToolCallsRequestSchema,
  type BeginToolCallsResponse,
  type EndedTerm,
  type Lease as PbLease,
  Leasehold,
  SessionRequestSchema,
  type SessionResponse,
  SettleToolCallRequestSchema,
  type SettleToolCallResponse,
} from "./gen/leasehold/v1/leasehold_pb.js";
import { detailsFromMap, fromCallError, fromRefusal, LeaseholdError, UnavailableError } from "./errors.js";

export type LeaseholdRpc = Client<typeof Leasehold>;

/** How long an idle Session stream stays open for the next operation (see StreamOps). */
export const STREAM_LINGER_MS = 250;

/** The protocol revision that carries the ledger's operations on the Session stream. */
export const LEDGER_ON_STREAM = 2;

/** An Acquire request as the ops take it. */
export type AcquireCall = MessageInitShape<typeof AcquireRequestSchema> & { readonly waitMs: bigint };
/** What a lease is built from: an Acquire's answer, unary or on the stream. */
export type Grant = Pick<AcquireResponse, "lease" | "previous" | "replayed" | "unsettledToolCalls">;

/** A BeginToolCalls request as the ops take it. */
export type BeginCalls = MessageInitShape<typeof BeginToolCallsRequestSchema>;
/** A SettleToolCall request as the ops take it. */
export type SettleCall = MessageInitShape<typeof SettleToolCallRequestSchema>;

/** A term as the lease presents it: key, fence and the secret lease id. */
export interface Term {
  readonly key: string;
  readonly fence: bigint;
  readonly leaseId: string;
}

/** A release that keeps the key for a named owner for a while. */
export interface Handoff {
  readonly successor: string;
  readonly withinMs: number;
}

function releaseFields(term: Term, suspend: boolean, handoff: Handoff | undefined) {
  return {
    key: term.key,
    fence: term.fence,
    leaseId: term.leaseId,
    suspend,
    successor: handoff?.successor ?? "",
    handoffMs: BigInt(handoff?.withinMs ?? 0),
  };
}

/** The operations a lease needs, from its grant to its release. */
export interface LeaseOps {
  /** Acquire (safe to resend: the request id makes a server replay a grant). */
  acquire(request: AcquireCall, timeoutMs: number): Promise<Grant>;
  renew(term: Term, ttlMs: number, timeoutMs: number): Promise<PbLease>;
  check(key: string, fence: bigint, timeoutMs: number): Promise<PbLease | undefined>;
  release(term: Term, suspend: boolean, timeoutMs: number, handoff?: Handoff): Promise<EndedTerm>;
  /** The ledger's BeginToolCalls (never resent: see endpoints.ts). */
  beginToolCalls(request: BeginCalls, timeoutMs: number): Promise<BeginToolCallsResponse>;
  /** The ledger's SettleToolCall. */
  settleToolCall(request: SettleCall, timeoutMs: number): Promise<SettleToolCallResponse>;
  /** A lease starts using these ops (keeps a stream open while any does). */
  hold(): void;
  /** A lease stopped using them. */
  unhold(): void;
  /** Ends any stream; later calls open a new one. */
  close(): void;
}

function missing(call: string): LeaseholdError {
  return new LeaseholdError("internal", `the server's ${call} reply carried no lease`);
}

/** Renew, Check and Release as unary calls (the gRPC-Web transport). */
export class UnaryOps implements LeaseOps {
  constructor(private readonly rpc: LeaseholdRpc) {}

  async acquire(request: AcquireCall, timeoutMs: number): Promise<Grant> {
    try {
      return await this.rpc.acquire(request, { timeoutMs });
    } catch (err) {
      throw fromCallError(err, "Acquire");
    }
  }

  async renew(term: Term, ttlMs: number, timeoutMs: number): Promise<PbLease> {
    try {
      const reply = await this.rpc.renew(
        { key: term.key, fence: term.fence, leaseId: term.leaseId, ttlMs: BigInt(ttlMs) },
        { timeoutMs },
      );
      if (reply.lease === undefined) throw missing("Renew");
      return reply.lease;
    } catch (err) {
      throw fromCallError(err, "Renew");
    }
  }

  async check(key: string, fence: bigint, timeoutMs: number): Promise<PbLease | undefined> {
    try {
      return (await this.rpc.check({ key, fence }, { timeoutMs })).lease;
    } catch (err) {
      throw fromCallError(err, "Check");
    }
  }

  async release(term: Term, suspend: boolean, timeoutMs: number, handoff?: Handoff): Promise<EndedTerm> {
    try {
      const reply = await this.rpc.release(releaseFields(term, suspend, handoff), { timeoutMs });
      if (reply.ended === undefined) throw missing("Release");
      return reply.ended;
    } catch (err) {
      throw fromCallError(err, "Release");
    }
  }

  async beginToolCalls(request: BeginCalls, timeoutMs: number): Promise<BeginToolCallsResponse> {
    try {
      return await this.rpc.beginToolCalls(request, { timeoutMs });
    } catch (err) {
      throw fromCallError(err, "BeginToolCalls");
    }
  }

  async settleToolCall(request: SettleCall, timeoutMs: number): Promise<SettleToolCallResponse> {
    try {
      return await this.rpc.settleToolCall(request, { timeoutMs });
    } catch (err) {
      throw fromCallError(err, "SettleToolCall");
    }
  }

  hold(): void {}
  unhold(): void {}
  close(): void {}
}

/** A push-fed async iterable: the request side of a Session stream. */
class RequestQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: T): boolean {
    if (this.closed) return false;
    this.items.push(item);
    this.wakeUp();
    return true;
  }

  close(): void {
    this.closed = true;
    this.wakeUp();
  }

  private wakeUp(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  // An async generator, because connect drives the iterator's return/throw.
  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
    }
  }
}

interface Waiter {
  resolve(r: SessionResponse): void;
  reject(e: LeaseholdError): void;
}

/** One open Session stream: where requests go and who waits for what. */
class OpenStream {
  readonly requests = new RequestQueue<MessageInitShape<typeof SessionRequestSchema>>();
  readonly waiting = new Map<bigint, Waiter>();
  readonly abort = new AbortController();
  broken: LeaseholdError | undefined;

  constructor(rpc: LeaseholdRpc) {
    const responses = rpc.session(this.requests, { signal: this.abort.signal });
    void (async () => {
      let why: LeaseholdError;
      try {
        for await (const response of responses) this.deliver(response);
        why = new UnavailableError("the Session stream ended");
      } catch (err) {
        const mapped = fromCallError(err, "Session");
        why =
          mapped instanceof UnavailableError
            ? mapped
            : new UnavailableError(`the Session stream failed: ${mapped.message}`, { cause: mapped });
      }
      this.breakWith(why);
    })();
  }

  private deliver(response: SessionResponse): void {
    const waiter = this.waiting.get(response.id);
    if (waiter === undefined) return; // timed out earlier; nobody waits now
    this.waiting.delete(response.id);
    if (response.code === 0) waiter.resolve(response);
    else waiter.reject(fromRefusal(response.code, response.message, detailsFromMap(response.details)));
  }

  breakWith(why: LeaseholdError): void {
    if (this.broken !== undefined) return;
    this.broken = why;
    this.requests.close();
    const waiters = [...this.waiting.values()];
    this.waiting.clear();
    for (const w of waiters) w.reject(why);
  }

  /** Half-closes the request side: the server ends the stream when done. */
  finish(): void {
    this.requests.close();
  }
}

/**
 * One pipelined Session stream per client, opened on first use and again
 * after it breaks. Operations in flight when it breaks fail with
 * {@link UnavailableError}, as unary calls would; the lease's retries then go
 * over a new stream. The stream is half-closed once no lease has held it and
 * no operation has been in flight for {@link STREAM_LINGER_MS}, so an idle
 * process can exit.
 */
export class StreamOps implements LeaseOps {
  private current: OpenStream | undefined;
  /** The timer that closes an idle stream (see closeIfIdle). */
  private lingering: NodeJS.Timeout | undefined;
  private nextId = 1n;
  private holders = 0;
  /** Whether the server takes the ledger on the stream; asked again after a stream broke (the server may have been replaced). */
  private ledgerOnStream: Promise<boolean> | undefined;
  private readonly unary: UnaryOps;

  constructor(private readonly rpc: LeaseholdRpc) {
    this.unary = new UnaryOps(rpc);
  }

  private stream(): OpenStream {
    const current = this.current;
    if (current !== undefined && current.broken === undefined) return current;
    if (current?.broken !== undefined) this.ledgerOnStream = undefined;
    const fresh = new OpenStream(this.rpc);
    this.current = fresh;
    return fresh;
  }

  private call(
    name: string,
    op: MessageInitShape<typeof SessionRequestSchema>["op"],
    timeoutMs: number,
  ): Promise<SessionResponse> {
    const id = this.nextId++;
    const stream = this.stream();
    return new Promise<SessionResponse>((resolve, reject) => {
      const timer = setTimeout(() => {
        stream.waiting.delete(id);
        reject(new UnavailableError(`${name} got no reply within ${timeoutMs} ms`));
        this.closeIfIdle();
      }, timeoutMs);
      timer.unref();
      stream.waiting.set(id, {
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
          this.closeIfIdle();
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
          this.closeIfIdle();
        },
      });
      if (!stream.requests.push(create(SessionRequestSchema, { id, op }))) {
        stream.waiting.delete(id);
        clearTimeout(timer);
        reject(stream.broken ?? new UnavailableError("the Session stream closed"));
      }
    });
  }

  /**
   * Half-closes the stream once no lease holds it and nothing is in flight,
   * after {@link STREAM_LINGER_MS} more of the same: a process running one
   * session after another keeps its stream (opening one costs about 0.5 ms
   * in Node), and an idle process still exits soon after its last release
   * (an open stream keeps Node's event loop alive).
   */
  private closeIfIdle(): void {
    if (!this.idle()) return;
    clearTimeout(this.lingering);
    this.lingering = setTimeout(() => {
      this.lingering = undefined;
      const current = this.current;
      if (current !== undefined && this.idle()) {
        this.current = undefined;
        current.finish();
      }
    }, STREAM_LINGER_MS);
    this.lingering.unref();
  }

  private idle(): boolean {
    return this.holders === 0 && this.current !== undefined && this.current.waiting.size === 0;
  }

  async acquire(request: AcquireCall, timeoutMs: number): Promise<Grant> {
    if (request.waitMs > 0n) return this.unary.acquire(request, timeoutMs);
    let reply: SessionResponse;
    try {
      reply = await this.call("Acquire", { case: "acquire", value: request }, timeoutMs);
    } catch (err) {
      // A stream the server refused as a whole (no credential, too many
      // streams) fails its operations as UnavailableError, so that a lease's
      // renewals retry on a new one; an Acquire answers what the unary call
      // would have: the refusal itself.
      const refused = err instanceof UnavailableError ? err.cause : undefined;
      if (refused instanceof LeaseholdError && !(refused instanceof UnavailableError)) throw refused;
      throw err;
    }
    const { lease, previous, replayed, unsettledToolCalls } = reply;
    return { lease, previous, replayed, unsettledToolCalls };
  }

  async renew(term: Term, ttlMs: number, timeoutMs: number): Promise<PbLease> {
    const reply = await this.call(
      "Renew",
      { case: "renew", value: { key: term.key, fence: term.fence, leaseId: term.leaseId, ttlMs: BigInt(ttlMs) } },
      timeoutMs,
    );
    if (reply.lease === undefined) throw missing("Renew");
    return reply.lease;
  }

  async check(key: string, fence: bigint, timeoutMs: number): Promise<PbLease | undefined> {
    return (await this.call("Check", { case: "check", value: { key, fence } }, timeoutMs)).lease;
  }

  async release(term: Term, suspend: boolean, timeoutMs: number, handoff?: Handoff): Promise<EndedTerm> {
    const reply = await this.call(
      "Release",
      { case: "release", value: releaseFields(term, suspend, handoff) },
      timeoutMs,
    );
    if (reply.ended === undefined) throw missing("Release");
    return reply.ended;
  }

  /**
   * Whether the server speaks {@link LEDGER_ON_STREAM}. A server too old to
   * answer ServerInfo gets unary calls; an unreachable one fails the
   * operation (and is asked again next time).
   */
  private takesLedger(timeoutMs: number): Promise<boolean> {
    if (this.ledgerOnStream === undefined) {
      const asked = this.rpc.serverInfo({}, { timeoutMs }).then(
        (info) => info.protocol >= LEDGER_ON_STREAM,
        (err: unknown) => {
          const mapped = fromCallError(err, "ServerInfo");
          if (mapped instanceof UnavailableError) {
            if (this.ledgerOnStream === asked) this.ledgerOnStream = undefined;
            throw mapped;
          }
          return false;
        },
      );
      this.ledgerOnStream = asked;
    }
    return this.ledgerOnStream;
  }

  async beginToolCalls(request: BeginCalls, timeoutMs: number): Promise<BeginToolCallsResponse> {
    if (!(await this.takesLedger(timeoutMs))) return this.unary.beginToolCalls(request, timeoutMs);
    const reply = await this.call("BeginToolCalls", { case: "beginToolCalls", value: request }, timeoutMs);
    if (reply.ledger.case !== "beginToolCalls") throw new LeaseholdError("internal", "the server's BeginToolCalls reply was empty");
    return reply.ledger.value;
  }

  async settleToolCall(request: SettleCall, timeoutMs: number): Promise<SettleToolCallResponse> {
    if (!(await this.takesLedger(timeoutMs))) return this.unary.settleToolCall(request, timeoutMs);
    const reply = await this.call("SettleToolCall", { case: "settleToolCall", value: request }, timeoutMs);
    if (reply.ledger.case !== "settleToolCall") throw new LeaseholdError("internal", "the server's SettleToolCall reply was empty");
    return reply.ledger.value;
  }

  hold(): void {
    this.holders += 1;
  }

  unhold(): void {
    this.holders = Math.max(0, this.holders - 1);
    this.closeIfIdle();
  }

  close(): void {
    clearTimeout(this.lingering);
    this.lingering = undefined;
    const current = this.current;
    this.current = undefined;
    if (current !== undefined) {
      current.breakWith(new UnavailableError("the client was closed"));
      current.abort.abort();
    }
  }
}
