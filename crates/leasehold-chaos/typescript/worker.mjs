// A chaos worker on the TypeScript client (`clients/typescript`, built to
// `dist/` by its `npm run build`).
//
// Run by the harness (`leasehold-chaos`), never by hand: it holds hot keys
// through `LeaseholdClient.acquire` (renewal in the background over the
// Session stream, or unary calls on the gRPC-Web transport, `gate()` before
// every write) and writes one JSON line per operation on stdout, in the
// harness's `Line` format, timed with `process.hrtime.bigint()` (libuv's
// CLOCK_MONOTONIC on Linux, the harness's clock) less the harness's origin.
// Store writes go to the harness the same way. The twin of
// `python/worker.py`; keep the two in step.
//
//   node worker.mjs CLIENT_MODULE URL WORKER_ID ORIGIN_NS SECONDS TTL_MS KEYS SEED TRANSPORT
//
// CLIENT_MODULE: the path of the client's `dist/index.js`. TRANSPORT:
// "grpc" or "grpc-web". Fences are written as JSON numbers: exact below
// 2^53, which a chaos run never reaches.

import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";

const [modulePath, url, worker, origin, seconds, ttlArg, keys, seed, transport] = process.argv.slice(2);
const lh = await import(pathToFileURL(modulePath).href);

const workerId = Number(worker);
const originNs = BigInt(origin);
const ttlMs = Number(ttlArg);
const keyNames = Array.from({ length: Number(keys) }, (_, k) => `chaos:${k}`);
const until = performance.now() + Number(seconds) * 1000;

// A small seeded generator (mulberry32), so a run's choices repeat with its seed.
let state = (Number(seed) * 1000 + workerId) >>> 0;
function random() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const choice = (items) => items[Math.floor(random() * items.length)];
const uniform = (lo, hi) => lo + random() * (hi - lo);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function now() {
  const t = process.hrtime.bigint() - originNs;
  return t > 0n ? Number(t) : 0;
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

function op(key, call, invoked, outcome) {
  emit({ Op: { worker: workerId, key, call, invoked, completed: now(), outcome } });
}

// The gRPC code of each error class the client throws for a server status.
const CODES = {
  busy: 10,
  permission_denied: 7,
  invalid_argument: 3,
  resource_exhausted: 8,
  unauthenticated: 16,
  unavailable: 14,
  quarantined: 9,
  compacted: 11,
  unsupported: 12,
};

// Statuses the server sent, as statuses; the client's own verdicts (a lease
// it decided was lost, a timeout, a transport failure) as unknown.
function failure(err) {
  if (err instanceof lh.BusyError) {
    return { Err: { code: 10, reason: null, fence: Number(err.fence), message: err.message } };
  }
  if (err instanceof lh.LeaseLostError || !(err instanceof lh.LeaseholdError)) {
    return { Unknown: `${err?.name ?? typeof err}: ${err?.message ?? String(err)}` };
  }
  const code = CODES[err.code];
  if (code === undefined || err instanceof lh.UnavailableError) {
    // UNAVAILABLE from this client may be its own verdict (a stream that
    // broke, a deadline): the outcome is unknown, as in the Python worker's
    // timeouts.
    return { Unknown: `${err.name}: ${err.message}` };
  }
  return { Err: { code, reason: null, fence: null, message: err.message } };
}

const client = lh.createClient({ baseUrl: url, transport, owner: `ts-${workerId}` });

while (performance.now() < until) {
  const key = choice(keyNames);
  const waitMs = choice([0, Math.floor(ttlMs / 2), ttlMs * 2]);
  const requestId = randomUUID();
  const call = { Acquire: { owner: `ts-${workerId}`, request_id: requestId, ttl_ms: ttlMs, wait_ms: waitMs } };
  let invoked = now();
  let lease;
  try {
    lease = await client.acquire(key, {
      ttlMs,
      waitMs,
      owner: `ts-${workerId}`,
      requestId,
      safetyMarginMs: Math.floor(ttlMs / 5),
      rpcTimeoutMs: 1500,
    });
  } catch (err) {
    op(key, call, invoked, failure(err));
    await sleep(uniform(10, 100));
    continue;
  }
  const fence = Number(lease.fence);
  op(key, call, invoked, { Ok: { Granted: { fence, ttl_ms: lease.ttlMs, replayed: lease.replayed } } });
  const end = performance.now() + uniform(ttlMs * 0.2, ttlMs * 2);
  while (performance.now() < end) {
    invoked = now();
    try {
      await lease.gate();
    } catch (err) {
      op(key, { Check: { fence } }, invoked, { Unknown: `gate: ${err?.message ?? String(err)}` });
      // Every loss the client reports is final for this lease.
      if (err instanceof lh.LeaseLostError) break;
      await sleep(ttlMs / 6);
      continue;
    }
    op(key, { Check: { fence } }, invoked, { Ok: "Live" });
    emit({ Write: { worker: workerId, key, fence } });
    await sleep(ttlMs / 6);
  }
  // Always released explicitly: a release the checker cannot see must not
  // end a term.
  const suspend = random() < 0.1;
  invoked = now();
  const release = { Release: { fence, suspend } };
  try {
    if (suspend) await lease.suspend();
    else await lease.release();
  } catch (err) {
    op(key, release, invoked, failure(err));
    continue;
  }
  op(key, release, invoked, { Ok: "Released" });
}
client.close();
// Renewal timers of a lease the loop gave up on must not keep the process alive.
process.exit(0);
