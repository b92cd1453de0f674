// What leasehold's TypeScript framework adapters add to a run, against the
// same run without them, in one process and one run of this script (never
// pass/fail). Needs the TypeScript client's tests built (they hold the fake
// Responses server and the test server launcher):
//
//   cd clients/typescript && npm run build:test
//   LEASEHOLD_BIN=../../target/release/leasehold node bench/adapters.mjs [runs]
//
// Each run is one turn on a new session / thread / chat: a tool call and an
// answer (two model calls), so every owned run acquires, claims, registers
// and settles one tool call, and releases. Plain and owned runs alternate,
// so drift on a busy machine hits both alike. Prints p50 and p90 per run and
// the added time.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

// Bare specifiers resolve from this package (ESM, one copy of each framework).
const load = (spec) => import(spec);
const built = (path) => import(new URL(`../dist-test/${path}`, import.meta.url).href);

const runs = Number(process.argv[2] ?? "40");
const { startMockResponses } = await built("test/mock-responses.js");
const { startServer } = await built("test/server.js");
const { createClient } = await built("src/index.js");
const { script } = await built("test/framework-workers.js");

const mock = await startMockResponses(script);
const server = await startServer();
const lh = createClient({ baseUrl: server.baseUrl, owner: "bench" });
const dir = mkdtempSync(join(tmpdir(), "adapters-ts-"));

const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

async function compare(name, plain, owned) {
  const a = [];
  const b = [];
  for (let i = 0; i < 5; i++) {
    await plain(`warm-${i}`);
    await owned(`warm-${i}`);
  }
  for (let i = 0; i < runs; i++) {
    let t = performance.now();
    await plain(`p-${i}`);
    a.push(performance.now() - t);
    t = performance.now();
    await owned(`o-${i}`);
    b.push(performance.now() - t);
  }
  const [p50a, p50b] = [pct(a, 50), pct(b, 50)];
  console.log(
    `${name.padEnd(22)} plain p50 ${p50a.toFixed(2)} ms p90 ${pct(a, 90).toFixed(2)} ms | owned p50 ${p50b.toFixed(2)} ms p90 ${pct(b, 90).toFixed(2)} ms | added ${(p50b - p50a).toFixed(2)} ms per run`,
  );
}

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
      (id) => sdk.run(plainAgent, "run shell 0", { session: new owned.SQLiteSession(id, db) }),
      (id) => owned.run(lh, ownedAgent, "run shell 0", { session: new owned.SQLiteSession(id, db) }),
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
      () => ai.generateText(args()),
      (id) => owned.generateText(lh, `chat:${id}`, args()),
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
    const model = async (state) => {
      const last = state.messages.at(-1);
      if (last instanceof ToolMessage) return { messages: [new AIMessage("done")] };
      return { messages: [new AIMessage({ content: "", tool_calls: [{ id: `call_${++n}`, name: "shell", args: {} }] })] };
    };
    const graph = (tools) =>
      new StateGraph(MessagesAnnotation)
        .addNode("agent", model)
        .addNode("tools", new ToolNode(tools))
        .addEdge(START, "agent")
        .addConditionalEdges("agent", (s) => (s.messages.at(-1).tool_calls?.length ? "tools" : END))
        .addEdge("tools", "agent");
    const plain = graph([shell]).compile({ checkpointer: SqliteSaver.fromConnString(join(dir, "plain.db")) });
    const owned = lg.own(graph(lg.ledgeredTools([shell])).compile({ checkpointer: SqliteSaver.fromConnString(join(dir, "owned.db")) }), lh);
    const turn = (g) => (id) => g.invoke({ messages: [new HumanMessage("ls")] }, { configurable: { thread_id: id } });
    await compare("langgraph.js (3 steps)", turn(plain), turn(owned));
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
    await compare("mastra (one turn)", turn(plain), turn(own));
  }
} finally {
  lh.close();
  await server.close();
  await mock.close();
  rmSync(dir, { recursive: true, force: true });
}
