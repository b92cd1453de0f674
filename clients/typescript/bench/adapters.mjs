// What leasehold's TypeScript framework adapters add to a run, against the
// same run without them, in one process and one run of this script (never
// pass/fail). Needs the TypeScript client's tests built (they hold the fake
// Responses server and the test server launcher) and a release server:
//
//   cargo build --release -p leasehold-server
//   cd clients/typescript && npm run build:test
//   LEASEHOLD_BIN=../../target/release/leasehold node bench/adapters.mjs [runs]
//
// Each run is one turn on a new session / thread / chat: a tool call and an
// answer (two model calls), so every owned run acquires, claims, registers
// and settles one tool call, and releases. Plain and owned runs alternate,
// so drift on a busy machine hits both alike. Prints p50 and p99 per run,
// the added time per run and per step, and the server round trips and
// commits of an owned run (the server's Prometheus counters around a pass
// of runs of their own); then the lease operations alone from the same
// client (acquire + release, a gate, a ledgered call's Begin + Settle) and
// the disk's floor in the server's directory (fdatasync, a SQLite WAL
// synchronous=FULL commit). Profile with `node --cpu-prof bench/adapters.mjs`.

import { closeSync, fdatasyncSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { createServer } from "node:net";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";

// Bare specifiers resolve from this package (ESM, one copy of each framework).
const load = (spec) => import(spec);
const built = (path) => import(new URL(`../dist-test/${path}`, import.meta.url).href);

const runs = Number(process.argv[2] ?? "40");
const COUNTED = 10;
const { startMockResponses } = await built("test/mock-responses.js");
const { startServer } = await built("test/server.js");
const { createClient } = await built("src/index.js");
const { script } = await built("test/framework-workers.js");

const freePort = () =>
  new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

console.log(`load average ${loadavg().map((x) => x.toFixed(2)).join(" ")}, ${runs} runs`);
const dir = mkdtempSync(join(tmpdir(), "adapters-ts-"));
const metricsAt = `127.0.0.1:${await freePort()}`;
const mock = await startMockResponses(script);
const server = await startServer(dir, "127.0.0.1:0", ["--sync", process.env.LEASEHOLD_BENCH_SYNC ?? "full", "--metrics-listen", metricsAt]);
const lh = createClient({ baseUrl: server.baseUrl, owner: "bench" });

const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const ms = (x) => `${x.toFixed(2)} ms`;

/** The server's request counts by RPC and its commits. */
async function metrics() {
  const text = await (await fetch(`http://${metricsAt}/metrics`)).text();
  const out = { commits: 0 };
  for (const m of text.matchAll(/^leasehold_request_seconds_count\{rpc="([^"]+)"\} (\d+)/gm)) out[m[1]] = Number(m[2]);
  const c = /^leasehold_commits_total (\d+)/m.exec(text);
  if (c !== null) out.commits = Number(c[1]);
  // Seconds the server spent answering (arrival to answer, commits included).
  out.serverSeconds = 0;
  for (const m of text.matchAll(/^leasehold_request_seconds_sum\{rpc="[^"]+"\} (\S+)/gm)) out.serverSeconds += Number(m[1]);
  const cs = /^leasehold_commit_seconds_sum (\S+)/m.exec(text);
  out.commitSeconds = cs === null ? 0 : Number(cs[1]);
  return out;
}

/** Round trips and commits per call of `fn`, over a pass of its own. */
async function counted(fn) {
  const before = await metrics();
  for (let i = 0; i < COUNTED; i++) await fn(`count-${i}-${Math.random()}`);
  const after = await metrics();
  const per = {};
  for (const k of Object.keys(after)) {
    const d = (after[k] - (before[k] ?? 0)) / COUNTED;
    if (d !== 0) per[k] = d;
  }
  const commits = per.commits ?? 0;
  const serverMs = (per.serverSeconds ?? 0) * 1e3;
  const commitMs = (per.commitSeconds ?? 0) * 1e3;
  delete per.commits;
  delete per.serverSeconds;
  delete per.commitSeconds;
  const trips = Object.values(per).reduce((a, b) => a + b, 0);
  const shown = Object.entries(per)
    .sort()
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
  return `${trips} round trips (${shown || "none"}), ${commits} commits; in the server ${ms(serverMs)} (commits ${ms(commitMs)})`;
}

/**
 * Alternates plain runs, owned runs and `ops` (the owned run's lease
 * operations alone, from the same client: what the round trips and commits
 * explain), and prints what the adapter adds and what `ops` leaves unexplained.
 */
async function compare(name, steps, plain, owned, ops) {
  const a = [];
  const b = [];
  const c = [];
  // This process's CPU time per variant (the fake model server's included,
  // alike in each): less disturbed by a loaded machine than wall time.
  const cpu = new Map([
    [a, 0],
    [b, 0],
    [c, 0],
  ]);
  for (let i = 0; i < 5; i++) {
    await plain(`warm-${i}`);
    await owned(`warm-${i}`);
    await ops(`warm-${i}`);
  }
  for (let i = 0; i < runs; i++) {
    for (const [fn, xs, id] of [
      [plain, a, `p-${i}`],
      [owned, b, `o-${i}`],
      [ops, c, `x-${i}`],
    ]) {
      const used = process.cpuUsage();
      const t = performance.now();
      await fn(id);
      xs.push(performance.now() - t);
      const d = process.cpuUsage(used);
      cpu.set(xs, cpu.get(xs) + (d.user + d.system) / 1e3);
    }
  }
  const line = (q) => {
    const added = pct(b, q) - pct(a, q);
    return (
      `p${q} plain ${ms(pct(a, q))} owned ${ms(pct(b, q))} added ${ms(added)} per run, ${ms(added / steps)} per step; ` +
      `its lease operations alone ${ms(pct(c, q))}, the rest ${ms(added - pct(c, q))}`
    );
  };
  console.log(`${name.padEnd(24)} ${line(50)}`);
  console.log(`${"".padEnd(24)} ${line(99)}`);
  const [ca, cb, cc] = [a, b, c].map((xs) => cpu.get(xs) / runs);
  console.log(
    `${"".padEnd(24)} CPU per run (this process): plain ${ms(ca)} owned ${ms(cb)} added ${ms(cb - ca)}; lease operations alone ${ms(cc)}`,
  );
  console.log(`${"".padEnd(24)} owned run: ${await counted(owned)}`);
  return { p50: pct(b, 50) - pct(a, 50), p99: pct(b, 99) - pct(a, 99) };
}

/**
 * An owned run's lease operations without the framework: Acquire, the claim
 * when the adapter makes one (a fence row upserted in one transaction of a
 * WAL synchronous=FULL SQLite file beside the store, as the claim does),
 * one ledgered call (Begin, Settle) unless `ledgered` is false, Release.
 */
function leaseOps(claimDb, ledgered = true) {
  let n = 0;
  return async (id) => {
    const lease = await lh.acquire(`ops:${id}:${++n}:${Math.random()}`);
    if (claimDb !== undefined) claimDb.claim.run(lease.key, lease.fence);
    if (ledgered) await lease.runToolCalls([{ callId: "c1", name: "shell" }], async () => "ok");
    await lease.release();
  };
}

async function claimDb(file) {
  const Database = (await load("better-sqlite3")).default;
  const db = new Database(join(dir, file));
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = FULL");
  db.exec("CREATE TABLE IF NOT EXISTS fence (key TEXT PRIMARY KEY, fence INTEGER NOT NULL)");
  const upsert = db.prepare("INSERT INTO fence (key, fence) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET fence = excluded.fence");
  return { claim: { run: db.transaction((k, f) => upsert.run(k, f)).immediate } };
}

/** Times `fn` `n` times (after a warm-up): p50 and p99. */
async function timed(n, fn) {
  for (let i = 0; i < 5; i++) await fn(`warm-${i}`);
  const xs = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn(`t-${i}`);
    xs.push(performance.now() - t);
  }
  return `p50 ${ms(pct(xs, 50))} p99 ${ms(pct(xs, 99))}`;
}

/** fdatasync of a 4 KiB write, and one-row SQLite commits (WAL, synchronous=FULL), in `where`. */
async function diskFloor(where) {
  const Database = (await load("better-sqlite3")).default;
  const n = 300;
  const f = [];
  const fd = openSync(join(where, "floor.bin"), "w");
  const buf = Buffer.alloc(4096, 7);
  for (let i = 0; i < n; i++) {
    writeSync(fd, buf, 0, buf.length, (i % 16) * 4096);
    const t = performance.now();
    fdatasyncSync(fd);
    f.push(performance.now() - t);
  }
  closeSync(fd);
  rmSync(join(where, "floor.bin"));
  const db = new Database(join(where, "floor.db"));
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = FULL");
  db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)");
  const insert = db.prepare("INSERT INTO t (v) VALUES (?)");
  const s = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    db.exec("BEGIN IMMEDIATE");
    insert.run(buf.subarray(0, 200));
    db.exec("COMMIT");
    s.push(performance.now() - t);
  }
  db.close();
  for (const suffix of ["", "-wal", "-shm"]) rmSync(join(where, `floor.db${suffix}`), { force: true });
  return { fdatasync: f, sqlite: s };
}

const floorBefore = await diskFloor(dir);

try {
  // OpenAI Agents SDK: sdk.run on SQLiteSession vs @leasehold/client/agents run.
  {
    const sdk = await load("@openai/agents");
    const { z } = await load("zod");
    const OpenAI = (await load("openai")).default;
    const Database = (await load("better-sqlite3")).default;
    const owned = await built("src/agents.js");
    sdk.setTracingDisabled(true);
    const db = new Database(join(dir, "agents.db"));
    db.pragma("journal_mode = WAL");
    const shell = sdk.tool({ name: "shell", description: "d", parameters: z.object({ ms: z.number() }), execute: async () => "ok" });
    const model = new sdk.OpenAIResponsesModel(new OpenAI({ baseURL: mock.baseURL, apiKey: "x", maxRetries: 0 }), "mock");
    const plainAgent = new sdk.Agent({ name: "a", instructions: "t", model, tools: [shell] });
    const ownedAgent = new sdk.Agent({ name: "a", instructions: "t", model, tools: [owned.ledgered(shell)] });
    await compare(
      "agents (one turn)",
      2,
      (id) => sdk.run(plainAgent, "run shell 0", { session: new owned.SQLiteSession(id, db) }),
      (id) => owned.run(lh, ownedAgent, "run shell 0", { session: new owned.SQLiteSession(id, db) }),
      leaseOps(await claimDb("agents-claim.db")),
    );
  }
  // AI SDK: ai.generateText vs @leasehold/client/ai-sdk generateText.
  {
    const ai = await load("ai");
    const { createOpenAI } = await load("@ai-sdk/openai");
    const { z } = await load("zod");
    const owned = await built("src/ai-sdk.js");
    const openai = createOpenAI({ baseURL: mock.baseURL, apiKey: "x" });
    const args = () => ({
      model: openai.responses("mock"),
      prompt: "run shell 0",
      tools: { shell: ai.tool({ inputSchema: z.object({ ms: z.number() }), execute: async () => "ok" }) },
      stopWhen: ai.stepCountIs(4),
    });
    await compare(
      "ai-sdk (one turn)",
      2,
      () => ai.generateText(args()),
      (id) => owned.generateText(lh, `chat:${id}`, args()),
      leaseOps(undefined),
    );
  }
  // LangGraph.js: the test graph (model -> tools -> model) on SqliteSaver, plain and own()ed.
  {
    const { AIMessage, HumanMessage, ToolMessage } = await load("@langchain/core/messages");
    const { tool } = await load("@langchain/core/tools");
    const { END, MessagesAnnotation, START, StateGraph } = await load("@langchain/langgraph");
    const { ToolNode } = await load("@langchain/langgraph/prebuilt");
    const { SqliteSaver } = await load("@langchain/langgraph-checkpoint-sqlite");
    const lg = await built("src/langgraph.js");
    const shell = tool(async () => "ok", { name: "shell", description: "d", schema: { type: "object", properties: {} } });
    let n = 0;
    // `rounds` tool calls, one per model turn: 2 * rounds + 1 super-steps.
    const modelOf = (rounds) => async (state) => {
      const results = state.messages.filter((m) => m instanceof ToolMessage).length;
      if (results >= rounds) return { messages: [new AIMessage("done")] };
      return { messages: [new AIMessage({ content: "", tool_calls: [{ id: `call_${++n}`, name: "shell", args: {} }] })] };
    };
    const graph = (tools, rounds = 1) =>
      new StateGraph(MessagesAnnotation)
        .addNode("agent", modelOf(rounds))
        .addNode("tools", new ToolNode(tools))
        .addEdge(START, "agent")
        .addConditionalEdges("agent", (s) => (s.messages.at(-1).tool_calls?.length ? "tools" : END))
        .addEdge("tools", "agent");
    const plain = graph([shell]).compile({ checkpointer: SqliteSaver.fromConnString(join(dir, "plain.db")) });
    const owned = lg.own(graph(lg.ledgeredTools([shell])).compile({ checkpointer: SqliteSaver.fromConnString(join(dir, "owned.db")) }), lh);
    const turn = (g) => (id) => g.invoke({ messages: [new HumanMessage("ls")] }, { configurable: { thread_id: id } });
    await compare("langgraph.js (3 steps)", 3, turn(plain), turn(owned), leaseOps(await claimDb("lg-claim.db")));
    // The adapter's cost per further super-step, without the ledger: the
    // slope between 3 and 19 super-steps of the same graph, plain tools.
    const saver = (file) => ({ checkpointer: SqliteSaver.fromConnString(join(dir, file)) });
    const bare = leaseOps(await claimDb("lg-claim-bare.db"), false);
    const added = [];
    for (const rounds of [1, 9]) {
      const steps = 2 * rounds + 1;
      const p = graph([shell], rounds).compile(saver(`plain-${rounds}.db`));
      const o = lg.own(graph([shell], rounds).compile(saver(`owned-${rounds}.db`)), lh);
      added.push(await compare(`langgraph.js (${steps}, no ledger)`, steps, turn(p), turn(o), bare));
    }
    const [three, nineteen] = added;
    console.log(
      `langgraph.js own() per further super-step: p50 ${ms((nineteen.p50 - three.p50) / 16)}, p99 ${ms((nineteen.p99 - three.p99) / 16)}`,
    );
  }
  // Mastra: an Agent with LibSQL memory, plain and own()ed.
  {
    const { Agent } = await load("@mastra/core/agent");
    const { createTool } = await load("@mastra/core/tools");
    const { LibSQLStore } = await load("@mastra/libsql");
    const { Memory } = await load("@mastra/memory");
    const { z } = await load("zod");
    const owned = await built("src/mastra.js");
    const make = (file, wrap) =>
      new Agent({
        id: "a",
        name: "a",
        instructions: "t",
        model: { id: "openai/mock", url: mock.baseURL, apiKey: "x", api: "responses" },
        memory: new Memory({ storage: new LibSQLStore({ id: file, url: `file:${join(dir, file)}` }), options: { lastMessages: 20 } }),
        tools: { shell: wrap(createTool({ id: "shell", description: "d", inputSchema: z.object({ ms: z.number() }), execute: async () => ({ ok: true }) })) },
      });
    const plain = make("plain-mastra.db", (t) => t);
    const own = owned.own(make("owned-mastra.db", owned.ledgered), lh);
    const turn = (agent) => (id) => agent.generate("run shell 0", { memory: { thread: id, resource: "u" } });
    // Mastra's LibSQL memory has no fence in its transactions: no claim, a
    // Check before each step and each memory write instead (not in `ops`).
    await compare("mastra (one turn)", 2, turn(plain), turn(own), leaseOps(undefined));
    // What Mastra itself does more when a run passes the four callbacks the
    // adapter passes (prepareStep, onFinish, onError, onAbort), as no-ops on
    // the plain agent, without leasehold.
    const callbacks = {
      prepareStep: async () => undefined,
      onFinish: async () => undefined,
      onError: async () => undefined,
      onAbort: async () => undefined,
    };
    const withCallbacks = (agent) => (id) => agent.generate("run shell 0", { memory: { thread: id, resource: "u" }, ...callbacks });
    await compare("mastra, callbacks alone", 2, turn(plain), withCallbacks(plain), async () => undefined);
  }
  // The lease operations alone, from the same client.
  {
    console.log("lease operations alone:");
    console.log(`  acquire + release       ${await timed(runs, async (id) => (await lh.acquire(`ops:${id}:${Math.random()}`)).release())}`);
    const held = await lh.acquire("ops:held");
    console.log(`  gate (Check)            ${await timed(runs, () => held.gate())}`);
    console.log(`  gate, storage-fenced    ${await timed(runs, () => held.gate({ storageFenced: true }))}`);
    let n = 0;
    const call = async () => {
      const id = `c${++n}`;
      await held.runToolCalls([{ callId: id, name: "shell" }], async () => "ok");
    };
    console.log(`  ledgered call (Begin + Settle) ${await timed(runs, call)}; ${await counted(call)}`);
    await held.release();
  }
  const floorAfter = await diskFloor(dir);
  console.log("disk floor in the server's directory, before / after:");
  for (const [k, what] of [["fdatasync", "fdatasync, 4 KiB"], ["sqlite", "SQLite WAL FULL commit"]]) {
    console.log(
      `  ${what}: p50 ${ms(pct(floorBefore[k], 50))} / ${ms(pct(floorAfter[k], 50))}, p99 ${ms(pct(floorBefore[k], 99))} / ${ms(pct(floorAfter[k], 99))}`,
    );
  }
  console.log(`load average at the end ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
} finally {
  lh.close();
  await server.close();
  await mock.close();
  rmSync(dir, { recursive: true, force: true });
}
