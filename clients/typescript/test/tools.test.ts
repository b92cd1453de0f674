// The tool-call loop, recovery of calls left running, and transcripts,
// against a real server over both transports.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import {
  createClient,
  InvalidArgumentError,
  LeaseholdClient,
  LeaseLostError,
  type ToolInvocation,
} from "../src/index.js";
import { answered, freePort, startServer, type TestServer } from "./server.js";

const text = (b: Uint8Array): string => new TextDecoder().decode(b);

for (const transport of ["grpc", "grpc-web"] as const) {
  describe(`tool calls and transcripts over ${transport}`, () => {
    let server: TestServer;
    let lh: LeaseholdClient;
    before(async () => {
      server = await startServer();
      lh = createClient({ baseUrl: server.baseUrl, transport, owner: "agent" });
    });
    after(async () => {
      lh.close();
      await server.close();
    });

    it(`begins and settles ${transport === "grpc" ? "on the Session stream" : "as unary calls"}`, async () => {
      const metricsAt = `127.0.0.1:${await freePort()}`;
      const counted = await startServer(undefined, "127.0.0.1:0", ["--metrics-listen", metricsAt]);
      const client = createClient({ baseUrl: counted.baseUrl, transport, owner: "agent" });
      try {
        await client.withLease("session:counted", { ttlMs: 5_000 }, async (lease) => {
          const calls = [
            { callId: "a", name: "t" },
            { callId: "b", name: "t" },
          ];
          const results = await lease.runToolCalls(calls, async (inv) => `out:${inv.call.callId}`);
          assert.deepEqual(
            results.map((r) => r.outcome.state),
            ["succeeded", "succeeded"],
          );
        });
        const [unaryBegin, unarySettle, streamBegin, streamSettle] = await Promise.all(
          ["BeginToolCalls", "SettleToolCall", "Session.BeginToolCalls", "Session.SettleToolCall"].map((rpc) =>
            answered(metricsAt, rpc),
          ),
        );
        if (transport === "grpc") {
          assert.deepEqual([unaryBegin, unarySettle, streamBegin, streamSettle], [0, 0, 1, 2]);
        } else {
          assert.deepEqual([unaryBegin, unarySettle, streamBegin, streamSettle], [1, 2, 0, 0]);
        }
      } finally {
        client.close();
        await counted.close();
      }
    });

    it("runs a duplicate call id once and returns results in the provider's order", async () => {
      const key = `session:1`;
      const ran: string[] = [];
      const invocations: ToolInvocation[] = [];
      await lh.withLease(key, { ttlMs: 5_000 }, async (lease) => {
        const runner = async (inv: ToolInvocation): Promise<string> => {
          ran.push(inv.call.callId);
          invocations.push(inv);
          await new Promise((r) => setTimeout(r, inv.call.callId === "call_1" ? 60 : 5));
          if (inv.call.name === "fail") throw new Error("tool exploded");
          return `out:${inv.call.callId}`;
        };
        const first = await lease.runToolCalls(
          [
            { callId: "call_1", name: "shell" },
            { callId: "call_2", name: "fail" },
            { callId: "call_1", name: "shell" },
          ],
          runner,
        );
        assert.deepEqual(
          first.map((r) => r.callId),
          ["call_1", "call_2", "call_1"],
        );
        assert.deepEqual(ran.sort(), ["call_1", "call_2"], "call_1 ran once although listed twice");
        const [r1, r2, r3] = first;
        assert.ok(r1 !== undefined && r2 !== undefined && r3 !== undefined);
        assert.equal(r1.outcome.state, "succeeded");
        assert.equal(r1.outcome.state === "succeeded" && text(r1.outcome.result), "out:call_1");
        assert.equal(r2.outcome.state, "failed");
        assert.equal(r2.outcome.state === "failed" && text(r2.outcome.result), "tool exploded");
        assert.deepEqual(r3.outcome, r1.outcome);
        // The invocation carries the fence and the documented idempotency key
        // (UUIDv5 of key NUL call id; the Rust client's test vector).
        const inv1 = invocations.find((i) => i.call.callId === "call_1");
        assert.equal(inv1?.fence, lease.fence);
        assert.equal(inv1?.idempotencyKey, "a2d46a7a-2e77-5d22-b2cb-c49159a0b511");

        // A later turn repeating call_1 reuses its stored outcome.
        const second = await lease.runToolCalls(
          [
            { callId: "call_3", name: "shell" },
            { callId: "call_1", name: "shell" },
          ],
          runner,
        );
        assert.deepEqual(ran.sort(), ["call_1", "call_2", "call_3"], "call_1 did not run a second time");
        assert.equal(second[0]?.reused, false);
        assert.equal(second[1]?.reused, true);
        assert.equal(second[1]?.outcome.state === "succeeded" && text(second[1].outcome.result), "out:call_1");
        const all = await lease.listToolCalls();
        assert.deepEqual(
          all.map((c) => [c.callId, c.state]),
          [
            ["call_1", "succeeded"],
            ["call_2", "failed"],
            ["call_3", "succeeded"],
          ],
        );
      });
    });

    it("scopes call ids to turns: a reused id runs again in a new turn, once within it", async () => {
      const lease = await lh.acquire(`turns:${transport}`, { ttlMs: 5_000 });
      const ran: ToolInvocation[] = [];
      const runner = async (inv: ToolInvocation): Promise<string> => {
        ran.push(inv);
        return inv.turn;
      };
      const call0 = { callId: "call_0", name: "shell" };
      await lease.runToolCalls([call0], runner, { turn: "t1" });
      const second = await lease.runToolCalls([call0, call0], runner, { turn: "t2" });
      assert.deepEqual(
        ran.map((i) => [i.turn, i.call.callId]),
        [
          ["t1", "call_0"],
          ["t2", "call_0"],
        ],
      );
      assert.notEqual(ran[0]?.idempotencyKey, ran[1]?.idempotencyKey, "each turn has its own key");
      assert.deepEqual(
        second.map((r) => r.outcome.state === "succeeded" && text(r.outcome.result)),
        ["t2", "t2"],
      );
      const again = await lease.runToolCalls([call0], runner, { turn: "t2" });
      assert.equal(ran.length, 2, "a duplicate within t2 did not run");
      assert.equal(again[0]?.reused, true);

      // acrossTurns: an id an earlier turn declared is reused, not run.
      const across = await lease.runToolCalls([call0, { callId: "call_1", name: "x" }], runner, {
        turn: "t3",
        acrossTurns: true,
      });
      assert.deepEqual(
        ran.map((i) => i.call.callId),
        ["call_0", "call_0", "call_1"],
      );
      assert.equal(across[0]?.reused, true);
      assert.equal(across[0]?.outcome.state === "succeeded" && text(across[0].outcome.result), "t1");

      // call_0 is in three turns: settling it needs the turn.
      await assert.rejects(lease.settleToolCall("call_0", { state: "unknown" }), InvalidArgumentError);
      assert.equal(lease.isValid(), true, "a refused settle is about the call, not the lease");
      const settled = await lease.settleToolCall("call_0", { state: "unknown" }, { turn: "t2" });
      assert.equal(settled.turn, "t2");
      assert.equal(settled.state, "succeeded", "the first outcome won");
      const all = await lease.listToolCalls();
      assert.deepEqual(
        all.map((c) => [c.turn, c.callId]),
        [
          ["t1", "call_0"],
          ["t2", "call_0"],
          ["t3", "call_1"],
        ],
      );
      assert.equal(all[1]?.idempotencyKey, ran[1]?.idempotencyKey, "the server computes the same key");
      await assert.rejects(lease.runToolCalls([call0], runner, { turn: "bad\nturn" }), InvalidArgumentError);
      await lease.release();
    });

    it("a call cut off by losing the lease stays running for the recoverer, who settles it", async () => {
      const key = `recover:${transport}`;
      const first = await lh.acquire(key, { ttlMs: 5_000 });
      let started!: () => void;
      const isStarted = new Promise<void>((r) => (started = r));
      const running = first.runToolCalls([{ callId: "call_x", name: "slow" }], async (inv) => {
        started();
        await new Promise((_, reject) => inv.signal.addEventListener("abort", () => reject(inv.signal.reason)));
        return "never";
      });
      const refused = assert.rejects(running, LeaseLostError);
      await isStarted;
      await first.suspend(); // as if the holder gave up mid-call
      await refused;

      const second = await lh.acquire(key, { ttlMs: 5_000 });
      assert.equal(second.recovered, true);
      assert.equal(second.unsettledToolCalls, 1);
      const left = await second.listToolCalls({ unsettled: true });
      assert.deepEqual(
        left.map((c) => [c.callId, c.state, c.fence]),
        [["call_x", "running", first.fence]],
      );
      const settled = await second.settleToolCall("call_x", { state: "unknown" });
      assert.equal(settled.state, "unknown");
      assert.equal(settled.settledFence, second.fence);
      let reran = false;
      const results = await second.runToolCalls([{ callId: "call_x", name: "slow" }], async () => {
        reran = true;
        return "again";
      });
      assert.equal(reran, false);
      assert.deepEqual(results, [{ callId: "call_x", outcome: { state: "unknown" }, reused: true }]);
      await second.release();
    });

    it("checks and repairs a transcript with a tool call left without its result", async () => {
      const broken = [
        { role: "user", content: "list files" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "call_9", type: "function", function: { name: "shell", arguments: "{}" } }],
        },
        { role: "user", content: "and?" },
      ];
      const report = await lh.checkTranscript(broken);
      assert.equal(report.healthy, false);
      assert.equal(report.format, "openai-chat");
      assert.equal(report.messages, 3);
      assert.ok(
        report.findings.some((f) => f.kind === "missing" && f.callId === "call_9"),
        JSON.stringify(report.findings),
      );
      const repaired = await lh.repairTranscript(broken);
      assert.equal(repaired.healthy, true);
      assert.ok(Array.isArray(repaired.transcript));
      assert.ok(repaired.actions.length > 0);
      const again = await lh.checkTranscript(repaired.transcript);
      assert.equal(again.healthy, true);
      // Text in, text out.
      const asText = await lh.repairTranscript(JSON.stringify(broken));
      assert.equal(typeof asText.transcript, "string");
    });
  });
}

