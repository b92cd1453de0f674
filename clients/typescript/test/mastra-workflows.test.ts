// Mastra workflow runs (`@mastra/core` workflows on one LibSQL file shared
// by server processes) with `ownWorkflows` from `@leasehold/client/mastra`.
// The field failure: boot-time recovery (`restartAllActiveWorkflowRuns`)
// restarts every run storage lists as running, including one a live server
// is executing, so its side effect happens twice.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import { createClient } from "../src/index.js";
import { startServer, type TestServer } from "./server.js";

const WORKER = fileURLToPath(new URL("./mastra-workflow-worker.js", import.meta.url));
const TTL_MS = 1000;

interface Line {
  readonly event: string;
  readonly status?: string;
  readonly by?: string;
  readonly name?: string;
  readonly message?: string;
  readonly runs?: string[];
}

/** One server process of the workflow worker, and what it printed. */
class Server {
  readonly lines: Line[] = [];
  readonly child: ChildProcess;
  readonly exited: Promise<void>;

  constructor(env: Record<string, string>) {
    this.child = spawn(process.execPath, [WORKER], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] });
    this.exited = new Promise((resolve) => this.child.once("exit", () => resolve()));
    createInterface({ input: this.child.stdout! }).on("line", (line) => this.lines.push(JSON.parse(line) as Line));
  }

  /** The first line saying `event`, waiting for it (bounded). */
  async event(event: string, timeoutMs = 20_000): Promise<Line> {
    for (const deadline = Date.now() + timeoutMs; Date.now() < deadline; ) {
      const line = this.lines.find((l) => l.event === event || l.event === "error");
      if (line !== undefined) return line;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error(`no ${event} within ${timeoutMs} ms (printed ${JSON.stringify(this.lines)})`);
  }

  /** Its final line (done or error), once it exited. */
  async outcome(): Promise<Line> {
    await this.exited;
    const last = this.lines.at(-1);
    assert.ok(last !== undefined, "the worker printed nothing");
    return last;
  }
}

describe("mastra workflows: one process executes a run", () => {
  let server: TestServer;
  let dir: string;
  let n = 0;
  let env: { db: string; effects: string };
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server.close();
  });

  const fresh = (): void => {
    dir = mkdtempSync(join(tmpdir(), "leasehold-mastra-wf-"));
    env = { db: join(dir, "mastra.db"), effects: join(dir, "effects") };
  };
  const start = (name: string, mode: string, owned: boolean, chargeMs = 0, ttlMs = TTL_MS): Server =>
    new Server({
      WF_NAME: name,
      WF_MODE: mode,
      WF_DB: env.db,
      EFFECTS: env.effects,
      CHARGE_MS: String(chargeMs),
      RUN_ID: `run-${n}`,
      WF_OWNED: owned ? "1" : "0",
      WF_TTL_MS: String(ttlMs),
      LEASEHOLD_URL: server.baseUrl,
    });
  const charges = (): string[] => readFileSync(env.effects, "utf8").trim().split("\n");
  const each = (): void => {
    n += 1;
    fresh();
  };
  const cleanup = (): void => rmSync(dir, { recursive: true, force: true });

  it("without leasehold: a booting server's recovery charges again while the first still runs", async () => {
    each();
    const a = start("a", "start", false, 3000);
    await a.event("charging");
    const b = start("b", "recover", false);
    assert.deepEqual((await b.event("active")).runs, [`run-${n}`]); // storage lists the live run as active
    assert.equal((await b.outcome()).status, "recovered");
    assert.equal((await a.outcome()).status, "success");
    assert.deepEqual(charges(), ["a charge 5", "b charge 5"]);
    cleanup();
  });

  it("owned: recovery skips a run a live server executes; a second start is busy", async () => {
    each();
    const a = start("a", "start", true, 3000);
    await a.event("charging");
    const b = start("b", "recover", true);
    assert.equal((await b.outcome()).status, "recovered");
    const c = start("c", "restart", true);
    const busy = await c.outcome();
    assert.equal(busy.name, "BusyError");
    assert.match(busy.message ?? "", new RegExp(`mastra-run:pay/run-${n}" is held by owner "a"`));
    assert.deepEqual(await a.outcome(), { event: "done", status: "success", by: "a" });
    assert.deepEqual(charges(), ["a charge 5"]);
    cleanup();
  });

  it("owned: a killed server's run is restarted by exactly one of two recovering servers, once its lease lapses", async () => {
    each();
    // a's lease outlives any process start on a loaded machine, so b below
    // runs while it is certainly still a's (with 1 s, a slow start of b saw
    // it lapse and rightly restarted the run).
    const a = start("a", "start", true, 60_000, 6000);
    await a.event("charging");
    a.child.kill("SIGKILL");
    await a.exited;
    // At once: the lease is still a's, nobody restarts the run.
    assert.equal((await start("b", "recover", true).outcome()).status, "recovered");
    assert.deepEqual(charges(), ["a charge 5"]);
    const probe = createClient({ baseUrl: server.baseUrl, owner: "probe" });
    try {
      const key = `mastra-run:pay/run-${n}`;
      for (let i = 0; (await probe.get(key)).lease !== undefined; i++) {
        assert.ok(i < 400, `${key}'s lease did not lapse`);
        await new Promise((r) => setTimeout(r, 25));
      }
    } finally {
      probe.close();
    }
    const c = start("c", "recover", true);
    const d = start("d", "recover", true);
    assert.equal((await c.outcome()).status, "recovered");
    assert.equal((await d.outcome()).status, "recovered");
    const after = charges();
    assert.equal(after.length, 2, `one restart, not ${after.length - 1}: ${after.join(", ")}`);
    assert.match(after[1]!, /^[cd] charge 5$/);
    const by = after[1]!.slice(0, 1);
    assert.deepEqual(await start("e", "status", true).outcome(), { event: "done", status: "success", by });
    cleanup();
  });

  it("owned: a server paused past its TTL finds its run taken over, and its late result is refused", async () => {
    each();
    const a = start("a", "start", true, 1500);
    await a.event("charging");
    a.child.kill("SIGSTOP");
    await new Promise((r) => setTimeout(r, TTL_MS + 300));
    const b = start("b", "restart", true);
    assert.deepEqual(await b.outcome(), { event: "done", status: "success", by: "b" });
    a.child.kill("SIGCONT");
    const late = await a.outcome();
    assert.equal(late.event, "error", `a's late run must not report success: ${JSON.stringify(late)}`);
    assert.equal(late.name, "LeaseLostError");
    // The run in storage is b's: a's late snapshot write was refused.
    assert.deepEqual(await start("e", "status", true).outcome(), { event: "done", status: "success", by: "b" });
    assert.deepEqual(charges(), ["a charge 5", "b charge 5"]);
    cleanup();
  });
});
