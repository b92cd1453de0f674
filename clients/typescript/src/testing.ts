// A throwaway leasehold server for your own tests: `@leasehold/client/testing`.
//
//   import { startTestServer } from "@leasehold/client/testing";
//   const server = await startTestServer();          // 127.0.0.1:<free port>, a temporary database
//   const lh = createClient({ baseUrl: server.baseUrl });
//   ...
//   await server.close();                            // stops it and deletes the database
//
// The binary is $LEASEHOLD_BIN when set, else the first `leasehold` on PATH;
// with neither, `startTestServer` rejects with NoServerBinaryError saying so.

import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { createInterface } from "node:readline";

/** No leasehold server binary to start. */
export class NoServerBinaryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NoServerBinaryError";
  }
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** $LEASEHOLD_BIN, else `leasehold` on PATH. @throws NoServerBinaryError */
export function findBinary(): string {
  const named = process.env.LEASEHOLD_BIN;
  if (named !== undefined && named !== "") {
    if (!executable(named)) throw new NoServerBinaryError(`LEASEHOLD_BIN=${named} is not an executable file`);
    return named;
  }
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    const candidate = join(dir, "leasehold");
    if (dir !== "" && executable(candidate)) return candidate;
  }
  throw new NoServerBinaryError(
    "no leasehold server binary: set LEASEHOLD_BIN to one, or put `leasehold` on PATH (cargo build --release in the leasehold repository)",
  );
}

export interface TestServer {
  /** `http://127.0.0.1:<port>`, for `createClient({ baseUrl })`. */
  readonly baseUrl: string;
  /** The temporary database file. */
  readonly dbPath: string;
  /** Stops the server (SIGTERM, then SIGKILL after 3 s) and deletes its database. */
  close(): Promise<void>;
}

/** Starts a server on a free loopback port with a temporary database; `args` are extra `serve` flags. */
export async function startTestServer(args: readonly string[] = []): Promise<TestServer> {
  const binary = findBinary();
  const home = mkdtempSync(join(tmpdir(), "leasehold-test-"));
  const dbPath = join(home, "leasehold.db");
  const child: ChildProcess = spawn(binary, ["serve", "--listen", "127.0.0.1:0", "--db", dbPath, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-2000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const close = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), 3_000);
      await exited;
      clearTimeout(killer);
    }
    rmSync(home, { recursive: true, force: true });
  };
  try {
    const address = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new NoServerBinaryError(`${binary} did not start within 15 s: ${stderr}`)), 15_000);
      child.once("error", (err) => {
        clearTimeout(timer);
        reject(new NoServerBinaryError(`${binary} could not be started: ${err.message}`));
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new NoServerBinaryError(`${binary} exited (${code}) before listening: ${stderr}`));
      });
      const stdout = child.stdout;
      if (stdout === null) throw new Error("no stdout");
      createInterface({ input: stdout }).once("line", (line) => {
        clearTimeout(timer);
        const m = /^listening on (\S+)/.exec(line);
        if (m?.[1] === undefined) reject(new NoServerBinaryError(`${binary} did not start a server: ${line}`));
        else resolve(m[1]);
      });
    });
    return { baseUrl: `http://${address}`, dbPath, close };
  } catch (err) {
    await close();
    throw err;
  }
}
