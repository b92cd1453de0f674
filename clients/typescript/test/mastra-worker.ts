// An agent server on Mastra (`@mastra/core` Agent, `@mastra/memory` on a
// LibSQL file it shares with other such processes), for the adapter's
// process tests: POST /run runs one turn of a thread against the fake
// Responses API at MODEL_URL; GET /items lists the thread's messages.
//
// AGENT_OWNED=1: the agent through `@leasehold/client/mastra` (`own`,
// `ledgered`); otherwise Mastra as a user has it today.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (owned), AGENT_TTL_MS,
// AGENT_EFFECTS (a file each tool's side effects are appended to).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { appendFileSync } from "node:fs";
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { LibSQLStore } from "@mastra/libsql";
import { Memory } from "@mastra/memory";
import { z } from "zod";
import { createClient } from "../src/index.js";
import { currentLease, ledgered, own } from "../src/mastra.js";
import { failure, type Message, type RunBody, serveWorker } from "./worker-http.js";

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const owned = process.env.AGENT_OWNED === "1";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const waitMs = Number(process.env.AGENT_WAIT_MS ?? "0");
const effects = process.env.AGENT_EFFECTS ?? "/dev/null";

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const shell = createTool({
  id: "shell",
  description: "runs a shell command for ms milliseconds",
  inputSchema: z.object({ ms: z.number() }),
  execute: async ({ ms }, context) => {
    const id = context?.agent?.toolCallId ?? "?";
    appendFileSync(effects, `${name} start ${id}\n`);
    await sleep(ms);
    appendFileSync(effects, `${name} end ${id}\n`);
    return { ran: ms };
  },
});

const storage = new LibSQLStore({ id: "threads", url: `file:${process.env.AGENT_DB ?? "mastra.db"}` });
const memory = new Memory({ storage, options: { lastMessages: 50 } });
const plain = new Agent({
  id: "assistant",
  name: "assistant",
  instructions: "You are a test agent.",
  model: { id: "openai/mock", url: process.env.MODEL_URL ?? "http://127.0.0.1:1/v1", apiKey: "test", api: "responses" },
  memory,
  tools: { shell: owned ? ledgered(shell) : shell },
});
const agent = owned
  ? own(plain, createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name }), { ttlMs, waitMs })
  : plain;

async function turn(body: RunBody): Promise<unknown> {
  let recovered: boolean | undefined;
  try {
    const result = await agent.generate(body.input ?? "", {
      memory: { thread: body.id, resource: "user" },
      prepareStep: () => {
        if (owned) recovered ??= currentLease().recovered;
        return undefined;
      },
    });
    return { ok: true, output: result.text, recovered };
  } catch (err) {
    return failure(err);
  }
}

/** The thread's messages (Mastra keeps a call, its result and the answer in one assistant message). */
async function items(thread: string): Promise<Message[]> {
  const { messages } = await memory.recall({ threadId: thread, resourceId: "user" });
  return messages.map((m) => ({
    role: m.role,
    text: (m.content.parts ?? [])
      .map((p) => {
        if (p.type === "text") return p.text;
        if (p.type === "tool-invocation") return `${p.toolInvocation.state}:${p.toolInvocation.toolCallId}`;
        return "";
      })
      .filter((t) => t !== "")
      .join(" "),
  }));
}

serveWorker(turn, items);
