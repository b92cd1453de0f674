"""What leasehold's framework adapters add to a run, against the same run
without them, in one process and one run of this script (never pass/fail):

    LEASEHOLD_BIN=target/release/leasehold clients/python/.venv/bin/python bench/adapters.py [runs]

LangGraph: the test agent (model -> tools -> model: three super-steps, a
checkpoint each) on SqliteSaver in a temporary file, plain and through
``own()`` with the ledgered ToolNode. OpenAI Agents SDK: one turn (a tool
call and an answer) on SQLiteSession, ``Runner.run`` and ``leasehold.agents.run``.
Each run is a new thread / session, so every owned run acquires, claims,
registers and settles one tool call, and releases. Prints p50 and p90 per
run and per super-step, and the added time. Alternates plain and owned runs
so that drift on a busy machine hits both alike.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients" / "python" / "tests"))

import agents_fake
import leasehold
import lg_agent
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.memory import SQLiteSession
from conftest import Server
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import ToolNode as PlainToolNode
from leasehold import agents as owned_agents
from leasehold.langgraph import ToolNode, own


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9)]


def report(name: str, plain: list[float], owned: list[float]) -> None:
    p50, p90 = quantiles(plain)
    o50, o90 = quantiles(owned)
    print(
        f"{name}: plain p50 {p50 * 1e3:.2f} ms p90 {p90 * 1e3:.2f} ms; "
        f"owned p50 {o50 * 1e3:.2f} ms p90 {o90 * 1e3:.2f} ms; "
        f"added p50 {(o50 - p50) * 1e3:.2f} ms per turn"
    )


def langgraph(address: str, tmp: Path, runs: int) -> None:
    """Three variants, each at 1 and at 9 tool rounds per run (3 and 19
    super-steps): what a run costs once (acquire, claim, release) and what
    each further super-step adds (the slope between the two)."""
    tools = lg_agent.Tools()
    conn = sqlite3.connect(tmp / "cp.db", check_same_thread=False)
    client = leasehold.Client(address)
    graphs = {}
    for rounds in (1, 9):
        model = lg_agent.ProviderModel(rounds=rounds)
        saver = SqliteSaver(conn)
        plain = lg_agent.build(model, PlainToolNode(tools.all))
        ledger = lg_agent.build(model, ToolNode(tools.all))
        graphs[("plain", rounds)] = plain.compile(checkpointer=saver)
        # own() runs with durability="sync": the same without leasehold.
        graphs[("plain-sync", rounds)] = plain.compile(checkpointer=saver).with_config(
            configurable={"__pregel_durability": "sync"}
        )
        graphs[("owned", rounds)] = own(plain.compile(checkpointer=saver), client)
        graphs[("owned+ledger", rounds)] = own(
            ledger.compile(checkpointer=saver), client
        )
    times: dict[tuple[str, int], list[float]] = {k: [] for k in graphs}
    for i in range(runs + 10):
        for (name, rounds), g in graphs.items():
            config = {"configurable": {"thread_id": f"{name}-{rounds}-{i}"}}
            start = time.perf_counter()
            g.invoke({"messages": [("user", "ls")]}, config)
            if i >= 10:  # warm-up
                times[(name, rounds)].append(time.perf_counter() - start)
    p50 = {k: statistics.median(v) for k, v in times.items()}
    steps = 2 * 9 + 1 - (2 * 1 + 1)
    slope = {name: (p50[(name, 9)] - p50[(name, 1)]) / steps for name, _ in graphs}
    print("LangGraph (SqliteSaver), p50 per run:")
    for (name, rounds), v in p50.items():
        print(f"  {name:13} {2 * rounds + 1:2} super-steps: {v * 1e3:7.2f} ms")
    for name in ("plain-sync", "owned", "owned+ledger"):
        base = "plain" if name == "plain-sync" else "plain-sync"
        print(
            f"  {name} against {base}: added per run (3 steps) "
            f"{(p50[(name, 1)] - p50[(base, 1)]) * 1e3:.2f} ms; added per further "
            f"super-step {(slope[name] - slope[base]) * 1e3:.2f} ms"
        )
    client.close()


async def agents_sdk(address: str, tmp: Path, runs: int) -> None:
    set_tracing_disabled(True)

    @function_tool
    async def shell(cmd: str) -> str:
        """Runs a command."""
        return f"ran {cmd}"

    model = agents_fake.FakeModel()
    plain = Agent(name="a", instructions="x", model=model, tools=[shell])
    ledgered = Agent(
        name="a", instructions="x", model=model, tools=[owned_agents.ledgered(shell)]
    )
    times: dict[str, list[float]] = {"plain": [], "owned": []}
    async with leasehold.AsyncClient(address) as client:
        for i in range(runs + 10):
            for name in ("plain", "owned"):
                session = SQLiteSession(f"{name}-{i}", tmp / "sessions.db")
                start = time.perf_counter()
                if name == "plain":
                    await Runner.run(plain, "ls", session=session)
                else:
                    await owned_agents.run(client, ledgered, "ls", session=session)
                if i >= 10:
                    times[name].append(time.perf_counter() - start)
    report(
        "Agents SDK (SQLiteSession), one turn per run", times["plain"], times["owned"]
    )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # LEASEHOLD_BENCH_SYNC=normal: the server's --sync normal.
        sync = os.environ.get("LEASEHOLD_BENCH_SYNC", "full")
        server = Server(tmp / "leasehold.db", extra=("--sync", sync))
        try:
            langgraph(server.address, tmp, runs)
            asyncio.run(agents_sdk(server.address, tmp, runs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
