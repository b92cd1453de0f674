// @leasehold/opencode: one OpenCode server at a time runs a session.
//
//   opencode.json: { "plugin": ["@leasehold/opencode"] }   (LEASEHOLD_URL names the lock server)
//
// Each session's run holds a leasehold lease on `opencode:session:<id>`:
// - `chat.message` takes it before the prompt is saved and before the run
//   reads the history (waiting `waitMs` for another server's run to end,
//   then refusing with SessionBusyError: the prompt is not saved);
// - `experimental.chat.messages.transform`, before each step turns the
//   history into provider messages, refuses a history holding a live tool
//   call of another run (and takes the lease for a run that entered without
//   a prompt);
// - `chat.params`, right before each model call, checks the lease's fence
//   with the server;
// - the `event` hook releases it when the session goes idle, or suspends it
//   when the run errored or was aborted; a lost lease aborts the run;
// - when the plugin loads, sessions whose last run ended unfinished (listed
//   RECOVERABLE) are resumed by whichever server takes their lease first.
// What the plugin API cannot reach is in docs/opencode.md.

import { createClient, type LeaseholdClient } from "@leasehold/client";
import type { Hooks, Plugin, PluginInput, PluginModule } from "@opencode-ai/plugin";
import { ForeignToolCallError, SessionBusyError, SessionLostError } from "./errors.js";
import { type HistoryMessage, sessionOf, unfinishedCalls } from "./history.js";
import { SessionLeases } from "./leases.js";
import { type Settings, settings } from "./options.js";

export { ForeignToolCallError, SessionBusyError, SessionLostError } from "./errors.js";
export { type HistoryMessage, type UnfinishedCall, unfinishedCalls } from "./history.js";
export type { LeaseholdPluginOptions } from "./options.js";

/** Bounds the recovery scan: at most this many pages of recoverable keys. */
const MAX_RECOVERY_PAGES = 100;

/** The plugin as OpenCode calls it: `(input, options) => hooks`. */
export const leaseholdPlugin: Plugin = async (input, options) => {
  const s = settings(options, process.env);
  const lh = createClient({
    baseUrl: s.url,
    ...(s.token !== undefined ? { token: s.token } : {}),
    ...(s.owner !== undefined ? { owner: s.owner } : {}),
  });
  return ownershipHooks(input, lh, s);
};

/** The hooks of {@link leaseholdPlugin}, on a client of your own (tests, embedding). */
export function ownershipHooks(input: PluginInput, lh: LeaseholdClient, s: Settings): Hooks {
  const leases = new SessionLeases(lh, s, (sessionID) => {
    // The lease is gone (expired while this server was stalled, or taken
    // over): stop the run so nothing more is written under it.
    leases.markFailed(sessionID);
    void input.client.session.abort({ path: { id: sessionID } }).catch(() => undefined);
  });

  if (s.recover) setTimeout(() => void recover(input, leases, lh, s), 0);

  return {
    "chat.message": async ({ sessionID }) => {
      await leases.take(sessionID, s.waitMs);
    },

    "experimental.chat.messages.transform": async (_input, output) => {
      const messages = output.messages as unknown as readonly HistoryMessage[];
      const sessionID = sessionOf(messages);
      if (sessionID === undefined) return;
      // A run entered without a prompt (a resume, a command's own loop)
      // takes the lease here, before its history goes anywhere; it does not
      // wait, since it has no caller to answer.
      const lease = leases.held(sessionID) ?? (await leases.take(sessionID, 0, { promptSaved: true }));
      const foreign = unfinishedCalls(messages);
      // A recovered term follows a run that died (expired) or failed
      // (suspended): its calls without a result really were interrupted, and
      // OpenCode says so to the model. Otherwise they are live elsewhere.
      if (foreign.length > 0 && !lease.recovered) throw new ForeignToolCallError(sessionID, foreign);
    },

    "chat.params": async ({ sessionID }) => {
      const lease = leases.held(sessionID);
      if (lease === undefined) return;
      try {
        await lease.gate();
      } catch (err) {
        leases.markFailed(sessionID);
        throw new SessionLostError(sessionID, err);
      }
    },

    event: async ({ event }) => {
      if (event.type === "session.error") {
        const id = event.properties.sessionID;
        if (id !== undefined) leases.markFailed(id);
      } else if (event.type === "session.idle") {
        void leases.end(event.properties.sessionID);
      } else if (event.type === "session.status" && event.properties.status.type === "idle") {
        void leases.end(event.properties.sessionID);
      }
    },

    dispose: async () => {
      await leases.endAll();
      lh.close();
    },
  };
}

/**
 * Resumes the sessions whose last run ended unfinished: each is taken with
 * a lease (without waiting), so of several servers starting at once exactly
 * one resumes it; the others see it busy and leave it.
 */
async function recover(input: PluginInput, leases: SessionLeases, lh: LeaseholdClient, s: Settings): Promise<void> {
  let pageToken = "";
  for (let page = 0; page < MAX_RECOVERY_PAGES; page++) {
    let keys;
    try {
      const reply = await lh.list({ prefix: s.keyPrefix, filter: "recoverable", pageToken });
      keys = reply.keys;
      pageToken = reply.nextPageToken;
    } catch {
      return; // The lock server is unreachable: nothing is resumed (the safe side).
    }
    for (const k of keys) {
      const sessionID = k.key.slice(s.keyPrefix.length);
      let lease;
      try {
        lease = await leases.take(sessionID, 0);
      } catch (err) {
        if (err instanceof SessionBusyError) continue; // Another server won it.
        continue;
      }
      // Listed before another server took it, resumed it and ended its run
      // cleanly: the key is free again, but nothing is left to recover (a
      // second resume would run the session's last turn again).
      if (!lease.recovered) {
        await leases.end(sessionID);
        continue;
      }
      try {
        await input.client.session.promptAsync({
          path: { id: sessionID },
          body: { parts: [{ type: "text", text: s.resumePrompt }] },
          throwOnError: true,
        });
      } catch {
        // Not a session of this server's project (or gone): leave it
        // recoverable for a server that can resume it.
        leases.markFailed(sessionID);
        await leases.end(sessionID);
      }
    }
    if (pageToken === "") return;
  }
}

/** The plugin module OpenCode loads from `"plugin": ["@leasehold/opencode"]`. */
const plugin: PluginModule = { id: "@leasehold/opencode", server: leaseholdPlugin };
export default plugin;
