// One agent server: an HTTP server on loopback that drives sessions stored in
// a SQLite file it shares with other such servers. Each session's loop is the
// AI SDK's generateText against the OpenAI Responses API, one step at a time
// (the loop writes each tool call before running it, as OpenCode does, so
// another process sees it running), chaining onto the session's last
// response id (`previous_response_id`).
//
// AGENT_MODE=opencode: OpenCode's shape. claim() sets time_suspended only
// when null and the result is ignored; release clears it by session id;
// restart recovery resumes every claimed session not in this process's
// active set; steering inputs are taken by session id. AGENT_REPAIR=placeholder
// adds OpenCode's repair: a call with no result gets a placeholder output.
//
// AGENT_MODE=leasehold: the same loop with leasehold: one owner per session
// (a lease on `session:<id>`), every continuation gated, every transcript
// write fenced in the same SQLite transaction, tool calls through the
// ledger, recovery of only the keys leasehold lists as recoverable, a fenced
// release.
//
// Env: AGENT_NAME, AGENT_DB, MODEL_URL, LEASEHOLD_URL (leasehold mode),
// AGENT_TTL_MS (default 1000), AGENT_WAIT_MS (default 200).
// Prints "listening on 127.0.0.1:<port>" once it serves.

import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, type ModelMessage, tool } from "ai";
import { BusyError, createClient, type Lease, type LeaseholdClient } from "../../src/index.js";
import { SessionStore } from "./store.js";

const name = process.env.AGENT_NAME ?? `agent-${process.pid}`;
const mode = process.env.AGENT_MODE === "leasehold" ? "leasehold" : "opencode";
const repair = process.env.AGENT_REPAIR === "placeholder";
const ttlMs = Number(process.env.AGENT_TTL_MS ?? "1000");
const waitMs = Number(process.env.AGENT_WAIT_MS ?? "200");
const store = new SessionStore(process.env.AGENT_DB ?? "sessions.db");
const openai = createOpenAI({ baseURL: process.env.MODEL_URL ?? "http://127.0.0.1:1/v1", apiKey: "test" });
const lh: LeaseholdClient | undefined =
  mode === "leasehold" ? createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name }) : undefined;

/** OpenCode's process-local set of sessions this process is running. */
const active = new Set<string>();
/** What happened, for the test to read: provider rejections, lost leases, busy refusals. */
const events: Array<{ session: string; kind: string; detail: string }> = [];

const PLACEHOLDER = JSON.stringify({
  error: "unknown_error",
  message: "Tool execution was interrupted and no result was captured.",
});

/** The tools' schemas, sent to the model (the loop runs them itself). */
const toolSchemas = {
  shell: tool({
    description: "Runs a shell command (slow).",
    inputSchema: jsonSchema<{ ms: number }>({ type: "object", properties: { ms: { type: "number" } }, required: ["ms"] }),
  }),
  read: tool({
    description: "Reads a file (fast).",
    inputSchema: jsonSchema<{ path: string }>({
      type: "object",
      properties: { path: { type: "string" } },
      required: ["path"],
    }),
  }),
};

function runTool(toolName: string, input: unknown, signal: AbortSignal | undefined): Promise<string> {
  const ms = toolName === "shell" ? Number((input as { ms?: number }).ms ?? 1000) : 5;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(toolName === "shell" ? "exit 0" : "file contents"), ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}

/** What a loop needs from its ownership: the OpenCode shape has none of it. */
interface Ownership {
  /** The continuation gate: the fence to write with (undefined: unfenced). */
  gate(): Promise<bigint | undefined>;
  readonly signal: AbortSignal | undefined;
  /** Runs one tool call (through the ledger with leasehold). */
  run(call: { callId: string; name: string; turn: string }, exec: (signal: AbortSignal | undefined) => Promise<string>): Promise<string>;
}

const unowned: Ownership = {
  gate: async () => undefined,
  signal: undefined,
  run: (_call, exec) => exec(undefined),
};

function leased(lease: Lease): Ownership {
  return {
    gate: () => lease.gate(),
    signal: lease.signal,
    run: async (call, exec) => {
      const [result] = await lease.runToolCalls([{ callId: call.callId, name: call.name }], (inv) => exec(inv.signal), {
        turn: call.turn,
      });
      const outcome = result?.outcome;
      if (outcome === undefined || outcome.state === "running") throw new Error(`call ${call.callId} has no outcome`);
      if (outcome.state === "unknown") return "interrupted: outcome unknown";
      return new TextDecoder().decode(outcome.result);
    },
  };
}

