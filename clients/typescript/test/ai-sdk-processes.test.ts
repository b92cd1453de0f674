// @leasehold/client/ai-sdk with agent server processes (test/ai-sdk-worker.ts):
// `generateText` in separate processes on one chat store (SQLite), against
// the fake Responses API on loopback. Without leasehold a second process
// answers with no trace of a turn already under way and the store puts that
// turn after its answer; with it one process owns the chat, a kill -9 of the
// owner is taken over by exactly one other, and a frozen owner's late save
// is refused.

import { fileURLToPath } from "node:url";
import { after, before, describe } from "node:test";
import { forkWithoutLeasehold, ownershipContract, script } from "./framework-workers.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
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

  // The SDK saves a turn as it ends: the later turn is stored first.
  forkWithoutLeasehold(() => ({ mock }), WORKER, ["meanwhile", "run shell 600"]);

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `chat:${id}`,
    // The chat is saved when a turn ends (onFinish): the frozen owner's save was refused.
    afterFreeze: () => [["hello", "answer:hello"]],
  });
});
