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
import { startServer, type TestServer } from "./server.js";
import { ledgered, NotOwnedError, ownedSession, SQLiteSession } from "../src/agents.js";
import { createClient, LeaseLostError, sqliteFencedWrite, StaleFenceError } from "../src/index.js";

const WORKER = fileURLToPath(new URL("./agents-sdk-worker.js", import.meta.url));

interface Item {
  readonly type?: string;
  readonly role?: string;
  readonly callId?: string;
  readonly content?: unknown;
  readonly output?: unknown;
}


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

  // The SDK saves a turn as it ends: the later turn is stored first.
  forkWithoutLeasehold(() => ({ mock }), WORKER, ["meanwhile", "run shell 600"]);

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `agents:${id}`,
    // The SDK saves a turn when it ends: the frozen owner's turn never reached the session.
    afterFreeze: () => [["hello", "answer:hello"]],
  });

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
