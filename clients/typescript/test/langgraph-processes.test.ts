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
import { Harness, ownershipContract, type RunReply, script } from "./framework-workers.js";
import type { Message } from "./worker-http.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";
import { UNKNOWN_RESULT } from "../src/langgraph.js";

const WORKER = fileURLToPath(new URL("./langgraph-worker.js", import.meta.url));


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
      const first = a.post("/run", { id: "t1", input: "run shell 600" });
      const call = await h.started("a");
      const second = (await b.post("/run", { id: "t1", input: "hello" })) as RunReply;
      assert.equal(second.ok, false, JSON.stringify(second));
      assert.match(second.message ?? "", new RegExp(`No tool output found for function call ${call}`));
      assert.equal(((await first) as RunReply).ok, true);
    } finally {
      await h.close();
    }
  });

  ownershipContract(() => ({ mock, server }), {
    worker: WORKER,
    key: (id) => `langgraph:${id}`,
    // b finished the step a was lost in (a's call answered as unknown: a's own result came
    // too late and was refused), then took its input.
    afterFreeze: (call) => [["run shell 1200", `call:${call}`, `result:${call}`, `answer:${call}`, "hello", "answer:hello"]],
  });

  it("the new owner answers the lost owner's call as unknown, not with the late result", async () => {
    const h = new Harness(WORKER, mock, server);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b", { AGENT_WAIT_MS: "5000" })]);
      const first = a.post("/run", { id: "s5", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500);
      assert.equal(((await b.post("/run", { id: "s5", input: "hello" })) as RunReply).ok, true);
      a.thaw();
      assert.equal(((await first) as RunReply).ok, false);
      const result = (await h.items<Message>("s5")).find((m) => m.text === `result:${call}`);
      assert.equal(result?.content, UNKNOWN_RESULT);
    } finally {
      await h.close();
    }
  });
});
