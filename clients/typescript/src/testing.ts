// A throwaway leasehold server for your own tests: `@leasehold/client/testing`.
//
//   import { startTestServer } from "@leasehold/client/testing";
//   const server = await startTestServer();          // 127.0.0.1:<free port>, a temporary database
//   const lh = createClient({ baseUrl: server.baseUrl });
//   ...
//   await server.close();                            // stops it and deletes the database
//
// A test server stops at once on close(), even with clients still connected:
// it is started with `--drain-timeout-ms 0` (the default drain waits up to
// 5 s for open connections to close). It still shuts down cleanly,
// committing what it acknowledged; pass your own `--drain-timeout-ms` in
// `args` to test draining.
//
// The binary is $LEASEHOLD_BIN when set, else the first `leasehold` on PATH;
// with neither, `startTestServer` rejects with NoServerBinaryError saying so;
// a binary older than this client (it does not speak the protocol revision
// the client needs) is refused with IncompatibleServerError.

import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { createInterface } from "node:readline";
import { createClient } from "./client.js";
import { UnauthenticatedError, UnsupportedError } from "./errors.js";
import { PROTOCOL } from "./protocol.js";

/** No leasehold server binary to start. */
export class NoServerBinaryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NoServerBinaryError";
  }
}

/** The binary started, but it does not speak what this client needs. */
export class IncompatibleServerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "IncompatibleServerError";
  }
}

/** Refuses a server older than this client, naming both sides. */
async function checkSpeaks(binary: string, baseUrl: string): Promise<void> {
  const client = createClient({ baseUrl, owner: "leasehold-testing" });
  try {
    const info = await client.serverInfo();
    if (!info.compatible) {
      throw new IncompatibleServerError(
        `${binary} is leasehold ${info.version}, speaking leasehold.v1 revision ${info.protocol}; ` +
          `this client needs revision ${PROTOCOL}: install a leasehold server of at least this client's version`,
      );
    }
  } catch (err) {
    if (err instanceof UnauthenticatedError) return; // started with --auth: no token to ask with
    if (err instanceof UnsupportedError) {
      throw new IncompatibleServerError(
        `${binary} is older than this client: it does not answer ServerInfo (${err.message}); ` +
          "install a leasehold server of at least this client's version",
      );
    }
    throw err;
  } finally {
    client.close();
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
  /** Stops the server (SIGTERM: it does not drain, so it exits at once; SIGKILL after 3 s) and deletes its database. */
  close(): Promise<void>;
}

const DRAIN = "--drain-timeout-ms";

/** Starts a server on a free loopback port with a temporary database; `args` are extra `serve` flags. */
export async function startTestServer(args: readonly string[] = []): Promise<TestServer> {
  const binary = findBinary();
  const home = mkdtempSync(join(tmpdir(), "leasehold-test-"));
  const dbPath = join(home, "leasehold.db");
  // A client the test left open (a watch, a wait in line) would hold the
  // default drain on every close; nothing is lost without it (acknowledged
  // writes are durable before their reply).
  const drain = args.some((a) => a === DRAIN || a.startsWith(`${DRAIN}=`)) ? [] : [DRAIN, "0"];
  const child: ChildProcess = spawn(binary, ["serve", "--listen", "127.0.0.1:0", "--db", dbPath, ...drain, ...args], {
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
    const baseUrl = `http://${address}`;
    await checkSpeaks(binary, baseUrl);
    return { baseUrl, dbPath, close };
  } catch (err) {
    await close();
    throw err;
  }
}
