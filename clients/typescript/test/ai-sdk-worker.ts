// An agent server on the AI SDK (`generateText`, a chat store in a SQLite
// file it shares with other such processes), for the adapter's process
// tests: POST /run runs one turn of a chat against the fake Responses API
// at MODEL_URL, saving the turn's messages in `onFinish`; GET /items lists
// the chat's stored messages.
//
// AGENT_OWNED=1: through `@leasehold/client/ai-sdk`, the save fenced in its
// SQLite transaction (`sqliteFencedWrite` with `currentLease()`); otherwise
// the AI SDK's own `generateText` and a plain save.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (owned), AGENT_TTL_MS,
// AGENT_WAIT_MS, AGENT_EFFECTS (a file each tool's side effects are appended to).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { appendFileSync } from "node:fs";
import { createOpenAI } from "@ai-sdk/openai";
import * as ai from "ai";
import Database from "better-sqlite3";
import { z } from "zod";
import { createClient, SQLITE_CREATE_TABLE, sqliteFencedWrite } from "../src/index.js";
import { currentLease, generateText } from "../src/ai-sdk.js";
import { failure, type Message, type RunBody, serveWorker, walMode } from "./worker-http.js";

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const owned = process.env.AGENT_OWNED === "1";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const waitMs = Number(process.env.AGENT_WAIT_MS ?? "0");
const effects = process.env.AGENT_EFFECTS ?? "/dev/null";

const db = new Database(process.env.AGENT_DB ?? "chats.db", { timeout: 10_000 });
walMode(db);
db.exec("CREATE TABLE IF NOT EXISTS chat_messages (id INTEGER PRIMARY KEY AUTOINCREMENT, chat TEXT NOT NULL, message TEXT NOT NULL)");
db.exec(SQLITE_CREATE_TABLE);
const openai = createOpenAI({ baseURL: process.env.MODEL_URL ?? "http://127.0.0.1:1/v1", apiKey: "test" });
const lh = owned ? createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name }) : undefined;

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const shell = ai.tool({
  description: "runs a shell command for ms milliseconds",
  inputSchema: z.object({ ms: z.number() }),
  execute: async ({ ms }, { toolCallId }) => {
    appendFileSync(effects, `${name} start ${toolCallId}\n`);
    await sleep(ms);
    appendFileSync(effects, `${name} end ${toolCallId}\n`);
    return `ran for ${ms} ms`;
  },
});

function load(chat: string): ai.ModelMessage[] {
  const rows = db.prepare("SELECT message FROM chat_messages WHERE chat = ? ORDER BY id").all(chat) as Array<{ message: string }>;
  return rows.map((r) => JSON.parse(r.message) as ai.ModelMessage);
}

function insert(chat: string, messages: readonly ai.ModelMessage[]): void {
  const stmt = db.prepare("INSERT INTO chat_messages (chat, message) VALUES (?, ?)");
  for (const m of messages) stmt.run(chat, JSON.stringify(m));
}

async function turn(body: RunBody): Promise<unknown> {
  const chat = body.id;
  const user: ai.ModelMessage = { role: "user", content: body.input ?? "" };
  const key = `chat:${chat}`;
  let recovered: boolean | undefined;
  const args = {
    model: openai.responses("mock"),
    headers: { "x-session": chat },
    tools: { shell },
    stopWhen: ai.stepCountIs(4),
    maxRetries: 0,
  };
  try {
    if (lh === undefined) {
      const result = await ai.generateText({
        ...args,
        messages: [...load(chat), user],
        onFinish: ({ responseMessages }) => {
          db.transaction(() => insert(chat, [user, ...responseMessages]))();
        },
      });
      return { ok: true, output: result.text };
    }
    const result = await generateText(
      lh,
      key,
      // The chat is read once the lease is held: what the owner sees.
      () => ({
        ...args,
        prepareStep: () => {
          recovered ??= currentLease().recovered;
          return undefined;
        },
        messages: [...load(chat), user],
        onFinish: ({ responseMessages }) => {
          sqliteFencedWrite(db, key, currentLease().fence, () => insert(chat, [user, ...responseMessages]));
        },
      }),
      { ttlMs, waitMs },
    );
    return { ok: true, output: result.text, recovered };
  } catch (err) {
    return failure(err);
  }
}

/** The chat's messages. */
function items(chat: string): Message[] {
  return load(chat).map((m) => {
    if (typeof m.content === "string") return { role: m.role, text: m.content };
    const text = m.content
      .map((p) => {
        if (p.type === "text") return p.text;
        if (p.type === "tool-call") return `call:${p.toolCallId}`;
        if (p.type === "tool-result") return `result:${p.toolCallId}`;
        return "";
      })
      .join(" ");
    return { role: m.role, text };
  });
}

serveWorker(turn, async (id) => items(id));
