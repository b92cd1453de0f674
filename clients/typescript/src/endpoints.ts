// Several servers behind one client: failover.
//
// Servers on one PostgreSQL database are stateless: a term granted through
// one is renewed, checked and released through any other with the same fence
// and lease id. A client given several base URLs sends each call to one of
// them (the *current* one, the first at the start) and, when it answers
// UNAVAILABLE (it died, is stopping, lost its database, or gave no answer
// within the call's timeout), moves on to the next in the list and stays
// there. Any other answer (a busy key, a stale fence) is the answer.
//
// Moving on is always right; sending the same call again to the next server
// is right only when a second delivery cannot do what the first did not (the
// first may have been applied before its reply was lost), as in the Rust
// client (crates/leasehold-client/src/endpoints.rs):
// - resent: Renew, Check, Release, Get, List, History, Unquarantine,
//   ListToolCalls, SettleToolCall (the first outcome wins), Acquire (always
//   sent with a request id, so the server replays a grant whose reply was
//   lost), the Transcripts service;
// - not resent: BeginToolCalls (a registration applied twice looks like
//   another holder of the term): the error comes back, later calls go to the
//   next server.

import type { Client } from "@connectrpc/connect";
import type {
  BeginToolCallsResponse,
  EndedTerm,
  Lease as PbLease,
  SettleToolCallResponse,
  Transcripts,
} from "./gen/leasehold/v1/leasehold_pb.js";
import { fromCallError, UnavailableError } from "./errors.js";
import type { AcquireCall, BeginCalls, Grant, Handoff, LeaseholdRpc, LeaseOps, SettleCall, Term } from "./ops.js";

/** Whether a call may be sent again to the next server after UNAVAILABLE. */
export type Resend = "safe" | "unsafe";

/** One server: its generated clients and the way leases reach it. */
export interface Node {
  /** The base URL as given, for messages. */
  readonly url: string;
  readonly rpc: LeaseholdRpc;
  readonly transcripts: Client<typeof Transcripts>;
  /** This server's own Session stream (or unary ops over gRPC-Web). */
  readonly ops: LeaseOps;
}

/** The servers of a client, in the order given, and which one is current. */
export class Endpoints {
  readonly nodes: readonly Node[];
  #current = 0;

  constructor(nodes: readonly Node[]) {
    if (nodes.length === 0) throw new Error("a client needs a server");
    this.nodes = nodes;
  }

  /** The server calls go to first now. */
  get current(): Node {
    return this.nodes[this.#current] as Node;
  }

  /**
   * Runs `op` against the current server; on UnavailableError moves on to
   * the next and, if `resend` allows, runs it there too, each server at most
   * once. Errors are mapped with {@link fromCallError} (named `name`).
   * @throws the last server's error; with several servers, an
   *   UnavailableError naming every server tried.
   */
  async run<T>(resend: Resend, name: string, op: (node: Node) => Promise<T>): Promise<T> {
    const count = this.nodes.length;
    const start = this.#current;
    const failures: string[] = [];
    for (let attempt = 0; attempt < count; attempt++) {
      const index = (start + attempt) % count;
      const node = this.nodes[index] as Node;
      try {
        return await op(node);
      } catch (err) {
        const mapped = fromCallError(err, name);
        if (!(mapped instanceof UnavailableError)) throw mapped;
        this.#moveOnFrom(index);
        if (count === 1) throw mapped;
        if (resend === "unsafe") {
          throw new UnavailableError(
            `${node.url}: ${mapped.message} (not resent to another server: it may have been applied)`,
            { cause: mapped },
          );
        }
        failures.push(`${node.url}: ${mapped.message}`);
      }
    }
    throw new UnavailableError(`no server answered (${failures.join("; ")})`);
  }

  /** Moves on from server `index`, unless another call already did (two calls failing together skip one server, not two). */
  #moveOnFrom(index: number): void {
    if (this.#current === index) this.#current = (index + 1) % this.nodes.length;
  }
}

/**
 * A lease's renewals, checks and releases through {@link Endpoints}: each on
 * the current server's own ops (its Session stream over "grpc"), resent to
 * the next server on UNAVAILABLE. All three are safe to resend: a renewal
 * applied twice extends the same term (and the lease measures its deadline
 * from the first send), a retried release returns the term as it first ended.
 */
export class FailoverOps implements LeaseOps {
  constructor(private readonly endpoints: Endpoints) {}

  acquire(request: AcquireCall, timeoutMs: number): Promise<Grant> {
    // Safe to resend on another server: the request id makes the server
    // replay a grant whose reply was lost.
    return this.endpoints.run("safe", "Acquire", (n) => n.ops.acquire(request, timeoutMs));
  }

  renew(term: Term, ttlMs: number, timeoutMs: number): Promise<PbLease> {
    return this.endpoints.run("safe", "Renew", (n) => n.ops.renew(term, ttlMs, timeoutMs));
  }

  check(key: string, fence: bigint, timeoutMs: number): Promise<PbLease | undefined> {
    return this.endpoints.run("safe", "Check", (n) => n.ops.check(key, fence, timeoutMs));
  }

  release(term: Term, suspend: boolean, timeoutMs: number, handoff?: Handoff): Promise<EndedTerm> {
    return this.endpoints.run("safe", "Release", (n) => n.ops.release(term, suspend, timeoutMs, handoff));
  }

  beginToolCalls(request: BeginCalls, timeoutMs: number): Promise<BeginToolCallsResponse> {
    // Not resent on another server: a registration applied twice looks like
    // another holder of this term.
    return this.endpoints.run("unsafe", "BeginToolCalls", (n) => n.ops.beginToolCalls(request, timeoutMs));
  }

  settleToolCall(request: SettleCall, timeoutMs: number): Promise<SettleToolCallResponse> {
    // Safe to resend: the first outcome wins, and a resend gets the stored record back.
    return this.endpoints.run("safe", "SettleToolCall", (n) => n.ops.settleToolCall(request, timeoutMs));
  }

  hold(): void {
    for (const n of this.endpoints.nodes) n.ops.hold();
  }

  unhold(): void {
    for (const n of this.endpoints.nodes) n.ops.unhold();
  }

  close(): void {
    for (const n of this.endpoints.nodes) n.ops.close();
  }
}
