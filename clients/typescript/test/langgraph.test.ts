// @leasehold/client/langgraph against the real LangGraph.js (@langchain/langgraph
// 1.7, SqliteSaver on better-sqlite3): two graphs on one checkpoint file
// (two servers' worth: nothing shared but the file) fork the thread and
// send an unanswered tool call without it; with it one run owns the
// thread and a stale fence is refused by SQLite in the write's transaction.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { AIMessage, type BaseMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import type { RunnableConfig } from "@langchain/core/runnables";
import type { BaseCheckpointSaver, PendingWrite } from "@langchain/langgraph-checkpoint";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";
import pg from "pg";
import Database from "better-sqlite3";

import { BusyError, createClient, InvalidArgumentError, type LeaseholdClient } from "../src/index.js";
import { LeaseholdSaver, ledgeredTools, own, StaleFenceError, withFence } from "../src/langgraph.js";
import { startServer, type TestServer, waitFor } from "./server.js";

class ProviderError extends Error {}

/** OpenAI's rule: every tool call answered before the next model turn. */
function checkPairing(messages: BaseMessage[]): void {
  const answered = new Set(messages.filter((m) => m instanceof ToolMessage).map((m) => (m as ToolMessage).tool_call_id));
  for (const m of messages) {
    for (const call of (m as AIMessage).tool_calls ?? []) {
      if (!answered.has(call.id ?? "")) throw new ProviderError(`No tool output found for function call ${call.id}.`);
    }
  }
}

class Agent {
  effects: string[] = [];
  entered = false;
  requests = 0;
  #open: Promise<void> = Promise.resolve();
  #release: () => void = () => undefined;
  #ids: string[];

  constructor(ids: string[]) {
    this.#ids = ids;
  }

  hold(): void {
    this.#open = new Promise((r) => {
      this.#release = r;
    });
  }

  release(): void {
    this.#release();
  }

  graph(path: string, ledger = false, checkpointer?: BaseCheckpointSaver) {
    const shell = tool(
      async ({ cmd }: { cmd: string }) => {
        this.entered = true;
        await this.#open;
        this.effects.push(cmd);
        return `ran ${cmd}`;
      },
      { name: "shell", description: "Runs a shell command.", schema: { type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] } },
    );
    const model = async (state: typeof MessagesAnnotation.State) => {
      this.requests += 1;
      checkPairing(state.messages);
      const last = state.messages.at(-1);
      if (last instanceof ToolMessage) return { messages: [new AIMessage(`done: ${String(last.content)}`)] };
      // LangGraph.js keeps one ToolMessage per tool-call id (a reused id's
      // answer replaces the earlier one in place), so the turn can end on
      // the model's own call: answer rather than call again.
      if (last instanceof AIMessage) return { messages: [new AIMessage("done")] };
      const id = this.#ids.shift() ?? "call_x";
      return { messages: [new AIMessage({ content: "", tool_calls: [{ id, name: "shell", args: { cmd: String(last?.content) } }] })] };
    };
    return new StateGraph(MessagesAnnotation)
      .addNode("agent", model)
      .addNode("tools", new ToolNode(ledger ? ledgeredTools([shell]) : [shell]))
      .addEdge(START, "agent")
      .addConditionalEdges("agent", (s) => ((s.messages.at(-1) as AIMessage).tool_calls?.length ? "tools" : END))
      .addEdge("tools", "agent")
      .compile({ checkpointer: checkpointer ?? SqliteSaver.fromConnString(path) });
  }
}

const THREAD = { configurable: { thread_id: "t1" } };

function checkpoints(path: string): string[] {
  const db = new Database(path, { readonly: true });
  try {
    return (db.prepare("SELECT checkpoint_id AS id FROM checkpoints WHERE checkpoint_ns = '' ORDER BY checkpoint_id").all() as { id: string }[]).map((r) => r.id);
  } finally {
    db.close();
  }
}

function forks(path: string): number {
  const db = new Database(path, { readonly: true });
  try {
    const rows = db.prepare("SELECT parent_checkpoint_id AS p, count(*) AS n FROM checkpoints WHERE checkpoint_ns = '' AND parent_checkpoint_id IS NOT NULL GROUP BY p HAVING n > 1").all();
    return rows.length;
  } finally {
    db.close();
  }
}

