// Mastra (`@mastra/core` Agent with `@mastra/memory` on one LibSQL file)
// with `@leasehold/client/mastra`: real packages, fake Responses API on
// loopback, agent server processes sharing the file.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { LibSQLStore } from "@mastra/libsql";
import { Memory } from "@mastra/memory";
import { z } from "zod";
import { Harness, type RunReply, script } from "./framework-workers.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";
import { BusyError, createClient, LeaseLostError } from "../src/index.js";
import { currentLease, ledgered, NotOwnedError, own } from "../src/mastra.js";

const WORKER = fileURLToPath(new URL("./mastra-worker.js", import.meta.url));

interface Message {
  readonly role: string;
  readonly text: string;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("mastra: one owner per thread", () => {
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

  it("without leasehold, a second run drives the thread while the first runs: its model never sees the first turn, and memory says it came after it", async () => {
    const h = new Harness(WORKER, mock, undefined);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { thread: "t1", input: "run shell 600" });
      await h.started("a");
      const second = (await b.post("/run", { thread: "t1", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(((await first) as RunReply).ok, true);
      const asked = mock.requests.find((r) => r.input.some((i) => i.role === "user" && itemText(i) === "hello"));
      assert.ok(asked !== undefined);
      assert.ok(!asked.input.some((i) => i.role === "user" && itemText(i).startsWith("run shell")), JSON.stringify(asked.input));
      const messages = await h.items<Message>("t1");
      assert.deepEqual(
        messages.filter((m) => m.role === "user").map((m) => m.text),
        ["run shell 600", "hello"],
        "memory puts the shell turn first, yet the hello turn was answered without it",
      );
    } finally {
      await h.close();
    }
  });

  it("with leasehold, a second run is Busy and writes nothing; a waiting one continues the whole history", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("c", { AGENT_WAIT_MS: "10000" })]);
      const first = a.post("/run", { thread: "t2", input: "run shell 600" });
      await h.started("a");
      const busy = (await b.post("/run", { thread: "t2", input: "hello" })) as RunReply;
      assert.equal(busy.error, "BusyError", JSON.stringify(busy));
      const waiting = c.post("/run", { thread: "t2", input: "next" });
      assert.equal(((await first) as RunReply).ok, true);
      const third = (await waiting) as RunReply;
      assert.equal(third.ok, true, JSON.stringify(third));
      assert.equal(third.recovered, false);
      const messages = await h.items<Message>("t2");
      assert.deepEqual(messages.filter((m) => m.role === "user").map((m) => m.text), ["run shell 600", "next"]);
      const asked = mock.requests.find((r) => r.input.some((i) => i.role === "user" && itemText(i) === "next"));
      assert.ok(asked?.input.some((i) => i.type === "function_call_output"), "the waiting run saw the whole first turn");
      assert.equal(mock.rejections().length, 0);
    } finally {
      await h.close();
    }
  });

  it("kill -9 of the owner mid-tool: exactly one of two racing runs takes over, and the begun call is settled unknown, never re-run", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const wait = { AGENT_WAIT_MS: "10000" };
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b", wait), h.worker("c", wait)]);
      void a.post("/run", { thread: "t3", input: "run shell 5000" }).catch(() => undefined);
      const call = await h.started("a");
      await a.kill();
      const replies = (await Promise.all([
        b.post("/run", { thread: "t3", input: "hello" }),
        c.post("/run", { thread: "t3", input: "again" }),
      ])) as RunReply[];
      assert.ok(replies.every((r) => r.ok), JSON.stringify(replies));
      assert.deepEqual(replies.map((r) => r.recovered).sort(), [false, true], JSON.stringify(replies));
      assert.deepEqual(h.effectLines(), [`a start ${call}`], "the lost owner's call was never run again");
      const calls = await h.ledger("mastra:t3");
      assert.deepEqual(calls.map((x) => [x.callId, x.state]), [[call, "unknown"]]);
    } finally {
      await h.close();
    }
  });

  it("an owner frozen (SIGSTOP) past its TTL: the new owner takes over, and the old one's late writes are refused", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b", { AGENT_WAIT_MS: "5000" })]);
      const first = a.post("/run", { thread: "t4", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500); // past a's 1 s TTL: the server ends its term
      const second = (await b.post("/run", { thread: "t4", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(second.recovered, true);
      a.thaw();
      const late = (await first) as RunReply;
      assert.equal(late.ok, false, JSON.stringify(late));
      assert.equal(late.error, "LeaseLostError", JSON.stringify(late));
      const messages = await h.items<Message>("t4");
      // The call itself was written while a still owned the thread (Mastra
      // flushes a call before running it); its result and answer came too late.
      assert.ok(
        !messages.some((m) => m.text.includes(`result:${call}`) || m.text.includes(`answer:${call}`)),
        `the lost owner's result was refused: ${JSON.stringify(messages)}`,
      );
      assert.equal(messages.at(-1)?.text, "answer:hello");
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });

  it("a ledgered call id seen before on the thread never runs again; the stored output is answered", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const a = await h.worker("a");
      for (const input of ["run shell 5 as call_dup", "run shell 5 as call_dup"]) {
        const reply = (await a.post("/run", { thread: "t5", input })) as RunReply;
        assert.equal(reply.ok, true, JSON.stringify(reply));
      }
      assert.deepEqual(h.effectLines(), ["a start call_dup", "a end call_dup"]);
      const outputs = mock.requests.flatMap((r) => r.input.filter((i) => i.type === "function_call_output" && i.call_id === "call_dup"));
      assert.ok(outputs.length >= 2, JSON.stringify(outputs));
      assert.ok(outputs.every((o) => JSON.stringify(o.output) === JSON.stringify(outputs[0]?.output)), JSON.stringify(outputs));
    } finally {
      await h.close();
    }
  });

  it("a ledgered tool outside an owned run refuses to run", async () => {
    let ran = false;
    const t = ledgered(
      createTool({
        id: "t",
        description: "t",
        inputSchema: z.object({}),
        execute: async () => {
          ran = true;
          return {};
        },
      }),
    );
    await assert.rejects(t.execute!({}, { agent: { toolCallId: "c1" } } as never), NotOwnedError);
    assert.equal(ran, false);
  });

  it("a memory write of a run that lost its lease is refused, even when the SDK goes on to save after the abort", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mastra-"));
    const client = createClient({ baseUrl: server.baseUrl, owner: "t" });
    try {
      const memory = new Memory({ storage: new LibSQLStore({ id: "m", url: `file:${join(dir, "m.db")}` }), options: { lastMessages: 50 } });
      const lose = createTool({
        id: "shell",
        description: "loses the lease while it runs",
        inputSchema: z.object({ ms: z.number() }),
        execute: async () => {
          await currentLease().suspend(); // as if the lease had expired mid-tool
          return { ran: true };
        },
      });
      const agent = own(
        new Agent({
          id: "a",
          name: "a",
          instructions: "test",
          model: { id: "openai/mock", url: mock.baseURL, apiKey: "test", api: "responses" },
          memory,
          tools: { shell: lose },
        }),
        client,
      );
      await assert.rejects(agent.generate("run shell 1", { memory: { thread: "t7", resource: "user" } }), LeaseLostError);
      const { messages } = await memory.recall({ threadId: "t7", resourceId: "user" });
      const parts = messages.flatMap((m) => m.content.parts ?? []);
      assert.ok(
        !parts.some((p) => p.type === "tool-invocation" && p.toolInvocation.state === "result"),
        `no result was saved after the loss: ${JSON.stringify(parts)}`,
      );
    } finally {
      client.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a stream() run holds the thread until its stream ends, then lets go", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mastra-"));
    const client = createClient({ baseUrl: server.baseUrl, owner: "t" });
    try {
      const memory = new Memory({ storage: new LibSQLStore({ id: "m", url: `file:${join(dir, "m.db")}` }), options: { lastMessages: 50 } });
      const agent = own(
        new Agent({
          id: "a",
          name: "a",
          instructions: "test",
          model: { id: "openai/mock", url: mock.baseURL, apiKey: "test", api: "responses" },
          memory,
        }),
        client,
      );
      const thread = { memory: { thread: "t8", resource: "user" } };
      const out = await agent.stream("hello", thread);
      await assert.rejects(agent.generate("second", thread), BusyError);
      assert.equal(await out.text, "answer:hello");
      const next = await agent.generate("after", thread);
      assert.equal(next.text, "answer:after");
      const { messages } = await memory.recall({ threadId: "t8", resourceId: "user" });
      assert.deepEqual(messages.map((m) => m.role), ["user", "assistant", "user", "assistant"]);
    } finally {
      client.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
