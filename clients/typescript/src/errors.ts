// The client's error classes, and the one place a server refusal (a gRPC
// status with its metadata, or a refusal inside a Session stream response)
// becomes one of them. Details a program needs (holder, fence, remaining
// time, why a fence is stale) are read from metadata, never parsed from
// messages.

import { Code, ConnectError, decodeBinaryHeader } from "@connectrpc/connect";
import { PROTOCOL } from "./protocol.js";

/** Why a fence is not the key's live term, as the server says it. */
export type StaleReason = "expired" | "released" | "suspended" | "superseded" | "unknown";

/**
 * Why a lease is lost:
 * - a {@link StaleReason}: the server refused the term (final);
 * - `"deadline"`: no renewal succeeded before the local deadline, so the
 *   server may have expired the term (final for this client: see the README);
 * - `"permission_denied"`: the server refused the lease id (final);
 * - `"ended"`: this lease was released or suspended.
 */
export type LossReason = StaleReason | "deadline" | "permission_denied" | "ended";

/** Every error this package throws. `code` names the kind without `instanceof`. */
export class LeaseholdError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "LeaseholdError";
    this.code = code;
  }
}

/** The key is held by someone else (gRPC `ABORTED`). */
export class BusyError extends LeaseholdError {
  readonly key: string;
  /** The holder's owner name. */
  readonly holder: string;
  /** The holder's fence. */
  readonly fence: bigint;
  /** How long the holder's term has left, by the server's clock. */
  readonly remainingMs: number;
  constructor(message: string, f: { key: string; holder: string; fence: bigint; remainingMs: number }) {
    super("busy", message);
    this.name = "BusyError";
    this.key = f.key;
    this.holder = f.holder;
    this.fence = f.fence;
    this.remainingMs = f.remainingMs;
  }
}

/**
 * The key is free but reserved (gRPC `ABORTED` with a reason), so nobody
 * else may take it for now. A {@link BusyError} (its `code` is "busy" too),
 * so code that waits out a busy key waits this out as well; `holder` is
 * empty.
 * - `reason: "lock_delay"`: the last term (`fence`) expired with a
 *   lock-delay; nobody may acquire the key until it runs out.
 * - `reason: "handoff"`: the last holder handed the key to `successor`; only
 *   an acquire by that owner gets it until the handoff times out.
 */
export class ReservedError extends BusyError {
  readonly reason: "lock_delay" | "handoff";
  /** For a handoff: the owner the key is kept for. */
  readonly successor: string;
  constructor(
    message: string,
    f: { key: string; reason: "lock_delay" | "handoff"; successor: string; fence: bigint; remainingMs: number },
  ) {
    super(message, { key: f.key, holder: "", fence: f.fence, remainingMs: f.remainingMs });
    this.name = "ReservedError";
    this.reason = f.reason;
    this.successor = f.successor;
  }
}

/**
 * An acquire of a quarantined key (gRPC `FAILED_PRECONDITION`, reason
 * `quarantined`): `failures` terms in a row ended by expiry or suspension, so
 * the server stopped handing the key out until an admin calls
 * `unquarantine(key)` (or acquires with `force`). The message lists the
 * failed terms; `history(key)` has them in full.
 */
export class QuarantinedError extends LeaseholdError {
  readonly key: string;
  readonly failures: number;
  constructor(message: string, f: { key: string; failures: number }) {
    super("quarantined", message);
    this.name = "QuarantinedError";
    this.key = f.key;
    this.failures = f.failures;
  }
}

/**
 * A watch asked for a revision the server's event log no longer holds (gRPC
 * `OUT_OF_RANGE`): list the keys again, then watch from the `nextRevision`
 * of a watch started at 0. `oldestRevision` is the oldest still held.
 */
export class CompactedError extends LeaseholdError {
  readonly oldestRevision: bigint;
  constructor(message: string, oldestRevision: bigint) {
    super("compacted", message);
    this.name = "CompactedError";
    this.oldestRevision = oldestRevision;
  }
}

/**
 * The server lacks this feature (gRPC `UNIMPLEMENTED`): its storage backend
 * does not have it, or the server is older than this client and lacks the
 * call itself (the message then says so). Never silently ignored.
 */
function missingRpc(message: string): string {
  const said = message === "" ? "" : ` (${message})`;
  return (
    `the server does not implement this call${said}: it is an older leasehold than this client ` +
    `(which speaks leasehold.v1 revision ${PROTOCOL}) or not a leasehold server; ` +
    "`leasehold health` against it prints its version"
  );
}

export class UnsupportedError extends LeaseholdError {
  constructor(message: string) {
    super("unsupported", message);
    this.name = "UnsupportedError";
  }
}

/**
 * The lease is lost, or a fence is not the key's live term (gRPC
 * `FAILED_PRECONDITION`). Stop acting: acquire again if the work must go on.
 */
