"""The two-graph regression in Python: two worker processes drive one
session of a small agent whose provider refuses an unmatched tool call."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_agent
import pytest
from conftest import Server, wait_until

import leasehold

CTX = multiprocessing.get_context("spawn")


class Graphs:
    """Starts graph processes and collects how each ended."""

    def __init__(self, db: Path) -> None:
        self.db = str(db)
        self.results: Any = CTX.Queue()
        self.processes: list[Any] = []
        self.events: list[Any] = []

    def start(self, gated: Any = None, **spec: Any) -> tuple[Any, Any]:
        in_tool = CTX.Event()
        spec.setdefault("tool_seconds", 0.1)
        process = CTX.Process(
            target=fake_agent.run_graph,
            args=({"db": self.db, **spec}, in_tool, gated, self.results),
            daemon=True,
        )
        process.start()
        self.processes.append(process)
        # Keep the event alive: a spawned child unpickles it after start().
        self.events.append(in_tool)
        return process, in_tool

    def outcomes(self, count: int) -> dict[str, tuple[str, Any]]:
        got = {}
        for _ in range(count):
            graph, status, detail = self.results.get(timeout=30)
            got[graph] = (status, detail)
        return got

    def stop(self) -> None:
        for process in self.processes:
            if process.is_alive() and process.pid:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.join(timeout=5)

    def items(self) -> list[dict[str, Any]]:
        conn = fake_agent.open_store(self.db)
        try:
            return fake_agent.history(conn)
        finally:
            conn.close()

    def provider_errors(self) -> list[str]:
        conn = fake_agent.open_store(self.db)
        try:
            return [r[0] for r in conn.execute("SELECT error FROM provider_log WHERE error != ''")]
        finally:
            conn.close()

    def effects(self) -> list[tuple[str, str]]:
        conn = fake_agent.open_store(self.db)
        try:
            return [(r[0], r[1]) for r in conn.execute("SELECT graph, call_id FROM effects")]
        finally:
            conn.close()


@pytest.fixture
def graphs(tmp_path: Path) -> Iterator[Graphs]:
    g = Graphs(tmp_path / "sessions.db")
    fake_agent.open_store(g.db).close()
    try:
        yield g
    finally:
        g.stop()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def test_without_leases_the_provider_sees_an_unmatched_call(graphs: Graphs, server: Server) -> None:
    """Unguarded, graph B builds its request from history holding A's running
    call and the provider refuses it; the transcript ends up interleaved."""
    _, a_in_tool = graphs.start(graph="A", tool_seconds=1.0)
    assert a_in_tool.wait(30)
    graphs.start(graph="B")
    ended = graphs.outcomes(2)
    assert ended["B"] == ("rejected", "No tool output found for function call call_A.")
    assert ended["A"][0] == "ok"
    assert graphs.provider_errors() == ["No tool output found for function call call_A."]
    report = leasehold.Client(server.address).check_transcript(graphs.items())
    assert not report.healthy


def test_with_leases_the_second_graph_waits_its_turn(graphs: Graphs, server: Server) -> None:
    """Guarded, B queues for the session while A's tool runs and continues
    from the whole history: the provider never sees an unmatched call."""
    _, a_in_tool = graphs.start(graph="A", address=server.address, ttl=2.0, tool_seconds=1.0)
    assert a_in_tool.wait(30)
    graphs.start(graph="B", address=server.address, ttl=2.0, wait=20.0)
    ended = graphs.outcomes(2)
    assert ended["A"][0] == "ok" and ended["B"][0] == "ok", ended
    assert ended["B"][1]["fence"] > ended["A"][1]["fence"]
    assert ended["B"][1]["previous_end"] == "released"
    assert graphs.provider_errors() == []
    items = graphs.items()
    # A's whole turn, then B's.
    assert [i.get("call_id") or i.get("role") for i in items] == [
        "user",
        "call_A",
        "call_A",
        "assistant",
        "user",
        "call_B",
        "call_B",
        "assistant",
    ]
    assert leasehold.Client(server.address).check_transcript(items).healthy


def test_a_holder_paused_past_its_ttl_is_refused_by_the_storage_fence(
    graphs: Graphs, server: Server
) -> None:
    """A passes its gate, then stalls past its TTL before its terminal write.
    B takes the session over (recovering A's call from the ledger without
    running it again) and finishes; when A resumes, its write is refused by
    the storage fence, and the provider never saw an unmatched call."""
    gated = CTX.Event()
    a, _ = graphs.start(gated=gated, graph="A", address=server.address, ttl=0.5, tool_seconds=0.2)
    assert gated.wait(30), "A never reached its terminal write"
    assert a.pid is not None
    assert wait_until(lambda: _stopped(a.pid), 10)
    graphs.start(graph="B", address=server.address, ttl=2.0, wait=20.0)
    status, b = graphs.outcomes(1)["B"]
    assert status == "ok", b
    assert b["recovered"] and b["previous_end"] == "expired"
    assert b["recovered_calls"] == [("call_A", "succeeded", True)]
    os.kill(a.pid, signal.SIGCONT)
    status, refused = graphs.outcomes(1)["A"]
    assert status == "stale", refused
    assert refused["highest"] == b["fence"] > refused["fence"]
    assert graphs.provider_errors() == []
    assert graphs.effects() == [("A", "call_A"), ("B", "call_B")]
    items = graphs.items()
    outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
    assert outputs == ["call_A", "call_B"]
    assert leasehold.Client(server.address).check_transcript(items).healthy
