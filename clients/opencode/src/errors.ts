// The plugin's refusals. OpenCode turns a throw from a hook into the run's
// error (and, from `chat.message`, into the prompt request's failure), so
// each says what happened and what the caller can do.

/**
 * Another server runs the session. Refused at a prompt (`chat.message`):
 * the prompt was not saved, send it again once the session is idle. Refused
 * at a run's step (`promptSaved`): nothing went to the model, but the
 * session's last prompt is saved and runs at the session's next run.
 */
export class SessionBusyError extends Error {
  readonly sessionID: string;
  /** The leasehold owner of the run in progress. */
  readonly holder: string;
  /** How long the holder's lease has left (it renews while it runs). */
  readonly remainingMs: number;
  /** The refusal came after the prompt was saved (at a run's step, not at the prompt). */
  readonly promptSaved: boolean;
  constructor(sessionID: string, holder: string, remainingMs: number, waitedMs: number, promptSaved = false) {
    super(
      `session ${sessionID} is busy: another server (${holder || "a reserved term"}) is running it` +
        (waitedMs > 0 ? ` and did not finish within ${waitedMs} ms` : "") +
        (promptSaved
          ? "; this run stopped before calling the model (its prompt is saved and runs when the session next runs)"
          : "; the prompt was not saved, send it again once the session is idle"),
    );
    this.promptSaved = promptSaved;
    this.name = "SessionBusyError";
    this.sessionID = sessionID;
    this.holder = holder;
    this.remainingMs = remainingMs;
  }
}

/** The history holds another run's live tool call: nothing was sent to the model. */
export class ForeignToolCallError extends Error {
  readonly sessionID: string;
  readonly callIDs: readonly string[];
  constructor(sessionID: string, calls: ReadonlyArray<{ callID: string; tool: string }>) {
    super(
      `session ${sessionID}: the history holds tool call ${calls.map((c) => `${c.callID} (${c.tool})`).join(", ")} ` +
        `still running in another run; not sending it to the model as interrupted`,
    );
    this.name = "ForeignToolCallError";
    this.sessionID = sessionID;
    this.callIDs = calls.map((c) => c.callID);
  }
}

/** This server no longer holds the session's lease: the run stops before its next model call. */
export class SessionLostError extends Error {
  readonly sessionID: string;
  constructor(sessionID: string, cause: unknown) {
    super(`session ${sessionID}: this server lost its lease on the session; the run stops here`, { cause });
    this.name = "SessionLostError";
    this.sessionID = sessionID;
  }
}
