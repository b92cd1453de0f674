// createClient: a connection to a leasehold server, and the acquire that
// hands out leases.

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { createClient as createRpcClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport as createNodeGrpcWebTransport } from "@connectrpc/connect-node";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Endpoints, FailoverOps, type Node } from "./endpoints.js";
import { Leasehold, Transcripts } from "./gen/leasehold/v1/leasehold_pb.js";
import { fromCallError, InvalidArgumentError, LeaseholdError, UnavailableError } from "./errors.js";
import { Lease } from "./lease.js";
import {
  type HistoryPage,
  type KeyPage,
  type KeyState,
  type ListFilterName,
  listFilter,
  type ServerInfo,
  toHistoryPage,
  toKeyState,
  Watch,
  type WatchOptions,
} from "./lifecycle.js";
import { type LeaseOps, StreamOps, UnaryOps } from "./ops.js";
import { PROTOCOL } from "./protocol.js";
import { now, retryPause, sleep, timing } from "./timing.js";
import {
  toFinding,
  type Transcript,
  type TranscriptFormat,
  type TranscriptRepair,
  type TranscriptReport,
  transcriptText,
} from "./transcripts.js";

/** Options of {@link createClient}. */
export interface ClientOptions {
  /**
   * The server, e.g. `http://127.0.0.1:7420`, or `https://host:7420` for TLS
   * (see `tls`). Several servers on one PostgreSQL database (`leasehold serve
   * --store postgres://…`), as an array or a comma-separated string, fail
   * over from one to the next: calls go to one at a time and move on when it
   * is unavailable, and only calls that are safe to send twice are resent
   * (see the README's "Several servers").
   */
  baseUrl: string | readonly string[];
  /**
   * `"grpc"`: gRPC over HTTP/2 (Node's http2), with one pipelined Session
   * stream for every lease's renewals, checks and releases. `"grpc-web"`:
   * gRPC-Web over `fetch` (HTTP/1.1 or whatever fetch speaks), with unary
   * Renew/Check/Release; for Bun and other runtimes whose HTTP/2 clients
   * misbehave. Default: "grpc" on Node, "grpc-web" on Bun.
   */
  transport?: "grpc" | "grpc-web";
  /** The default owner name, shown to others in busy errors. Default: `hostname:pid`. */
  owner?: string;
  /** connect interceptors applied to every call (auth headers, logging). */
  interceptors?: Interceptor[];
  /**
   * Bearer token for a server run with `--auth`: sent as
   * `authorization: Bearer <token>` on every call (use https:// off loopback).
   */
  token?: string;
  /**
   * TLS settings for an `https://` baseUrl: a private CA to trust and, for
   * a server run with `--client-ca`, the client certificate and key. Without
   * it, `https://` trusts Node's default roots (plus NODE_EXTRA_CA_CERTS).
   * On the "grpc-web" transport, giving `tls` switches from `fetch` (which
   * takes no per-client TLS settings) to Node's https module.
   */
  tls?: TlsOptions;
}

/**
 * PEM contents (not paths: read them with `readFileSync`), as Node's `tls`
 * takes them.
 */
export interface TlsOptions {
  /** CA certificates to trust instead of Node's default roots. */
  ca?: string | Uint8Array;
  /** The client certificate chain (mutual TLS); needs `key`. */
  cert?: string | Uint8Array;
  /** The client certificate's private key; needs `cert`. */
  key?: string | Uint8Array;
}

