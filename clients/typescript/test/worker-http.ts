// The HTTP face of a framework worker process (test/*-worker.ts): POST /run
// with a JSON body runs one turn, GET /items?id= lists a session's stored
// messages; prints "listening on 127.0.0.1:<port>" once it serves.

import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** What a worker's POST /run takes: the session (thread, chat) id and the user's message (null: resume). */
export interface RunBody {
  readonly id: string;
  readonly input: string | null;
}

/** One stored message as the tests compare them: a tool call as `call:<id>`, its result as `result:<id>`. */
export interface Message {
  readonly role: string;
  readonly text: string;
  readonly content?: string;
}

/** The error a run ended with, as the tests read it. */
export function failure(err: unknown): { ok: false; error: string; message: string } {
  const e = err as Error;
  return { ok: false, error: e.name, message: e.message };
}

export function serveWorker(run: (body: RunBody) => Promise<unknown>, items: (id: string) => Promise<Message[]>): void {
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    void (async () => {
      let body = "";
      for await (const chunk of req) body += String(chunk);
      const url = new URL(req.url ?? "/", "http://x");
      let out: unknown;
      if (req.method === "POST" && url.pathname === "/run") out = await run(JSON.parse(body) as RunBody);
      else if (req.method === "GET" && url.pathname === "/items") out = await items(url.searchParams.get("id") ?? "");
      else {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(out));
    })();
  });
  server.listen(0, "127.0.0.1", () => {
    console.log(`listening on 127.0.0.1:${(server.address() as AddressInfo).port}`);
  });
}

/** The part of a better-sqlite3 database `walMode` uses. */
interface Pragmas {
  pragma(source: string, options?: { simple: boolean }): unknown;
}

/**
 * Puts the shared database file in WAL mode. Two workers starting at once
 * on a fresh file race for the switch, and SQLite answers the loser
 * SQLITE_BUSY without calling its busy handler: it retries (bounded), and
 * a file already in WAL mode (the mode persists) needs no switch.
 */
export function walMode(db: Pragmas): void {
  for (let attempt = 0; ; attempt++) {
    try {
      if (db.pragma("journal_mode", { simple: true }) !== "wal") db.pragma("journal_mode = WAL");
      return;
    } catch (err) {
      if ((err as { code?: string }).code !== "SQLITE_BUSY" || attempt >= 50) throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
    }
  }
}
