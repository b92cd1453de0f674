// Resumable streams (the AI SDK's `activeStreamId` pattern) with
// `@leasehold/client/ai-sdk`: the real AI SDK (`ai` 7, @ai-sdk/openai)
// against a fake Responses server on loopback, a chat table in a real
// SQLite file, and an in-process registry where Redis and `resumable-stream`
// would keep each stream. Two servers of one chat are two clients here.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import { createOpenAI } from "@ai-sdk/openai";
import * as ai from "ai";
import Database from "better-sqlite3";

import { BusyError, createClient, type LeaseholdClient, SQLITE_CREATE_TABLE, sqliteFencedWrite, StaleFenceError } from "../src/index.js";
import { currentLease, liveStreamId, newStreamId, streamText } from "../src/ai-sdk.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer, waitFor } from "./server.js";

const WORKER = fileURLToPath(new URL("./ai-sdk-resume-worker.js", import.meta.url));

/** `promise`, or a failure after `ms` (no test waits without bound). */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([promise, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms).unref())]);
}

/** A shell tool whose calls wait until released. */
class Shell {
  entered = false;
  #release: () => void = () => undefined;
  readonly #open = new Promise<void>((resolve) => {
    this.#release = resolve;
  });

  release(): void {
    this.#release();
  }

  readonly tool = ai.tool({
    description: "Runs a shell command.",
    inputSchema: ai.jsonSchema<{ cmd: string }>({ type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] }),
    execute: async ({ cmd }: { cmd: string }) => {
      this.entered = true;
      await this.#open;
      return `ran ${cmd}`;
    },
  });
}

/** Where the servers' streams are kept for resuming (Redis, with `resumable-stream`). */
class Registry {
  readonly #streams = new Map<string, { done: boolean }>();

  register(id: string, stream: ReadableStream<string>): void {
    const entry = { done: false };
    this.#streams.set(id, entry);
    void (async () => {
      const reader = stream.getReader();
      while (!(await reader.read()).done);
      entry.done = true;
    })();
  }

  /** Whether the stream is still being written (a resume would follow it). */
  open(id: string): boolean {
    return this.#streams.get(id)?.done === false;
  }
}

