// @leasehold/client/ai-sdk with agent server processes (test/ai-sdk-worker.ts):
// `generateText` in separate processes on one chat store (SQLite), against
// the fake Responses API on loopback. Without leasehold a second process
// answers with no trace of a turn already under way and the store puts that
// turn after its answer; with it one process owns the chat, a kill -9 of the
// owner is taken over by exactly one other, and a frozen owner's late save
// is refused.

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { Harness, type RunReply, script } from "./framework-workers.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";

const WORKER = fileURLToPath(new URL("./ai-sdk-worker.js", import.meta.url));

interface Message {
  readonly role: string;
  readonly text: string;
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe("ai sdk: one owner per chat, across processes", () => {
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

  it("without leasehold, a second process answers with no trace of the turn under way, and the store puts that turn after the answer", async () => {
    const h = new Harness(WORKER, mock, undefined);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { chat: "c1", input: "run shell 600" });
      await h.started("a");
      const second = (await b.post("/run", { chat: "c1", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(((await first) as RunReply).ok, true);
      const asked = mock.requests.find((r) => r.session === "c1" && r.input.some((i) => i.role === "user" && itemText(i) === "hello"));
      assert.ok(asked !== undefined);
      assert.ok(!asked.input.some((i) => i.role === "user" && itemText(i).startsWith("run shell")), JSON.stringify(asked.input));
      const users = (await h.items<Message>("c1")).filter((m) => m.role === "user").map((m) => m.text);
      assert.deepEqual(users, ["hello", "run shell 600"]);
    } finally {
      await h.close();
    }
  });

  it("with leasehold, the second process is Busy and asks nothing; a waiting one continues the whole chat", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("c", { AGENT_WAIT_MS: "10000" })]);
      const first = a.post("/run", { chat: "c2", input: "run shell 600" });
      const call = await h.started("a");
      const busy = (await b.post("/run", { chat: "c2", input: "hello" })) as RunReply;
      assert.equal(busy.error, "BusyError", JSON.stringify(busy));
      const waiting = c.post("/run", { chat: "c2", input: "next" });
      assert.equal(((await first) as RunReply).ok, true);
      const third = (await waiting) as RunReply;
      assert.equal(third.ok, true, JSON.stringify(third));
      assert.equal(third.recovered, false);
      assert.deepEqual(
        (await h.items<Message>("c2")).map((m) => m.text),
        ["run shell 600", `call:${call}`, `result:${call}`, `answer:${call}`, "next", "answer:next"],
      );
      assert.ok(!mock.requests.some((r) => r.session === "c2" && r.input.some((i) => itemText(i) === "hello")), "the busy run asked nothing");
      assert.equal(mock.rejections("c2").length, 0);
    } finally {
      await h.close();
    }
  });

  it("kill -9 of the owner mid-tool: exactly one of two racing processes takes over, and the begun call is settled unknown, never re-run", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const wait = { AGENT_WAIT_MS: "10000" };
      const [a, b, c] = await Promise.all([h.worker("a"), h.worker("b", wait), h.worker("c", wait)]);
      void a.post("/run", { chat: "c3", input: "run shell 5000" }).catch(() => undefined);
      const call = await h.started("a");
      await a.kill();
      const replies = (await Promise.all([
        b.post("/run", { chat: "c3", input: "hello" }),
        c.post("/run", { chat: "c3", input: "again" }),
      ])) as RunReply[];
      assert.ok(replies.every((r) => r.ok), JSON.stringify(replies));
      assert.deepEqual(replies.map((r) => r.recovered).sort(), [false, true], JSON.stringify(replies));
      assert.deepEqual(h.effectLines(), [`a start ${call}`], "the lost owner's call was never run again");
      const calls = await h.ledger("chat:c3");
      assert.deepEqual(calls.map((x) => [x.callId, x.state]), [[call, "unknown"]]);
      assert.equal(mock.rejections("c3").length, 0);
    } finally {
      await h.close();
    }
  });

  it("an owner frozen (SIGSTOP) past its TTL: the new owner takes over, and the old one's late save is refused", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b", { AGENT_WAIT_MS: "5000" })]);
      const first = a.post("/run", { chat: "c4", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500); // past a's 1 s TTL: the server ends its term
      const second = (await b.post("/run", { chat: "c4", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(second.recovered, true);
      a.thaw();
      const late = (await first) as RunReply;
      assert.equal(late.ok, false, JSON.stringify(late));
      assert.match(late.error ?? "", /LeaseLostError|StaleFenceError/);
      assert.deepEqual((await h.items<Message>("c4")).map((m) => m.text), ["hello", "answer:hello"]);
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });
});
