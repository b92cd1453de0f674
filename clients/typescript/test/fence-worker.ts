// An earlier owner for the paused-writer tests (fence-pg, fence-sqlite): it
// opens a fenced write, inserts its row, prints "inside <pg backend pid>",
// then blocks until a line arrives on stdin (the test stops it with SIGSTOP
// meanwhile), finishes the write and prints "ok" or "error <name> <reason>".
//
//   node fence-worker.js pg <url> <schema> <key> <fence> <body> <idleTimeoutMs>
//   node fence-worker.js sqlite <path> <key> <fence> <body> <timeoutMs>

import { readSync } from "node:fs";
import Database from "better-sqlite3";
import pg from "pg";
import { FenceTimeoutError, LeaseholdError, pgFencedWrite, sqliteFencedWrite } from "../src/index.js";

function report(err: unknown): void {
  const reason = err instanceof FenceTimeoutError ? err.reason : "";
  const name = err instanceof Error ? err.name : "thrown";
  process.stdout.write(`error ${name} ${reason} ${err instanceof LeaseholdError ? "" : String(err)}\n`);
}

/** Blocks the whole process (synchronously) until the test writes a line. */
function waitForLine(): void {
  const buf = Buffer.alloc(64);
  readSync(0, buf, 0, buf.length, null);
}

const [kind, ...args] = process.argv.slice(2);
if (kind === "pg") {
  const [url, schema, key, fence, body, idle] = args as [string, string, string, string, string, string];
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query(`SET search_path TO ${schema}`);
  try {
    await pgFencedWrite(
      client,
      key,
      BigInt(fence),
      async (c) => {
        await c.query("INSERT INTO items (session, body, fence) VALUES ($1, $2, $3)", [key, body, fence]);
        const pid = (await c.query("SELECT pg_backend_pid() AS pid")).rows[0] as { pid: number };
        process.stdout.write(`inside ${pid.pid}\n`);
        waitForLine();
      },
      { idleTimeoutMs: Number(idle) },
    );
    process.stdout.write("ok\n");
  } catch (err) {
    report(err);
  }
  await client.end().catch(() => undefined);
} else {
  const [path, key, fence, body, timeout] = args as [string, string, string, string, string];
  const db = new Database(path);
  try {
    sqliteFencedWrite(
      db,
      key,
      BigInt(fence),
      () => {
        db.prepare("INSERT INTO items (session, body) VALUES (?, ?)").run(key, body);
        process.stdout.write("inside 0\n");
        waitForLine();
      },
      { timeoutMs: Number(timeout) },
    );
    process.stdout.write("ok\n");
  } catch (err) {
    report(err);
  }
  db.close();
}
