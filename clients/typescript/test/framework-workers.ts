// What the framework adapters' process tests share: the scripted model,
// the reply of a worker's POST /run, a harness of agent server processes
// (one test/*-worker.ts each) on one database, with a file their tools
// append their side effects to, and the ownership contract every adapter
// meets (ownershipContract).

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { type AgentProcess, startAgent } from "./agents.js";
import { itemText, type InputItem, type MockResponses, type ModelReply } from "./mock-responses.js";
import { type TestServer, waitFor } from "./server.js";
import type { Message } from "./worker-http.js";
import { createClient, type ToolCallRecord } from "../src/index.js";

/** The last user message "run shell N [as ID]" calls shell; a tool output after it gets "answer:<call ids>"; anything else is answered. */
export function script(input: readonly InputItem[]): ModelReply {
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

export interface RunReply {
  readonly ok: boolean;
  readonly output?: unknown;
  readonly error?: string;
  readonly message?: string;
  readonly recovered?: boolean;
}

export class Harness {
  readonly dir = mkdtempSync(join(tmpdir(), "framework-"));
  readonly db = join(this.dir, "agents.db");
  readonly effects = join(this.dir, "effects.log");
  readonly workers: AgentProcess[] = [];
  /** Workers still starting: close() waits for them, so none outlives the test (its pipes would keep node --test waiting). */
  readonly #starting = new Set<Promise<AgentProcess>>();
  /** `worker`: the worker script; `server`: the leasehold server (the workers own their sessions) or none. */
  constructor(
    readonly script: string,
    readonly mock: MockResponses,
    readonly server: TestServer | undefined,
    readonly env: Readonly<Record<string, string>> = {},
  ) {
    writeFileSync(this.effects, "");
  }
  async worker(name: string, env: Record<string, string> = {}): Promise<AgentProcess> {
    const starting = startAgent(this.script, {
      AGENT_NAME: name,
      AGENT_DB: this.db,
      AGENT_EFFECTS: this.effects,
      MODEL_URL: this.mock.baseURL,
      ...(this.server === undefined ? {} : { AGENT_OWNED: "1", LEASEHOLD_URL: this.server.baseUrl }),
      ...this.env,
      ...env,
    });
    this.#starting.add(starting);
    try {
      const w = await starting;
      this.workers.push(w);
      return w;
    } finally {
      this.#starting.delete(starting);
    }
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
  /** What the first worker's GET /items?id= answers: the session's or thread's stored items. */
  async items<T>(id: string): Promise<T[]> {
    return (await this.workers[0]!.get(`/items?id=${id}`)) as T[];
  }
  async close(): Promise<void> {
    // A worker that failed to start took the test down while others were still starting.
    await Promise.allSettled([...this.#starting]);
    await Promise.all(this.workers.map((w) => w.stop()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}


/**
 * The failure without leasehold, for a framework that saves a turn as it
 * ends: a second process drives session "s1" while the first's turn runs.
 * Its model is asked with no trace of that turn, and the store then holds
 * both turns in `storedUsers` order, a history neither model saw.
 */
export function forkWithoutLeasehold(env: () => { mock: MockResponses }, worker: string, storedUsers: readonly string[]): void {
  it("without leasehold, a second process drives the session while the first's turn runs: its model never sees that turn, and the store keeps both turns as neither model saw them", async () => {
    const h = new Harness(worker, env().mock, undefined);
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b")]);
      const first = a.post("/run", { id: "s1", input: "run shell 600" });
      await h.started("a");
      const second = (await b.post("/run", { id: "s1", input: "meanwhile" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(((await first) as RunReply).ok, true);
      const asked = env().mock.requests.find((r) => r.input.some((i) => i.role === "user" && itemText(i) === "meanwhile"));
      assert.ok(asked !== undefined);
      assert.ok(!asked.input.some((i) => i.role === "user" && itemText(i).startsWith("run shell")), JSON.stringify(asked.input));
      const users = (await h.items<Message>("s1")).filter((m) => m.role === "user").map((m) => m.text);
      assert.deepEqual(users, storedUsers);
    } finally {
      await h.close();
    }
  });
}

/** What differs between the frameworks in the shared process tests. */
export interface Contract {
  /** The worker script (test/*-worker.js). */
  readonly worker: string;
  /** More environment for every worker (a mode of the worker script). */
  readonly env?: Readonly<Record<string, string>>;
  /** The lease key of session `id`. */
  readonly key: (id: string) => string;
  /** The stored texts after "run shell 600" (tool call `call`) and then "next". */
  readonly afterWait?: (call: string) => string[];
  /**
   * The stored texts after a's "run shell 1200" (call `call`) froze past its
   * TTL and b's "hello": one of these (a framework that saves in the
   * background may or may not have saved a's first writes before the freeze).
   */
  readonly afterFreeze: (call: string) => string[][];
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const texts = async (h: Harness, id: string): Promise<string[]> => (await h.items<Message>(id)).map((m) => m.text);

/**
 * The ownership contract every framework adapter meets with agent server
 * processes on one database (registered as `it`s in the caller's
 * `describe`): one writer at a time, a kill -9 of the owner taken over by
 * exactly one other with its begun call settled unknown and never re-run,
 * and a frozen owner's late write refused.
 */
export function ownershipContract(env: () => { mock: MockResponses; server: TestServer }, c: Contract): void {
  const harness = (): Harness => new Harness(c.worker, env().mock, env().server, c.env);

  it("the second process is Busy and asks nothing; a waiting one continues the whole history", async () => {
    const h = harness();
    try {
      const [a, b, w] = await Promise.all([h.worker("a"), h.worker("b"), h.worker("w", { AGENT_WAIT_MS: "10000" })]);
      const first = a.post("/run", { id: "s2", input: "run shell 600" });
      const call = await h.started("a");
      const busy = (await b.post("/run", { id: "s2", input: "while busy" })) as RunReply;
      assert.equal(busy.error, "BusyError", JSON.stringify(busy));
      const waiting = w.post("/run", { id: "s2", input: "next" });
      assert.equal(((await first) as RunReply).ok, true);
      const third = (await waiting) as RunReply;
      assert.equal(third.ok, true, JSON.stringify(third));
      assert.equal(third.recovered, false);
      const expected = c.afterWait?.(call) ?? ["run shell 600", `call:${call}`, `result:${call}`, `answer:${call}`, "next", "answer:next"];
      assert.deepEqual(await texts(h, "s2"), expected);
      const asked = (text: string) => env().mock.requests.some((r) => r.input.some((i) => i.role === "user" && itemText(i) === text));
      assert.ok(!asked("while busy"), "the busy run asked the model nothing");
      const next = env().mock.requests.find((r) => r.input.some((i) => i.role === "user" && itemText(i) === "next"));
      assert.ok(
        next?.input.some((i) => i.role === "user" && itemText(i) === "run shell 600"),
        "the waiting run's model saw the first turn",
      );
    } finally {
      await h.close();
    }
  });

  it("kill -9 of the owner mid-tool: exactly one of two racing processes takes over, and the begun call is settled unknown, never re-run", async () => {
    const h = harness();
    try {
      const wait = { AGENT_WAIT_MS: "10000" };
      const [a, b, d] = await Promise.all([h.worker("a"), h.worker("b", wait), h.worker("d", wait)]);
      void a.post("/run", { id: "s3", input: "run shell 5000" }).catch(() => undefined);
      const call = await h.started("a");
      await a.kill();
      const replies = (await Promise.all([
        b.post("/run", { id: "s3", input: "hello" }),
        d.post("/run", { id: "s3", input: "again" }),
      ])) as RunReply[];
      assert.ok(replies.every((r) => r.ok), JSON.stringify(replies));
      assert.deepEqual(replies.map((r) => r.recovered).sort(), [false, true], JSON.stringify(replies));
      assert.deepEqual(h.effectLines(), [`a start ${call}`], "the lost owner's call was never run again");
      assert.deepEqual((await h.ledger(c.key("s3"))).map((x) => [x.callId, x.state]), [[call, "unknown"]]);
      // The server's record, newest first: a's term expired, then one taker, then the other.
      const client = createClient({ baseUrl: env().server.baseUrl });
      try {
        const terms = [...(await client.history(c.key("s3"))).entries].reverse().slice(0, 3);
        assert.deepEqual(terms.map((t) => [t.end, t.owner === "a"]), [["expired", true], ["released", false], ["released", false]]);
        assert.deepEqual(new Set(terms.slice(1).map((t) => t.owner)), new Set(["b", "d"]));
      } finally {
        client.close();
      }
    } finally {
      await h.close();
    }
  });

  it("an owner frozen (SIGSTOP) past its TTL: the new owner takes over, and the old one's late write is refused", async () => {
    const h = harness();
    try {
      const [a, b] = await Promise.all([h.worker("a"), h.worker("b", { AGENT_WAIT_MS: "5000" })]);
      const first = a.post("/run", { id: "s4", input: "run shell 1200" });
      const call = await h.started("a");
      a.freeze();
      await sleep(1_500); // past a's 1 s TTL: the server ends its term
      const second = (await b.post("/run", { id: "s4", input: "hello" })) as RunReply;
      assert.equal(second.ok, true, JSON.stringify(second));
      assert.equal(second.recovered, true);
      a.thaw();
      const late = (await first) as RunReply;
      assert.equal(late.ok, false, JSON.stringify(late));
      assert.match(late.error ?? "", /LeaseLostError|StaleFenceError/);
      const stored = await texts(h, "s4");
      const expected = c.afterFreeze(call);
      assert.ok(
        expected.some((e) => JSON.stringify(e) === JSON.stringify(stored)),
        `stored ${JSON.stringify(stored)}, expected one of ${JSON.stringify(expected)}`,
      );
      // The tool outlives the run: a's lease can lapse (and the run answer)
      // just before the tool's own timer ends it, so wait for its end line.
      await waitFor(() => h.effectLines().length >= 2, 5_000, "the lost owner's tool to end");
      assert.deepEqual(h.effectLines(), [`a start ${call}`, `a end ${call}`], "ran once, by the lost owner");
    } finally {
      await h.close();
    }
  });
}
