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
import { Harness, type RunReply, script } from "./framework-workers.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
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

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

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

  it("without leasehold, a second run drives the session while the first runs: its model never sees the first turn, and the stored history puts that turn after the answer", async () => {
    const h = new Harness(WORKER, mock, undefined);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { session: "s1", input: "run shell 600" });
      await h.started("a");
      const second = (await b.post("/run", { session: "s1", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(((await first) as RunReply).ok, true);
      // The second run's model was asked with no trace of the turn that began before it.
      const asked = mock.requests.find((r) => r.session === "s1" && r.input.some((i) => i.role === "user" && itemText(i) === "hello"));
      assert.ok(asked !== undefined);
      assert.ok(!asked.input.some((i) => i.role === "user" && itemText(i).startsWith("run shell")), JSON.stringify(asked.input));
      // And the session now says the shell turn came after the hello turn's answer.
      const users = (await h.items<Item>("s1")).filter((i) => i.role === "user").map((i) => i.content);
      assert.deepEqual(users, ["hello", "run shell 600"]);
    } finally {
      await h.close();
    }
  });

  it("with leasehold, a second run is Busy and writes nothing; a waiting one continues the whole history", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("c")]);
      const first = a.post("/run", { session: "s2", input: "run shell 600" });
      await h.started("a");
      const busy = (await b.post("/run", { session: "s2", input: "hello" })) as RunReply;
      assert.equal(busy.error, "BusyError", JSON.stringify(busy));
      const waiting = c.post("/run", { session: "s2", input: "next", waitMs: 10_000 });
      assert.equal(((await first) as RunReply).ok, true);
      const third = (await waiting) as RunReply;
      assert.equal(third.ok, true, JSON.stringify(third));
      assert.equal(third.recovered, false);
      const items = await h.items<Item>("s2");
      assert.deepEqual(
        items.map((i) => i.role ?? i.type),
        ["user", "function_call", "function_call_result", "assistant", "user", "assistant"],
      );
      assert.ok(!items.some((i) => i.content === "hello"), "the busy run wrote nothing");
      const asked = mock.requests.find((r) => r.session === "s2" && r.input.some((i) => i.role === "user" && itemText(i) === "next"));
      assert.ok(asked?.input.some((i) => i.type === "function_call_output"), "the waiting run saw the whole first turn");
      assert.equal(mock.rejections("s2").length, 0);
    } finally {
      await h.close();
    }
  });

  it("kill -9 of the owner mid-tool: exactly one of two racing runs takes over, and the begun call is settled unknown, never re-run", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("c")]);
      void a.post("/run", { session: "s3", input: "run shell 5000" }).catch(() => undefined);
      const call = await h.started("a");
      await a.kill();
      const replies = (await Promise.all([
        b.post("/run", { session: "s3", input: "hello", waitMs: 10_000 }),
        c.post("/run", { session: "s3", input: "again", waitMs: 10_000 }),
      ])) as RunReply[];
      assert.ok(replies.every((r) => r.ok), JSON.stringify(replies));
      assert.deepEqual(replies.map((r) => r.recovered).sort(), [false, true], JSON.stringify(replies));
      assert.deepEqual(h.effectLines(), [`a start ${call}`], "the lost owner's call was never run again");
      const calls = await h.ledger("agents:s3");
      assert.deepEqual(calls.map((x) => [x.callId, x.state]), [[call, "unknown"]]);
      assert.equal(mock.rejections("s3").length, 0);
    } finally {
      await h.close();
    }
  });

  it("an owner frozen (SIGSTOP) past its TTL: the new owner takes over, and the old one's late write is refused", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { session: "s4", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500); // past a's 1 s TTL: the server ends its term
      const second = (await b.post("/run", { session: "s4", input: "hello", waitMs: 5_000 })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(second.recovered, true);
      a.thaw();
      const late = (await first) as RunReply;
      assert.equal(late.ok, false, JSON.stringify(late));
      assert.match(late.error ?? "", /LeaseLostError|StaleFenceError/);
      const items = await h.items<Item>("s4");
      assert.deepEqual(items.map((i) => i.role ?? i.type), ["user", "assistant"], JSON.stringify(items));
      assert.equal(items[0]?.content, "hello");
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });

  it("a ledgered call id seen before on the session never runs again; the stored output is answered", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const a = await h.worker("a");
      for (const input of ["run shell 5 as call_dup", "run shell 5 as call_dup"]) {
        const reply = (await a.post("/run", { session: "s5", input })) as RunReply;
        assert.equal(reply.ok, true, JSON.stringify(reply));
      }
      assert.deepEqual(h.effectLines(), ["a start call_dup", "a end call_dup"]);
      const results = (await h.items<Item>("s5")).filter((i) => i.type === "function_call_result");
      assert.equal(results.length, 2);
      assert.deepEqual(results[1]?.output, results[0]?.output);
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
