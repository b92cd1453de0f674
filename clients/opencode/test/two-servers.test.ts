// The field report's regression test, on the real `opencode serve`: two
// servers on different loopback ports over one data directory drive one
// session, with a fake provider that enforces the pairing rule and holds a
// tool open. OpenCode 1.18.33 sends the other server's running call as
// "[Tool execution was interrupted]", so the provider's 400 alone would not
// show the corruption: overlapOf() finds it from what the models were sent
// (a request while another server's call was live, a live call reported
// interrupted, a real result no model saw).
//
// The servers of all variants start at once in before() (each variant has
// its own data directory) and each runs one whole turn first, so the races
// below are between warm servers: the test lets the first server's tool go
// only once the second server's run has reached the model, or its prompt
// has waited HOLD_MS. Without the plugin every run overlaps; with it none.
//
// LEASEHOLD_OPENCODE_RUNS: seeded runs per variant (default 3).

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { createClient, type LeaseholdClient } from "@leasehold/client";
import { type MockProvider, type Overlap, overlapOf, overlapped, repliedBy, startMockProvider } from "./mock-provider.js";
import {
  api,
  busy,
  createSession,
  messages,
  pluginSpec,
  type Proc,
  prompt,
  promptAsync,
  sandbox,
  startLeasehold,
  startOpencode,
  subscribe,
  until,
  warm,
} from "./servers.js";

const RUNS = Number(process.env.LEASEHOLD_OPENCODE_RUNS ?? "3");
/** How long the first server's tool stays open at most once the second server was sent its prompt. */
const HOLD_MS = 2_500;

let root: string;
let mock: MockProvider;
let lock: Proc;
let lh: LeaseholdClient;
const started: Proc[] = [];

/** The servers, by label; started in before(). */
const servers = new Map<string, Proc>();

/** A small seeded generator (mulberry32), so a failing run can be replayed by its seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function opencode(label: string, dir: string, plugin: Record<string, unknown> | undefined): Promise<Proc> {
  const p = await startOpencode(dir, mock.baseURL(label), plugin === undefined ? [] : [pluginSpec(plugin)]);
  started.push(p);
  servers.set(label, p);
  return p;
}

function server(label: string): Proc {
  const p = servers.get(label);
  assert.ok(p !== undefined, `no server ${label}`);
  return p;
}

function signal(callID: string): void {
  const c = mock.calls.get(callID);
  assert.ok(c !== undefined, `no call ${callID}`);
  writeFileSync(c.signal, "");
}

/** The call the mock gave `label` in `session`, once it gave one. */
async function callOf(label: string, session: string): Promise<string> {
  let id: string | undefined;
  try {
    await until(`a tool call for ${label}`, () => {
      id = [...mock.calls.values()].find((c) => c.server === label && c.session === session)?.callID;
      return id !== undefined;
    });
  } catch (err) {
    throw new Error(`${String(err)}; the server's output:\n${server(label).output()}`);
  }
  return id!;
}

function modelCalls(label: string, session: string): number {
  return mock.requests.filter((q) => q.session === session && q.server === label && q.chat).length;
}

async function idle(procs: Proc[], session: string): Promise<void> {
  await until("the session idle on every server", async () => {
    for (const s of procs) if (await busy(s, session)) return false;
    return true;
  });
}

interface Round {
  readonly session: string;
  readonly second: { status: number; json: unknown; text: string };
  readonly overlap: Overlap;
  /** The server whose model call wrote the reply to the second server's prompt. */
  readonly secondRepliedBy: string | undefined;
}

/**
 * One seeded run: server `first` starts a slow tool in a new session; a
 * seeded while later server `second` is sent a prompt for the same session;
 * the tool is let go once `second`'s run has called the model, or its prompt
 * has been pending HOLD_MS (a run kept off the model stays off it that long),
 * and a seeded while after that.
 */
async function round(first: string, second: string, seed: number): Promise<Round> {
  const r = rng(seed);
  const a = server(first);
  const b = server(second);
  const session = await createSession(a);
  await promptAsync(a, session, "slow: run the tool");
  const call = await callOf(first, session);
  await sleep(Math.floor(r() * 150));
  const sent = Date.now();
  let answered = false;
  const pending = prompt(b, session, "second prompt, from the other server").finally(() => (answered = true));
  await until("the second server's model call or the hold", () => answered || modelCalls(second, session) > 0 || Date.now() - sent >= HOLD_MS, HOLD_MS + 5_000);
  await sleep(Math.floor(r() * 150));
  signal(call);
  const answer = await pending;
  await idle([a, b], session);
  const parts = (answer.json as { parts?: Array<{ metadata?: { openai?: { itemId?: string } } }> } | undefined)?.parts ?? [];
  return { session, second: answer, overlap: overlapOf(mock, session), secondRepliedBy: repliedBy(mock, parts) };
}

