// The plugin's options: from opencode.json (`"plugin": [["@leasehold/opencode",
// { … }]]`), else the LEASEHOLD_* environment, else the defaults below.

/** Options of the plugin, as given in opencode.json. */
export interface LeaseholdPluginOptions {
  /** The leasehold server (or a comma-separated list for failover). Default LEASEHOLD_URL, else http://127.0.0.1:7420. */
  url?: string;
  /** Bearer token for a server run with --auth. Default LEASEHOLD_TOKEN. */
  token?: string;
  /** A session's lease TTL; the lease renews itself at a third of it while the run goes on. Default 10 s. */
  ttlMs?: number;
  /** How long a prompt waits for another server's run on the session to end before it is refused. Default 10 s. */
  waitMs?: number;
  /** Key of a session's lease: this prefix and the session id. Default "opencode:session:". */
  keyPrefix?: string;
  /** Resume, when the plugin loads, the sessions whose last run ended unfinished (lease expired or suspended). Default true. */
  recover?: boolean;
  /** The user message a resumed session is sent. */
  resumePrompt?: string;
  /** This server's owner name, shown to the others in busy errors. Default hostname:pid. */
  owner?: string;
}

export interface Settings {
  readonly url: string;
  readonly token: string | undefined;
  readonly ttlMs: number;
  readonly waitMs: number;
  readonly keyPrefix: string;
  readonly recover: boolean;
  readonly resumePrompt: string;
  readonly owner: string | undefined;
}

const DEFAULT_RESUME =
  "The server that was running this session stopped before the run finished. " +
  "Tool calls it left without a result did not complete; continue the task from here.";

function num(name: string, value: unknown, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new Error(`@leasehold/opencode: option ${name} must be a non-negative integer (ms), not ${String(value)}`);
  }
  return value;
}

function str(name: string, value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw new Error(`@leasehold/opencode: option ${name} must be a string`);
  return value;
}

/** The settings for `options` as OpenCode passes them (an untyped record). */
export function settings(options: Record<string, unknown> | undefined, env: NodeJS.ProcessEnv): Settings {
  const o = options ?? {};
  const recover = o.recover;
  if (recover !== undefined && typeof recover !== "boolean") {
    throw new Error("@leasehold/opencode: option recover must be true or false");
  }
  return {
    url: str("url", o.url) ?? env.LEASEHOLD_URL ?? "http://127.0.0.1:7420",
    token: str("token", o.token) ?? env.LEASEHOLD_TOKEN,
    ttlMs: num("ttlMs", o.ttlMs, 10_000),
    waitMs: num("waitMs", o.waitMs, 10_000),
    keyPrefix: str("keyPrefix", o.keyPrefix) ?? "opencode:session:",
    recover: recover ?? true,
    resumePrompt: str("resumePrompt", o.resumePrompt) ?? DEFAULT_RESUME,
    owner: str("owner", o.owner),
  };
}
