// @leasehold/client/ai-sdk against the real AI SDK (`ai` 7, @ai-sdk/openai)
// and a fake OpenAI Responses server on loopback: one owner per chat, tools
// through the ledger, a lost owner stopped before its next step, streams
// holding their lease until they end, and a takeover's unsettled call.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { createOpenAI } from "@ai-sdk/openai";
import { jsonSchema, stepCountIs, tool } from "ai";

import { BusyError, createClient, type LeaseholdClient, LeaseLostError } from "../src/index.js";
import { currentLease, generateText, streamText, UNKNOWN_RESULT } from "../src/ai-sdk.js";
import { itemText, type MockResponses, startMockResponses } from "./mock-responses.js";
import { checksAnswered, freePort, startServer, type TestServer, waitFor } from "./server.js";

/** Calls `shell` once per user message (reusing `ids` in turn when given), then answers. */
function script(ids: string[] = []): Parameters<typeof startMockResponses>[0] {
  return (input) => {
    const last = input.at(-1);
    if (last?.type === "function_call_output") return { text: `done: ${String(last.output)}` };
    const id = ids.shift();
    const cmd = last === undefined ? "" : itemText(last);
    return { call: { name: "shell", args: { cmd }, ...(id === undefined ? {} : { id }) } };
  };
}

class Shell {
  effects: string[] = [];
  entered = false;
  #open: Promise<void> = Promise.resolve();
  #release: () => void = () => undefined;

  hold(): void {
    this.#open = new Promise((resolve) => {
      this.#release = resolve;
    });
  }

  release(): void {
    this.#release();
  }

  readonly tool = tool({
    description: "Runs a shell command.",
    inputSchema: jsonSchema<{ cmd: string }>({ type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] }),
    execute: async ({ cmd }: { cmd: string }) => {
      this.entered = true;
      await this.#open;
      this.effects.push(cmd);
      return `ran ${cmd}`;
    },
  });
}

