// A fake OpenAI Responses API on loopback, shared by several OpenCode
// servers: each server is given its own base URL (/<label>/v1), so every
// request says which server sent it (and x-session-id which session).
// It enforces the provider's pairing rule (a function_call without its
// function_call_output gets the provider's 400, "No tool output found for
// function call <id>.") and scripts the model: a user message containing
// "slow" asks for a `bash` call that waits for a signal file, so the test
// holds a tool open for as long as it likes; anything else gets text.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";

export interface InputItem {
  readonly type?: string;
  readonly role?: string;
  readonly content?: string | ReadonlyArray<{ readonly type?: string; readonly text?: string }>;
  readonly call_id?: string;
  readonly output?: unknown;
}

export interface ProviderRequest {
  /** The server that sent it (the label in its base URL). */
  readonly server: string;
  readonly session: string;
  /** A step of a session's run (it offers tools), not a title request. */
  readonly chat: boolean;
  readonly at: number;
  readonly input: readonly InputItem[];
  /** The 400's message, when the request was rejected. */
  readonly rejected: string | undefined;
  /** The call the mock asked for in its answer, if it asked for one. */
  readonly called: string | undefined;
  /** The id of the output item it answered with (OpenCode keeps it in a part's metadata.openai.itemId). */
  readonly reply: string | undefined;
}

export interface IssuedCall {
  readonly callID: string;
  readonly server: string;
  readonly session: string;
  /** What the tool prints when it ends: the result a model must see. */
  readonly result: string;
  /** The file whose creation lets the tool end. */
  readonly signal: string;
}

export interface MockProvider {
  baseURL(server: string): string;
  readonly requests: ProviderRequest[];
  readonly calls: Map<string, IssuedCall>;
  close(): Promise<void>;
}

export function itemText(item: InputItem): string {
  if (typeof item.content === "string") return item.content;
  return (item.content ?? []).map((c) => c.text ?? "").join("");
}

function outputText(output: unknown): string {
  return typeof output === "string" ? output : JSON.stringify(output ?? "");
}

/** The provider's own check: the first function_call without its output. */
export function missingOutput(input: readonly InputItem[]): string | undefined {
  const outputs = new Set(input.filter((i) => i.type === "function_call_output").map((i) => i.call_id));
  return input.find((i) => i.type === "function_call" && !outputs.has(i.call_id))?.call_id;
}

/** The output `input` sends for `callID`, if any. */
export function outputFor(input: readonly InputItem[], callID: string): string | undefined {
  const item = input.find((i) => i.type === "function_call_output" && i.call_id === callID);
  return item === undefined ? undefined : outputText(item.output);
}