export class LeaseLostError extends LeaseholdError {
  readonly key: string;
  readonly fence: bigint;
  readonly reason: LossReason;
  constructor(message: string, f: { key: string; fence: bigint; reason: LossReason }, options?: { cause?: unknown }) {
    super("lost", message, options);
    this.name = "LeaseLostError";
    this.key = f.key;
    this.fence = f.fence;
    this.reason = f.reason;
  }
}

/** Right fence, wrong lease id (gRPC `PERMISSION_DENIED`). */
export class PermissionDeniedError extends LeaseholdError {
  readonly key: string;
  readonly fence: bigint;
  constructor(message: string, f: { key: string; fence: bigint }) {
    super("permission_denied", message);
    this.name = "PermissionDeniedError";
    this.key = f.key;
    this.fence = f.fence;
  }
}

/**
 * The server runs with `--auth` and the client sent no token, or one it does
 * not know (gRPC `UNAUTHENTICATED`): give `token` to `createClient`.
 */
export class UnauthenticatedError extends LeaseholdError {
  constructor(message: string) {
    super("unauthenticated", message);
    this.name = "UnauthenticatedError";
  }
}

/** Malformed input: key, owner, TTL, wait, transcript (gRPC `INVALID_ARGUMENT`). */
export class InvalidArgumentError extends LeaseholdError {
  constructor(message: string) {
    super("invalid_argument", message);
    this.name = "InvalidArgumentError";
  }
}

/**
 * A server limit was reached (`RESOURCE_EXHAUSTED`); other clients are still
 * served. `limit` names it: "keys_per_principal" (release keys first),
 * "waiters_per_key", "waits_per_connection", "streams_per_connection",
 * "ops_per_second" (back off); empty when gRPC itself refused (a message
 * over the size limit).
 */
export class ResourceExhaustedError extends LeaseholdError {
  readonly limit: string;
  constructor(message: string, limit: string) {
    super("resource_exhausted", message);
    this.name = "ResourceExhaustedError";
    this.limit = limit;
  }
}

/**
 * The server could not be reached, did not answer in time, is shutting down,
 * or its storage failed. Retrying later may succeed.
 */
export class UnavailableError extends LeaseholdError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("unavailable", message, options);
    this.name = "UnavailableError";
  }
}

/**
 * Something that belongs to an owned run (a ledgered tool, `currentLease()`)
 * used outside one: the framework adapters' one such error.
 */
export class NotOwnedError extends LeaseholdError {
  constructor(message: string) {
    super("not_owned", message);
    this.name = "NotOwnedError";
  }
}

/** A refusal's details by metadata name: ASCII values as text, `-bin` values as bytes. */
export interface RefusalDetails {
  text(name: string): string | undefined;
  bytes(name: string): Uint8Array | undefined;
}

const decoder = new TextDecoder();

/** Parses an unsigned decimal exactly into a bigint; never through `number`. */
export function parseU64(text: string | undefined): bigint | undefined {
  if (text === undefined || !/^[0-9]{1,20}$/.test(text.trim())) return undefined;
  const value = BigInt(text.trim());
  return value <= 0xffff_ffff_ffff_ffffn ? value : undefined;
}

/** Converts a server-side millisecond count (uint64) to a number, saturating. */
export function msToNumber(ms: bigint): number {
  return ms > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(ms);
}

/** Details carried in a Session stream response (`map<string, bytes>`). */
export function detailsFromMap(map: Readonly<Record<string, Uint8Array>>): RefusalDetails {
  return {
    text: (name) => {
      const v = map[name];
      return v === undefined ? undefined : decoder.decode(v);
    },
    bytes: (name) => map[name],
  };
}

/** Details carried as response metadata (headers or trailers) of a unary call. */
export function detailsFromHeaders(headers: Headers): RefusalDetails {
  return {
    text: (name) => headers.get(name) ?? undefined,
    bytes: (name) => {
      const v = headers.get(name);
      if (v === null) return undefined;
      try {
        return decodeBinaryHeader(v);
      } catch {
        return undefined;
      }
    },
  };
}

function binText(details: RefusalDetails, name: string): string {
  const v = details.bytes(name);
  return v === undefined ? "" : decoder.decode(v);
}

/**
 * The one table from a server refusal (gRPC code, message, details) to an
 * error of this package. Statuses without leasehold details (a proxy, a
 * deadline, a broken connection) map by code alone.
 */
