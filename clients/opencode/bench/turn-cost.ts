// What the plugin costs a turn: one prompt answered with text (one model
// call, no tool), on a server without the plugin and on one with it, in one
// run against the same fake provider and lock server, interleaved.
//
//   LEASEHOLD_BIN=… node dist-test/bench/turn-cost.js [turns per server, default 40]

import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startMockProvider } from "../test/mock-provider.js";
import { createSession, pluginSpec, prompt, sandbox, startLeasehold, startOpencode } from "../test/servers.js";

const turns = Number(process.argv[2] ?? "40");
const root = mkdtempSync(join(tmpdir(), "leasehold-opencode-bench-"));
mkdirSync(join(root, "signals"));
const mock = await startMockProvider(join(root, "signals"));
const lock = await startLeasehold(root);
for (const d of ["bare", "owned"]) sandbox(join(root, d));
const bare = await startOpencode(join(root, "bare"), mock.baseURL("bare"), []);
const owned = await startOpencode(join(root, "owned"), mock.baseURL("owned"), [pluginSpec({ url: lock.url, recover: false })]);
try {
  const times: Record<"bare" | "owned", number[]> = { bare: [], owned: [] };
  const sessions = { bare: await createSession(bare), owned: await createSession(owned) };
  // Warm-up: the first turn loads the provider, the plugin and the title agent.
  await prompt(bare, sessions.bare, "warm up");
  await prompt(owned, sessions.owned, "warm up");
  for (let i = 0; i < turns; i++) {
    for (const [name, server] of [["bare", bare], ["owned", owned]] as const) {
      const t0 = performance.now();
      const r = await prompt(server, sessions[name], `turn ${i}`);
      if (r.status !== 200) throw new Error(`${name} turn ${i}: ${r.status} ${r.text}`);
      times[name].push(performance.now() - t0);
    }
  }
  const q = (xs: number[], p: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))] ?? NaN;
  for (const name of ["bare", "owned"] as const) {
    console.log(`${name === "bare" ? "without the plugin" : "with the plugin   "}: p50 ${q(times[name], 0.5).toFixed(1)} ms, p90 ${q(times[name], 0.9).toFixed(1)} ms per turn (${turns} turns)`);
  }
  console.log(`cost per turn (p50): ${(q(times.owned, 0.5) - q(times.bare, 0.5)).toFixed(1)} ms`);
} finally {
  await Promise.all([bare.stop(), owned.stop(), lock.stop()]);
  await mock.close();
  rmSync(root, { recursive: true, force: true });
}