type Output = { callId: string; toolName: string; output: string };

/**
 * The session loop: send the pending tool outputs (or, with none, the
 * steering inputs), write what the model said, run its tool calls, repeat
 * until there is nothing left to send.
 */
async function loop(sessionId: string, own: Ownership, first: Output[] = []): Promise<void> {
  let outputs = first;
  for (let step = 0; step < 32; step++) {
    const fence = await own.gate();
    let messages: ModelMessage[];
    if (outputs.length > 0) {
      messages = [
        {
          role: "tool",
          content: outputs.map((o) => ({
            type: "tool-result" as const,
            toolCallId: o.callId,
            toolName: o.toolName,
            output: { type: "text" as const, value: o.output },
          })),
        },
      ];
    } else {
      const taken = store.write(sessionId, fence, () => {
        const texts = store.take(sessionId, name);
        for (const t of texts) store.addPart(sessionId, "user", null, t, name);
        return texts;
      });
      if (taken.length === 0) return;
      messages = taken.map((t) => ({ role: "user" as const, content: t }));
    }
    const previousResponseId = store.lastResponseId(sessionId);
    let result;
    try {
      result = await generateText({
        model: openai.responses("mock-model"),
        messages,
        tools: toolSchemas,
        maxRetries: 0,
        headers: { "x-session": sessionId },
        ...(own.signal === undefined ? {} : { abortSignal: own.signal }),
        providerOptions: { openai: { store: true, ...(previousResponseId === undefined ? {} : { previousResponseId }) } },
      });
    } catch (err) {
      events.push({ session: sessionId, kind: "provider_error", detail: err instanceof Error ? err.message : String(err) });
      throw err;
    }
    const responseId = result.response.id;
    const calls = result.toolCalls;
    const writeFence = await own.gate();
    store.write(sessionId, writeFence, () => {
      store.setLastResponseId(sessionId, responseId);
      for (const c of calls) store.addPart(sessionId, "call", c.toolCallId, JSON.stringify({ name: c.toolName, input: c.input }), name);
      if (calls.length === 0) store.addPart(sessionId, "answer", null, result.text, name);
    });
    outputs = [];
    for (const c of calls) {
      const output = await own.run({ callId: c.toolCallId, name: c.toolName, turn: responseId }, (signal) => {
        // With leasehold the call is in the ledger by now (registration comes first).
        events.push({ session: sessionId, kind: "tool_started", detail: c.toolCallId });
        return runTool(c.toolName, c.input, signal);
      });
      const resultFence = await own.gate();
      store.write(sessionId, resultFence, () => store.addPart(sessionId, "result", c.toolCallId, output, name));
      outputs.push({ callId: c.toolCallId, toolName: c.toolName, output });
    }
  }
}

// ---- OpenCode's shape ----

/** OpenCode's placeholder repair: every call without a result gets a placeholder output. */
function placeholders(sessionId: string): Output[] {
  if (!repair) return [];
  const open = store.openCalls(sessionId);
  store.write(sessionId, undefined, () => {
    for (const c of open) store.addPart(sessionId, "result", c.callId, PLACEHOLDER, name);
  });
  return open.map((c) => ({ callId: c.callId, toolName: c.name, output: PLACEHOLDER }));
}

async function driveOpenCode(sessionId: string, recovering: boolean): Promise<void> {
  if (active.has(sessionId)) return; // this process's loop takes the new input
  store.claim(sessionId); // the result is ignored: another server's claim does not stop this one
  active.add(sessionId);
  try {
    await loop(sessionId, unowned, recovering || repair ? placeholders(sessionId) : []);
  } finally {
    active.delete(sessionId);
    store.release(sessionId); // by session id: ends whoever's claim it is
  }
}

// ---- with leasehold ----

const keyOf = (sessionId: string): string => `session:${sessionId}`;

/** Runs the session while holding its lease; ends it released, or suspended on an error. */
async function owned(sessionId: string, lease: Lease, first: Output[]): Promise<void> {
  active.add(sessionId);
  try {
    await loop(sessionId, leased(lease), first);
    await lease.release(); // fenced: presents the term's fence and lease id
  } catch (err) {
    events.push({ session: sessionId, kind: "stopped", detail: err instanceof Error ? `${err.name}: ${err.message}` : String(err) });
    await lease.suspend().catch(() => undefined);
  } finally {
    active.delete(sessionId);
  }
  // An input that arrived while this loop was finishing: take the session again.
  if (store.pending(sessionId) > 0) void driveLeasehold(sessionId);
}