// A server of protocol revision 1 (LEASEHOLD_PREV_BIN, e.g. the previous
// release's binary) takes the ledger only as unary calls: over "grpc" the
// client falls back to them. Skipped without such a binary.
describe("tool calls against a server older than the ledger on the stream", { skip: (process.env.LEASEHOLD_PREV_BIN ?? "") === "" }, () => {
  it("falls back to unary BeginToolCalls and SettleToolCall", async () => {
    const metricsAt = `127.0.0.1:${await freePort()}`;
    const old = await startServer(undefined, "127.0.0.1:0", ["--metrics-listen", metricsAt], undefined, process.env.LEASEHOLD_PREV_BIN);
    const client = createClient({ baseUrl: old.baseUrl, transport: "grpc", owner: "agent" });
    try {
      assert.equal((await client.serverInfo()).protocol, 1, "LEASEHOLD_PREV_BIN speaks revision 1");
      await client.withLease("session:old", { ttlMs: 5_000 }, async (lease) => {
        const results = await lease.runToolCalls([{ callId: "a", name: "t" }], async () => "out");
        assert.equal(results[0]?.outcome.state, "succeeded");
        const again = await lease.runToolCalls([{ callId: "a", name: "t" }], async () => assert.fail("ran twice"));
        assert.equal(again[0]?.outcome.state, "succeeded");
      });
      assert.equal(await answered(metricsAt, "BeginToolCalls"), 2);
      assert.equal(await answered(metricsAt, "SettleToolCall"), 1);
    } finally {
      client.close();
      await old.close();
    }
  });
});
