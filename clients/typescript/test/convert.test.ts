// The conversion layer: refusals to errors, and 64-bit values kept as bigint
// end to end (never through number, which loses precision above 2^53).

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, encodeBinaryHeader } from "@connectrpc/connect";
import {
  AcquireResponseSchema,
  SessionResponseSchema,
  TermEnd,
} from "../src/gen/leasehold/v1/leasehold_pb.js";
import {
  detailsFromHeaders,
  detailsFromMap,
  fromCallError,
  fromRefusal,
  parseU64,
} from "../src/errors.js";
import {
  BusyError,
  CompactedError,
  InvalidArgumentError,
  LeaseholdError,
  LeaseLostError,
  PermissionDeniedError,
  QuarantinedError,
  ReservedError,
  ResourceExhaustedError,
  UnavailableError,
  UnsupportedError,
} from "../src/index.js";
import { toEnded } from "../src/lease.js";

const enc = new TextEncoder();
const ABOVE_2_53 = 2n ** 53n + 1n; // 9007199254740993: not representable as a number
const MAX_U64 = 2n ** 64n - 1n;

describe("64-bit fences", () => {
  it("are bigint in generated messages and survive the wire format exactly", () => {
    const reply = create(AcquireResponseSchema, {
      lease: { key: "k", fence: ABOVE_2_53, leaseId: "id", ttlMs: 1000n },
      previous: { fence: MAX_U64, owner: "o", end: TermEnd.SUSPENDED, endedAtMs: 1n },
    });
    const back = fromBinary(AcquireResponseSchema, toBinary(AcquireResponseSchema, reply));
    assert.equal(back.lease?.fence, ABOVE_2_53);
    assert.equal(back.previous?.fence, MAX_U64);
    assert.notEqual(Number(ABOVE_2_53), Number(ABOVE_2_53 - 1n) + 2, "sanity: number would lose it");
    const ended = toEnded(back.previous!);
    assert.equal(ended.fence, MAX_U64);
    assert.equal(ended.end, "suspended");
  });

  it("parse exactly from refusal details, and reject what is not a u64", () => {
    assert.equal(parseU64("9007199254740993"), ABOVE_2_53);
    assert.equal(parseU64("18446744073709551615"), MAX_U64);
    assert.equal(parseU64("18446744073709551616"), undefined);
    assert.equal(parseU64("-1"), undefined);
    assert.equal(parseU64("1e3"), undefined);
    assert.equal(parseU64(undefined), undefined);
  });
});

describe("refusals become the package's errors", () => {
  it("a busy refusal on the Session stream keeps holder, fence and time left", () => {
    const response = create(SessionResponseSchema, {
      code: Code.Aborted,
      message: "key held",
      details: {
        "leasehold-key-bin": enc.encode("sessión:1"),
        "leasehold-holder-bin": enc.encode("graph-ä"),
        "leasehold-fence": enc.encode(ABOVE_2_53.toString()),
        "leasehold-remaining-ms": enc.encode("1234"),
      },
    });
    const back = fromBinary(SessionResponseSchema, toBinary(SessionResponseSchema, response));
    const err = fromRefusal(back.code, back.message, detailsFromMap(back.details));
    assert.ok(err instanceof BusyError);
    assert.ok(err instanceof LeaseholdError);
    assert.equal(err.key, "sessión:1");
    assert.equal(err.holder, "graph-ä");
    assert.equal(err.fence, ABOVE_2_53);
    assert.equal(err.remainingMs, 1234);
  });

  it("a busy status from a unary call reads the same details from metadata", () => {
    const meta = new Headers({
      "leasehold-key-bin": encodeBinaryHeader(enc.encode("k")),
      "leasehold-holder-bin": encodeBinaryHeader(enc.encode("graph-ä")),
      "leasehold-fence": MAX_U64.toString(),
      "leasehold-remaining-ms": "77",
    });
    const err = fromCallError(new ConnectError("held", Code.Aborted, meta), "Acquire");
    assert.ok(err instanceof BusyError);
    assert.equal(err.holder, "graph-ä");
    assert.equal(err.fence, MAX_U64);
    assert.equal(err.remainingMs, 77);
  });

  it("a reset connection or a failed TLS handshake is Unavailable, whatever code connect guessed", () => {
    // connect-node reports ECONNRESET as Aborted (which would read as a busy
    // key) and TLS failures as Internal; neither is the server's answer.
    const failures: [Code, string][] = [
      [Code.Aborted, "ECONNRESET"],
      [Code.Internal, "ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED"],
      [Code.Internal, "UNABLE_TO_VERIFY_LEAF_SIGNATURE"],
      [Code.Unknown, "ERR_TLS_CERT_ALTNAME_INVALID"],
    ];
    for (const [code, cause] of failures) {
      const reason = Object.assign(new Error(cause), { code: cause });
      const err = fromCallError(new ConnectError(cause, code, undefined, undefined, reason), "Acquire");
      assert.ok(err instanceof UnavailableError, `${cause}: ${err.name}`);
    }
  });

  it("a limit refusal is ResourceExhaustedError naming the limit", () => {
    const details = detailsFromHeaders(new Headers({ "leasehold-limit": "keys_per_principal" }));
    const err = fromRefusal(Code.ResourceExhausted, "limit keys_per_principal reached", details);
    assert.ok(err instanceof ResourceExhaustedError);
    assert.equal(err.code, "resource_exhausted");
    assert.equal(err.limit, "keys_per_principal");
  });

  it("each code maps to its class", () => {
    const none = detailsFromHeaders(new Headers());
    const stale = fromRefusal(
      Code.FailedPrecondition,
      "stale",
      detailsFromHeaders(new Headers({ "leasehold-reason": "superseded", "leasehold-fence": "3" })),
    );
    assert.ok(stale instanceof LeaseLostError);
    assert.equal(stale.reason, "superseded");
    assert.equal(stale.fence, 3n);
    const odd = fromRefusal(Code.FailedPrecondition, "stale", detailsFromHeaders(new Headers({ "leasehold-reason": "??" })));
    assert.ok(odd instanceof LeaseLostError && odd.reason === "unknown");
    assert.ok(fromRefusal(Code.PermissionDenied, "no", none) instanceof PermissionDeniedError);
    assert.ok(fromRefusal(Code.InvalidArgument, "bad", none) instanceof InvalidArgumentError);
    for (const code of [Code.Unavailable, Code.DeadlineExceeded, Code.Canceled]) {
      assert.ok(fromRefusal(code, "down", none) instanceof UnavailableError, Code[code]);
    }
    const nf = fromRefusal(Code.NotFound, "never", none);
    assert.equal(nf.code, "not_found");
    const internal = fromRefusal(Code.Internal, "disk", none);
    assert.equal(internal.code, "internal");
    assert.ok(!(internal instanceof UnavailableError));
  });
});

