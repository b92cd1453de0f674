// @leasehold/client/langgraph with agent server processes (test/langgraph-worker.ts):
// LangGraph.js graphs in separate processes on one SqliteSaver file, their
// model the fake Responses API on loopback. Without leasehold a second
// process's run sends the first's still-running call with no output (the
// provider's 400); with it one process owns the thread, a kill -9 of the
// owner is taken over by exactly one other, and a frozen owner's late
// checkpoint is refused.

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { Harness, type RunReply, script } from "./framework-workers.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";
import { createClient } from "../src/index.js";
import { UNKNOWN_RESULT } from "../src/langgraph.js";

const WORKER = fileURLToPath(new URL("./langgraph-worker.js", import.meta.url));

interface Message {
  readonly role: string;
  readonly text: string;
  readonly content?: string;
}

const show = (value: unknown): string => JSON.stringify(value, (_, v: unknown) => (typeof v === "bigint" ? v.toString() : v));

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("langgraph.js: one owner per thread, across processes", () => {
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

  it("without leasehold, a second process sends the first's running call with no output: the provider's 400", async () => {
    const h = new Harness(WORKER, mock, undefined);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { thread: "t1", input: "run shell 600" });
      const call = await h.started("a");
      const second = (await b.post("/run", { thread: "t1", input: "hello" })) as RunReply;
      assert.equal(second.ok, false, JSON.stringify(second));
      assert.match(second.message ?? "", new RegExp(`No tool output found for function call ${call}`));
      assert.equal(((await first) as RunReply).ok, true);
    } finally {
      await h.close();
    }
  });

  it("with leasehold, the second process is Busy and writes nothing; a waiting one continues the whole thread", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("c", { AGENT_WAIT_MS: "10000" })]);
      const first = a.post("/run", { thread: "t2", input: "run shell 600" });
      const call = await h.started("a");
      const busy = (await b.post("/run", { thread: "t2", input: "hello" })) as RunReply;
      assert.equal(busy.error, "BusyError", JSON.stringify(busy));
      const waiting = c.post("/run", { thread: "t2", input: "next" });
      assert.equal(((await first) as RunReply).ok, true);
      assert.equal(((await waiting) as RunReply).ok, true);
      assert.deepEqual(
        (await h.items<Message>("t2")).map((m) => m.text),
        ["run shell 600", `call:${call}`, `result:${call}`, `answer:${call}`, "next", "answer:next"],
      );
      assert.equal(mock.rejections("t2").length, 0);
    } finally {
      await h.close();
    }
  });

  it("kill -9 of the owner mid-tool: exactly one of two racing processes takes over, and the begun call is settled unknown, never re-run", async () => {
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
      assert.deepEqual(h.effectLines(), [`a start ${call}`], "the lost owner's call was never run again");
      const calls = await h.ledger("langgraph:t3");
      assert.deepEqual(calls.map((x) => [x.callId, x.state]), [[call, "unknown"]]);
      // The server's record: a's term expired, then one taker, then the other.
      const client = createClient({ baseUrl: server.baseUrl });
      try {
        const terms = [...(await client.history("langgraph:t3")).entries].reverse();
        assert.deepEqual(terms.slice(0, 3).map((t) => t.end), ["expired", "released", "released"], show(terms));
        assert.deepEqual(new Set(terms.slice(1, 3).map((t) => t.owner)), new Set(["b", "c"]));
      } finally {
        client.close();
      }
      assert.equal(mock.rejections("t3").length, 0, "the taken-over call was answered (as unknown) before the model saw it");
    } finally {
      await h.close();
    }
  });

  it("an owner frozen (SIGSTOP) past its TTL: the new owner takes over, and the old one's late checkpoint is refused", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b", { AGENT_WAIT_MS: "5000" })]);
      const first = a.post("/run", { thread: "t4", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500); // past a's 1 s TTL: the server ends its term
      const second = (await b.post("/run", { thread: "t4", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      a.thaw();
      const late = (await first) as RunReply;
      assert.equal(late.ok, false, JSON.stringify(late));
      assert.match(late.error ?? "", /LeaseLostError|StaleFenceError/);
      const messages = await h.items<Message>("t4");
      // b finished the step a was lost in: the call answered as unknown (a's
      // own result, "ran for 1200 ms", came too late and was refused), then hello.
      assert.deepEqual(
        messages.map((m) => m.text),
        ["run shell 1200", `call:${call}`, `result:${call}`, `answer:${call}`, "hello", "answer:hello"],
      );
      assert.equal(messages[2]?.content, UNKNOWN_RESULT);
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });
});