export function fromRefusal(code: number, message: string, details: RefusalDetails): LeaseholdError {
  const key = binText(details, "leasehold-key-bin");
  const fence = parseU64(details.text("leasehold-fence")) ?? 0n;
  const reason = details.text("leasehold-reason");
  const remainingMs = msToNumber(parseU64(details.text("leasehold-remaining-ms")) ?? 0n);
  if (code === Code.Aborted && (reason === "lock_delay" || reason === "handoff")) {
    const successor = binText(details, "leasehold-successor-bin");
    return new ReservedError(message, { key, reason, successor, fence, remainingMs });
  }
  if (code === Code.FailedPrecondition && reason === "quarantined") {
    const failures = msToNumber(parseU64(details.text("leasehold-failures")) ?? 0n);
    return new QuarantinedError(message, { key, failures });
  }
  const oldest = parseU64(details.text("leasehold-oldest-revision"));
  if (code === Code.OutOfRange && oldest !== undefined) {
    return new CompactedError(message, oldest);
  }
  switch (code) {
    case Code.InvalidArgument:
      return new InvalidArgumentError(message);
    case Code.Aborted:
      return new BusyError(message, {
        key,
        holder: binText(details, "leasehold-holder-bin"),
        fence,
        remainingMs,
      });
    case Code.FailedPrecondition: {
      const stale: StaleReason =
        reason === "expired" || reason === "released" || reason === "suspended" || reason === "superseded"
          ? reason
          : "unknown";
      return new LeaseLostError(message, { key, fence, reason: stale });
    }
    case Code.PermissionDenied:
      return new PermissionDeniedError(message, { key, fence });
    case Code.NotFound:
      return new LeaseholdError("not_found", message);
    case Code.Unimplemented:
      // A leasehold server's own refusal says "unsupported: ..."; anything
      // else is the RPC itself missing, so name the likely cause.
      return new UnsupportedError(message.startsWith("unsupported: ") ? message.slice(13) : missingRpc(message));
    case Code.Unauthenticated:
      return new UnauthenticatedError(message);
    case Code.ResourceExhausted:
      return new ResourceExhaustedError(message, details.text("leasehold-limit") ?? "");
    case Code.Unavailable:
    case Code.DeadlineExceeded:
    case Code.Canceled:
      return new UnavailableError(message);
    default:
      return new LeaseholdError("internal", message);
  }
}

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_PING_CANCEL",
]);

/**
 * Node's codes for a TLS handshake that failed: OpenSSL's (ERR_SSL_...,
 * e.g. a server that requires a client certificate), Node's own
 * (ERR_TLS_..., e.g. a name mismatch) and certificate verification's
 * (UNABLE_TO_VERIFY_LEAF_SIGNATURE, SELF_SIGNED_CERT_IN_CHAIN, CERT_HAS_EXPIRED...).
 */
const TLS_CODE = /^(ERR_SSL_|ERR_TLS_|EPROTO$|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|HOSTNAME_MISMATCH|ERR_OSSL_)/;

/**
 * Whether `err` (or an error in its cause chain) is a failure to reach the
 * server: a socket error, a TLS handshake that failed, or fetch's "fetch
 * failed" (undici). connect reports these with whatever code it guesses
 * (Unknown, Internal, or Aborted for a reset connection, which would read as
 * a busy key), never as the server's answer: they are all Unavailable.
 */
function isNetworkError(err: unknown): boolean {
  let e: unknown = err;
  for (let depth = 0; depth < 6 && e !== undefined && e !== null; depth++) {
    if (typeof e === "object") {
      const code = (e as { code?: unknown }).code;
      if (typeof code === "string" && (NETWORK_CODES.has(code) || code.startsWith("UND_ERR") || TLS_CODE.test(code))) {
        return true;
      }
      if (e instanceof TypeError && /fetch failed|network/i.test(e.message)) return true;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** Turns whatever a connect call threw into an error of this package. */
export function fromCallError(err: unknown, call: string): LeaseholdError {
  if (err instanceof LeaseholdError) return err;
  const ce = ConnectError.from(err);
  if (isNetworkError(err)) {
    return new UnavailableError(`${call}: cannot reach the server: ${ce.rawMessage}`, { cause: err });
  }
  const mapped = fromRefusal(ce.code, ce.rawMessage, detailsFromHeaders(ce.metadata));
  if (mapped instanceof UnavailableError || mapped.code === "internal") {
    // Keep the transport's story (connection refused, timeout) for debugging.
    return mapped instanceof UnavailableError
      ? new UnavailableError(`${call}: ${ce.rawMessage || Code[ce.code]}`, { cause: err })
      : new LeaseholdError("internal", `${call}: ${ce.rawMessage || Code[ce.code]}`, { cause: err });
  }
  return mapped;
}

/**
 * Whether an answer to a Renew, Check or Release of a term means the term is
 * over for good (retrying cannot help).
 */
export function endsTheTerm(err: LeaseholdError): boolean {
  return (
    err instanceof LeaseLostError ||
    err instanceof PermissionDeniedError ||
    err instanceof InvalidArgumentError ||
    err.code === "not_found"
  );
}
