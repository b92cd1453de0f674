// Real processes for the tests: `opencode serve` (the pinned opencode-ai,
// installed in this package's node_modules) over a sandboxed data directory
// that several servers share, and the leasehold server (LEASEHOLD_BIN).
// Everything listens on loopback; nothing reaches the network (models
// fetch, autoupdate and default plugins are off).

import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** clients/opencode, from dist-test/test. */
export const packageDir = resolve(here, "..", "..");

export function opencodeBinary(): string {
  for (const pkg of ["opencode-linux-x64", "opencode-linux-x64-baseline"]) {
    const bin = join(packageDir, "node_modules", pkg, "bin", "opencode");
    if (existsSync(bin)) return bin;
  }
  throw new Error("no opencode binary under node_modules (run clients/opencode/setup.sh)");
}

/** The plugin as OpenCode loads it from a path, with its options. */
export function pluginSpec(options: Record<string, unknown>): [string, Record<string, unknown>] {
  return [`file://${join(packageDir, "dist", "index.js")}`, options];
}

export interface Proc {
  readonly url: string;
  readonly pid: number;
  readonly output: () => string;
  /** kill -9; resolves once it exited. */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

async function startProcess(
  bin: string,
  args: string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv; listening: RegExp; what: string },
): Promise<Proc> {
  const child: ChildProcess = spawn(bin, args, { cwd: options.cwd, env: options.env, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  const keep = (chunk: string): void => {
    output = (output + chunk).slice(-20_000);
  };
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", keep);
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${options.what} did not listen within 60 s:\n${output}`)), 60_000);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${options.what} exited (${code}) before listening:\n${output}`));
    });
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (line) => {
      keep(line + "\n");
      const m = options.listening.exec(line);
      if (m?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
  });
  if (!/^(http:\/\/)?127\.0\.0\.1:\d+\/?$/.test(url)) throw new Error(`${options.what} listens on ${url}, not loopback`);
  let gone = false;
  void exited.then(() => (gone = true));
  const signal = async (sig: NodeJS.Signals): Promise<void> => {
    if (gone) return;
    child.kill(sig);
    const t = setTimeout(() => child.kill("SIGKILL"), 5_000);
    await exited;
    clearTimeout(t);
  };
  return {
    url: url.replace(/\/$/, "").replace(/^(?!http)/, "http://"),
    pid: child.pid!,
    output: () => output,
    kill: () => signal("SIGKILL"),
    stop: () => signal("SIGTERM"),
  };
}

/** The leasehold server on a fresh SQLite file in `dir`. */
export async function startLeasehold(dir: string): Promise<Proc> {
  const bin = process.env.LEASEHOLD_BIN;
  if (bin === undefined || bin === "") throw new Error("LEASEHOLD_BIN is not set");
  return startProcess(bin, ["serve", "--listen", "127.0.0.1:0", "--db", join(dir, "leasehold.db")], {
    listening: /^listening on (\S+)/,
    what: "leasehold",
  });
}

/** A sandbox (data, config, cache, state and project directories) that several servers share. */
export function sandbox(root: string): { root: string; project: string } {
  for (const d of ["data", "config", "cache", "state", "home", "project", "signals"]) mkdirSync(join(root, d), { recursive: true });
  return { root, project: join(root, "project") };
}

/** `opencode serve` on a free loopback port over the sandbox, with the mock provider at `baseURL`. */
export async function startOpencode(
  root: string,
  baseURL: string,
  plugins: Array<string | [string, Record<string, unknown>]>,
): Promise<Proc> {
  const config = {
    $schema: "https://opencode.ai/config.json",
    model: "mock/m",
    small_model: "mock/m",
    share: "disabled",
    autoupdate: false,
    permission: { "*": "allow" },
    plugin: plugins,
    provider: {
      mock: {
        npm: "@ai-sdk/openai",
        name: "Mock",
        options: { baseURL, apiKey: "test" },
        models: { m: { name: "m", tool_call: true } },
      },
    },
  };
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    HOME: join(root, "home"),
    XDG_DATA_HOME: join(root, "data"),
    XDG_CONFIG_HOME: join(root, "config"),
    XDG_CACHE_HOME: join(root, "cache"),
    XDG_STATE_HOME: join(root, "state"),
    OPENCODE_DISABLE_MODELS_FETCH: "1",
    OPENCODE_DISABLE_AUTOUPDATE: "1",
    OPENCODE_DISABLE_DEFAULT_PLUGINS: "1",
    OPENCODE_CONFIG_CONTENT: JSON.stringify(config),
  };
  return startProcess(opencodeBinary(), ["serve", "--port", "0", "--hostname", "127.0.0.1", "--print-logs", "--log-level", process.env.OPENCODE_TEST_LOG_LEVEL ?? "WARN"], {
    cwd: join(root, "project"),
    env,
    listening: /listening on (\S+)/,
    what: "opencode serve",
  });
}