before(async () => {
  root = mkdtempSync(join(tmpdir(), "leasehold-opencode-"));
  mkdirSync(join(root, "signals"));
  mock = await startMockProvider(join(root, "signals"));
  lock = await startLeasehold(root);
  lh = createClient({ baseUrl: lock.url });
  for (const d of ["bare", "owned", "recovery"]) sandbox(join(root, d));
  const owned = { url: lock.url, ttlMs: 10_000, recover: false };
  const recovery = { url: lock.url, ttlMs: 3_000, waitMs: 300 };
  // Each variant's first server alone on its fresh data directory: two
  // `opencode serve` starting at once on one fresh directory race on its
  // migrations (one exits with "Failed query: CREATE TABLE workspace"),
  // which is not the race under test. The directories are separate, so the
  // variants start side by side.
  await Promise.all([
    opencode("bare1", join(root, "bare"), undefined),
    // own1 waits briefly (it is the refused server), own2 long (it waits out own1's run).
    opencode("own1", join(root, "owned"), { ...owned, waitMs: 300 }),
    opencode("rec0", join(root, "recovery"), recovery),
  ]);
  await Promise.all([
    opencode("bare2", join(root, "bare"), undefined),
    opencode("own2", join(root, "owned"), { ...owned, waitMs: 20_000 }),
    // Started now but sent nothing until the owner is dead: OpenCode loads
    // the plugin (and so runs its recovery) at a server's first request for
    // the directory, which is the moment the recovery test controls.
    opencode("rec1", join(root, "recovery"), recovery),
    opencode("rec2", join(root, "recovery"), recovery),
  ]);
  await Promise.all(["bare1", "bare2", "own1", "own2"].map((l) => warm(server(l))));
  // rec0's 3 s lease (short, so the recovery test need not wait long for it
  // to expire) alone: warmed among four others, its first turn twice ended
  // in a 500 on this loaded machine.
  await warm(server("rec0"));
});

after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  lh?.close();
  await lock?.stop();
  await mock?.close();
  rmSync(root, { recursive: true, force: true });
});

test("without the plugin, two servers drive one session and a live tool is reported interrupted: every run", async () => {
  let overlaps = 0;
  for (let seed = 1; seed <= RUNS; seed++) {
    const { overlap, secondRepliedBy } = await round("bare1", "bare2", seed);
    if (overlapped(overlap) || secondRepliedBy !== "bare2") overlaps++;
    else console.log(`seed ${seed}: no overlap: ${JSON.stringify(overlap)}, the second prompt answered by ${secondRepliedBy}`);
  }
  console.log(`without the plugin: ${overlaps}/${RUNS} runs overlapped`);
  assert.equal(overlaps, RUNS, "a run without the plugin did not overlap: the test would not see the bug");
});

test("with the plugin, the second server's prompt waits for the first run: no overlap", async () => {
  let overlaps = 0;
  for (let seed = 1; seed <= RUNS; seed++) {
    const { session, second, overlap, secondRepliedBy } = await round("own1", "own2", seed);
    const none: Overlap = { concurrent: 0, liveInterrupted: 0, unseen: 0, rejected: 0 };
    if (overlapped(overlap)) overlaps++;
    assert.deepEqual(overlap, none, `seed ${seed} overlapped`);
    assert.equal(second.status, 200, `the waiting prompt failed: ${second.text}`);
    // The second server's own model call answered its prompt, on a history
    // with the first one's real result.
    assert.equal(secondRepliedBy, "own2", "the second prompt was not answered by its own server's model call");
    const call = [...mock.calls.values()].find((c) => c.session === session)!;
    const fromB = mock.requests.filter((q) => q.session === session && q.server === "own2" && q.chat);
    assert.ok(fromB.length > 0 && fromB.every((q) => q.input.some((i) => i.type === "function_call_output" && JSON.stringify(i.output).includes(call.result))));
    const st = await lh.get(`opencode:session:${session}`);
    assert.equal(st.lease, undefined, "the lease is still held after both runs went idle");
    assert.equal(st.lastEnded?.end, "released");
  }
  console.log(`with the plugin: ${overlaps}/${RUNS} runs overlapped`);
  assert.equal(overlaps, 0);
});

/** own2 holds a slow tool in a new session; resolves with the session and the call. */
async function holdOnOwn2(): Promise<{ session: string; call: string }> {
  const session = await createSession(server("own2"));
  await promptAsync(server("own2"), session, "slow: run the tool");
  return { session, call: await callOf("own2", session) };
}