/** Starts the provider; the tools' signal files go in `signalDir`. */
export async function startMockProvider(signalDir: string): Promise<MockProvider> {
  const requests: ProviderRequest[] = [];
  const calls = new Map<string, IssuedCall>();
  let n = 0;
  const server: Server = createServer((req, res) => void handle(req, res));
  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body = "";
    for await (const chunk of req) body += String(chunk);
    const m = /^\/([a-z0-9]+)\/v1\/responses$/.exec(req.url ?? "");
    if (req.method !== "POST" || m === null) {
      res.writeHead(404).end();
      return;
    }
    const label = m[1] ?? "";
    const parsed = JSON.parse(body) as { input?: InputItem[]; tools?: unknown[]; model?: string };
    const input = parsed.input ?? [];
    const session = String(req.headers["x-session-id"] ?? "");
    const chat = Array.isArray(parsed.tools) && parsed.tools.length > 0;
    const base = { server: label, session, chat, at: Date.now(), input };
    const missing = missingOutput(input);
    if (missing !== undefined) {
      const message = `No tool output found for function call ${missing}.`;
      requests.push({ ...base, rejected: message, called: undefined, reply: undefined });
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message, type: "invalid_request_error", param: "input", code: null } }));
      return;
    }
    const k = ++n;
    const last = input[input.length - 1];
    const slow = chat && last?.role === "user" && itemText(last).includes("slow");
    let item: Record<string, unknown>;
    let called: string | undefined;
    if (slow) {
      const callID = `call_${k}`;
      const signal = join(signalDir, `go-${callID}`);
      const result = `result-of-${callID}`;
      calls.set(callID, { callID, server: label, session, result, signal });
      called = callID;
      // Bounded: the tool gives up after 20 s even if never signalled.
      const command = `i=0; while [ ! -f ${signal} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo ${result}`;
      item = {
        type: "function_call",
        id: `fc_${k}`,
        call_id: callID,
        name: "bash",
        arguments: JSON.stringify({ command, description: "wait for the signal" }),
        status: "completed",
      };
    } else {
      const text = chat ? "ok" : "A title";
      item = { type: "message", role: "assistant", id: `msg_${k}`, status: "completed", content: [{ type: "output_text", text, annotations: [] }] };
    }
    requests.push({ ...base, rejected: undefined, called, reply: String(item.id) });
    const id = `resp_${k}`;
    const model = parsed.model ?? "mock";
    const usage = { input_tokens: 1, output_tokens: 1, total_tokens: 2 };
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    let seq = 0;
    const send = (event: Record<string, unknown>): void => {
      res.write(`event: ${String(event.type)}\ndata: ${JSON.stringify({ ...event, sequence_number: seq++ })}\n\n`);
    };
    send({ type: "response.created", response: { id, created_at: 0, model } });
    if (item.type === "message") {
      send({ type: "response.output_item.added", output_index: 0, item: { type: "message", id: item.id } });
      send({ type: "response.output_text.delta", item_id: item.id, output_index: 0, delta: chat ? "ok" : "A title" });
    } else {
      send({ type: "response.output_item.added", output_index: 0, item: { ...item, arguments: "" } });
      send({ type: "response.function_call_arguments.delta", item_id: item.id, output_index: 0, delta: item.arguments });
    }
    send({ type: "response.output_item.done", output_index: 0, item });
    send({ type: "response.completed", response: { id, created_at: 0, model, status: "completed", output: [item], usage } });
    res.end();
  }
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    baseURL: (label) => `http://127.0.0.1:${port}/${label}/v1`,
    requests,
    calls,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** What went wrong in one session, judged from everything the provider saw. */
export interface Overlap {
  /** Requests from one server sent while another server's tool call in the session had no result yet. */
  readonly concurrent: number;
  /** Requests that told a model another server's tool call was interrupted (its real result not sent). */
  readonly liveInterrupted: number;
  /** Tool calls whose real result no model ever saw. */
  readonly unseen: number;
  /** The provider's 400s. */
  readonly rejected: number;
}

export function overlapOf(mock: MockProvider, session: string): Overlap {
  const reqs = mock.requests.filter((r) => r.session === session && r.chat);
  const calls = [...mock.calls.values()].filter((c) => c.session === session);
  let concurrent = 0;
  let liveInterrupted = 0;
  for (const r of reqs) {
    const crossed = calls.some((c) => {
      if (c.server === r.server) return false;
      const issued = reqs.find((q) => q.called === c.callID);
      const answered = reqs.find((q) => q.server === c.server && (outputFor(q.input, c.callID) ?? "").includes(c.result));
      return issued !== undefined && issued.at <= r.at && (answered === undefined || r.at < answered.at);
    });
    if (crossed) concurrent++;
    const interrupted = calls.some((c) => {
      if (c.server === r.server) return false;
      const out = outputFor(r.input, c.callID);
      return out !== undefined && !out.includes(c.result);
    });
    if (interrupted) liveInterrupted++;
  }
  const unseen = calls.filter((c) => !reqs.some((r) => (outputFor(r.input, c.callID) ?? "").includes(c.result))).length;
  const rejected = reqs.filter((r) => r.rejected !== undefined).length;
  return { concurrent, liveInterrupted, unseen, rejected };
}

/** The server whose model call wrote a reply, from the output item ids in its parts. */
export function repliedBy(mock: MockProvider, parts: ReadonlyArray<{ metadata?: { openai?: { itemId?: string } } }>): string | undefined {
  const ids = new Set(parts.map((p) => p.metadata?.openai?.itemId).filter((id) => id !== undefined));
  return mock.requests.find((q) => q.reply !== undefined && ids.has(q.reply))?.server;
}

export function overlapped(o: Overlap): boolean {
  return o.concurrent + o.liveInterrupted + o.unseen + o.rejected > 0;
}