/** One HTTP call to an OpenCode server's API. */
export async function api(
  server: Proc,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; json: unknown; text: string }> {
  const res = await fetch(server.url + path, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text };
}

export async function createSession(server: Proc): Promise<string> {
  const r = await api(server, "POST", "/session", {});
  const id = (r.json as { id?: string } | undefined)?.id;
  if (r.status !== 200 || id === undefined) throw new Error(`POST /session: ${r.status} ${r.text}`);
  return id;
}

export function prompt(server: Proc, session: string, text: string): Promise<{ status: number; json: unknown; text: string }> {
  return api(server, "POST", `/session/${session}/message`, { parts: [{ type: "text", text }] });
}

export async function promptAsync(server: Proc, session: string, text: string): Promise<void> {
  const r = await api(server, "POST", `/session/${session}/prompt_async`, { parts: [{ type: "text", text }] });
  if (r.status >= 300) throw new Error(`prompt_async: ${r.status} ${r.text}`);
}

/** Whether the server is running the session now. */
export async function busy(server: Proc, session: string): Promise<boolean> {
  const r = await api(server, "GET", "/session/status");
  const s = (r.json as Record<string, { type?: string }> | undefined)?.[session];
  return s !== undefined && s.type !== "idle";
}

/** Polls `cond` every 25 ms for at most `ms`. */
export async function until(what: string, cond: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** The session's messages as one server reads them from the shared database. */
export async function messages(
  server: Proc,
  session: string,
): Promise<Array<{ info: { role: string; id: string }; parts: Array<{ type: string; text?: string; state?: { status?: string } }> }>> {
  const r = await api(server, "GET", `/session/${session}/message`);
  return r.json as Array<{ info: { role: string; id: string }; parts: Array<{ type: string; text?: string }> }>;
}

/** A server's event stream (`GET /event`), collected as it comes. */
export interface Events {
  readonly events: Array<{ type?: string; properties?: Record<string, unknown> }>;
  close(): void;
}

export async function subscribe(server: Proc): Promise<Events> {
  const stop = new AbortController();
  const res = await fetch(server.url + "/event", { signal: stop.signal });
  if (res.body === null) throw new Error("GET /event: no body");
  const reader = res.body.getReader();
  const events: Events["events"] = [];
  void (async () => {
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        buf += decoder.decode(value, { stream: true });
        for (let i = buf.indexOf("\n\n"); i >= 0; i = buf.indexOf("\n\n")) {
          for (const line of buf.slice(0, i).split("\n")) {
            if (!line.startsWith("data:")) continue;
            try {
              events.push(JSON.parse(line.slice(5)) as Events["events"][number]);
            } catch {
              // Not JSON: not an event this test reads.
            }
          }
          buf = buf.slice(i + 2);
        }
      }
    } catch {
      // Closed.
    }
  })();
  return { events, close: () => stop.abort() };
}

/**
 * One whole text turn in a session of its own: OpenCode loads the project
 * and its plugins at a server's first request for a directory and the
 * provider's SDK at its first model call (over a second on 2 cores), which
 * would otherwise land inside the race a test sets up.
 */
export async function warm(server: Proc): Promise<void> {
  const session = await createSession(server);
  const r = await prompt(server, session, "warm up");
  if (r.status !== 200) throw new Error(`warm-up prompt: ${r.status} ${r.text}; the server's output:\n${server.output()}`);
}
