// The OpenAI Agents SDK (`@openai/agents`) with `@leasehold/client/agents`:
// real SDK, fake Responses API on loopback, agent server processes sharing
// one SQLite file.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import * as sdk from "@openai/agents";
import Database from "better-sqlite3";
import { z } from "zod";
import { forkWithoutLeasehold, Harness, ownershipContract, type RunReply, script } from "./framework-workers.js";
import type { Message } from "./worker-http.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
import { checksAnswered, freePort, startServer, type TestServer, waitFor } from "./server.js";
import OpenAI from "openai";
import { currentLease, ledgered, NotOwnedError, ownedSession, run, SQLiteSession } from "../src/agents.js";
import { BusyError, createClient, type Lease, type LeaseholdClient, LeaseLostError, sqliteFencedWrite, StaleFenceError } from "../src/index.js";

const WORKER = fileURLToPath(new URL("./agents-sdk-worker.js", import.meta.url));

interface Item {
  readonly type?: string;
  readonly role?: string;
  readonly callId?: string;
  readonly content?: unknown;
  readonly output?: unknown;
}


let slowLease: Lease | undefined;
const slowShell = sdk.tool({
  name: "shell",
  description: "runs a shell command for ms milliseconds",
  parameters: z.object({ ms: z.number() }),
  execute: async ({ ms }) => {
    slowLease = currentLease();
    await new Promise((r) => setTimeout(r, ms));
    return `ran for ${ms} ms`;
  },
});

