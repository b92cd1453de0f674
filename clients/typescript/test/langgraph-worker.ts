// An agent server on LangGraph.js (a StateGraph with a ToolNode, SqliteSaver
// on a file it shares with other such processes), for the adapter's
// process tests: POST /run runs one turn of a thread, whose model node asks
// the fake Responses API at MODEL_URL (the whole thread as Responses input
// items, so an unanswered call gets the provider's 400); GET /items lists
// the thread's messages.
//
// AGENT_OWNED=1: the graph through `@leasehold/client/langgraph` (`own`,
// `ledgeredTools`); otherwise LangGraph as a user has it today.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (owned), AGENT_TTL_MS,
// AGENT_WAIT_MS, AGENT_EFFECTS (a file each tool's side effects are appended to).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { appendFileSync } from "node:fs";
import { AIMessage, type BaseMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";
import { createClient } from "../src/index.js";
import { ledgeredTools, own, RUN } from "../src/langgraph.js";
import { failure, type Message, type RunBody, serveWorker } from "./worker-http.js";

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const owned = process.env.AGENT_OWNED === "1";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const waitMs = Number(process.env.AGENT_WAIT_MS ?? "0");
const effects = process.env.AGENT_EFFECTS ?? "/dev/null";
const modelUrl = process.env.MODEL_URL ?? "http://127.0.0.1:1/v1";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const shell = tool(
  async ({ ms }: { ms: number }, config: { toolCall?: { id?: string } }) => {
    const id = config.toolCall?.id ?? "?";
    appendFileSync(effects, `${name} start ${id}\n`);
    await sleep(ms);
    appendFileSync(effects, `${name} end ${id}\n`);
    return `ran for ${ms} ms`;
  },
  {
    name: "shell",
    description: "runs a shell command for ms milliseconds",
    schema: { type: "object", properties: { ms: { type: "number" } }, required: ["ms"] },
  },
);

/** The thread as Responses API input items. */
function toInput(messages: BaseMessage[]): unknown[] {
  return messages.flatMap((m): unknown[] => {
    if (m instanceof HumanMessage) return [{ role: "user", content: String(m.content) }];
    if (m instanceof ToolMessage) return [{ type: "function_call_output", call_id: m.tool_call_id, output: String(m.content) }];
    if (m instanceof AIMessage) {
      const calls = (m.tool_calls ?? []).map((c) => ({
        type: "function_call",
        call_id: c.id,
        name: c.name,
        arguments: JSON.stringify(c.args),
      }));
      return calls.length > 0 ? calls : [{ role: "assistant", content: String(m.content) }];
    }
    return [];
  });
}

async function model(
  state: typeof MessagesAnnotation.State,
  config: { configurable?: Record<string, unknown> },
): Promise<{ messages: BaseMessage[] }> {
  const run = config.configurable?.[RUN] as { lease?: { recovered: boolean } } | undefined;
  recovered ??= run?.lease?.recovered;
  const res = await fetch(`${modelUrl}/responses`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-session": String(config.configurable?.thread_id ?? "") },
    body: JSON.stringify({ model: "mock", input: toInput(state.messages) }),
  });
  const body = (await res.json()) as {
    error?: { message: string };
    output?: Array<{ type: string; call_id?: string; name?: string; arguments?: string; content?: Array<{ text: string }> }>;
  };
  if (!res.ok) throw new Error(`provider ${res.status}: ${body.error?.message}`);
  const item = body.output?.[0];
  if (item?.type === "function_call") {
    return {
      messages: [
        new AIMessage({
          content: "",
          tool_calls: [{ id: item.call_id, name: item.name ?? "", args: JSON.parse(item.arguments ?? "{}") as Record<string, unknown> }],
        }),
      ],
    };
  }
  return { messages: [new AIMessage(item?.content?.map((c) => c.text).join("") ?? "")] };
}

const compiled = new StateGraph(MessagesAnnotation)
  .addNode("agent", model)
  .addNode("tools", new ToolNode(owned ? ledgeredTools([shell]) : [shell]))
  .addEdge(START, "agent")
  .addConditionalEdges("agent", (s) => ((s.messages.at(-1) as AIMessage).tool_calls?.length ? "tools" : END))
  .addEdge("tools", "agent")
  .compile({ checkpointer: SqliteSaver.fromConnString(process.env.AGENT_DB ?? "langgraph.db") });
const graph = owned
  ? own(compiled, createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name }), { ttlMs, waitMs })
  : compiled;

let recovered: boolean | undefined;

async function turn(body: RunBody): Promise<unknown> {
  recovered = undefined;
  try {
    const out = (await graph.invoke(
      body.input === null ? null : { messages: [new HumanMessage(body.input)] },
      { configurable: { thread_id: body.id } },
    )) as typeof MessagesAnnotation.State;
    return { ok: true, output: String(out.messages.at(-1)?.content), recovered };
  } catch (err) {
    return failure(err);
  }
}

/** The thread's messages (a tool result with its content). */
async function items(thread: string): Promise<Message[]> {
  const state = await compiled.getState({ configurable: { thread_id: thread } });
  const messages = ((state.values as { messages?: BaseMessage[] }).messages ?? []) as BaseMessage[];
  return messages.map((m) => {
    if (m instanceof ToolMessage) return { role: "tool", text: `result:${m.tool_call_id}`, content: String(m.content) };
    if (m instanceof AIMessage && (m.tool_calls?.length ?? 0) > 0) {
      return { role: "assistant", text: (m.tool_calls ?? []).map((c) => `call:${c.id}`).join(" ") };
    }
    return { role: m instanceof HumanMessage ? "user" : "assistant", text: String(m.content) };
  });
}

serveWorker(turn, items);
