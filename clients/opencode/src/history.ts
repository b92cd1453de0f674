// What a run is about to send the model, judged before OpenCode turns it
// into provider messages: a tool call still pending or running in the
// history was started by some other run (a step's own calls have all ended
// before the next step reads the history), and OpenCode would send it to
// the model as "[Tool execution was interrupted]" while it is still live.

/** The parts of an OpenCode message this check reads. */
export interface HistoryMessage {
  readonly info: { readonly sessionID: string; readonly role: string };
  readonly parts: ReadonlyArray<{
    readonly type: string;
    readonly callID?: string;
    readonly tool?: string;
    readonly state?: { readonly status?: string };
  }>;
}

/** A tool call that has no result yet. */
export interface UnfinishedCall {
  readonly callID: string;
  readonly tool: string;
}

/** The session the history belongs to, or undefined for an empty history. */
export function sessionOf(messages: readonly HistoryMessage[]): string | undefined {
  return messages[0]?.info.sessionID;
}

/** Every tool call in `messages` that is still pending or running. */
export function unfinishedCalls(messages: readonly HistoryMessage[]): UnfinishedCall[] {
  const calls: UnfinishedCall[] = [];
  for (const message of messages) {
    for (const part of message.parts) {
      if (part.type !== "tool") continue;
      const status = part.state?.status;
      if (status === "pending" || status === "running") {
        calls.push({ callID: part.callID ?? "", tool: part.tool ?? "" });
      }
    }
  }
  return calls;
}
