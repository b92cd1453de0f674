"""leasehold.agents against the real OpenAI Agents SDK (fake model): two
runs of one session interleave its history without it (openai-agents #1061,
google-adk #4751's shape), and with it one run owns the session, a stale
owner's write is refused by SQLite itself, and a tool call id never runs
twice."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import agents_fake
import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.exceptions import UserError
from agents.memory import SessionABC, SQLiteSession
from conftest import Server, checks_answered, metrics_address

import leasehold
from leasehold import agents as owned
from leasehold.fence import FenceTimeout, StaleFence

set_tracing_disabled(True)


class Tools:
    def __init__(self) -> None:
        self.effects: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

        @function_tool
        async def shell(cmd: str) -> str:
            """Runs a shell command."""
            self.entered.set()
            await self.gate.wait()
            self.effects.append(cmd)
            return f"ran {cmd}"

        self.shell = shell


def _agent(tools: Tools, ids: list[str] | None = None, ledger: bool = True) -> Agent[Any]:
    model = agents_fake.FakeModel(ids=iter(ids) if ids is not None else None)
    tool = owned.ledgered(tools.shell) if ledger else tools.shell
    return Agent(name="agent", instructions="help", model=model, tools=[tool])


def _shape(items: list[Any]) -> list[str]:
    out = []
    for item in items:
        if item.get("role") == "user":
            out.append(f"user:{item['content']}")
        elif item.get("type") in ("function_call", "function_call_output"):
            out.append(f"{item['type']}:{item['call_id']}")
        else:
            out.append("assistant")
    return out


def _turn(cmd: str, call_id: str) -> list[str]:
    return [
        f"user:{cmd}",
        f"function_call:{call_id}",
        f"function_call_output:{call_id}",
        "assistant",
    ]


async def test_without_leasehold_two_runs_interleave_one_session(tmp_path: Path) -> None:
    db = tmp_path / "conversations.db"
    tools = Tools()
    tools.gate.clear()
    a = asyncio.ensure_future(
        Runner.run(_agent(tools, ledger=False), "ls", session=SQLiteSession("s1", db))
    )
    await asyncio.wait_for(tools.entered.wait(), 10)
    b = asyncio.ensure_future(
        Runner.run(_agent(tools, ["call_b"], False), "cat", session=SQLiteSession("s1", db))
    )
    await asyncio.sleep(0.2)
    tools.gate.set()
    await a
    await b
    shape = _shape(await SQLiteSession("s1", db).get_items())
    whole = [
        _turn("ls", "call_1") + _turn("cat", "call_b"),
        _turn("cat", "call_b") + _turn("ls", "call_1"),
    ]
    assert shape not in whole, shape
    assert shape[:2] == ["user:ls", "user:cat"], shape


async def test_one_run_owns_the_session_and_a_second_waits_or_is_busy(
    server: Server, tmp_path: Path
) -> None:
    db = tmp_path / "conversations.db"
    tools = Tools()
    async with (
        leasehold.AsyncClient(server.address, owner="a") as ca,
        leasehold.AsyncClient(server.address, owner="b") as cb,
    ):
        tools.gate.clear()
        agent_a = _agent(tools)
        a = asyncio.ensure_future(owned.run(ca, agent_a, "ls", session=SQLiteSession("s1", db)))
        await asyncio.wait_for(tools.entered.wait(), 10)
        busy_agent = _agent(tools, ["call_x"])
        with pytest.raises(leasehold.Busy) as busy:
            await owned.run(cb, busy_agent, "rm", session=SQLiteSession("s1", db))
        assert busy.value.holder == "a"
        assert busy_agent.model.requests == []  # type: ignore[union-attr]
        agent_b = _agent(tools, ["call_b"])
        b = asyncio.ensure_future(
            owned.run(cb, agent_b, "cat", session=SQLiteSession("s1", db), wait=20.0)
        )
        await asyncio.sleep(0.2)
        assert agent_b.model.requests == []  # type: ignore[union-attr]
        tools.gate.set()
        assert (await a).final_output == "done: ran ls"
        assert (await b).final_output == "done: ran cat"
        shape = _shape(await SQLiteSession("s1", db).get_items())
        assert shape == _turn("ls", "call_1") + _turn("cat", "call_b")
        for request in agent_a.model.requests + agent_b.model.requests:  # type: ignore[union-attr]
            agents_fake.check_pairing(request)
        assert tools.effects == ["ls", "cat"]
        state = await ca.get("agents:s1")
        assert state.lease is None and state.last_ended is not None
        assert (state.last_ended.owner, state.last_ended.end) == ("b", "released")


async def test_sqlite_refuses_a_stale_owners_write_in_its_transaction(
    server: Server, tmp_path: Path
) -> None:
    db = tmp_path / "conversations.db"
    tools = Tools()
    async with leasehold.AsyncClient(server.address) as client:
        async with owned.owned(SQLiteSession("s1", db), client) as first:
            assert first.fenced_in_transaction
        await owned.run(client, _agent(tools), "ls", session=SQLiteSession("s1", db))  # fence 2
        before = await SQLiteSession("s1", db).get_items()
        # The first owner's write arriving late, having passed its checks.
        with pytest.raises(StaleFence) as stale:
            await first.inner.add_items([{"role": "user", "content": "late"}])
        assert (stale.value.fence, stale.value.highest) == (1, 2)
        with pytest.raises(StaleFence):
            await first.inner.clear_session()
        assert await SQLiteSession("s1", db).get_items() == before
        # And through the owned session, the local check refuses first.
        with pytest.raises(leasehold.LeaseLost):
            await first.add_items([{"role": "user", "content": "late"}])


async def test_a_writer_holding_the_sessions_lock_is_a_fence_timeout(
    server: Server, tmp_path: Path
) -> None:
    """An earlier owner paused inside its write holds SQLite's write lock:
    the next owner's claim fails after the busy timeout with the library's
    FenceTimeout, not sqlite3's 'database is locked'."""
    db = tmp_path / "conversations.db"
    await SQLiteSession("s1", db).get_items()  # creates the tables
    paused = sqlite3.connect(db)
    paused.execute("BEGIN IMMEDIATE")
    try:
        async with leasehold.AsyncClient(server.address) as client:
            with pytest.raises(FenceTimeout) as caught:
                async with owned.owned(SQLiteSession("s1", db), client):
                    pass
            assert caught.value.reason == "busy"
    finally:
        paused.rollback()
        paused.close()


