// Mastra's signals runtime (`agent.sendSignal`, its cross-process thread
// lease) with `leased(pubsub, lh)` from `@leasehold/client/mastra`: real
// packages, the fake Responses API on loopback. Each "process" is an agent
// with its own pubsub object (Mastra keeps its runtime state per pubsub)
// on one shared event bus, as processes share a Redis pubsub.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Agent } from "@mastra/core/agent";
import { EventEmitterPubSub, PubSub } from "@mastra/core/events";
import { LibSQLStore } from "@mastra/libsql";
import { Memory } from "@mastra/memory";
import { script } from "./framework-workers.js";
import { type MockResponses, startMockResponses } from "./mock-responses.js";
import { startServer, type TestServer } from "./server.js";
import { createClient, type LeaseholdClient } from "../src/index.js";
import { LeaseholdLeaseProvider, leased } from "../src/mastra.js";

/** One process's view of a bus it shares with others: its own identity (and Mastra state), the bus's events, no leases. */
class Link extends PubSub {
  constructor(readonly bus: EventEmitterPubSub) {
    super();
  }
  publish(...args: Parameters<PubSub["publish"]>): Promise<void> {
    return this.bus.publish(...args);
  }
  subscribe(...args: Parameters<PubSub["subscribe"]>): Promise<void> {
    return this.bus.subscribe(...args);
  }
  unsubscribe(...args: Parameters<PubSub["unsubscribe"]>): Promise<void> {
    return this.bus.unsubscribe(...args);
  }
  flush(): Promise<void> {
    return this.bus.flush();
  }
}

/** A link whose lease backend cannot be reached (every lease call throws), as a Redis that is down. */
class UnreachableLeases extends Link {
  #down(): Promise<never> {
    return Promise.reject(new Error("ECONNREFUSED"));
  }
  acquireLease(): Promise<never> {
    return this.#down();
  }
  getLeaseOwner(): Promise<never> {
    return this.#down();
  }
  releaseLease(): Promise<never> {
    return this.#down();
  }
  renewLease(): Promise<never> {
    return this.#down();
  }
  transferLease(): Promise<never> {
    return this.#down();
  }
}

const wake = { behavior: "wake" } as const;

