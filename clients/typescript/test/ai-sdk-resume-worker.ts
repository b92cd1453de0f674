// A server process of the resumable-stream test: starts one owned turn of
// chat CHAT (lease TTL 1 s) whose tool never returns, saves its stream id
// as the chat's activeStreamId in CHAT_DB (fenced), prints
// {"streaming":"<id>"} and waits to be killed.
// Env: CHAT, CHAT_DB, MODEL_URL, LEASEHOLD_URL.

import { createOpenAI } from "@ai-sdk/openai";
import * as ai from "ai";
import Database from "better-sqlite3";
import { createClient, sqliteFencedWrite } from "../src/index.js";
import { currentLease, newStreamId, streamText } from "../src/ai-sdk.js";

const chat = process.env.CHAT ?? "c";
const key = `chat:${chat}`;
const db = new Database(process.env.CHAT_DB ?? "chats.db", { timeout: 10_000 });
const lh = createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: `worker-${process.pid}` });
const openai = createOpenAI({ baseURL: process.env.MODEL_URL ?? "http://127.0.0.1:1/v1", apiKey: "test" });

const result = await streamText(
  lh,
  key,
  {
    model: openai.responses("mock"),
    prompt: "sleep",
    tools: {
      shell: ai.tool({
        description: "Runs a shell command.",
        inputSchema: ai.jsonSchema<{ cmd: string }>({ type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] }),
        execute: () => new Promise<string>(() => undefined),
      }),
    },
    stopWhen: ai.stepCountIs(4),
    maxRetries: 0,
  },
  { ttlMs: 1000 },
);
const response = result.toUIMessageStreamResponse({
  consumeSseStream: () => {
    const id = newStreamId();
    sqliteFencedWrite(db, key, currentLease().fence, () => {
      db.prepare(
        "INSERT INTO chats (id, active_stream_id) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET active_stream_id = excluded.active_stream_id",
      ).run(chat, id);
    });
    process.stdout.write(`${JSON.stringify({ streaming: id })}\n`);
  },
});
await response.text();