describe("langgraph: one owner per thread", () => {
  let server: TestServer;
  let lh: LeaseholdClient;
  let other: LeaseholdClient;
  let dir: string;

  before(async () => {
    server = await startServer();
    lh = createClient({ baseUrl: server.baseUrl, owner: "a" });
    other = createClient({ baseUrl: server.baseUrl, owner: "b" });
    dir = mkdtempSync(join(tmpdir(), "leasehold-lg-"));
  });
  after(async () => {
    lh.close();
    other.close();
    await server.close();
  });

  it("without leasehold, a second graph sends an unanswered call and forks the thread", async () => {
    const path = join(dir, "plain.db");
    const a = new Agent(["call_1"]);
    const b = new Agent(["call_b"]);
    const ga = a.graph(path);
    const gb = b.graph(path);
    a.hold();
    const first = ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    await waitFor(() => a.entered, 5000, "A's tool");
    for (let i = 0; i < 100 && ((await gb.getState(THREAD)).values.messages ?? []).length < 2; i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    await assert.rejects(gb.invoke({ messages: [new HumanMessage("cat")] }, THREAD), (err: unknown) => {
      assert.ok(err instanceof ProviderError);
      assert.equal(err.message, "No tool output found for function call call_1.");
      return true;
    });
    a.release();
    await first;
    assert.ok(forks(path) > 0);
  });

  it("with leasehold, the second is Busy, writes nothing, and the owner finishes and lets go", async () => {
    const path = join(dir, "owned.db");
    const a = new Agent(["call_1"]);
    const b = new Agent(["call_b"]);
    const ga = own(a.graph(path), lh);
    const gb = own(b.graph(path), other);
    assert.ok((ga.checkpointer as LeaseholdSaver).fencedInTransaction);
    a.hold();
    const first = ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    await waitFor(() => a.entered, 5000, "A's tool");
    await new Promise((r) => setTimeout(r, 200));
    const before = checkpoints(path);
    await assert.rejects(gb.invoke({ messages: [new HumanMessage("cat")] }, THREAD), BusyError);
    assert.equal(b.requests, 0);
    assert.deepEqual(checkpoints(path), before);
    a.release();
    const out = await first;
    assert.equal(String(out.messages.at(-1)?.content), "done: ran ls");
    assert.equal(forks(path), 0);
    const state = await lh.get("langgraph:t1");
    assert.equal(state.lease, undefined);
    assert.equal(state.lastEnded?.end, "released");
    assert.deepEqual(a.effects, ["ls"]);
  });

  it("SQLite refuses a stale fence that passed every local check, in the write's own transaction", async () => {
    const path = join(dir, "stale.db");
    const a = new Agent(["call_1", "call_2"]);
    const ga = own(a.graph(path), lh, { prefix: "stale:" });
    await ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    const saver = ga.checkpointer as LeaseholdSaver;
    const head = await saver.getTuple(THREAD);
    assert.ok(head !== undefined);
    await ga.invoke({ messages: [new HumanMessage("pwd")] }, THREAD); // a newer term wrote
    const before = checkpoints(path);
    const fence = (await lh.get("stale:t1")).lastEnded?.fence ?? 0n;
    await assert.rejects(
      withFence("stale:t1", fence - 1n, () => saver.inner.put(head.config, head.checkpoint, head.metadata ?? { source: "loop", step: 0, parents: {} }, {})),
      (err: unknown) => {
        assert.ok(err instanceof StaleFenceError, String(err));
        assert.equal(err.highest, fence);
        assert.ok(
          err.message.startsWith(`fence ${fence - 1n} for key "stale:t1" is stale: fence ${fence} has already written `),
          err.message,
        );
        return true;
      },
    );
    assert.deepEqual(checkpoints(path), before);
    // Nothing was left open: the next run writes as usual.
    await ga.invoke({ messages: [new HumanMessage("whoami")] }, THREAD);
    assert.ok(checkpoints(path).length > before.length);
  });

  it("a SqliteSaver subclass is fenced in the write's transaction too, not gate-only", async () => {
    class AuditedSaver extends SqliteSaver {}
    const path = join(dir, "subclass.db");
    const a = new Agent(["call_1", "call_2"]);
    const ga = own(a.graph(path, false, new AuditedSaver(new Database(path))), lh, { prefix: "sub:" });
    const saver = ga.checkpointer as LeaseholdSaver;
    assert.ok(saver.fencedInTransaction);
    assert.ok(saver.inner instanceof AuditedSaver);
    await ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    const head = await saver.getTuple(THREAD);
    assert.ok(head !== undefined);
    await ga.invoke({ messages: [new HumanMessage("pwd")] }, THREAD);
    const fence = (await lh.get("sub:t1")).lastEnded?.fence ?? 0n;
    const before = checkpoints(path);
    await assert.rejects(
      withFence("sub:t1", fence - 1n, () => saver.inner.put(head.config, head.checkpoint, head.metadata ?? { source: "loop", step: 0, parents: {} }, {})),
      StaleFenceError,
    );
    assert.deepEqual(checkpoints(path), before);
  });

  it("a SqliteSaver whose handle it cannot fence is refused, never silently gate-only", () => {
    class Elsewhere extends SqliteSaver {
      constructor() {
        super(new Database(":memory:"));
        (this as unknown as { db: unknown }).db = { remote: true };
      }
    }
    assert.throws(() => own(new Agent([]).graph("", false, new Elsewhere()), lh), (err: unknown) => {
      assert.ok(err instanceof TypeError, String(err));
      assert.match(err.message, /Elsewhere is a SqliteSaver whose database handle .* leasehold cannot fence/);
      return true;
    });
  });

  it("a write outside any run takes the thread for just that write", async () => {
    const path = join(dir, "outside.db");
    const a = new Agent(["call_1"]);
    const ga = own(a.graph(path), lh, { prefix: "out:" });
    await ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    await ga.updateState(THREAD, { messages: [new AIMessage("edited")] }, "agent");
    const state = await lh.get("out:t1");
    assert.equal(state.lease, undefined);
    assert.equal(state.lastEnded?.end, "released");
    assert.equal(String((await ga.getState(THREAD)).values.messages.at(-1).content), "edited");
  });

  it("a ledgered tool call id seen before on the thread never runs again", async () => {
    const path = join(dir, "ledger.db");
    const a = new Agent(["call_1", "call_1"]);
    const ga = own(a.graph(path, true), lh, { prefix: "ledger:" });
    await ga.invoke({ messages: [new HumanMessage("rm -rf build")] }, THREAD);
    const out = await ga.invoke({ messages: [new HumanMessage("rm -rf build")] }, THREAD);
    // The second call_1 was answered from the ledger, not run again.
    assert.deepEqual(a.effects, ["rm -rf build"]);
    const answers = out.messages.filter((m: BaseMessage) => m instanceof ToolMessage) as ToolMessage[];
    assert.deepEqual(
      answers.map((m) => [m.tool_call_id, String(m.content)]),
      [["call_1", "ran rm -rf build"]],
    );
  });
});

const pgUrl = process.env.LEASEHOLD_TEST_PG_URL;

describe("langgraph: PostgresSaver fenced in its own transaction", { skip: pgUrl === undefined || pgUrl === "" ? "LEASEHOLD_TEST_PG_URL is not set" : false }, () => {
  const schema = `leasehold_lg_${randomBytes(6).toString("hex")}`;
  let server: TestServer;
  let lh: LeaseholdClient;
  let other: LeaseholdClient;
  let admin: pg.Client;
  let pool: pg.Pool;
  let saver: PostgresSaver;

  before(async () => {
    server = await startServer();
    lh = createClient({ baseUrl: server.baseUrl, owner: "a" });
    other = createClient({ baseUrl: server.baseUrl, owner: "b" });
    admin = new pg.Client({ connectionString: pgUrl });
    await admin.connect();
    await admin.query(`CREATE SCHEMA ${schema}`);
    // The saver's tables in its schema; leasehold_fence in the connections' search_path.
    pool = new pg.Pool({ connectionString: pgUrl, options: `-c search_path=${schema}`, max: 4 });
    saver = new PostgresSaver(pool, undefined, { schema });
    await saver.setup();
  });
  after(async () => {
    lh?.close();
    other?.close();
    await pool?.end();
    await admin?.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin?.end();
    await server?.close();
  });

  const rows = async (table: string): Promise<number> =>
    Number(((await admin.query(`SELECT count(*) AS n FROM ${schema}.${table}`)).rows[0] as { n: string }).n);

  it("one owner, and a stale fence that passed every local check is refused by PostgreSQL, nothing written", async () => {
    const a = new Agent(["call_1", "call_2"]);
    const b = new Agent(["call_b"]);
    const ga = own(a.graph("", false, saver), lh, { prefix: "pg:" });
    const gb = own(b.graph("", false, saver), other, { prefix: "pg:" });
    assert.ok((ga.checkpointer as LeaseholdSaver).fencedInTransaction);
    a.hold();
    const first = ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD);
    await waitFor(() => a.entered, 5000, "A's tool");
    await assert.rejects(gb.invoke({ messages: [new HumanMessage("cat")] }, THREAD), BusyError);
    assert.equal(b.requests, 0);
    a.release();
    await first;
    const head = await (ga.checkpointer as LeaseholdSaver).getTuple(THREAD);
    assert.ok(head !== undefined);
    await ga.invoke({ messages: [new HumanMessage("pwd")] }, THREAD); // a newer term wrote
    const fence = (await lh.get("pg:t1")).lastEnded?.fence ?? 0n;
    assert.equal(
      ((await admin.query(`SELECT fence::text AS f FROM ${schema}.leasehold_fence WHERE key = 'pg:t1'`)).rows[0] as { f: string }).f,
      fence.toString(),
      "every term's writes advanced the fence in PostgreSQL",
    );
    const before = [await rows("checkpoints"), await rows("checkpoint_writes")];
    const inner = (ga.checkpointer as LeaseholdSaver).inner;
    await assert.rejects(
      withFence("pg:t1", fence - 1n, () => inner.put(head.config, head.checkpoint, head.metadata ?? { source: "loop", step: 0, parents: {} }, {})),
      (err: unknown) => {
        assert.ok(err instanceof StaleFenceError, String(err));
        assert.equal(err.highest, fence);
        assert.ok(
          err.message.startsWith(`fence ${fence - 1n} for key "pg:t1" is stale: fence ${fence} has already written `),
          err.message,
        );
        return true;
      },
    );
    await assert.rejects(withFence("pg:t1", fence - 1n, () => inner.putWrites(head.config, [["x", 1]], "task")), StaleFenceError);
    assert.deepEqual([await rows("checkpoints"), await rows("checkpoint_writes")], before);
    await ga.invoke({ messages: [new HumanMessage("whoami")] }, THREAD); // nothing was left open
    assert.ok((await rows("checkpoints")) > before[0]!);
  });

  it("a PostgresSaver subclass is fenced too, and a write it makes outside a transaction is refused", async () => {
    // A subclass that writes its pending writes with pool.query, each
    // statement its own transaction: nothing could fence those.
    class Shortcut extends PostgresSaver {
      override async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string): Promise<void> {
        const pool = (this as unknown as { pool: pg.Pool }).pool;
        for (const [channel] of writes) {
          await pool.query(`INSERT INTO ${schema}.checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob) VALUES ($1, '', $2, $3, 0, $4, 'json', '\\x00')`, [
            config.configurable?.thread_id,
            config.configurable?.checkpoint_id,
            taskId,
            channel,
          ]);
        }
      }
    }
    const sub = new Shortcut(pool, undefined, { schema });
    const a = new Agent(["call_1"]);
    const ga = own(a.graph("", false, sub), lh, { prefix: "pgsub:" });
    const saver = ga.checkpointer as LeaseholdSaver;
    assert.ok(saver.fencedInTransaction);
    const before = await rows("checkpoint_writes");
    await assert.rejects(ga.invoke({ messages: [new HumanMessage("ls")] }, THREAD), (err: unknown) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.match(err.message, /"pgsub:t1" went through pool.query/);
      return true;
    });
    assert.equal(await rows("checkpoint_writes"), before, "the unfenced write was refused, not made");
    assert.deepEqual(a.effects, []);
  });
});
