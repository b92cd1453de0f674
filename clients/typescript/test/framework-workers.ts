// What the framework adapters' process tests share: the scripted model,
// the reply of a worker's POST /run, and a harness of agent server
// processes (one test/*-worker.ts each) on one database, with a file their
// tools append their side effects to.

import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type AgentProcess, startAgent } from "./agents.js";
import { itemText, type InputItem, type MockResponses, type ModelReply } from "./mock-responses.js";
import { type TestServer, waitFor } from "./server.js";
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
  /** `worker`: the worker script; `server`: the leasehold server (the workers own their sessions) or none. */
  constructor(
    readonly script: string,
    readonly mock: MockResponses,
    readonly server: TestServer | undefined,
  ) {
    writeFileSync(this.effects, "");
  }
  async worker(name: string, env: Record<string, string> = {}): Promise<AgentProcess> {
    const w = await startAgent(this.script, {
      AGENT_NAME: name,
      AGENT_DB: this.db,
      AGENT_EFFECTS: this.effects,
      MODEL_URL: this.mock.baseURL,
      ...(this.server === undefined ? {} : { AGENT_OWNED: "1", LEASEHOLD_URL: this.server.baseUrl }),
      ...env,
    });
    this.workers.push(w);
    return w;
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
    await Promise.all(this.workers.map((w) => w.stop()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}