describe("lifecycle refusals (#15)", () => {
  const map = (entries: Record<string, string>) =>
    detailsFromMap(Object.fromEntries(Object.entries(entries).map(([k, v]) => [k, enc.encode(v)])));

  it("ABORTED with reason lock_delay is a ReservedError (a BusyError), not a holderless BusyError", () => {
    const err = fromRefusal(
      Code.Aborted,
      "in its lock-delay",
      map({
        "leasehold-key-bin": "s",
        "leasehold-reason": "lock_delay",
        "leasehold-fence": "9007199254740993",
        "leasehold-remaining-ms": "250",
      }),
    );
    assert.ok(err instanceof ReservedError && err instanceof BusyError);
    assert.equal(err.code, "busy");
    assert.equal(err.reason, "lock_delay");
    assert.equal(err.fence, ABOVE_2_53);
    assert.equal(err.remainingMs, 250);
    assert.equal(err.successor, "");
    assert.equal(err.key, "s");
  });

  it("ABORTED with reason handoff names the successor", () => {
    const err = fromRefusal(
      Code.Aborted,
      "kept for ui",
      map({ "leasehold-reason": "handoff", "leasehold-successor-bin": "ui-ü", "leasehold-remaining-ms": "9" }),
    );
    assert.ok(err instanceof ReservedError);
    assert.equal(err.reason, "handoff");
    assert.equal(err.successor, "ui-ü");
    assert.equal(err.remainingMs, 9);
  });

  it("FAILED_PRECONDITION with reason quarantined is a QuarantinedError, not a LeaseLostError", () => {
    const err = fromRefusal(
      Code.FailedPrecondition,
      "quarantined",
      map({ "leasehold-key-bin": "q", "leasehold-reason": "quarantined", "leasehold-failures": "3" }),
    );
    assert.ok(err instanceof QuarantinedError && !(err instanceof LeaseLostError));
    assert.equal(err.failures, 3);
    assert.equal(err.key, "q");
  });

  it("OUT_OF_RANGE with the oldest revision is a CompactedError; without it, not", () => {
    const err = fromRefusal(Code.OutOfRange, "revision 3 is compacted", map({ "leasehold-oldest-revision": "40" }));
    assert.ok(err instanceof CompactedError);
    assert.equal(err.oldestRevision, 40n);
    assert.ok(!(fromRefusal(Code.OutOfRange, "message too large", map({})) instanceof CompactedError));
  });

  it("UNIMPLEMENTED is an UnsupportedError, also through a unary call's metadata", () => {
    const err = fromCallError(new ConnectError("unsupported: watch on the postgres backend", Code.Unimplemented), "Watch");
    assert.ok(err instanceof UnsupportedError);
    assert.equal(err.code, "unsupported");
    assert.equal(err.message, "watch on the postgres backend");
  });

  it("a Session stream refusal maps through the same table", () => {
    const response = create(SessionResponseSchema, {
      id: 1n,
      code: Code.Aborted,
      message: "kept",
      details: { "leasehold-reason": enc.encode("handoff"), "leasehold-successor-bin": enc.encode("ui") },
    });
    const err = fromRefusal(response.code, response.message, detailsFromMap(response.details));
    assert.ok(err instanceof ReservedError);
    assert.equal(err.successor, "ui");
  });

  it("toEnded carries handedOff", () => {
    const ended = toEnded(create(AcquireResponseSchema, {
      previous: { fence: 1n, owner: "o", end: TermEnd.RELEASED, endedAtMs: 1n, handedOff: true },
    }).previous!);
    assert.equal(ended.handedOff, true);
  });
});
