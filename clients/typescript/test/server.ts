// Starts a real leasehold server (the binary named by LEASEHOLD_BIN) on a
// free loopback port with a database in a temporary directory.

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export interface TestServer {
  readonly baseUrl: string;
  readonly pid: number;
  readonly dbPath: string;
  /** SIGKILL (kill -9): no drain, connections reset; resolves once it exited. */
  kill(): Promise<void>;
  /** SIGSTOP: the server freezes (as in a long GC pause or a stopped VM). */
  freeze(): void;
  /** SIGCONT. */
  thaw(): void;
  /** Stops the server (SIGTERM, then SIGKILL) and keeps the database. */
  stop(): Promise<void>;
  /** Stops the server and deletes its database. */
  close(): Promise<void>;
}

/**
 * Returns once the kernel reports every thread of `pid` stopped (state `T`
 * in /proc/<pid>/task/<tid>/stat): SIGSTOP is delivered asynchronously, and
 * a server thread still running on the other core could answer one more
 * request (seen: a Check sent right after the freeze was answered).
 * Bounded: gives up after 2 s, and at once where /proc is missing.
 */
function stoppedForSure(pid: number): void {
  const until = Date.now() + 2_000;
  const stopped = (tid: string): boolean => {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
    } catch {
      return true; // the thread has exited
    }
    // The state follows the parenthesised command name.
    return stat.slice(stat.lastIndexOf(")") + 2).startsWith("T");
  };
  while (Date.now() < until) {
    try {
      if (readdirSync(`/proc/${pid}/task`).every(stopped)) return;
    } catch {
      return;
    }
  }
}

export function serverBinary(): string {
  const bin = process.env.LEASEHOLD_BIN;
  if (bin === undefined || bin === "") {
    throw new Error("LEASEHOLD_BIN is not set: point it at the leasehold server binary (e.g. target/release/leasehold)");
  }
  return bin;
}

/**
 * Starts a server; with `dir`, on the database already in that directory;
 * with `listen`, on that loopback address instead of a free port; with
 * `store`, on that store instead of the SQLite file (e.g. `["--store",
 * "postgres://…", "--pg-schema", "s"]`).
 */
export async function startServer(
  dir?: string,
  listen = "127.0.0.1:0",
  extraArgs: string[] = [],
  store?: string[],
  binary?: string,
): Promise<TestServer> {
  if (!listen.startsWith("127.0.0.1:")) throw new Error(`tests listen on loopback only, not ${listen}`);
  const bin = binary ?? serverBinary();
  const home = dir ?? mkdtempSync(join(tmpdir(), "leasehold-ts-"));
  const dbPath = join(home, "x.db");
  const storeArgs = store ?? ["--db", dbPath];
  const child: ChildProcess = spawn(bin, ["serve", "--listen", listen, ...storeArgs, "--drain-timeout-ms", "200", ...extraArgs], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const addr = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not say where it listens within 15 s; stderr:\n${stderr}`)), 15_000);
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code}) before listening; stderr:\n${stderr}`));
    });
    const lines = createInterface({ input: child.stdout! });
    lines.once("line", (line) => {
      clearTimeout(timer);
      const m = /^listening on (\S+)/.exec(line);
      if (m === null || m[1] === undefined) reject(new Error(`unexpected first line from server: ${line}`));
      else resolve(m[1]);
    });
  });
  if (!addr.startsWith("127.0.0.1:")) throw new Error(`server listens on ${addr}, not loopback`);
  const pid = child.pid!;
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    try {
      process.kill(pid, "SIGCONT");
    } catch {
      // already gone
    }
    child.kill("SIGTERM");
    const killer = setTimeout(() => child.kill("SIGKILL"), 3_000);
    await exited;
    clearTimeout(killer);
  };
  return {
    baseUrl: `http://${addr}`,
    pid,
    dbPath,
    kill: async () => {
      stopped = true;
      child.kill("SIGKILL");
      await exited;
    },
    freeze: () => {
      process.kill(pid, "SIGSTOP");
      stoppedForSure(pid);
    },
    thaw: () => process.kill(pid, "SIGCONT"),
    stop,
    close: async () => {
      await stop();
      rmSync(home, { recursive: true, force: true });
    },
  };
}

/** Resolves once `cond()` holds, or fails after `timeoutMs`. */
export async function waitFor(cond: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const start = Date.now();
  while (!cond()) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A loopback port free at the time of asking (for `--metrics-listen`). */
export async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      probe.close(() => resolve(port));
    });
  });
}

/** How many Check requests (unary or on a Session stream) the server at `metricsAt` answered. */
/** How many calls of exactly `rpc` (e.g. "BeginToolCalls" or "Session.BeginToolCalls") the server answered. */
export async function answered(metricsAt: string, rpc: string): Promise<number> {
  const text = await (await fetch(`http://${metricsAt}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^leasehold_request_seconds_count\{rpc="([^"]+)"\} (\d+)/gm)) if (m[1] === rpc) n += Number(m[2]);
  return n;
}

export async function checksAnswered(metricsAt: string): Promise<number> {
  const text = await (await fetch(`http://${metricsAt}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/^leasehold_request_seconds_count\{rpc="(?:Session\.)?Check"\} (\d+)/gm)) n += Number(m[1]);
  return n;
}
