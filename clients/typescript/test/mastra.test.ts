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
import { forkWithoutLeasehold, Harness, ownershipContract, type RunReply, script } from "./framework-workers.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";
import { BusyError, createClient, LeaseLostError } from "../src/index.js";
import { currentLease, ledgered, NotOwnedError, own } from "../src/mastra.js";

const WORKER = fileURLToPath(new URL("./mastra-worker.js", import.meta.url));


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

  // Mastra orders memory by when each message was made: the shell turn first, though the other was answered without it.
  forkWithoutLeasehold(() => ({ mock }), WORKER, ["run shell 600", "meanwhile"]);

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `mastra:${id}`,
    // Mastra keeps a call, its result and the answer in one assistant message.
    afterWait: (call) => ["run shell 600", `result:${call} answer:${call}`, "next", "answer:next"],
    // Mastra saves in the background: a's user message and call may have been saved while
    // it still owned the thread, or not; its result and answer came too late and were refused.
    afterFreeze: (call) => [
      ["run shell 1200", `call:${call}`, "hello", "answer:hello"],
      ["hello", "answer:hello"],
    ],
  });

  it("a ledgered call id seen before on the thread never runs again; the stored output is answered", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const a = await h.worker("a");
      for (const input of ["run shell 5 as call_dup", "run shell 5 as call_dup"]) {
        const reply = (await a.post("/run", { id: "t5", input })) as RunReply;
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
      // The stream lets go in its onFinish, which Mastra calls just after `text` resolves.
      let state = await client.get("mastra:t8");
      for (let i = 0; i < 100 && state.lease !== undefined; i++) {
        await new Promise((r) => setTimeout(r, 20));
        state = await client.get("mastra:t8");
      }
      assert.equal(state.lease, undefined, "the stream's end let go of the thread");
      assert.equal(state.lastEnded?.end, "released");
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
