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
import { Harness, ownershipContract, type RunReply, script } from "./framework-workers.js";
import type { Message } from "./worker-http.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";

const WORKER = fileURLToPath(new URL("./ai-sdk-worker.js", import.meta.url));

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
      const first = a.post("/run", { id: "c1", input: "run shell 600" });
      await h.started("a");
      const second = (await b.post("/run", { id: "c1", input: "hello" })) as RunReply;
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

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `chat:${id}`,
    // The chat is saved when a turn ends (onFinish): the frozen owner's save was refused.
    afterFreeze: () => [["hello", "answer:hello"]],
  });
});