/** Options of {@link LeaseholdClient.acquire}. */
export interface AcquireOptions {
  /** Lease duration; the server accepts 100 ms to 24 h. Default 10 s. */
  ttlMs?: number;
  /** Wait (FIFO) for a held key this long; 0 (the default) fails at once with BusyError. At most 5 min. */
  waitMs?: number;
  /** Overrides the client's owner name for this lease. */
  owner?: string;
  /**
   * Retry token: the same owner and request id while that term is live gets
   * the same term back instead of a conflict. Default: a fresh UUID (resent
   * on retries of this acquire).
   */
  requestId?: string;
  /** Renewal interval; default ttl/3 (jittered). */
  renewEveryMs?: number;
  /** Subtracted from the TTL for the local deadline; default ttl/10, at most 2 s. */
  safetyMarginMs?: number;
  /** How long one renew, check or release may take; default the renewal interval, at most 5 s. */
  rpcTimeoutMs?: number;
  /**
   * If this term ends by expiry, nobody may acquire the key for this long
   * (ReservedError, reason "lock_delay"), so writes this holder sent before
   * it was lost drain first. A release or suspend skips it. At most 60 s; default 0.
   */
  lockDelayMs?: number;
  /**
   * Quarantine the key once this many terms in a row (this one included) end
   * by expiry or suspension (QuarantinedError until `unquarantine`). Default 0:
   * the server's default (off unless the server sets one).
   */
  maxRecoveries?: number;
  /** Acquire the key even if it is quarantined (needs the admin right). */
  force?: boolean;
}

/** How many times an acquire is sent, at most, when the server is unreachable. */
const ACQUIRE_ATTEMPTS = 3;
const DEFAULT_TTL_MS = 10_000;
/** HTTP/2 pings find a silently dead connection (no FIN or RST) in seconds. */
const PING_INTERVAL_MS = 5_000;
const PING_TIMEOUT_MS = 5_000;

function isBun(): boolean {
  return typeof (globalThis as { Bun?: unknown }).Bun !== "undefined";
}

/** A connection to a leasehold server. */
export class LeaseholdClient implements AsyncDisposable {
  /** The transport in use. */
  readonly transport: "grpc" | "grpc-web";
  /** The default owner name. */
  readonly owner: string;
  /** Every server, in the order given. */
  readonly baseUrls: readonly string[];
  readonly #endpoints: Endpoints;
  readonly #ops: LeaseOps;

  constructor(options: ClientOptions) {
    const baseUrls = baseUrlsOf(options.baseUrl);
    this.baseUrls = baseUrls;
    this.transport = options.transport ?? (isBun() ? "grpc-web" : "grpc");
    this.owner = options.owner ?? `${hostname()}:${process.pid}`;
    const interceptors: Interceptor[] = [...(options.interceptors ?? [])];
    if (options.token !== undefined) {
      const header = `Bearer ${options.token}`;
      interceptors.unshift((next) => async (req) => {
        req.header.set("authorization", header);
        return await next(req);
      });
    }
    if (this.transport !== "grpc" && this.transport !== "grpc-web") {
      throw new InvalidArgumentError(`transport must be "grpc" or "grpc-web", not ${String(this.transport)}`);
    }
    const nodes: Node[] = baseUrls.map((baseUrl) => {
      const transport = makeTransport(this.transport, baseUrl, nodeTls(baseUrl, options.tls), interceptors);
      const rpc = createRpcClient(Leasehold, transport);
      return {
        url: baseUrl,
        rpc,
        transcripts: createRpcClient(Transcripts, transport),
        ops: this.transport === "grpc" ? new StreamOps(rpc) : new UnaryOps(rpc),
      };
    });
    this.#endpoints = new Endpoints(nodes);
    this.#ops = new FailoverOps(this.#endpoints);
  }

  /** The server calls go to now: the first given, then the next after each failover. */
  get currentBaseUrl(): string {
    return this.#endpoints.current.url;
  }

