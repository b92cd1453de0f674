// A Mastra server process with one workflow (`pay`: one step, `charge`,
// which takes CHARGE_MS and appends its side effect to EFFECTS), its runs in a LibSQL file it shares with other such processes,
// for the `ownWorkflows` process tests. One command per process:
//
//   WF_MODE=start    starts run RUN_ID and waits for its result
//   WF_MODE=restart  restarts run RUN_ID (`run.restart()`)
//   WF_MODE=recover  what a server does on boot: mastra.restartAllActiveWorkflowRuns()
//   WF_MODE=status   the run's status and result as storage has them
//
// WF_OWNED=1: the Mastra instance through `ownWorkflows` (LEASEHOLD_URL,
// WF_TTL_MS); otherwise Mastra as a user has it today. Prints one JSON line
// per event: {"event":"charging"} when the charge begins, then
// {"event":"done","status":...,"by":...} or {"event":"error","name":...}.

import { appendFileSync } from "node:fs";
import { Mastra } from "@mastra/core/mastra";
import { createStep, createWorkflow } from "@mastra/core/workflows";
import { LibSQLStore } from "@mastra/libsql";
import { z } from "zod";
import { createClient } from "../src/index.js";
import { ownWorkflows } from "../src/mastra.js";

const name = process.env.WF_NAME ?? `server-${process.pid}`;
const mode = process.env.WF_MODE ?? "start";
const runId = process.env.RUN_ID ?? "r1";
const chargeMs = Number(process.env.CHARGE_MS ?? "0");
const effects = process.env.EFFECTS ?? "/dev/null";

const say = (line: object): void => void process.stdout.write(`${JSON.stringify(line)}\n`);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const charge = createStep({
  id: "charge",
  inputSchema: z.object({ amount: z.number() }),
  outputSchema: z.object({ by: z.string() }),
  execute: async ({ inputData }) => {
    // On disk before it is announced: the test kills -9 on "charging", and
    // a kill between the two lines would otherwise lose the charge.
    appendFileSync(effects, `${name} charge ${inputData.amount}\n`);
    say({ event: "charging" });
    await sleep(chargeMs);
    return { by: name };
  },
});
const pay = createWorkflow({
  id: "pay",
  inputSchema: z.object({ amount: z.number() }),
  outputSchema: z.object({ by: z.string() }),
})
  .then(charge)
  .commit();

let mastra = new Mastra({
  workflows: { pay },
  storage: new LibSQLStore({ id: name, url: `file:${process.env.WF_DB ?? ""}` }),
  ...(process.env.WF_DEBUG === "1" ? {} : { logger: false }),
});
if (process.env.WF_OWNED === "1") {
  const lh = createClient({ baseUrl: process.env.LEASEHOLD_URL ?? "", owner: name });
  mastra = ownWorkflows(mastra, lh, { ttlMs: Number(process.env.WF_TTL_MS ?? "1000"), waitMs: 0 });
}

try {
  const workflow = mastra.getWorkflow("pay");
  if (mode === "start") {
    const run = await workflow.createRun({ runId });
    const result = await run.start({ inputData: { amount: 5 } });
    say({ event: "done", status: result.status, by: result.status === "success" ? result.result.by : undefined });
  } else if (mode === "status") {
    const state = await workflow.getWorkflowRunById(runId);
    say({ event: "done", status: state?.status, by: (state?.result as { by?: string } | undefined)?.by });
  } else if (mode === "restart") {
    const result = await (await workflow.createRun({ runId })).restart();
    say({ event: "done", status: result.status, by: result.status === "success" ? result.result.by : undefined });
  } else {
    const active = await workflow.listActiveWorkflowRuns();
    say({ event: "active", runs: active.runs.map((r) => r.runId) });
    await mastra.restartAllActiveWorkflowRuns();
    say({ event: "done", status: "recovered" });
  }
} catch (err) {
  const e = err as Error;
  say({ event: "error", name: e.name, message: e.message });
}
process.exit(0);