describe("ai-sdk: generateText / streamText as the chat's owner", () => {
  let server: TestServer;
  let model: MockResponses;
  let lh: LeaseholdClient;
  let other: LeaseholdClient;
  const ids: string[] = [];

  before(async () => {
    server = await startServer();
    model = await startMockResponses(script(ids));
    lh = createClient({ baseUrl: server.baseUrl, owner: "a" });
    other = createClient({ baseUrl: server.baseUrl, owner: "b" });
  });
  after(async () => {
    lh.close();
    other.close();
    await model.close();
    await server.close();
  });

  const openai = (): ReturnType<typeof createOpenAI> => createOpenAI({ baseURL: model.baseURL, apiKey: "test" });

  it("a second run of the chat is refused before it asks the model; the first finishes and lets go", async () => {
    const shell = new Shell();
    shell.hold();
    const args = (prompt: string) => ({
      model: openai().responses("mock"),
      prompt,
      tools: { shell: shell.tool },
      stopWhen: stepCountIs(4),
    });
    const first = generateText(lh, "chat:1", args("ls"));
    await waitFor(() => shell.entered, 5000, "the first run's tool");
    const requests = model.requests.length;
    await assert.rejects(generateText(other, "chat:1", args("rm -rf build")), (err: unknown) => {
      assert.ok(err instanceof BusyError);
      assert.equal(err.holder, "a");
      return true;
    });
    assert.equal(model.requests.length, requests);
    shell.release();
    const result = await first;
    assert.equal(result.text, "done: ran ls");
    assert.deepEqual(shell.effects, ["ls"]);
    const state = await lh.get("chat:1");
    assert.equal(state.lease, undefined);
    assert.equal(state.lastEnded?.end, "released");
    assert.equal(model.rejections().length, 0);
  });

  it("a step of a fresh lease asks the server nothing; onFinish's gate does", async () => {
    const metricsAt = `127.0.0.1:${await freePort()}`;
    const counted = await startServer(undefined, "127.0.0.1:0", ["--metrics-listen", metricsAt]);
    const client = createClient({ baseUrl: counted.baseUrl, owner: "a" });
    try {
      const shell = new Shell();
      const args = {
        model: openai().responses("mock"),
        prompt: "ls",
        tools: { shell: shell.tool },
        stopWhen: stepCountIs(4),
      };
      const before = await checksAnswered(metricsAt);
      const result = await generateText(client, "chat:fresh", args);
      assert.equal(result.text, "done: ran ls");
      assert.equal(result.steps.length, 2);
      assert.equal(await checksAnswered(metricsAt), before, "the two steps' gates made no Check");
      await generateText(client, "chat:fresh-2", { ...args, onFinish: () => undefined });
      assert.equal(await checksAnswered(metricsAt), before + 1, "the gate before onFinish asked the server");
    } finally {
      client.close();
      await counted.close();
    }
  });

  it("a tool call id seen before in the chat never runs again", async () => {
    const shell = new Shell();
    ids.push("call_dup", "call_dup");
    const args = {
      model: openai().responses("mock"),
      prompt: "rm -rf build",
      tools: { shell: shell.tool },
      stopWhen: stepCountIs(4),
    };
    await generateText(lh, "chat:2", args);
    const again = await generateText(lh, "chat:2", args);
    assert.deepEqual(shell.effects, ["rm -rf build"]);
    assert.equal(again.text, "done: ran rm -rf build");
  });

  it("a run that loses its lease stops before its next step and never saves", async () => {
    let saved = 0;
    const losing = tool({
      description: "Runs a shell command.",
      inputSchema: jsonSchema<{ cmd: string }>({ type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] }),
      execute: async ({ cmd }: { cmd: string }) => {
        await currentLease().release(); // the term ends under the run
        return `ran ${cmd}`;
      },
    });
    const before = model.requests.length;
    await assert.rejects(
      generateText(lh, "chat:3", {
        model: openai().responses("mock"),
        prompt: "ls",
        tools: { shell: losing },
        stopWhen: stepCountIs(4),
        onFinish: () => {
          saved += 1;
        },
      }),
      LeaseLostError,
    );
    assert.equal(saved, 0);
    assert.equal(model.requests.length, before + 1); // the first step only
  });

  it("a run whose model fails throws the model's error, not a loss, and leaves the chat suspended", async () => {
    const dead = createOpenAI({ baseURL: "http://127.0.0.1:1/v1", apiKey: "test" });
    await assert.rejects(generateText(lh, "chat:fail", { model: dead.responses("mock"), prompt: "ls", maxRetries: 0 }), (err: unknown) => {
      assert.ok(!(err instanceof LeaseLostError), `a model failure reported as ${String(err)}`);
      return true;
    });
    assert.equal((await lh.get("chat:fail")).lastEnded?.end, "suspended");
  });

  it("a streamed run holds its lease until its stream ends", async () => {
    const shell = new Shell();
    shell.hold();
    let finished = "";
    const result = await streamText(lh, "chat:4", {
      model: openai().responses("mock"),
      prompt: "ls",
      tools: { shell: shell.tool },
      stopWhen: stepCountIs(4),
      onFinish: (event) => {
        finished = `${event.text} @ fence ${currentLease().fence}`;
      },
    });
    const consumed = result.consumeStream();
    await waitFor(() => shell.entered, 5000, "the streamed run's tool");
    await assert.rejects(
      streamText(other, "chat:4", { model: openai().responses("mock"), prompt: "cat" }),
      BusyError,
    );
    shell.release();
    await consumed;
    assert.equal(await result.text, "done: ran ls");
    await waitFor(() => finished !== "", 5000, "onFinish");
    let state = await lh.get("chat:4");
    for (let i = 0; i < 100 && state.lease !== undefined; i++) {
      await new Promise((r) => setTimeout(r, 20));
      state = await lh.get("chat:4");
    }
    assert.equal(state.lease, undefined);
    assert.equal(state.lastEnded?.end, "released");
    assert.equal(finished, `done: ran ls @ fence ${state.lastEnded?.fence}`);
  });

  it("a chat taken over from a lost owner answers its unsettled call as unknown, never running it", async () => {
    const lost = await other.acquire("chat:5", { ttlMs: 10_000 });
    // The lost owner began call_7 and never settled it.
    void lost.runToolCalls([{ callId: "call_7", name: "shell" }], () => new Promise(() => undefined)).catch(() => undefined);
    for (let i = 0; i < 100 && (await lost.listToolCalls({ unsettled: true })).length === 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    await lost.suspend();
    const shell = new Shell();
    ids.push("call_7");
    const result = await generateText(lh, "chat:5", {
      model: openai().responses("mock"),
      prompt: "ls",
      tools: { shell: shell.tool },
      stopWhen: stepCountIs(4),
    });
    assert.deepEqual(shell.effects, []);
    assert.ok(result.text.startsWith("done: ") && result.text.includes(UNKNOWN_RESULT), result.text);
  });
});