describe("ai-sdk: resumable streams (activeStreamId) follow the chat's owner", () => {
  let server: TestServer;
  let model: MockResponses;
  let a: LeaseholdClient;
  let b: LeaseholdClient;
  let dir: string;
  let db: Database.Database;
  const registry = new Registry();

  before(async () => {
    server = await startServer();
    model = await startMockResponses((input) => {
      const last = input.at(-1);
      if (last?.type === "function_call_output") return { text: `done: ${String(last.output)}` };
      return { call: { name: "shell", args: { cmd: last === undefined ? "" : itemText(last) } } };
    });
    a = createClient({ baseUrl: server.baseUrl, owner: "a" });
    b = createClient({ baseUrl: server.baseUrl, owner: "b" });
    dir = mkdtempSync(join(tmpdir(), "leasehold-resume-"));
    db = new Database(join(dir, "chats.db"));
    db.exec("CREATE TABLE chats (id TEXT PRIMARY KEY, active_stream_id TEXT)");
    db.exec(SQLITE_CREATE_TABLE);
  });
  after(async () => {
    a.close();
    b.close();
    db.close();
    rmSync(dir, { recursive: true, force: true });
    await model.close();
    await server.close();
  });

  const openai = (): ReturnType<typeof createOpenAI> => createOpenAI({ baseURL: model.baseURL, apiKey: "test" });
  const stored = (chat: string): string | null =>
    (db.prepare("SELECT active_stream_id AS id FROM chats WHERE id = ?").get(chat) as { id: string | null } | undefined)?.id ?? null;
  const setActive = (chat: string, id: string): void => {
    db.prepare("INSERT INTO chats (id, active_stream_id) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET active_stream_id = excluded.active_stream_id").run(chat, id);
  };
  const args = (shell: Shell): Parameters<typeof ai.streamText>[0] => ({
    model: openai().responses("mock"),
    prompt: "ls",
    tools: { shell: shell.tool },
    stopWhen: ai.stepCountIs(4),
    maxRetries: 0,
  });

  /** The AI SDK's resumable POST route as its docs have it: the chat's active stream set, then cleared by chat id. */
  function postPlain(chat: string, shell: Shell): { id: Promise<string>; done: Promise<string> } {
    let named: (id: string) => void = () => undefined;
    const id = new Promise<string>((resolve) => (named = resolve));
    const response = ai.streamText(args(shell)).toUIMessageStreamResponse({
      consumeSseStream: ({ stream }) => {
        const streamId = randomUUID();
        registry.register(streamId, stream);
        setActive(chat, streamId);
        named(streamId);
      },
      onFinish: () => {
        db.prepare("UPDATE chats SET active_stream_id = NULL WHERE id = ?").run(chat);
      },
    });
    return { id: within(id, 5000, "stream id"), done: response.text() };
  }

  /** The same route with leasehold: the run owns the chat, its stream id names its term, the set fenced, the clear by id. */
  async function postOwned(client: LeaseholdClient, chat: string, shell: Shell, ttlMs = 10_000): Promise<{ id: Promise<string>; done: Promise<string> }> {
    const key = `chat:${chat}`;
    let named: (id: string) => void = () => undefined;
    const id = new Promise<string>((resolve) => (named = resolve));
    const result = await streamText(client, key, args(shell), { ttlMs });
    let streamId = "";
    const response = result.toUIMessageStreamResponse({
      consumeSseStream: ({ stream }) => {
        streamId = newStreamId(); // leasehold: the id names the run's term
        registry.register(streamId, stream);
        sqliteFencedWrite(db, key, currentLease().fence, () => setActive(chat, streamId)); // leasehold: fenced
        named(streamId);
      },
      onFinish: () => {
        // leasehold: only this run's own id is cleared (the lease may be released by now)
        db.prepare("UPDATE chats SET active_stream_id = NULL WHERE id = ? AND active_stream_id = ?").run(chat, streamId);
      },
    });
    return { id: within(id, 5000, "stream id"), done: response.text() };
  }

  it("without leasehold: a second server's turn takes the chat's stream, and the first one's finish clears it while it still runs", async () => {
    const first = new Shell();
    const second = new Shell();
    const one = postPlain("c1", first);
    await waitFor(() => first.entered, 5000, "the first turn's tool");
    const two = postPlain("c1", second);
    const twoId = await two.id;
    await waitFor(() => second.entered, 5000, "the second turn's tool");
    assert.equal(stored("c1"), twoId);
    first.release();
    await one.done;
    // The second turn is still streaming, but a client that reconnects finds no stream to resume.
    assert.equal(stored("c1"), null);
    assert.ok(registry.open(twoId), "the second turn's stream is still being written");
    second.release();
    await two.done;
  });

  it("owned: a second server is Busy, the owner's stream is the live one until its own finish clears it", async () => {
    const shell = new Shell();
    const one = await postOwned(a, "c2", shell);
    const id = await one.id;
    await waitFor(() => shell.entered, 5000, "the owner's tool");
    await assert.rejects(postOwned(b, "c2", new Shell()), BusyError);
    assert.equal(stored("c2"), id);
    assert.equal(await liveStreamId(b, "chat:c2", stored("c2")), id);
    assert.match(id, new RegExp(`^${(await b.get("chat:c2")).lease?.fence}\\.`));
    shell.release();
    await one.done;
    await waitFor(() => stored("c2") === null, 5000, "the owner's finish clearing its stream");
    // A resume route reads the stored id, which the finish cleared: nothing to resume.
    assert.equal(await liveStreamId(b, "chat:c2", stored("c2")), null);
    // The release follows the finish without holding the stream back; once it
    // lands, even the old id read before the clear names no live run.
    for (let i = 0; (await b.get("chat:c2")).lease !== undefined && i < 500; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(await liveStreamId(b, "chat:c2", id), null, "an ended run's stream is not live");
  });

  it("owned: a run that lost the chat stops and clears only its own stream; its late write is refused by the database", async () => {
    const stalled = new Shell();
    const one = await postOwned(a, "c3", stalled, 1000);
    const aId = await one.id;
    await waitFor(() => stalled.entered, 5000, "the first owner's tool");
    const aFence = BigInt(aId.split(".")[0]!);
    // The lease server is paused past the TTL: a's term expires under it.
    server.freeze();
    await new Promise((r) => setTimeout(r, 1400));
    server.thaw();
    assert.equal(await liveStreamId(b, "chat:c3", aId), null, "a's stream is no longer live");
    // a's run is aborted by the loss; its finish clears its own id.
    await one.done.catch(() => undefined);
    await waitFor(() => stored("c3") === null, 5000, "a's aborted run clearing its own stream");
    // b takes the chat over; its stream is the live one.
    const shell = new Shell();
    const two = await postOwned(b, "c3", shell);
    const bId = await two.id;
    await waitFor(() => shell.entered, 5000, "the new owner's tool");
    assert.equal(await liveStreamId(a, "chat:c3", stored("c3")), bId);
    // a's late write of its stream id is refused in the same transaction.
    assert.throws(
      () => sqliteFencedWrite(db, "chat:c3", aFence, () => setActive("c3", aId)),
      StaleFenceError,
    );
    assert.equal(stored("c3"), bId);
    stalled.release();
    shell.release();
    await two.done;
    await waitFor(() => stored("c3") === null, 5000, "b's finish clearing its stream");
  });

  it("kill -9 of the owner mid-stream: its stream id stays stored but is not live once its term lapses", async () => {
    const worker = spawn(process.execPath, [WORKER], {
      env: { ...process.env, CHAT_DB: join(dir, "chats.db"), MODEL_URL: model.baseURL, LEASEHOLD_URL: server.baseUrl, CHAT: "c4" },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
    try {
      const printed = await within(
        new Promise<string>((resolve, reject) => {
          createInterface({ input: worker.stdout! }).once("line", resolve);
          worker.once("exit", () => reject(new Error("the worker exited before streaming")));
        }),
        15_000,
        "stream from the worker",
      );
      const deadId = (JSON.parse(printed) as { streaming: string }).streaming;
      assert.equal(stored("c4"), deadId);
      assert.equal(await liveStreamId(b, "chat:c4", deadId), deadId, "live while its term is");
      worker.kill("SIGKILL");
      await exited;
      // What a resume route would hand a reconnecting client: the store still names the dead stream ...
      assert.equal(stored("c4"), deadId);
      // ... and leasehold says it is not live once the term lapses (TTL 1 s).
      let live: string | null = deadId;
      for (let i = 0; i < 60 && live !== null; i++) {
        await new Promise((r) => setTimeout(r, 100));
        live = await liveStreamId(b, "chat:c4", stored("c4"));
      }
      assert.equal(live, null);
      assert.equal((await b.get("chat:c4")).recoverable, true, "the chat is listed for a recoverer");
    } finally {
      worker.kill("SIGKILL"); // a failed assertion must not leave it running (its tool never returns)
    }
  });

  it("liveStreamId: no id, an id it did not make and an unknown chat are not live", async () => {
    assert.equal(await liveStreamId(a, "chat:c2", null), null);
    assert.equal(await liveStreamId(a, "chat:c2", undefined), null);
    assert.equal(await liveStreamId(a, "chat:c2", randomUUID()), null);
    assert.equal(await liveStreamId(a, "chat:c2", "12345"), null);
    assert.equal(await liveStreamId(a, "chat:never", `1.${randomUUID()}`), null);
  });
});
