// The session store both agent servers share: one SQLite file (better-sqlite3,
// WAL), shaped like OpenCode's: a session row with a `time_suspended` claim
// and the last response id the next request chains onto, the transcript's
// parts, and a steering inbox taken by session id.

import Database from "better-sqlite3";
import { SQLITE_CREATE_TABLE, sqliteFencedWrite } from "../../src/index.js";

export type PartKind = "user" | "call" | "result" | "answer";

export interface Part {
  readonly seq: number;
  readonly kind: PartKind;
  readonly callId: string | null;
  readonly body: string;
  /** The agent server that wrote the part. */
  readonly server: string;
}

export class SessionStore {
  readonly db: Database.Database;

  constructor(path: string) {
    this.db = new Database(path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("busy_timeout = 5000");
    this.db.exec(`CREATE TABLE IF NOT EXISTS session (
      id TEXT PRIMARY KEY NOT NULL,
      time_suspended INTEGER,
      last_response_id TEXT
    );
    CREATE TABLE IF NOT EXISTS part (
      seq INTEGER PRIMARY KEY AUTOINCREMENT,
      session_id TEXT NOT NULL,
      kind TEXT NOT NULL,
      call_id TEXT,
      body TEXT NOT NULL,
      server TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS inbox (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      session_id TEXT NOT NULL,
      text TEXT NOT NULL,
      taken_by TEXT
    );`);
    this.db.exec(SQLITE_CREATE_TABLE);
  }

  /**
   * A write transaction. With a fence, it is fenced: the session's fence is
   * advanced in the same BEGIN IMMEDIATE transaction, and a stale one rolls
   * everything back (StaleFenceError). Without one (OpenCode's shape), it is
   * a plain transaction.
   */
  write<T>(sessionId: string, fence: bigint | undefined, work: () => T): T {
    if (fence === undefined) return this.db.transaction(work).immediate();
    return sqliteFencedWrite(this.db, `session:${sessionId}`, fence, work);
  }

  ensureSession(id: string): void {
    this.db.prepare("INSERT INTO session (id) VALUES (?) ON CONFLICT (id) DO NOTHING").run(id);
  }

  /** OpenCode's claim: sets the timestamp only when null, and the caller ignores how many rows changed. */
  claim(id: string): void {
    this.db.prepare("UPDATE session SET time_suspended = ? WHERE id = ? AND time_suspended IS NULL").run(Date.now(), id);
  }

  /** OpenCode's release: clears the claim by session id, whoever set it. */
  release(id: string): void {
    this.db.prepare("UPDATE session SET time_suspended = NULL WHERE id = ?").run(id);
  }

  /** The sessions with a claim set (what OpenCode's restart recovery looks at). */
  claimed(): string[] {
    return (this.db.prepare("SELECT id FROM session WHERE time_suspended IS NOT NULL").all() as Array<{ id: string }>).map(
      (r) => r.id,
    );
  }

  lastResponseId(id: string): string | undefined {
    const row = this.db.prepare("SELECT last_response_id AS r FROM session WHERE id = ?").get(id) as
      | { r: string | null }
      | undefined;
    return row?.r ?? undefined;
  }

  setLastResponseId(id: string, responseId: string): void {
    this.db.prepare("UPDATE session SET last_response_id = ? WHERE id = ?").run(responseId, id);
  }

  enqueue(id: string, text: string): void {
    this.ensureSession(id);
    this.db.prepare("INSERT INTO inbox (session_id, text) VALUES (?, ?)").run(id, text);
  }

  pending(id: string): number {
    const row = this.db.prepare("SELECT count(*) AS n FROM inbox WHERE session_id = ? AND taken_by IS NULL").get(id) as {
      n: number;
    };
    return row.n;
  }

  /**
   * Takes the session's oldest pending steering input (call inside `write`),
   * by session id: nothing records which server received it. One at a time,
   * so each input is one turn.
   */
  take(id: string, server: string): string[] {
    const rows = this.db
      .prepare(
        `UPDATE inbox SET taken_by = ? WHERE id = (
           SELECT min(id) FROM inbox WHERE session_id = ? AND taken_by IS NULL
         ) RETURNING text`,
      )
      .all(server, id) as Array<{ text: string }>;
    return rows.map((r) => r.text);
  }

  addPart(id: string, kind: PartKind, callId: string | null, body: string, server: string): void {
    this.db
      .prepare("INSERT INTO part (session_id, kind, call_id, body, server) VALUES (?, ?, ?, ?, ?)")
      .run(id, kind, callId, body, server);
  }

  parts(id: string): Part[] {
    return (
      this.db
        .prepare("SELECT seq, kind, call_id AS callId, body, server FROM part WHERE session_id = ? ORDER BY seq")
        .all(id) as Part[]
    ).map((p) => ({ ...p }));
  }

  /** Calls with no result part yet: running here, running elsewhere, or left by a dead process. */
  openCalls(id: string): Array<{ callId: string; name: string }> {
    const parts = this.parts(id);
    const done = new Set(parts.filter((p) => p.kind === "result").map((p) => p.callId));
    return parts
      .filter((p) => p.kind === "call" && p.callId !== null && !done.has(p.callId))
      .map((p) => ({ callId: p.callId as string, name: (JSON.parse(p.body) as { name: string }).name }));
  }

  close(): void {
    this.db.close();
  }
}
