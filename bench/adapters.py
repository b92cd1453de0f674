"""What leasehold's framework adapters add to a run, against the same run
without them, in one process and one run of this script (never pass/fail):

    cargo build --release -p leasehold-server
    LEASEHOLD_BIN=target/release/leasehold clients/python/.venv/bin/python bench/adapters.py [runs]

LangGraph: the test agent (model -> tools -> model: three super-steps, a
checkpoint each) on SqliteSaver in a temporary file, plain and through
``own()`` with the ledgered ToolNode, at 1 and at 9 tool rounds per run (3
and 19 super-steps): the run's fixed cost, and what each further super-step
adds (the slope between the two). OpenAI Agents SDK: one turn (a tool call
and an answer, two model calls) on SQLiteSession, ``Runner.run`` and
``leasehold.agents.run``. Google ADK: the same turn in a new session on
SqliteSessionService, a plain and an ``own()``ed Runner. pydantic-ai: the
same turn as one load-run-save cycle of a new conversation, plain and
through ``leasehold.pydantic_ai.run`` with the ledgered toolset. Each run
is a new thread / session, so every owned run acquires, claims, registers
and settles its tool calls, and releases.
Plain and owned runs alternate so that drift on a busy machine hits both
alike. Prints p50 and p99 per run, the added time per run and per step,
the server round trips and commits per run (the server's own Prometheus
counters, read before and after a separate pass of runs), and the disk's
floor in the same directory: fdatasync of a file, and a SQLite WAL
``synchronous=FULL`` commit, against which the ledger's cost per call is set.

``LEASEHOLD_BENCH_PROFILE=1`` (needs ``pip install pyinstrument``, not a
test dependency) also profiles a pass of owned runs of each adapter.
``LEASEHOLD_BENCH_SYNC=normal`` runs the server with ``--sync normal``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients" / "python" / "tests"))

import agents_fake
import lg_agent
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.memory import SQLiteSession
from conftest import Server
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import ToolNode as PlainToolNode

import leasehold
from leasehold import agents as owned_agents
from leasehold._types import ToolCallRequest
from leasehold.langgraph import ToolNode, own

WARMUP = 10
#: Runs of each variant in the (untimed) pass that counts round trips.
COUNTED = 20


def p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if q == 50:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


# -- the disk's floor ----------------------------------------------------------
def disk_floor(directory: Path, n: int = 300) -> dict[str, list[float]]:
    """fdatasync of a 4 KiB write to a file, and one-row SQLite commits in
    WAL mode with synchronous=FULL (as the server's default store), both in
    ``directory`` (the server's database's directory)."""
    out: dict[str, list[float]] = {"fdatasync": [], "sqlite": []}
    path = directory / "floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
            start = time.perf_counter()
            os.fdatasync(fd)
            out["fdatasync"].append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    db = sqlite3.connect(directory / "floor.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
    for _ in range(n):
        start = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t (v) VALUES (?)", (os.urandom(200),))
        db.execute("COMMIT")
        out["sqlite"].append(time.perf_counter() - start)
    db.close()
    for leftover in directory.glob("floor.db*"):
        leftover.unlink()
    return out


# -- the server's counters -----------------------------------------------------
class Metrics:
    """The server's Prometheus counters: requests by RPC, and commits."""

    LINE = re.compile(r'^leasehold_request_seconds_count\{rpc="([^"]+)"\} (\d+)', re.MULTILINE)
    COMMITS = re.compile(r"^leasehold_commits_total (\d+)", re.MULTILINE)
    #: Seconds the server spent answering (arrival to answer, commits included).
    SERVER = re.compile(r'^leasehold_request_seconds_sum\{rpc="[^"]+"\} (\S+)', re.MULTILINE)
    COMMIT_SECONDS = re.compile(r"^leasehold_commit_seconds_sum (\S+)", re.MULTILINE)

    def __init__(self, address: str) -> None:
        self.url = f"http://{address}/metrics"

    def read(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url, timeout=5) as reply:
            text = reply.read().decode()
        counts = {rpc: int(n) for rpc, n in self.LINE.findall(text)}
        commits = self.COMMITS.search(text)
        counts["commits"] = int(commits.group(1)) if commits else 0
        # In microseconds, so that every value stays an int.
        counts["server_us"] = int(
            sum(float(x) for x in self.SERVER.findall(text)) * 1e6
        )
        commit_seconds = self.COMMIT_SECONDS.search(text)
        counts["commit_us"] = (
            int(float(commit_seconds.group(1)) * 1e6) if commit_seconds else 0
        )
        return counts

    def per_run(self, runs: int, do: Callable[[int], None]) -> str:
        before = self.read()
        for i in range(runs):
            do(i)
        after = self.read()
        diff = {k: (after.get(k, 0) - before.get(k, 0)) / runs for k in after}
        return self.describe(diff)

    @staticmethod
    def describe(diff: dict[str, float]) -> str:
        commits = diff.pop("commits")
        server, commit = diff.pop("server_us") / 1e6, diff.pop("commit_us") / 1e6
        calls = {k: v for k, v in diff.items() if v}
        trips = sum(calls.values())
        shown = ", ".join(f"{k} {v:g}" for k, v in sorted(calls.items()))
        return (
            f"{trips:g} round trips ({shown or 'none'}), {commits:g} commits; "
            f"in the server {ms(server)} (commits {ms(commit)})"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profiled(name: str, do: Callable[[], None]) -> None:
    if os.environ.get("LEASEHOLD_BENCH_PROFILE") != "1":
        return
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("  (pyinstrument is not installed: no profile)")
        return
    profiler = Profiler(interval=0.0002)
    profiler.start()
    do()
    profiler.stop()
    print(f"--- profile: {name}")
    print(profiler.output_text(unicode=False, color=False, show_all=False))


# -- LangGraph -----------------------------------------------------------------
def langgraph(address: str, metrics: Metrics, tmp: Path, runs: int) -> None:
    """Four variants, each at 1 and at 9 tool rounds per run (3 and 19
    super-steps)."""
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

    def invoke(name: str, rounds: int, thread: str) -> None:
        graphs[(name, rounds)].invoke(
            {"messages": [("user", "ls")]}, {"configurable": {"thread_id": thread}}
        )

    times: dict[tuple[str, int], list[float]] = {k: [] for k in graphs}
    # CPU time of this process (all its threads): less disturbed by a
    # loaded machine than wall time.
    cpu: dict[tuple[str, int], float] = dict.fromkeys(graphs, 0.0)
    for i in range(runs + WARMUP):
        for name, rounds in graphs:
            used = time.process_time()
            start = time.perf_counter()
            invoke(name, rounds, f"{name}-{rounds}-{i}")
            if i >= WARMUP:
                times[(name, rounds)].append(time.perf_counter() - start)
                cpu[(name, rounds)] += time.process_time() - used
    print("LangGraph (SqliteSaver), per run:")
    for (name, rounds), v in times.items():
        print(
            f"  {name:13} {2 * rounds + 1:2} super-steps: p50 {ms(p(v, 50)):>9} "
            f"p99 {ms(p(v, 99)):>9}; CPU {ms(cpu[(name, rounds)] / runs):>9}"
        )
    steps = (2 * 9 + 1) - (2 * 1 + 1)
    for name, base in (("owned", "plain-sync"), ("owned+ledger", "plain-sync")):
        for q in (50, 99):
            run = p(times[(name, 1)], q) - p(times[(base, 1)], q)
            per_step = (
                (p(times[(name, 9)], q) - p(times[(name, 1)], q))
                - (p(times[(base, 9)], q) - p(times[(base, 1)], q))
            ) / steps
            print(
                f"  {name} against {base}, p{q}: added per run (3 steps) {ms(run)}; "
                f"added per further super-step {ms(per_step)}"
            )
    # Each further round is two super-steps and one ledgered tool call.
    for q in (50, 99):
        per_call = (
            (p(times[("owned+ledger", 9)], q) - p(times[("owned+ledger", 1)], q))
            - (p(times[("owned", 9)], q) - p(times[("owned", 1)], q))
        ) / 8
        print(f"  the ledger, p{q}: added per tool call {ms(per_call)}")
    print("  server round trips and commits per run (a pass of its own):")
    for name in ("owned", "owned+ledger"):
        for rounds in (1, 9):
            counts = metrics.per_run(
                COUNTED, lambda i, n=name, r=rounds: invoke(n, r, f"count-{n}-{r}-{i}")
            )
            print(f"    {name:13} {2 * rounds + 1:2} super-steps: {counts}")
    profiled(
        "LangGraph own() + ledgered ToolNode, 9 rounds, 20 runs",
        lambda: [invoke("owned+ledger", 9, f"prof-{i}") for i in range(20)],
    )
    client.close()


# -- the ledger alone ----------------------------------------------------------
def ledger(address: str, metrics: Metrics, runs: int) -> list[float]:
    """One call's Begin and Settle on a held lease, back to back (what a
    ledgered tool adds around the tool itself)."""
    samples: list[float] = []
    with (
        leasehold.Client(address) as client,
        client.acquire("ledger-bench", ttl=30) as lease,
    ):

        def one(i: int) -> None:
            call = ToolCallRequest(call_id=f"c{i}", name="shell", input_digest="")
            start = time.perf_counter()
            lease.begin_tool_calls([call])
            lease.settle_tool_call(call.call_id, "succeeded", b"ok")
            if i >= WARMUP:
                samples.append(time.perf_counter() - start)

        for i in range(WARMUP):
            one(i)
        # Counted around the timed calls themselves: the server's commit
        # time here is the durable writes of these very calls.
        before = metrics.read()
        for i in range(WARMUP, WARMUP + runs):
            one(i)
        after = metrics.read()
    diff = {k: (after.get(k, 0) - before.get(k, 0)) / runs for k in after}
    commit = diff["commit_us"] / 1e6
    print(
        f"Ledger, one call's Begin + Settle on a held lease: p50 {ms(p(samples, 50))} "
        f"p99 {ms(p(samples, 99))}; {Metrics.describe(diff)}; beyond the server's "
        f"commits (their mean) p50 {ms(p(samples, 50) - commit)}"
    )
    return samples


# -- OpenAI Agents SDK ---------------------------------------------------------
async def agents_sdk(address: str, metrics: Metrics, tmp: Path, runs: int) -> None:
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
    async with leasehold.AsyncClient(address) as client:

        async def plain_run(sid: str) -> None:
            await Runner.run(plain, "ls", session=SQLiteSession(sid, tmp / "sessions.db"))

        async def owned_run(sid: str) -> None:
            session = SQLiteSession(sid, tmp / "sessions.db")
            await owned_agents.run(client, ledgered, "ls", session=session)

        await alternate(
            "Agents SDK (SQLiteSession), one turn (two model calls, one tool call) per run:",
            runs,
            metrics,
            2,
            plain_run,
            owned_run,
        )
        if os.environ.get("LEASEHOLD_BENCH_PROFILE") == "1":
            try:
                from pyinstrument import Profiler

                profiler = Profiler(interval=0.0002, async_mode="enabled")
                profiler.start()
                for i in range(40):
                    await owned_run(f"prof-{i}")
                profiler.stop()
                print("--- profile: Agents SDK owned runs, 40 runs")
                print(profiler.output_text(unicode=False, color=False))
            except ImportError:
                print("  (pyinstrument is not installed: no profile)")


async def alternate(
    title: str,
    runs: int,
    metrics: Metrics,
    steps: int,
    plain: Callable[[str], Any],
    owned: Callable[[str], Any],
) -> None:
    """Alternates ``plain(run_id)`` and ``owned(run_id)`` (coroutine
    functions), prints p50/p99 per run and per step, CPU per run, and the
    server's round trips and commits per owned run (a pass of its own)."""
    times: dict[str, list[float]] = {"plain": [], "owned": []}
    cpu = {"plain": 0.0, "owned": 0.0}
    fns = {"plain": plain, "owned": owned}
    for i in range(runs + WARMUP):
        for name in ("plain", "owned"):
            used = time.process_time()
            start = time.perf_counter()
            await fns[name](f"{name}-{i}")
            if i >= WARMUP:
                times[name].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - used
    before = await asyncio.to_thread(metrics.read)
    for i in range(COUNTED):
        await owned(f"count-{i}")
    after = await asyncio.to_thread(metrics.read)
    print(title)
    for q in (50, 99):
        added = p(times["owned"], q) - p(times["plain"], q)
        print(
            f"  p{q}: plain {ms(p(times['plain'], q))}, owned {ms(p(times['owned'], q))}, "
            f"added per run {ms(added)}, per step ({steps}) {ms(added / steps)}"
        )
    print(
        f"  CPU per run (this process): plain {ms(cpu['plain'] / runs)}, "
        f"owned {ms(cpu['owned'] / runs)}"
    )
    diff = {k: (after.get(k, 0) - before.get(k, 0)) / COUNTED for k in after}
    print(f"  server per owned run: {Metrics.describe(diff)}")


async def adk(address: str, metrics: Metrics, tmp: Path, runs: int) -> None:
    """Google ADK: a Runner on SqliteSessionService, one turn (two model
    calls, one tool call) in a new session per run, plain and ``own()``ed
    (the session claimed and its appends fenced, the tool ledgered)."""
    import adk_fake
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner as AdkRunner
    from google.adk.sessions.sqlite_session_service import SqliteSessionService
    from google.genai import types

    from leasehold.adk import own as own_adk

    # The fake model reports no token usage, which ADK warns of per call.
    logging.getLogger("google_adk").setLevel(logging.ERROR)

    async def shell(cmd: str) -> dict[str, str]:
        """Runs a shell command."""
        return {"out": f"ran {cmd}"}

    def runner(db: str) -> AdkRunner:
        agent = LlmAgent(
            name="agent", model=adk_fake.FakeLlm(), instruction="help", tools=[shell]
        )
        return AdkRunner(
            agent=agent, app_name="app", session_service=SqliteSessionService(str(tmp / db))
        )

    message = types.Content(role="user", parts=[types.Part(text="ls")])
    async with leasehold.AsyncClient(address) as client:
        plain, owned = runner("adk-plain.db"), own_adk(runner("adk-owned.db"), client)

        def turn(r: AdkRunner) -> Callable[[str], Any]:
            async def one(sid: str) -> None:
                await r.session_service.create_session(app_name="app", user_id="u", session_id=sid)
                async for _ in r.run_async(user_id="u", session_id=sid, new_message=message):
                    pass

            return one

        await alternate(
            "Google ADK (SqliteSessionService), a new session, one turn (two model calls, "
            "one tool call) per run:",
            runs,
            metrics,
            2,
            turn(plain),
            turn(owned),
        )


async def pydantic_ai(address: str, metrics: Metrics, runs: int) -> None:
    """pydantic-ai: an Agent on a FunctionModel, one load-run-save cycle of a
    new conversation (two model calls, one tool call) per run, plain and
    through ``leasehold.pydantic_ai.run`` with the ledgered toolset."""
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.conversation_store import InMemoryConversationStore
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from leasehold import pydantic_ai as owned_pai

    calls = iter(range(1, 1 << 30))

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"done: {last.content}")])
        name = info.function_tools[0].name
        return ModelResponse(
            parts=[ToolCallPart(name, {"cmd": "ls"}, tool_call_id=f"call_{next(calls)}")]
        )

    async def shell(cmd: str) -> str:
        """Runs a shell command."""
        return f"ran {cmd}"

    toolset: Any = FunctionToolset([shell])
    plain_agent: Any = PydanticAgent(FunctionModel(respond), toolsets=[toolset])
    owned_agent: Any = PydanticAgent(
        FunctionModel(respond), toolsets=[owned_pai.ledgered(FunctionToolset([shell]))]
    )
    store = InMemoryConversationStore()
    async with leasehold.AsyncClient(address) as client:

        async def plain(cid: str) -> None:
            conversation = await store.load(cid) or Conversation(conversation_id=cid)
            result = await plain_agent.run("ls", conversation=conversation)
            await store.save(result)

        async def owned(cid: str) -> None:
            await owned_pai.run(client, owned_agent, "ls", conversation_id=cid, store=store)

        await alternate(
            "pydantic-ai (InMemoryConversationStore), a new conversation, one turn (two "
            "model calls, one tool call) per run:",
            runs,
            metrics,
            2,
            plain,
            owned,
        )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {runs} runs")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        floor = disk_floor(tmp)
        # LEASEHOLD_BENCH_SYNC=normal: the server's --sync normal.
        sync = os.environ.get("LEASEHOLD_BENCH_SYNC", "full")
        metrics_at = f"127.0.0.1:{free_port()}"
        server = Server(
            tmp / "leasehold.db", extra=("--sync", sync, "--metrics-listen", metrics_at)
        )
        metrics = Metrics(metrics_at)
        try:
            langgraph(server.address, metrics, tmp, runs)
            calls = ledger(server.address, metrics, runs)
            asyncio.run(agents_sdk(server.address, metrics, tmp, runs))
            asyncio.run(adk(server.address, metrics, tmp, runs))
            asyncio.run(pydantic_ai(server.address, metrics, runs))
        finally:
            server.stop()
        # Again at the end: a disk busy with others' work changes in minutes.
        after = disk_floor(tmp)
    print(
        f"Disk floor in the server's directory (server --sync {sync}), before / after:"
    )
    for name, what in (
        ("fdatasync", "fdatasync, 4 KiB"),
        ("sqlite", "SQLite WAL FULL commit"),
    ):
        print(
            f"  {what}: p50 {ms(p(floor[name], 50))} / {ms(p(after[name], 50))}, "
            f"p99 {ms(p(floor[name], 99))} / {ms(p(after[name], 99))}"
        )
    commit = min(p(floor["sqlite"], 50), p(after["sqlite"], 50))
    print(
        f"  the ledger's call (two commits: Begin, Settle) beyond two commits of the floor: "
        f"p50 {ms(p(calls, 50) - 2 * commit)}"
    )
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
