// The OpenAI Agents SDK (`@openai/agents`) with `@leasehold/client/agents`:
// real SDK, fake Responses API on loopback, agent server processes sharing
// one SQLite file.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { type AgentProcess, startAgent } from "./agents.js";
import { itemText, type InputItem, type MockResponses, type ModelReply, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer, waitFor } from "./server.js";
import * as sdk from "@openai/agents";
import Database from "better-sqlite3";
import { z } from "zod";
import { ledgered, NotOwnedError, ownedSession, SQLiteSession } from "../src/agents.js";
import { createClient, LeaseLostError, sqliteFencedWrite, StaleFenceError, type ToolCallRecord } from "../src/index.js";

const WORKER = fileURLToPath(new URL("./agents-sdk-worker.js", import.meta.url));

/** The last user message "run shell N [as ID]" calls shell; a tool output after it gets "answer:<call ids>"; anything else is answered. */
function script(input: readonly InputItem[]): ModelReply {
  let last = input.length - 1;
  while (last >= 0 && input[last]?.role !== "user") last--;
  const outputs = input.slice(last + 1).filter((i) => i.type === "function_call_output");
  if (outputs.length > 0) return { text: `answer:${outputs.map((o) => o.call_id).join(",")}` };
  const user = input[last];
  const text = user === undefined ? "" : itemText(user);
  const shell = /^run shell (\d+)(?: as (\w+))?/.exec(text);
  if (shell?.[1] !== undefined) {
    return { call: { name: "shell", args: { ms: Number(shell[1]) }, ...(shell[2] === undefined ? {} : { id: shell[2] }) } };
  }
  return { text: `answer:${text}` };
}

interface RunReply {
  readonly ok: boolean;
  readonly output?: unknown;
  readonly error?: string;
  readonly message?: string;
  readonly recovered?: boolean;
}

interface Item {
  readonly type?: string;
  readonly role?: string;
  readonly callId?: string;
  readonly content?: unknown;
  readonly output?: unknown;
}

class Harness {
  readonly dir = mkdtempSync(join(tmpdir(), "agents-sdk-"));
  readonly db = join(this.dir, "agents.db");
  readonly effects = join(this.dir, "effects.log");
  readonly workers: AgentProcess[] = [];
  constructor(readonly mock: MockResponses, readonly server: TestServer | undefined) {
    writeFileSync(this.effects, "");
  }
  async worker(name: string, env: Record<string, string> = {}): Promise<AgentProcess> {
    const w = await startAgent(WORKER, {
      AGENT_NAME: name,
      AGENT_DB: this.db,
      AGENT_EFFECTS: this.effects,
      MODEL_URL: this.mock.baseURL,
      ...(this.server === undefined ? {} : { AGENT_OWNED: "1", LEASEHOLD_URL: this.server.baseUrl }),
      ...env,
    });
    this.workers.push(w);
    return w;
  }
  /** The call id of `worker`'s first tool start, once its tool is running. */
  async started(worker: string): Promise<string> {
    let id: string | undefined;
    await waitFor(
      () => {
        id = this.effectLines().find((l) => l.startsWith(`${worker} start `))?.split(" ")[2];
        return id !== undefined;
      },
      10_000,
      `${worker}'s tool to start`,
    );
    return id as string;
  }
  /** The key's tool-call ledger, read by taking the key once every run let go. */
  async ledger(key: string): Promise<ToolCallRecord[]> {
    const client = createClient({ baseUrl: this.server!.baseUrl, owner: "test" });
    try {
      const lease = await client.acquire(key, { waitMs: 5_000 });
      try {
        return await lease.listToolCalls();
      } finally {
        await lease.release();
      }
    } finally {
      client.close();
    }
  }
  effectLines(): string[] {
    return readFileSync(this.effects, "utf8").split("\n").filter((l) => l !== "");
  }
  async items(session: string): Promise<Item[]> {
    return (await this.workers[0]!.get(`/items?session=${session}`)) as Item[];
  }
  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.stop()));
    rmSync(this.dir, { recursive: true, force: true });
  }
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
    const h = new Harness(mock, undefined);
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
      const users = (await h.items("s1")).filter((i) => i.role === "user").map((i) => i.content);
      assert.deepEqual(users, ["hello", "run shell 600"]);
    } finally {
      await h.close();
    }
  });

  it("with leasehold, a second run is Busy and writes nothing; a waiting one continues the whole history", async () => {
    const h = new Harness(mock, server);
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
      const items = await h.items("s2");
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
    const h = new Harness(mock, server);
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
    const h = new Harness(mock, server);
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
      const items = await h.items("s4");
      assert.deepEqual(items.map((i) => i.role ?? i.type), ["user", "assistant"], JSON.stringify(items));
      assert.equal(items[0]?.content, "hello");
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });

  it("a ledgered call id seen before on the session never runs again; the stored output is answered", async () => {
    const h = new Harness(mock, server);
    try {
      const a = await h.worker("a");
      for (const input of ["run shell 5 as call_dup", "run shell 5 as call_dup"]) {
        const reply = (await a.post("/run", { session: "s5", input })) as RunReply;
        assert.equal(reply.ok, true, JSON.stringify(reply));
      }
      assert.deepEqual(h.effectLines(), ["a start call_dup", "a end call_dup"]);
      const results = (await h.items("s5")).filter((i) => i.type === "function_call_result");
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