describe("mastra: the signals runtime's thread lease on leasehold", () => {
  let mock: MockResponses;
  let server: TestServer;
  let dir: string;
  const clients: LeaseholdClient[] = [];
  before(async () => {
    mock = await startMockResponses(script);
    server = await startServer();
    dir = mkdtempSync(join(tmpdir(), "mastra-signals-"));
  });
  after(async () => {
    for (const c of clients) c.close();
    await mock.close();
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const client = (owner: string, baseUrl = server.baseUrl): LeaseholdClient => {
    const c = createClient({ baseUrl, owner });
    clients.push(c);
    return c;
  };
  const agentOn = (name: string, pubsub: PubSub): Agent =>
    new Agent({
      id: "assistant",
      name: "assistant",
      instructions: "test",
      model: { id: "openai/mock", url: mock.baseURL, apiKey: "test", api: "responses" },
      memory: new Memory({ storage: new LibSQLStore({ id: name, url: `file:${join(dir, "threads.db")}` }), options: { lastMessages: 50 } }),
      pubsub,
    });
  /** The model requests that carried `text` as input. */
  const asked = (text: string): number =>
    mock.requests.filter((r) => r.input.some((i) => JSON.stringify(i.content ?? "").includes(text))).length;

  it("two processes that wake one idle thread both run it without a lease; with leased() one runs and the other defers to it", async () => {
    const bus = new EventEmitterPubSub();
    // Without: a pubsub that cannot lease, so Mastra falls back to "everyone wins".
    {
      const [a, b] = [agentOn("a0", new Link(bus)), agentOn("b0", new Link(bus))];
      const sent = [
        a.sendSignal({ type: "user", contents: "plain from a" }, { resourceId: "u", threadId: "t1", ifIdle: wake }),
        b.sendSignal({ type: "user", contents: "plain from b" }, { resourceId: "u", threadId: "t1", ifIdle: wake }),
      ];
      const decided = await Promise.all(sent.map((s) => s.accepted));
      assert.deepEqual(decided.map((d) => d.action), ["wake", "wake"], "both processes ran the thread at once");
      for (const d of decided) if (d.action === "wake") await d.output.text;
      assert.equal(asked("plain from a") + asked("plain from b"), 2);
    }
    // With: the same, each pubsub leased() on its own leasehold client.
    {
      const errors: unknown[] = [];
      const onError = (err: unknown): void => void errors.push(err);
      const a = agentOn("a1", leased(new Link(bus), client("proc-a"), { onError }));
      const b = agentOn("b1", leased(new Link(bus), client("proc-b"), { onError }));
      const sent = [
        a.sendSignal({ type: "user", contents: "owned from a" }, { resourceId: "u", threadId: "t2", ifIdle: wake }),
        b.sendSignal({ type: "user", contents: "owned from b" }, { resourceId: "u", threadId: "t2", ifIdle: wake }),
      ];
      const decided = await Promise.all(sent.map((s) => s.accepted));
      const woke = decided.filter((d) => d.action === "wake");
      assert.equal(woke.length, 1, JSON.stringify(decided.map((d) => d.action)));
      const deferred = decided.find((d) => d.action === "deliver");
      assert.ok(deferred !== undefined && woke[0] !== undefined, JSON.stringify(decided.map((d) => d.action)));
      assert.equal(deferred.runId, woke[0].runId, "the loser hands its signal to the winner's run");
      if (woke[0].action === "wake") await woke[0].output.text;
      assert.equal(asked("owned from a") + asked("owned from b"), 1, "one run of the thread");
      assert.deepEqual(errors, []);
      // Mastra releases the thread when the run ends; leasehold saw one term, released.
      const key = `mastra-thread:u/t2`;
      let state = await clients[0]!.get(key);
      for (let i = 0; i < 100 && state.lease !== undefined; i++) {
        await new Promise((r) => setTimeout(r, 20));
        state = await clients[0]!.get(key);
      }
      assert.equal(state.lease, undefined);
      assert.equal(state.lastEnded?.end, "released");
      assert.equal(state.lastEnded?.owner, woke[0].runId);
    }
  });

  it("a lease backend that cannot be reached: Mastra's fails open and both run; leasehold's fails closed and neither does", async () => {
    const bus = new EventEmitterPubSub();
    {
      const [a, b] = [agentOn("a2", new UnreachableLeases(bus)), agentOn("b2", new UnreachableLeases(bus))];
      const decided = await Promise.all(
        [a, b].map((x, i) => x.sendSignal({ type: "user", contents: `open ${i}` }, { resourceId: "u", threadId: "t3", ifIdle: wake }).accepted),
      );
      assert.deepEqual(decided.map((d) => d.action), ["wake", "wake"], "an unreachable lease counted as won, twice");
      for (const d of decided) if (d.action === "wake") await d.output.text;
    }
    {
      const errors: string[] = [];
      const onError = (_err: unknown, key: string): void => void errors.push(key);
      const down = "http://127.0.0.1:1";
      const a = agentOn("a3", leased(new Link(bus), client("proc-a", down), { onError }));
      const b = agentOn("b3", leased(new Link(bus), client("proc-b", down), { onError }));
      const decided = await Promise.all(
        [a, b].map((x, i) => x.sendSignal({ type: "user", contents: `closed ${i}` }, { resourceId: "u", threadId: "t4", ifIdle: wake }).accepted),
      );
      assert.ok(decided.every((d) => d.action !== "wake"), JSON.stringify(decided.map((d) => d.action)));
      assert.equal(asked("closed 0") + asked("closed 1"), 0, "no run without a lease");
      assert.deepEqual(errors, ["u\0t4", "u\0t4"], "each refusal was reported");
    }
  });

  it("the provider keeps Mastra's contract: one owner, idempotent for it, release and transfer only by the owner, renew false once lost", async () => {
    const a = new LeaseholdLeaseProvider(client("proc-a"));
    const b = new LeaseholdLeaseProvider(client("proc-b"));
    const key = "u\0t5";
    assert.deepEqual(await a.acquireLease(key, "run-1", 5_000), { acquired: true, owner: "run-1" });
    assert.deepEqual(await a.acquireLease(key, "run-1", 5_000), { acquired: true, owner: "run-1" }, "the same owner again");
    assert.deepEqual(await b.acquireLease(key, "run-2", 5_000), { acquired: false, owner: "run-1" });
    assert.deepEqual(await a.acquireLease(key, "run-9", 5_000), { acquired: false, owner: "run-1" }, "another run in the same process");
    assert.equal(await b.getLeaseOwner(key), "run-1");
    assert.equal(await b.getLeaseOwner("u\0never"), undefined);
    await b.releaseLease(key, "run-1"); // b holds nothing: a no-op
    await a.releaseLease(key, "run-2"); // not the owner: a no-op
    assert.equal(await b.getLeaseOwner(key), "run-1");
    assert.equal(await a.renewLease(key, "run-1", 5_000), true);
    assert.equal(await b.transferLease(key, "run-1", "run-2", 5_000), false, "only the holding process transfers");
    const fence = a.lease(key)!.fence;
    assert.equal(await a.transferLease(key, "run-1", "run-3", 5_000), true);
    assert.ok(a.lease(key)!.fence > fence, "the successor's term has a greater fence");
    assert.equal(a.lease(key)!.previous?.handedOff, true);
    assert.equal(await b.getLeaseOwner(key), "run-3");
    assert.deepEqual(await b.acquireLease(key, "run-2", 5_000), { acquired: false, owner: "run-3" });
    await a.lease(key)!.suspend(); // as if the term were lost
    assert.equal(await a.renewLease(key, "run-3", 5_000), false);
    assert.deepEqual(await b.acquireLease(key, "run-2", 5_000), { acquired: true, owner: "run-2" });
    await b.releaseLease(key, "run-2");
    assert.equal(await a.getLeaseOwner(key), undefined);
  });
});
