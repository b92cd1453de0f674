// An agent server on the OpenAI Agents SDK (`@openai/agents`), for the
// adapter's process tests: an HTTP server on loopback whose POST /run runs
// one turn of a session stored in a SQLite file it shares with other such
// processes, against the fake Responses API at MODEL_URL.
//
// AGENT_OWNED=1: through `@leasehold/client/agents` (`run`, `ledgered`,
// its fenced SQLiteSession); otherwise the SDK's own `run` on the same
// session store, as a user has it today.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (owned), AGENT_TTL_MS, AGENT_WAIT_MS,
// AGENT_EFFECTS (a file each tool's side effects are appended to), AGENT_STREAM=1 (streamed
// runs, `stream: true`, their events read to the end).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { appendFileSync } from "node:fs";
import * as sdk from "@openai/agents";
import Database from "better-sqlite3";
import OpenAI from "openai";
import { z } from "zod";
import { createClient, type LeaseholdClient } from "../src/index.js";
import { currentLease, ledgered, run, SQLiteSession } from "../src/agents.js";
import { failure, type Message, type RunBody, serveWorker, walMode } from "./worker-http.js";

sdk.setTracingDisabled(true);

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const owned = process.env.AGENT_OWNED === "1";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const waitMs = Number(process.env.AGENT_WAIT_MS ?? "0");
const effects = process.env.AGENT_EFFECTS ?? "/dev/null";
const streamed = process.env.AGENT_STREAM === "1";
const db = new Database(process.env.AGENT_DB ?? "agents.db", { timeout: 10_000 });
walMode(db);
const client: LeaseholdClient | undefined = owned
  ? createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name })
  : undefined;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const shell = sdk.tool({
  name: "shell",
  description: "runs a shell command for ms milliseconds",
  parameters: z.object({ ms: z.number() }),
  execute: async ({ ms }, _context, details) => {
    const id = details?.toolCall?.callId ?? "?";
    appendFileSync(effects, `${name} start ${id}\n`);
    await sleep(ms);
    appendFileSync(effects, `${name} end ${id}\n`);
    return `ran for ${ms} ms`;
  },
});

function agentFor(session: string): sdk.Agent {
  const openai = new OpenAI({
    baseURL: process.env.MODEL_URL ?? "http://127.0.0.1:1/v1",
    apiKey: "test",
    defaultHeaders: { "x-session": session },
    maxRetries: 0,
  });
  return new sdk.Agent({
    name: "assistant",
    instructions: "You are a test agent.",
    model: new sdk.OpenAIResponsesModel(openai, "mock"),
    tools: [owned ? ledgered(shell) : shell],
  });
}

async function turn(body: RunBody): Promise<unknown> {
  const session = new SQLiteSession(body.id, db);
  const agent = agentFor(body.id);
  const input = body.input ?? "";
  try {
    if (client === undefined) {
      if (streamed) {
        const result = await sdk.run(agent, input, { session, stream: true });
        for await (const _event of result);
        await result.completed;
        return { ok: true, output: result.finalOutput };
      }
      const result = await sdk.run(agent, input, { session });
      return { ok: true, output: result.finalOutput };
    }
    let recovered: boolean | undefined;
    let fence: string | undefined;
    const options = {
      session,
      callModelInputFilter: ({ modelData }: { modelData: sdk.ModelInputData }) => {
        const lease = currentLease();
        recovered ??= lease.recovered;
        fence ??= lease.fence.toString();
        return modelData;
      },
    };
    if (streamed) {
      const result = await run(client, agent, input, { ...options, stream: true }, { ttlMs, waitMs });
      for await (const _event of result);
      await result.completed;
      return { ok: true, output: result.finalOutput, recovered, fence };
    }
    const result = await run(client, agent, input, options, { ttlMs, waitMs });
    return { ok: true, output: result.finalOutput, recovered, fence };
  } catch (err) {
    return failure(err);
  }
}

/** The session's items, as the tests compare them. */
async function items(id: string): Promise<Message[]> {
  const stored = (await new SQLiteSession(id, db).getItems()) as Array<{
    type?: string;
    role?: string;
    callId?: string;
    content?: string | Array<{ text?: string }>;
  }>;
  return stored.map((i) => {
    if (i.type === "function_call") return { role: "assistant", text: `call:${i.callId}` };
    if (i.type === "function_call_result") return { role: "tool", text: `result:${i.callId}` };
    const text = typeof i.content === "string" ? i.content : (i.content ?? []).map((c) => c.text ?? "").join("");
    return { role: i.role ?? i.type ?? "", text };
  });
}

serveWorker(turn, items);
