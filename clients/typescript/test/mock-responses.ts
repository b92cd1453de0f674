// A fake OpenAI Responses API on loopback (POST /v1/responses, JSON or SSE)
// that enforces the provider's pairing rule: a `function_call` input item
// with no `function_call_output` for its `call_id` gets the provider's 400,
// "No tool output found for function call <id>." What the model says is a
// script the test gives; every request and rejection is recorded.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** One input item as the AI SDK's OpenAI provider sends it (the fields used here). */
export interface InputItem {
  readonly type?: string;
  readonly role?: string;
  readonly content?: string | ReadonlyArray<{ readonly type?: string; readonly text?: string }>;
  readonly call_id?: string;
  readonly name?: string;
  readonly arguments?: string;
  readonly output?: unknown;
}

/** What the scripted model answers: text, or one function call. */
export type ModelReply =
  | { readonly text: string }
  /** `id`: the call id to use (default: a fresh `call_<n>`), for a model that reuses ids. */
  | { readonly call: { readonly name: string; readonly args: object; readonly id?: string } };

export interface RecordedRequest {
  /** The `x-session` header the agent sent (its session id), or "". */
  readonly session: string;
  readonly input: readonly InputItem[];
  /** The 400's message, when the request was rejected. */
  readonly rejected: string | undefined;
  readonly reply: ModelReply | undefined;
}

export interface MockResponses {
  /** `http://127.0.0.1:<port>/v1`, for `createOpenAI({ baseURL })`. */
  readonly baseURL: string;
  readonly requests: RecordedRequest[];
  /** The 400s sent, per session. */
  rejections(session?: string): RecordedRequest[];
  close(): Promise<void>;
}

/** The text of a user or assistant message item. */
export function itemText(item: InputItem): string {
  if (typeof item.content === "string") return item.content;
  return (item.content ?? []).map((c) => c.text ?? "").join("");
}

/** The provider's pairing check: the first function_call without an output. */
export function missingOutput(input: readonly InputItem[]): string | undefined {
  const outputs = new Set(input.filter((i) => i.type === "function_call_output").map((i) => i.call_id));
  return input.find((i) => i.type === "function_call" && !outputs.has(i.call_id))?.call_id;
}

let counter = 0;

/** The other pairing check: the first function_call_output without its call. */
export function orphanOutput(input: readonly InputItem[]): string | undefined {
  const calls = new Set(input.filter((i) => i.type === "function_call").map((i) => i.call_id));
  return input.find((i) => i.type === "function_call_output" && !calls.has(i.call_id))?.call_id;
}

/**
 * Starts the fake provider; `script` decides each answer from the request's
 * new input items (and the whole context, when `previous_response_id`
 * chains onto a stored response, as the provider does with `store: true`).
 */
export async function startMockResponses(
  script: (input: readonly InputItem[], session: string, context: readonly InputItem[]) => ModelReply,
): Promise<MockResponses> {
  const requests: RecordedRequest[] = [];
  /** Each response's whole context (its input chain and its output), by response id. */
  const stored = new Map<string, InputItem[]>();
  const server: Server = createServer((req, res) => {
    void handle(req, res);
  });
  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body = "";
    for await (const chunk of req) body += String(chunk);
    const session = String(req.headers["x-session"] ?? "");
    if (req.method !== "POST" || !(req.url ?? "").endsWith("/responses")) {
      res.writeHead(404).end();
      return;
    }
    const parsed = JSON.parse(body) as {
      input?: InputItem[];
      stream?: boolean;
      model?: string;
      previous_response_id?: string;
    };
    const input = parsed.input ?? [];
    const previous = parsed.previous_response_id;
    const base = previous === undefined || previous === null ? [] : stored.get(previous);
    const context = [...(base ?? []), ...input];
    const missing = missingOutput(context);
    const orphan = orphanOutput(context);
    const message =
      base === undefined
        ? `Previous response with id '${previous}' not found.`
        : missing !== undefined
          ? `No tool output found for function call ${missing}.`
          : orphan !== undefined
            ? `No tool call found for function call output with call_id ${orphan}.`
            : undefined;
    if (message !== undefined) {
      requests.push({ session, input, rejected: message, reply: undefined });
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message, type: "invalid_request_error", param: "input", code: null } }));
      return;
    }
    const reply = script(input, session, context);
    requests.push({ session, input, rejected: undefined, reply });
    const n = ++counter;
    const id = `resp_${n}`;
    const model = parsed.model ?? "mock";
    const usage = { input_tokens: 1, output_tokens: 1, total_tokens: 2 };
    const item =
      "text" in reply
        ? {
            type: "message",
            role: "assistant",
            id: `msg_${n}`,
            status: "completed",
            content: [{ type: "output_text", text: reply.text, annotations: [] }],
          }
        : {
            type: "function_call",
            id: `fc_${n}`,
            call_id: reply.call.id ?? `call_${n}`,
            name: reply.call.name,
            arguments: JSON.stringify(reply.call.args),
            status: "completed",
          };
    stored.set(id, [...context, item as InputItem]);
    if (parsed.stream !== true) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ id, created_at: 0, model, output: [item], usage }));
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    let seq = 0;
    const send = (event: Record<string, unknown>): void => {
      res.write(`event: ${String(event.type)}\ndata: ${JSON.stringify({ ...event, sequence_number: seq++ })}\n\n`);
    };
    send({ type: "response.created", response: { id, created_at: 0, model } });
    if (item.type === "message") {
      send({ type: "response.output_item.added", output_index: 0, item: { type: "message", id: item.id } });
      send({ type: "response.output_text.delta", item_id: item.id, output_index: 0, delta: "text" in reply ? reply.text : "" });
    } else {
      send({ type: "response.output_item.added", output_index: 0, item: { ...item, arguments: "" } });
      send({
        type: "response.function_call_arguments.delta",
        item_id: item.id,
        output_index: 0,
        delta: (item as { arguments: string }).arguments,
      });
    }
    send({ type: "response.output_item.done", output_index: 0, item });
    // As the API does: the completed event carries the whole response.
    send({ type: "response.completed", response: { id, created_at: 0, model, status: "completed", output: [item], usage } });
    res.end();
  }
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    baseURL: `http://127.0.0.1:${port}/v1`,
    requests,
    rejections: (s) => requests.filter((r) => r.rejected !== undefined && (s === undefined || r.session === s)),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