async def test_a_tool_call_id_seen_before_never_runs_again(server: Server, tmp_path: Path) -> None:
    db = tmp_path / "conversations.db"
    tools = Tools()
    async with leasehold.AsyncClient(server.address) as client:
        agent = _agent(tools, ["call_1", "call_1"])
        await owned.run(client, agent, "rm -rf build", session=SQLiteSession("s1", db))
        second = await owned.run(client, agent, "rm -rf build", session=SQLiteSession("s1", db))
        assert tools.effects == ["rm -rf build"]
        assert second.final_output == "done: ran rm -rf build"


async def test_a_run_that_raises_leaves_the_session_recoverable(
    server: Server, tmp_path: Path
) -> None:
    db = tmp_path / "conversations.db"
    failing = Agent(name="agent", instructions="help", model=agents_fake.FakeModel(fail=True))
    async with leasehold.AsyncClient(server.address) as client:
        with pytest.raises(agents_fake.ProviderError):
            await owned.run(client, failing, "ls", session=SQLiteSession("s1", db))
        state = await client.get("agents:s1")
        assert state.recoverable and state.last_ended is not None
        assert state.last_ended.end == "suspended"


class MemorySession(SessionABC):
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.items: list[Any] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return list(self.items)

    async def add_items(self, items: list[Any]) -> None:
        self.items.extend(items)

    async def pop_item(self) -> Any:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items.clear()


async def test_any_other_session_is_gated(server: Server) -> None:
    session = MemorySession("m1")
    async with leasehold.AsyncClient(server.address) as client:
        result = await owned.run(client, _agent(Tools()), "ls", session=session)
        assert result.final_output == "done: ran ls"
        assert _shape(session.items) == _turn("ls", "call_1")
        async with owned.owned(session, client) as mine:
            assert not mine.fenced_in_transaction
            await mine.run.lease.release()  # type: ignore[misc]
            with pytest.raises(leasehold.LeaseLost):
                await mine.add_items([{"role": "user", "content": "late"}])
        assert len(session.items) == 4


async def test_model_calls_of_a_fenced_session_ask_the_server_nothing(tmp_path: Path) -> None:
    """With a SQLiteSession (fenced in its writes' transaction) a fresh
    lease passes each model call's gate locally: no Check reaches the
    server; with any other session every model call is checked there."""
    metrics_at = metrics_address()
    server = Server(tmp_path / "leasehold.db", extra=("--metrics-listen", metrics_at))
    try:
        async with leasehold.AsyncClient(server.address) as client:
            fenced = SQLiteSession("s1", tmp_path / "c.db")
            before = checks_answered(metrics_at)
            result = await owned.run(client, _agent(Tools()), "ls", session=fenced)
            assert result.final_output == "done: ran ls"
            assert checks_answered(metrics_at) == before
            other = MemorySession("m1")
            await owned.run(client, _agent(Tools()), "ls", session=other)
            # Each model call and each session write asked the server.
            assert checks_answered(metrics_at) >= before + 2
    finally:
        server.stop()


async def test_a_ledgered_tool_outside_an_owned_run_is_refused(tmp_path: Path) -> None:
    tools = Tools()
    # The SDK wraps a tool's exception in a UserError naming the tool.
    with pytest.raises(UserError, match="ledgered but ran outside") as refused:
        await Runner.run(_agent(tools), "ls", session=SQLiteSession("s1", tmp_path / "c.db"))
    assert isinstance(refused.value.__cause__, owned.NotOwned)
    assert tools.effects == []