async function driveLeasehold(sessionId: string): Promise<void> {
  if (lh === undefined || active.has(sessionId)) return;
  let lease: Lease;
  try {
    lease = await lh.acquire(keyOf(sessionId), { ttlMs, waitMs });
  } catch (err) {
    // The owner takes the input at its next continuation (or after its release).
    if (err instanceof BusyError) events.push({ session: sessionId, kind: "busy", detail: err.holder });
    else events.push({ session: sessionId, kind: "acquire_error", detail: String(err) });
    return;
  }
  await owned(sessionId, lease, []);
}

/** Recovery: only the sessions leasehold lists as recoverable, and only the acquire that wins. */
async function recoverLeasehold(): Promise<string[]> {
  if (lh === undefined) return [];
  const resumed: string[] = [];
  const page = await lh.list({ prefix: "session:", filter: "recoverable" });
  for (const k of page.keys) {
    const sessionId = k.key.slice("session:".length);
    if (active.has(sessionId)) continue;
    let lease: Lease;
    try {
      lease = await lh.acquire(k.key, { ttlMs, waitMs: 0 });
    } catch (err) {
      if (err instanceof BusyError) continue; // another server won it
      throw err;
    }
    if (!lease.recovered) {
      // Someone recovered and finished it between the list and this acquire.
      await lease.release();
      continue;
    }
    resumed.push(sessionId);
    // The calls the transcript shows without a result. The ledger says which
    // ran: one still running is settled once, as unknown (never run again);
    // one settled before the crash gives its stored result; one the ledger
    // never registered never started (registration comes before the run).
    const ledger = await lease.listToolCalls();
    const outputs: Output[] = [];
    for (const c of store.openCalls(sessionId)) {
      const known = ledger.filter((r) => r.callId === c.callId).at(-1);
      let output = "not run: the server stopped before the call started";
      if (known !== undefined) {
        const record =
          known.state === "running"
            ? await lease.settleToolCall(c.callId, { state: "unknown" }, { turn: known.turn })
            : known;
        output = record.state === "unknown" ? "interrupted: outcome unknown" : new TextDecoder().decode(record.result);
      }
      const fence = await lease.gate();
      store.write(sessionId, fence, () => store.addPart(sessionId, "result", c.callId, output, name));
      outputs.push({ callId: c.callId, toolName: c.name, output });
    }
    void owned(sessionId, lease, outputs);
  }
  return resumed;
}

/** OpenCode's recovery: every claimed session not in this process's active set is taken as orphaned. */
function recoverOpenCode(): string[] {
  const resumed = store.claimed().filter((id) => !active.has(id));
  for (const id of resumed) void driveOpenCode(id, true).catch(() => undefined);
  return resumed;
}

// ---- HTTP ----

async function body(req: IncomingMessage): Promise<Record<string, unknown>> {
  let text = "";
  for await (const chunk of req) text += String(chunk);
  return text === "" ? {} : (JSON.parse(text) as Record<string, unknown>);
}

function reply(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(value));
}

const server = createServer((req, res) => {
  void (async () => {
    const url = req.url ?? "";
    const m = /^\/session\/([^/]+)\/message$/.exec(url);
    if (req.method === "POST" && m !== null && m[1] !== undefined) {
      const sessionId = m[1];
      const { text } = (await body(req)) as { text?: string };
      store.enqueue(sessionId, String(text ?? ""));
      const drive = mode === "leasehold" ? driveLeasehold(sessionId) : driveOpenCode(sessionId, false);
      void drive.catch(() => undefined); // errors are in `events`
      reply(res, 202, { queued: true });
    } else if (req.method === "POST" && url === "/recover") {
      reply(res, 200, { resumed: mode === "leasehold" ? await recoverLeasehold() : recoverOpenCode() });
    } else if (req.method === "GET" && url === "/status") {
      reply(res, 200, { name, active: [...active], events });
    } else {
      reply(res, 404, {});
    }
  })().catch((err: unknown) => reply(res, 500, { error: String(err) }));
});

server.listen(0, "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`listening on 127.0.0.1:${port}\n`);
});
process.on("SIGTERM", () => {
  server.close();
  lh?.close();
  store.close();
  process.exit(0);
});
