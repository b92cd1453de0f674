// The two-servers scenario by hand: a fake OpenAI Responses API that refuses
// a function_call without its output, a throwaway leasehold server, and two
// agent server processes (agent.ts) on one SQLite file, played once per
// mode and printed as a transcript. (test/two-servers.test.ts plays the
// same servers with assertions, seeded runs, kill -9 and SIGSTOP.)
//
//   LEASEHOLD_BIN=/path/to/leasehold node dist-test/examples/two-servers/demo.js [opencode|placeholder|leasehold ...]
//
// Server A is asked to "run shell 800" (a slow tool); once its call is in
// the transcript, server B is asked to "read a.txt" for the same session.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { startTestServer, type TestServer } from "../../src/testing.js";
import { type AgentProcess, startAgent } from "../../test/agents.js";
import { itemText, type InputItem, type ModelReply, startMockResponses } from "../../test/mock-responses.js";
import { type Part, SessionStore } from "./store.js";

const AGENT = fileURLToPath(new URL("./agent.js", import.meta.url));
const MODES = {
  opencode: { title: "without leasehold (OpenCode's shape)", env: {} },
  placeholder: { title: "without leasehold, with OpenCode's placeholder repair", env: { AGENT_REPAIR: "placeholder" } },
  leasehold: { title: "with leasehold", env: { AGENT_MODE: "leasehold" } },
} as const;
type Mode = keyof typeof MODES;

/** The scripted model: "run shell N" calls shell, "read …" calls read, tool outputs get "answer:<call ids>". */
function script(input: readonly InputItem[]): ModelReply {
  const outputs = input.filter((i) => i.type === "function_call_output");
  if (outputs.length > 0) return { text: `answer:${outputs.map((o) => o.call_id).join(",")}` };
  const user = [...input].reverse().find((i) => i.role === "user");
  const text = user === undefined ? "" : itemText(user);
  const shell = /^run shell (\d+)/.exec(text);
  if (shell?.[1] !== undefined) return { call: { name: "shell", args: { ms: Number(shell[1]) } } };
  if (text.startsWith("read")) return { call: { name: "read", args: { path: "a.txt" } } };
  return { text: `answer:${text}` };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `done` every 20 ms for up to 20 s. */
async function until(what: string, done: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    if (await done()) return;
    await sleep(20);
  }
  throw new Error(`timed out waiting for ${what}`);
}

export interface Outcome {
  readonly parts: Part[];
  /** The provider's 400s. */
  readonly rejections: string[];
  /** How many answers the shell's turn got. */
  readonly shellAnswers: number;
  /** What the agents reported (busy refusals, provider errors, stops). */
  readonly events: string[];
}

/** Plays the scenario once in `mode`; `leasehold` is the server for that mode. */
export async function play(mode: Mode, leasehold: TestServer | undefined): Promise<Outcome> {
  const dir = mkdtempSync(join(tmpdir(), "two-servers-demo-"));
  const db = join(dir, "sessions.db");
  const store = new SessionStore(db);
  const mock = await startMockResponses(script);
  const agents: AgentProcess[] = [];
  try {
    const env = (name: string): Record<string, string> => ({
      AGENT_NAME: name,
      AGENT_DB: db,
      MODEL_URL: mock.baseURL,
      ...(leasehold === undefined ? {} : { LEASEHOLD_URL: leasehold.baseUrl }),
      ...MODES[mode].env,
    });
    const [a, b] = await Promise.all([startAgent(AGENT, env("a")), startAgent(AGENT, env("b"))]);
    agents.push(a, b);
    const session = "s1";
    await a.post(`/session/${session}/message`, { text: "run shell 800" });
    let shell = "";
    await until("server A's shell call", () => {
      shell = store.parts(session).find((p) => p.kind === "call" && p.body.includes('"name":"shell"'))?.callId ?? "";
      return shell !== "";
    });
    await b.post(`/session/${session}/message`, { text: "read a.txt" });
    const answers = (): number =>
      store.parts(session).filter((p) => p.kind === "answer" && p.body.split(":")[1]?.split(",").includes(shell)).length;
    await until("the session to settle", async () => {
      const statuses = (await Promise.all([a.get("/status"), b.get("/status")])) as Array<{ active: string[] }>;
      return statuses.every((s) => !s.active.includes(session)) && store.pending(session) === 0 && answers() > 0;
    });
    const statuses = (await Promise.all([a.get("/status"), b.get("/status")])) as Array<{
      name: string;
      events: Array<{ kind: string; detail: string }>;
    }>;
    return {
      parts: store.parts(session),
      rejections: mock.rejections(session).map((r) => r.rejected ?? ""),
      shellAnswers: answers(),
      events: statuses.flatMap((s) => s.events.map((e) => `${s.name}: ${e.kind} ${e.detail}`)),
    };
  } finally {
    await Promise.all(agents.map((agent) => agent.stop()));
    await mock.close();
    store.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

function print(mode: Mode, outcome: Outcome): void {
  console.log(`== ${MODES[mode].title}`);
  for (const p of outcome.parts) console.log(`  ${p.server}  ${p.kind.padEnd(6)}  ${(p.callId ?? "").padEnd(8)}  ${p.body}`);
  console.log(`  provider rejections: ${outcome.rejections.length}${outcome.rejections.map((r) => `\n    ${r}`).join("")}`);
  console.log(`  answers to the shell's turn: ${outcome.shellAnswers}`);
  for (const e of outcome.events) console.log(`  event  ${e}`);
}

async function main(): Promise<void> {
  const asked = process.argv.slice(2);
  const modes = (asked.length === 0 ? Object.keys(MODES) : asked) as Mode[];
  for (const m of modes) {
    if (!(m in MODES)) throw new Error(`unknown mode ${m}: one of ${Object.keys(MODES).join(", ")}`);
  }
  for (const mode of modes) {
    const leasehold = mode === "leasehold" ? await startTestServer() : undefined;
    try {
      print(mode, await play(mode, leasehold));
    } finally {
      await leasehold?.close();
    }
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : err);
    process.exit(1);
  });
}
