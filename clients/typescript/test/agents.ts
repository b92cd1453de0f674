// Starts a Node process (an example agent server) that prints
// "listening on 127.0.0.1:<port>", and talks JSON to it.

import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";

export interface AgentProcess {
  readonly url: string;
  readonly pid: number;
  post(path: string, value: unknown): Promise<unknown>;
  get(path: string): Promise<unknown>;
  /** SIGKILL; resolves once it exited. */
  kill(): Promise<void>;
  freeze(): void;
  thaw(): void;
  stop(): Promise<void>;
}

export async function startAgent(script: string, env: Record<string, string>): Promise<AgentProcess> {
  const child: ChildProcess = spawn(process.execPath, [script], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (c: string) => {
    stderr = (stderr + c).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const addr = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`agent did not listen within 15 s; stderr:\n${stderr}`)), 15_000);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`agent exited (${code}) before listening; stderr:\n${stderr}`));
    });
    createInterface({ input: child.stdout! }).once("line", (line) => {
      clearTimeout(timer);
      const m = /^listening on (127\.0\.0\.1:\d+)/.exec(line);
      if (m?.[1] === undefined) reject(new Error(`unexpected first line from agent: ${line}`));
      else resolve(m[1]);
    });
  });
  const url = `http://${addr}`;
  const pid = child.pid!;
  const call = async (method: string, path: string, value?: unknown): Promise<unknown> => {
    let res: Response;
    try {
      res = await fetch(`${url}${path}`, {
        method,
        headers: { "content-type": "application/json" },
        ...(value === undefined ? {} : { body: JSON.stringify(value) }),
      });
    } catch (err) {
      throw new Error(`${method} ${path}: ${(err as Error).message}; the agent's stderr:\n${stderr}`, { cause: err });
    }
    const out = (await res.json()) as unknown;
    if (res.status >= 500) throw new Error(`${method} ${path}: ${JSON.stringify(out)}`);
    return out;
  };
  return {
    url,
    pid,
    post: (path, value) => call("POST", path, value),
    get: (path) => call("GET", path),
    kill: async () => {
      child.kill("SIGKILL");
      await exited;
    },
    freeze: () => process.kill(pid, "SIGSTOP"),
    thaw: () => process.kill(pid, "SIGCONT"),
    stop: async () => {
      try {
        process.kill(pid, "SIGCONT");
      } catch {
        // gone
      }
      child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), 3_000);
      await exited;
      clearTimeout(killer);
    },
  };
}