describe("agents sdk: one owner per session", () => {
  let mock: MockResponses;
  let server: TestServer;
  before(async () => {
    mock = await startMockResponses(script);
    server = await startServer();
  });
  after(async () => {
    await mock.close();
    await server.close();
  });

  /** A SQLite file of sessions and a client, for one in-process test; removed after it. */
  async function withSessions(fn: (db: Database.Database, client: LeaseholdClient) => Promise<void>): Promise<void> {
    const dir = mkdtempSync(join(tmpdir(), "agents-sdk-"));
    const db = new Database(join(dir, "a.db"));
    const client = createClient({ baseUrl: server.baseUrl, owner: "t" });
    try {
      await fn(db, client);
    } finally {
      client.close();
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }

  /** An agent on the fake Responses server (or `baseURL`) with `tools`. */
  function agentOf(tools: sdk.Tool[], baseURL = mock.baseURL): sdk.Agent {
    const model = new sdk.OpenAIResponsesModel(new OpenAI({ baseURL, apiKey: "t", maxRetries: 0 }), "mock");
    return new sdk.Agent({ name: "assistant", instructions: "test", model, tools });
  }

  // The SDK saves a turn as it ends: the later turn is stored first.
  forkWithoutLeasehold(() => ({ mock }), WORKER, ["meanwhile", "run shell 600"]);

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `agents:${id}`,
    // The SDK saves a turn when it ends: the frozen owner's turn never reached the session.
    afterFreeze: () => [["hello", "answer:hello"]],
  });

  it("the model calls of a run on a SQLiteSession ask the server nothing; on any other session each is checked", async () => {
    const metricsAt = `127.0.0.1:${await freePort()}`;
    const counted = await startServer(undefined, "127.0.0.1:0", ["--metrics-listen", metricsAt]);
    const dir = mkdtempSync(join(tmpdir(), "agents-sdk-"));
    const db = new Database(join(dir, "a.db"));
    const client = createClient({ baseUrl: counted.baseUrl, owner: "t" });
    try {
      const before = await checksAnswered(metricsAt);
      const result = await run(client, agentOf([ledgered(slowShell)]), "run shell 0", { session: new SQLiteSession("fresh", db) });
      assert.equal(result.finalOutput?.toString().startsWith("answer:"), true, String(result.finalOutput));
      assert.equal(await checksAnswered(metricsAt), before, "two model calls, no Check");
      await run(client, agentOf([ledgered(slowShell)]), "run shell 0", { session: new sdk.MemorySession({ sessionId: "m" }) });
      // Each model call (and each write of a session without a fence) asked the server.
      assert.ok((await checksAnswered(metricsAt)) >= before + 2);
    } finally {
      client.close();
      db.close();
      rmSync(dir, { recursive: true, force: true });
      await counted.close();
    }
  });

  it("a streamed run holds the session until its run ends, read or not; a custom Runner runs owned too", () =>
    withSessions(async (db, client) => {
      const other = createClient({ baseUrl: server.baseUrl, owner: "other" });
      try {
        const session = new SQLiteSession("s8", db);
        const runner = new sdk.Runner({ tracingDisabled: true });
        const result = await run(client, agentOf([ledgered(slowShell)]), "run shell 300", { session, stream: true }, { runner });
        // Nobody reads the stream: the run goes on, and owns the session meanwhile.
        await assert.rejects(other.acquire("agents:s8"), BusyError);
        await result.completed;
        assert.equal(result.finalOutput?.toString().startsWith("answer:"), true, String(result.finalOutput));
        const texts = (await session.getItems()).map((i) => (i as Item).role ?? (i as Item).type);
        assert.deepEqual(texts, ["user", "function_call", "function_call_result", "assistant"]);
        const next = await other.acquire("agents:s8");
        assert.ok(next.fence > 0n);
        await next.release();
      } finally {
        other.close();
      }
    }));

  it("a streamed run that loses its lease: completed rejects with LeaseLostError and the late write is refused", () =>
    withSessions(async (db, client) => {
      const admin = createClient({ baseUrl: server.baseUrl, owner: "admin" });
      try {
        const session = new SQLiteSession("s9", db);
        const result = await run(client, agentOf([ledgered(slowShell)]), "run shell 600", { session, stream: true });
        const events: string[] = [];
        const reading = (async () => {
          for await (const e of result) events.push(e.type);
        })().catch(() => undefined);
        await waitFor(() => slowLease?.key === "agents:s9", 5_000, "the streamed run's tool to start");
        // Another owner takes the session while the tool runs (the term ended under the run).
        await slowLease?.release();
        const taker = await admin.acquire("agents:s9");
        await assert.rejects(result.completed, LeaseLostError);
        assert.ok(result.error instanceof LeaseLostError, String(result.error));
        await reading;
        assert.ok(events.length > 0, "the stream was read while the run lasted");
        const stored = (await session.getItems()).map((i) => (i as Item).type ?? (i as Item).role);
        assert.ok(!stored.includes("function_call_result"), `the lost run's tool result was not stored: ${JSON.stringify(stored)}`);
        await taker.release();
      } finally {
        admin.close();
      }
    }));

  it("a ledgered call id seen before on the session never runs again; the stored output is answered", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const a = await h.worker("a");
      for (const input of ["run shell 5 as call_dup", "run shell 5 as call_dup"]) {
        const reply = (await a.post("/run", { id: "s5", input })) as RunReply;
        assert.equal(reply.ok, true, JSON.stringify(reply));
      }
      assert.deepEqual(h.effectLines(), ["a start call_dup", "a end call_dup"]);
      assert.equal((await h.items<Message>("s5")).filter((m) => m.text === "result:call_dup").length, 2);
      const outputs = mock.requests.flatMap((r) => r.input.filter((i) => i.type === "function_call_output" && i.call_id === "call_dup"));
      assert.ok(outputs.length >= 2 && outputs.every((o) => JSON.stringify(o.output) === JSON.stringify(outputs[0]?.output)), JSON.stringify(outputs));
    } finally {
      await h.close();
    }
  });

  it("SQLite refuses a stale fence that passed every local check, in the write's own transaction", async () => {
    const dir = mkdtempSync(join(tmpdir(), "agents-sdk-"));
    const db = new Database(join(dir, "a.db"));
    const client = createClient({ baseUrl: server.baseUrl, owner: "t" });
    try {
      const session = new SQLiteSession("s6", db);
      const lease = await client.acquire("agents:s6");
      const mine = ownedSession(session, lease);
      await mine.addItems([{ role: "user", content: "one" }]);
      // A later owner's fence reached the database first; this lease still looks valid here.
      sqliteFencedWrite(db, "agents:s6", lease.fence + 1n, () => undefined);
      assert.equal(lease.isValid(), true);
      await assert.rejects(mine.addItems([{ role: "user", content: "two" }]), StaleFenceError);
      await assert.rejects(mine.popItem(), StaleFenceError);
      assert.deepEqual((await session.getItems()).map((i) => (i as Item).content), ["one"]);
      await lease.release();
    } finally {
      client.close();
      db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("any other session is gated: once the lease is lost its writes are refused, its reads too", async () => {
    const client = createClient({ baseUrl: server.baseUrl, owner: "t" });
    try {
      const inner = new sdk.MemorySession({ sessionId: "s7" });
      const lease = await client.acquire("agents:s7");
      const mine = ownedSession(inner, lease);
      await mine.addItems([{ role: "user", content: "one" }]);
      await lease.release();
      await assert.rejects(mine.addItems([{ role: "user", content: "two" }]), LeaseLostError);
      await assert.rejects(mine.getItems(), LeaseLostError);
      assert.equal((await inner.getItems()).length, 1);
      assert.equal(await mine.getSessionId(), "s7", "what does not read or write passes through");
    } finally {
      client.close();
    }
  });

  it("a run interrupted for approval lets go; its RunState resumes under a new lease and the approved call runs once", () =>
    withSessions(async (db, client) => {
      const ran: bigint[] = [];
      const approved = sdk.tool({
        name: "shell",
        description: "runs a shell command for ms milliseconds",
        parameters: z.object({ ms: z.number() }),
        needsApproval: true,
        execute: async ({ ms }) => {
          ran.push(currentLease().fence);
          return `ran for ${ms} ms`;
        },
      });
      const agent = agentOf([ledgered(approved)]);
      const session = new SQLiteSession("s-hitl", db);
      const first = await run(client, agent, "run shell 10", { session });
      assert.equal(first.interruptions.length, 1);
      assert.deepEqual(ran, []);
      const asked = await client.get("agents:s-hitl");
      assert.equal(asked.lease, undefined, "an interrupted run lets go of the session");
      first.state.approve(first.interruptions[0]!);
      const resumed = await run(client, agent, first.state, { session });
      assert.equal(resumed.finalOutput?.toString().startsWith("answer:"), true, String(resumed.finalOutput));
      const ended = await client.get("agents:s-hitl");
      assert.deepEqual(ran, [ended.lastEnded?.fence], "the approved call ran once, under the resume's lease");
      assert.ok((ended.lastEnded?.fence ?? 0n) > (asked.lastEnded?.fence ?? 0n));
      assert.equal(ended.lastEnded?.end, "released");
    }));

  it("a run whose model fails throws the model's error, not a loss, and leaves the session suspended", () =>
    withSessions(async (db, client) => {
      // Nothing listens on port 1: the model call fails, the lease does not.
      const agent = agentOf([], "http://127.0.0.1:1/v1");
      for (const stream of [false, true]) {
        const id = `s-fail-${stream}`;
        const session = new SQLiteSession(id, db);
        const failed = stream
          ? run(client, agent, "hi", { session, stream: true }).then((r) => r.completed)
          : run(client, agent, "hi", { session });
        await assert.rejects(failed, (err: unknown) => {
          assert.ok(!(err instanceof LeaseLostError), `a model failure reported as ${String(err)}`);
          return true;
        });
        assert.equal((await client.get(`agents:${id}`)).lastEnded?.end, "suspended");
      }
    }));

  it("a ledgered tool outside an owned run refuses to run", async () => {
    let ran = false;
    const t = ledgered(
      sdk.tool({
        name: "t",
        description: "t",
        parameters: z.object({}),
        execute: () => {
          ran = true;
          return "x";
        },
      }),
    );
    await assert.rejects(t.invoke(new sdk.RunContext(), "{}"), NotOwnedError);
    assert.equal(ran, false);
  });
});

// Servers of its own: the contract uses fixed session ids, and a second
// run of it on the servers above would find the first run's keys and calls.
describe("agents sdk: streamed runs (stream: true) own the session the same way", () => {
  let mock: MockResponses;
  let server: TestServer;
  before(async () => {
    mock = await startMockResponses(script);
    server = await startServer();
  });
  after(async () => {
    await mock.close();
    await server.close();
  });

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    env: { AGENT_STREAM: "1" },
    key: (id) => `agents:${id}`,
    afterFreeze: () => [["hello", "answer:hello"]],
  });
});
