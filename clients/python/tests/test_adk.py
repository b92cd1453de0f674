"""leasehold.adk against the real Google ADK (fake model): a reused call id
runs its tool twice and a concurrent second run fails only once it writes,
without it; with it one run owns the session, the second is refused before
it reads, a stale owner's append is refused by SQLite in its transaction,
and a call id never runs twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import adk_fake
import pytest
from conftest import Server, checks_answered, metrics_address
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.events import Event
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

import leasehold
from leasehold.adk import _SCOPE as SCOPE
from leasehold.adk import NotOwned, own
from leasehold.fence import StaleFence

IDS = {"app_name": "app", "user_id": "u", "session_id": "s1"}


class Tools:
    def __init__(self) -> None:
        self.effects: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def shell(self, cmd: str) -> dict[str, str]:
        """Runs a shell command."""
        self.entered.set()
        await self.gate.wait()
        self.effects.append(cmd)
        return {"out": f"ran {cmd}"}


def _runner(db: Path, tools: Tools, ids: list[str] | None = None) -> Runner:
    model = adk_fake.FakeLlm(ids=ids)
    agent = LlmAgent(name="agent", model=model, instruction="help", tools=[tools.shell])
    return Runner(agent=agent, app_name="app", session_service=SqliteSessionService(str(db)))


async def _run(runner: Runner, text: str) -> list[str]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    out = []
    async for event in runner.run_async(user_id="u", session_id="s1", new_message=message):
        for part in (event.content.parts or []) if event.content else []:
            if part.text:
                out.append(part.text)
    return out


def _model(runner: Runner) -> Any:
    return runner.agent.model  # type: ignore[union-attr]


async def _shape(db: Path) -> list[str]:
    session = await SqliteSessionService(str(db)).get_session(**IDS)
    assert session is not None
    shape = []
    for event in session.events:
        for part in event.content.parts or [] if event.content else []:
            if part.function_call is not None:
                shape.append(f"call:{part.function_call.id}")
            elif part.function_response is not None:
                shape.append(f"response:{part.function_response.id}")
            else:
                shape.append(f"{event.author}:{part.text}")
    return shape


async def test_without_leasehold_a_reused_call_id_runs_the_tool_twice(tmp_path: Path) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    runner = _runner(db, tools, ["call_1", "call_1"])
    await runner.session_service.create_session(**IDS)
    await _run(runner, "rm -rf build")
    await _run(runner, "rm -rf build")
    assert tools.effects == ["rm -rf build", "rm -rf build"]


async def test_without_leasehold_a_second_run_strands_the_first_runs_tool_call(
    tmp_path: Path,
) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    a, b = _runner(db, tools), _runner(db, tools, ["call_b"])
    await a.session_service.create_session(**IDS)
    tools.gate.clear()
    first = asyncio.ensure_future(_run(a, "ls"))
    await asyncio.wait_for(tools.entered.wait(), 10)
    second = asyncio.ensure_future(_run(b, "cat"))
    # B reads the session and asks its model while A's tool call is still
    # running: nothing stops a second run before it has begun its work.
    deadline = asyncio.get_running_loop().time() + 10
    while not _model(b).requests and not second.done():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    tools.gate.set()
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    # ADK's own staleness check (since 1.24's fix) refuses the *first* run's
    # append of its tool result: the tool ran, its result is lost, and the
    # session now holds a call with no response, which the provider refuses
    # on the next request.
    assert isinstance(outcomes[0], StaleSessionError), outcomes
    assert "ls" in tools.effects
    history = await _shape(db)
    assert "call:call_1" in history and "response:call_1" not in history, history
    session = await SqliteSessionService(str(db)).get_session(**IDS)
    assert session is not None
    with pytest.raises(adk_fake.ProviderError, match="function call call_1"):
        adk_fake.check_pairing([e.content for e in session.events if e.content])


async def test_one_run_owns_the_session_and_a_second_waits_or_is_busy(
    server: Server, tmp_path: Path
) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    async with (
        leasehold.AsyncClient(server.address, owner="a") as ca,
        leasehold.AsyncClient(server.address, owner="b") as cb,
    ):
        a = own(_runner(db, tools), ca)
        busy_runner = own(_runner(db, tools, ["call_x"]), cb)
        b = own(_runner(db, tools, ["call_b"]), cb, wait=20.0)
        await a.session_service.create_session(**IDS)
        tools.gate.clear()
        first = asyncio.ensure_future(_run(a, "ls"))
        await asyncio.wait_for(tools.entered.wait(), 10)
        with pytest.raises(leasehold.Busy) as busy:
            await _run(busy_runner, "rm")
        assert busy.value.holder == "a"
        assert _model(busy_runner).requests == []
        second = asyncio.ensure_future(_run(b, "cat"))
        await asyncio.sleep(0.2)
        assert _model(b).requests == []
        tools.gate.set()
        assert (await first)[-1] == "done: {'out': 'ran ls'}"
        assert (await second)[-1] == "done: {'out': 'ran cat'}"
        assert await _shape(db) == [
            "user:ls",
            "call:call_1",
            "response:call_1",
            "agent:done: {'out': 'ran ls'}",
            "user:cat",
            "call:call_b",
            "response:call_b",
            "agent:done: {'out': 'ran cat'}",
        ]
        for request in _model(a).requests + _model(b).requests:
            adk_fake.check_pairing(request)
        assert tools.effects == ["ls", "cat"]
        state = await ca.get("adk:app:u:s1")
        assert state.last_ended is not None and state.last_ended.owner == "b"


async def test_sqlite_refuses_a_stale_owners_append_in_its_transaction(
    server: Server, tmp_path: Path
) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    async with leasehold.AsyncClient(server.address) as client:
        runner = own(_runner(db, tools, ["call_1", "call_2"]), client)
        service = runner.session_service
        assert service.fenced_in_transaction  # type: ignore[attr-defined]
        await service.create_session(**IDS)
        await _run(runner, "ls")
        await _run(runner, "pwd")  # fence 2 on the session
        session = await service.get_session(**IDS)
        assert session is not None
        before = await _shape(db)
        late = Event(
            author="user", content=types.Content(role="user", parts=[types.Part(text="late")])
        )
        token = SCOPE.set(("adk:app:u:s1", 1))
        try:
            with pytest.raises(StaleFence) as stale:
                await service.inner.append_event(session, late)  # type: ignore[attr-defined]
        finally:
            SCOPE.reset(token)
        assert (stale.value.fence, stale.value.highest) == (1, 2)
        assert await _shape(db) == before
        # Outside any owned run, the wrapper refuses before the database.
        with pytest.raises(NotOwned):
            await service.append_event(session, late)
        assert await _shape(db) == before


async def test_a_tool_call_id_seen_before_never_runs_again(server: Server, tmp_path: Path) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    async with leasehold.AsyncClient(server.address) as client:
        runner = own(_runner(db, tools, ["call_1", "call_1"]), client)
        await runner.session_service.create_session(**IDS)
        await _run(runner, "rm -rf build")
        second = await _run(runner, "rm -rf build")
        assert tools.effects == ["rm -rf build"]
        assert second[-1] == "done: {'out': 'ran rm -rf build'}"


async def test_a_run_that_raises_leaves_the_session_recoverable(
    server: Server, tmp_path: Path
) -> None:
    db, tools = tmp_path / "sessions.db", Tools()
    async with leasehold.AsyncClient(server.address) as client:
        runner = own(_runner(db, tools), client)
        await runner.session_service.create_session(**IDS)
        _model(runner).ids = iter(())  # the model fails on its first call
        with pytest.raises(RuntimeError):
            await _run(runner, "ls")
        state = await client.get("adk:app:u:s1")
        assert state.recoverable and state.last_ended is not None
        assert state.last_ended.end == "suspended"


async def test_model_calls_of_a_fenced_session_ask_the_server_nothing(tmp_path: Path) -> None:
    """On SqliteSessionService (fenced in each append's transaction) a fresh
    lease passes each model call's gate locally: no Check reaches the
    server; with any other service every model call is checked there."""
    from google.adk.sessions import InMemorySessionService

    metrics_at = metrics_address()
    server = Server(tmp_path / "leasehold.db", extra=("--metrics-listen", metrics_at))
    try:
        async with leasehold.AsyncClient(server.address) as client:
            fenced = own(_runner(tmp_path / "sessions.db", Tools()), client)
            await fenced.session_service.create_session(**IDS)
            before = checks_answered(metrics_at)
            assert (await _run(fenced, "ls"))[-1] == "done: {'out': 'ran ls'}"
            assert checks_answered(metrics_at) == before
            agent = LlmAgent(
                name="agent", model=adk_fake.FakeLlm(), instruction="help", tools=[Tools().shell]
            )
            other = own(
                Runner(agent=agent, app_name="app", session_service=InMemorySessionService()),
                client,
            )
            await other.session_service.create_session(**IDS)
            await _run(other, "ls")
            # Each of its two model calls (and each append) asked the server.
            assert checks_answered(metrics_at) >= before + 2
    finally:
        server.stop()
