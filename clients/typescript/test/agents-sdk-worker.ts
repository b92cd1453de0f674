// An agent server on the OpenAI Agents SDK (`@openai/agents`), for the
// adapter's process tests: an HTTP server on loopback whose POST /run runs
// one turn of a session stored in a SQLite file it shares with other such
// processes, against the fake Responses API at MODEL_URL.
//
// AGENT_OWNED=1: through `@leasehold/client/agents` (`run`, `ledgered`,
// its fenced SQLiteSession); otherwise the SDK's own `run` on the same
// session store, as a user has it today.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (owned), AGENT_TTL_MS,
// AGENT_EFFECTS (a file each tool's side effects are appended to).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { appendFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import * as sdk from "@openai/agents";
import Database from "better-sqlite3";
import OpenAI from "openai";
import { z } from "zod";
import { createClient, type LeaseholdClient } from "../src/index.js";
import { currentLease, ledgered, run, SQLiteSession } from "../src/agents.js";

sdk.setTracingDisabled(true);

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const owned = process.env.AGENT_OWNED === "1";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const effects = process.env.AGENT_EFFECTS ?? "/dev/null";
const db = new Database(process.env.AGENT_DB ?? "agents.db", { timeout: 10_000 });
db.pragma("journal_mode = WAL");
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

interface RunBody {
  readonly session: string;
  readonly input: string;
  readonly waitMs?: number;
}

async function turn(body: RunBody): Promise<unknown> {
  const session = new SQLiteSession(body.session, db);
  const agent = agentFor(body.session);
  try {
    if (client === undefined) {
      const result = await sdk.run(agent, body.input, { session });
      return { ok: true, output: result.finalOutput };
    }
    let recovered: boolean | undefined;
    let fence: string | undefined;
    const result = await run(
      client,
      agent,
      body.input,
      {
        session,
        callModelInputFilter: ({ modelData }) => {
          const lease = currentLease();
          recovered ??= lease.recovered;
          fence ??= lease.fence.toString();
          return modelData;
        },
      },
      { ttlMs, waitMs: body.waitMs ?? 0 },
    );
    return { ok: true, output: result.finalOutput, recovered, fence };
  } catch (err) {
    const e = err as Error;
    return { ok: false, error: e.name, message: e.message };
  }
}

const server = createServer((req: IncomingMessage, res: ServerResponse) => {
  void (async () => {
    let body = "";
    for await (const chunk of req) body += String(chunk);
    const url = new URL(req.url ?? "/", "http://x");
    let out: unknown;
    if (req.method === "POST" && url.pathname === "/run") out = await turn(JSON.parse(body) as RunBody);
    else if (req.method === "GET" && url.pathname === "/items") {
      out = await new SQLiteSession(url.searchParams.get("id") ?? "", db).getItems();
    } else {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(out));
  })();
});
server.listen(0, "127.0.0.1", () => {
  console.log(`listening on 127.0.0.1:${(server.address() as AddressInfo).port}`);
});