test("with the plugin, a prompt that waits too long is refused as busy, unsaved, and no model is called", async () => {
  const [a, b] = [server("own2"), server("own1")];
  const { session, call } = await holdOnOwn2();
  const before = (await messages(b, session)).length;
  const refused = await prompt(b, session, "second prompt, refused");
  // OpenCode 1.18.33 answers a hook's throw with its generic 500 (the
  // message goes to its log under the ref it returns; see docs/opencode.md).
  assert.equal(refused.status, 500);
  assert.equal((await messages(b, session)).length, before, "the refused prompt was saved");
  assert.equal(modelCalls("own1", session), 0, "the refused server called the model");
  const ref = (refused.json as { data?: { ref?: string } } | undefined)?.data?.ref ?? "";
  assert.match(ref, /^err_/);
  const logged = b.output().split("\n").find((l) => l.includes(`ref=${ref}`)) ?? "";
  assert.match(logged, /SessionBusyError: session \S+ is busy: another server \(.+\) is running it and did not finish within 300 ms; the prompt was not saved/);
  signal(call);
  await idle([a, b], session);
  assert.ok(!overlapped(overlapOf(mock, session)));
});

test("with the plugin, an async prompt refused as busy is dropped unsaved and published as session.error", async () => {
  const [a, b] = [server("own2"), server("own1")];
  const events = await subscribe(b);
  try {
    const { session, call } = await holdOnOwn2();
    const before = (await messages(b, session)).length;
    // prompt_async answers 204 before any hook runs: the refusal can only
    // reach its caller as an event.
    const r = await api(b, "POST", `/session/${session}/prompt_async`, { parts: [{ type: "text", text: "async prompt, refused" }] });
    assert.equal(r.status, 204);
    let error: Record<string, unknown> | undefined;
    await until("session.error on the refusing server's event stream", () => {
      error = events.events.find((e) => e.type === "session.error" && e.properties?.sessionID === session)?.properties;
      return error !== undefined;
    }, 10_000);
    assert.equal((await messages(b, session)).length, before, "the refused prompt was saved");
    assert.equal(modelCalls("own1", session), 0, "the refused server called the model");
    // OpenCode wraps what the hook threw: UnknownError, with the error's
    // name, message and stack (Cause.pretty) as its message.
    const e = error?.error as { name?: string; data?: { message?: string } } | undefined;
    assert.equal(e?.name, "UnknownError");
    assert.match(e?.data?.message ?? "", /^SessionBusyError: session \S+ is busy: another server \(.+\) is running it and did not finish within 300 ms; the prompt was not saved/);
    signal(call);
    await idle([a, b], session);
    assert.ok(!overlapped(overlapOf(mock, session)));
    // The refusal did not disturb the owner's lease: it ends released.
    assert.equal((await lh.get(`opencode:session:${session}`)).lastEnded?.end, "released");
  } finally {
    events.close();
  }
});

test("after kill -9 of the owner mid-tool, of two servers loading the project at once exactly one resumes the session", async () => {
  const owner = server("rec0");
  const session = await createSession(owner);
  await promptAsync(owner, session, "slow: run the tool");
  const call = await callOf("rec0", session);
  await until("the tool running", async () =>
    (await messages(owner, session)).some((m) => m.parts.some((p) => p.type === "tool" && p.state?.status === "running")),
  );
  await owner.kill();
  const key = `opencode:session:${session}`;
  await until("the dead owner's lease listed recoverable", async () => (await lh.get(key)).recoverable, 10_000);
  const [c, d] = [server("rec1"), server("rec2")];
  // OpenCode loads plugins with the project, at a server's first request for it.
  await Promise.all([c, d].map((s) => fetch(s.url + "/session/status").then((r) => r.text())));
  const resumed = () => mock.requests.filter((q) => q.session === session && q.chat && q.server !== "rec0");
  await until("a resumed run", () => resumed().length > 0);
  await idle([c, d], session);
  await sleep(1_000); // a second resume would have started by now
  const resumedBy = new Set(resumed().map((q) => q.server));
  assert.equal(resumedBy.size, 1, `resumed by ${[...resumedBy].join(", ")}`);
  // The loser saw the lease taken and left the session alone: it sent no
  // resume prompt (one refused at chat.message would be logged here).
  for (const s of [c, d]) {
    const refused = s.output().split("\n").filter((l) => l.includes(session) && l.includes("SessionBusyError"));
    assert.deepEqual(refused, [], "a recoverer sent its resume prompt without the lease");
  }
  assert.ok(resumed().every((q) => q.rejected === undefined), "the resumed run sent the dead call without an output");
  assert.ok(resumed().some((q) => q.input.some((i) => i.type === "function_call" && i.call_id === call)));
  // Exactly one resume prompt was saved: a loser that got as far as saving
  // one would leave it for the session's next run.
  const resumes = (await messages(c, session)).filter((m) => m.info.role === "user" && m.parts.some((p) => p.text?.startsWith("The server that was running this session stopped")));
  assert.equal(resumes.length, 1, "resume prompts saved");
  const st = await lh.get(key);
  assert.equal(st.lease, undefined);
  assert.equal(st.lastEnded?.end, "released");
  assert.equal(st.recoverable, false);
});