  /**
   * Acquires `key`: a {@link Lease} that renews itself until released.
   * Transient failures are retried with the same request id, so a lost reply
   * cannot leave an orphaned second term.
   * @throws BusyError when the key is held (after waiting `waitMs`);
   *   ReservedError (a BusyError) when it is free but in a lock-delay or kept
   *   for another owner's handoff; QuarantinedError for a quarantined key;
   *   InvalidArgumentError; UnavailableError.
   */
  async acquire(key: string, options: AcquireOptions = {}): Promise<Lease> {
    const t = timing({
      ttlMs: options.ttlMs ?? DEFAULT_TTL_MS,
      renewEveryMs: options.renewEveryMs,
      safetyMarginMs: options.safetyMarginMs,
      rpcTimeoutMs: options.rpcTimeoutMs,
    });
    const waitMs = options.waitMs ?? 0;
    if (!Number.isSafeInteger(waitMs) || waitMs < 0) {
      throw new InvalidArgumentError(`waitMs must be a non-negative integer, not ${waitMs}`);
    }
    const lockDelayMs = options.lockDelayMs ?? 0;
    if (!Number.isSafeInteger(lockDelayMs) || lockDelayMs < 0) {
      throw new InvalidArgumentError(`lockDelayMs must be a non-negative integer, not ${lockDelayMs}`);
    }
    const maxRecoveries = options.maxRecoveries ?? 0;
    if (!Number.isInteger(maxRecoveries) || maxRecoveries < 0 || maxRecoveries > 0xffff_ffff) {
      throw new InvalidArgumentError(`maxRecoveries must be a non-negative integer, not ${maxRecoveries}`);
    }
    const request = {
      key,
      owner: options.owner ?? this.owner,
      ttlMs: BigInt(t.ttlMs),
      waitMs: BigInt(waitMs),
      // Made up here unless the caller supplied one (then another attempt,
      // or another process, may have made the grant a replay answers).
      requestId: options.requestId ?? randomUUID(),
      lockDelayMs: BigInt(lockDelayMs),
      maxRecoveries,
      force: options.force ?? false,
    };
    const generatedId = options.requestId === undefined;
    // Taken once, before the first attempt: a grant that a retry's reply
    // replays was made after this send, never before it.
    const firstSent = now();
    for (let attempt = 1; ; attempt++) {
      try {
        // On the Session stream when it does not wait (see ops.ts); the
        // stream lingers after the reply, so the lease's renewals and
        // release reuse it.
        const reply = await this.#ops.acquire(request, waitMs + t.rpcTimeoutMs);
        // A fresh grant happened after our first send, so that send time is a
        // safe basis for the local deadline. A replayed one happened at some
        // earlier attempt: ours if we made up the id, of unknown age (another
        // process's, perhaps long ago) if the caller supplied it.
        const sentAt = !reply.replayed || generatedId ? firstSent : undefined;
        return await Lease.start({ endpoints: this.#endpoints, ops: this.#ops, timing: t, reply, sentAt });
      } catch (err) {
        const mapped = fromCallError(err, "Acquire");
        if (mapped instanceof UnavailableError && attempt < ACQUIRE_ATTEMPTS) {
          await sleep(retryPause(t, attempt + 1));
          continue;
        }
        throw mapped;
      }
    }
  }

  /**
   * Runs `fn` while holding `key`: released when `fn` returns (unless `fn`
   * ended the term itself, e.g. with `lease.handOff`), suspended (released
   * as unfinished, so recoverable) when it throws.
   * @throws what acquire throws; what `fn` throws; LeaseLostError when the
   *   release after a successful `fn` is refused (the lease was lost meanwhile:
   *   do not trust writes that were not fenced).
   */
  async withLease<T>(key: string, options: AcquireOptions, fn: (lease: Lease) => Promise<T>): Promise<T> {
    const lease = await this.acquire(key, options);
    let result: T;
    try {
      result = await fn(lease);
    } catch (err) {
      try {
        await lease.suspend();
      } catch {
        // Already lost or unreachable: the term ends at its TTL. The work's
        // own error is the one to report.
      }
      throw err;
    }
    // fn may have ended the term itself (handOff, release, suspend).
    if (lease.lossReason !== "ended") await lease.release();
    return result;
  }

  /**
   * Which server this is: its release, the revision of `leasehold.v1` it
   * speaks and its backend; `compatible` says whether this client can speak to it.
   * @throws UnsupportedError from a server older than the call itself.
   */
  async serverInfo(): Promise<ServerInfo> {
    try {
      const reply = await this.#endpoints.run("safe", "ServerInfo", (n) => n.rpc.serverInfo({}));
      return {
        version: reply.version,
        protocol: reply.protocol,
        backend: reply.backend,
        compatible: reply.protocol >= PROTOCOL,
      };
    } catch (err) {
      throw fromCallError(err, "ServerInfo");
    }
  }

  /**
   * The key's live term (without its lease id), last ended term, whether it
   * is recoverable or quarantined, and its reservation.
   * @throws LeaseholdError with code "not_found" for a key the server does not hold.
   */
  async get(key: string): Promise<KeyState> {
    try {
      return toKeyState(key, await this.#endpoints.run("safe", "Get", (n) => n.rpc.get({ key })));
    } catch (err) {
      throw fromCallError(err, "Get");
    }
  }

  /** One page of keys in order (`filter` default "all"; `pageSize` 0 means 100). */
  async list(
    options: { prefix?: string; filter?: ListFilterName; pageSize?: number; pageToken?: string } = {},
  ): Promise<KeyPage> {
    const filter = listFilter(options.filter ?? "all");
    try {
      const request = {
        prefix: options.prefix ?? "",
        filter,
        pageSize: options.pageSize ?? 0,
        pageToken: options.pageToken ?? "",
      };
      const reply = await this.#endpoints.run("safe", "List", (n) => n.rpc.list(request));
      return { keys: reply.keys.map((k) => toKeyState(k.key, k)), nextPageToken: reply.nextPageToken };
    } catch (err) {
      throw fromCallError(err, "List");
    }
  }

  /**
   * One page of `key`'s ended terms, newest first: `before` undefined for the
   * newest, then the previous page's `nextBefore`.
   * @throws LeaseholdError with code "not_found" for a key the server does not hold.
   */
  async history(key: string, options: { pageSize?: number; before?: bigint } = {}): Promise<HistoryPage> {
    try {
      const request = {
        key,
        pageSize: options.pageSize ?? 0,
        pageToken: options.before === undefined ? "" : options.before.toString(),
      };
      const reply = await this.#endpoints.run("safe", "History", (n) => n.rpc.history(request));
      return toHistoryPage(reply);
    } catch (err) {
      throw fromCallError(err, "History");
    }
  }

  /** Lifts `key`'s quarantine (admin right) and returns its state. */
  async unquarantine(key: string): Promise<KeyState> {
    let reply;
    try {
      // Safe to resend: lifting a lifted quarantine changes nothing.
      reply = await this.#endpoints.run("safe", "Unquarantine", (n) => n.rpc.unquarantine({ key }));
    } catch (err) {
      throw fromCallError(err, "Unquarantine");
    }
    if (reply.key === undefined) throw new LeaseholdError("internal", "the server's Unquarantine reply carried no key");
    return toKeyState(reply.key.key, reply.key);
  }

  /**
   * Watches ownership changes of `key`, or of every key under `prefix`
   * (neither: every key), from `startRevision` (0: only what happens from now
   * on): `for await (const e of lh.watch({ prefix }))`. Works on both
   * transports (gRPC-Web carries server streams). See {@link Watch} for
   * `ready`, `nextRevision` and resuming.
   * @throws (from `ready` or the iteration) CompactedError for a revision the
   *   server no longer holds; UnsupportedError on a backend without watch.
   */
  watch(options: WatchOptions = {}): Watch {
    return new Watch(this.#endpoints.current.rpc, options);
  }

  /** Checks that every tool call in `messages` is paired the way the provider requires. */
  async checkTranscript(messages: Transcript, options: { format?: TranscriptFormat } = {}): Promise<TranscriptReport> {
    try {
      const request = { transcript: transcriptText(messages), format: options.format ?? "" };
      const reply = await this.#endpoints.run("safe", "Transcripts.Check", (n) => n.transcripts.check(request));
      return {
        healthy: reply.healthy,
        format: reply.format,
        messages: Number(reply.messages),
        findings: reply.findings.map(toFinding),
        report: reply.reportJson === "" ? undefined : (JSON.parse(reply.reportJson) as unknown),
      };
    } catch (err) {
      throw fromCallError(err, "Transcripts.Check");
    }
  }

  /**
   * Repairs tool-call pairing in `messages` (moves, drops, inserts results).
   * The repaired transcript comes back in the input's shape: text for text,
   * an array for an array.
   */
  async repairTranscript<T extends Transcript>(
    messages: T,
    options: { format?: TranscriptFormat; placeholderMarkers?: string[] } = {},
  ): Promise<TranscriptRepair<T>> {
    let reply;
    try {
      const request = {
        transcript: transcriptText(messages),
        format: options.format ?? "",
        placeholderMarkers: options.placeholderMarkers ?? [],
      };
      reply = await this.#endpoints.run("safe", "Transcripts.Repair", (n) => n.transcripts.repair(request));
    } catch (err) {
      throw fromCallError(err, "Transcripts.Repair");
    }
    const transcript = (typeof messages === "string" ? reply.transcript : parseArray(reply.transcript)) as
      TranscriptRepair<T>["transcript"];
    return {
      transcript,
      healthy: reply.healthy,
      actions: reply.actionsJson === "" ? [] : (JSON.parse(reply.actionsJson) as unknown[]),
      unrecoverable: reply.unrecoverable.map(toFinding),
    };
  }

  /**
   * Closes the Session stream now, failing operations in flight on it with
   * UnavailableError. Release leases first: a lease still held opens a new
   * stream at its next renewal. (The stream also closes by itself whenever no
   * lease is held and nothing is in flight.)
   */
  close(): void {
    this.#ops.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

function parseArray(text: string): unknown[] {
  const parsed = JSON.parse(text) as unknown;
  if (!Array.isArray(parsed)) {
    throw new LeaseholdError("internal", "the repaired transcript is not a JSON array");
  }
  return parsed;
}

/** The servers a client was given: one URL, a comma-separated list, or an array. */
function baseUrlsOf(baseUrl: string | readonly string[]): string[] {
  const items = typeof baseUrl === "string" ? baseUrl.split(",") : Array.isArray(baseUrl) ? [...baseUrl] : undefined;
  if (items === undefined) {
    throw new InvalidArgumentError(`baseUrl must be an http:// or https:// URL or a list of them, not ${String(baseUrl)}`);
  }
  const urls = items.map((u) => (typeof u === "string" ? u.trim() : u)).filter((u) => u !== "");
  if (urls.length === 0) throw new InvalidArgumentError("baseUrl names no server");
  for (const u of urls) {
    if (typeof u !== "string" || !/^https?:\/\//.test(u)) {
      throw new InvalidArgumentError(`baseUrl must be an http:// or https:// URL, not ${String(u)}`);
    }
  }
  return urls as string[];
}

/** The transport to one server. */
function makeTransport(
  kind: "grpc" | "grpc-web",
  baseUrl: string,
  tls: ReturnType<typeof nodeTls>,
  interceptors: Interceptor[],
): Transport {
  if (kind === "grpc") {
    return createGrpcTransport({
      baseUrl,
      pingIntervalMs: PING_INTERVAL_MS,
      pingTimeoutMs: PING_TIMEOUT_MS,
      interceptors,
      ...(tls === undefined ? {} : { nodeOptions: tls }),
    });
  }
  // fetch cannot be handed a CA or a client certificate per client (only a
  // process-wide NODE_EXTRA_CA_CERTS), so TLS settings mean Node's own https
  // module, still speaking gRPC-Web over HTTP/1.1.
  return tls === undefined
    ? createGrpcWebTransport({ baseUrl, interceptors })
    : createNodeGrpcWebTransport({ baseUrl, httpVersion: "1.1", nodeOptions: tls, interceptors });
}

/** The TLS settings in Node's shape, after checking they make sense with `baseUrl`. */
function nodeTls(
  baseUrl: string,
  tls: TlsOptions | undefined,
): { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer } | undefined {
  if (tls === undefined) return undefined;
  if (!baseUrl.startsWith("https://")) {
    throw new InvalidArgumentError(`tls options need an https:// baseUrl, not ${baseUrl}`);
  }
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new InvalidArgumentError("tls.cert and tls.key go together: a client certificate needs its key");
  }
  const pem = (v: string | Uint8Array | undefined): string | Buffer | undefined =>
    v === undefined || typeof v === "string" ? v : Buffer.from(v);
  const out: { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer } = {};
  const [ca, cert, key] = [pem(tls.ca), pem(tls.cert), pem(tls.key)];
  if (ca !== undefined) out.ca = ca;
  if (cert !== undefined) out.cert = cert;
  if (key !== undefined) out.key = key;
  return out;
}

/** Creates a client for the leasehold server (or servers, with failover) at `options.baseUrl`. */
export function createClient(options: ClientOptions): LeaseholdClient {
  return new LeaseholdClient(options);
}
