"""leasehold.pydantic_ai against the real pydantic-ai (FunctionModel): two
load-run-save cycles of one conversation let the second's tool run and
then lose its turn to a conflict, without it; with it the second is
refused before it loads, and a call id never runs twice."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from conftest import Server
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict, InMemoryConversationStore
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import leasehold
from leasehold import pydantic_ai as owned


class Tools:
    def __init__(self) -> None:
        self.effects: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def shell(self, cmd: str) -> str:
        """Runs a shell command."""
        self.entered.set()
        await self.gate.wait()
        self.effects.append(cmd)
        return f"ran {cmd}"


def _model(ids: list[str] | None = None) -> FunctionModel:
    calls = iter(ids) if ids is not None else (f"call_{n}" for n in itertools.count(1))

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"done: {last.content}")])
        prompt = next(
            p.content
            for m in reversed(messages)
            if isinstance(m, ModelRequest)
            for p in m.parts
            if getattr(p, "part_kind", "") == "user-prompt"
        )
        return ModelResponse(
            parts=[
                ToolCallPart(info.function_tools[0].name, {"cmd": prompt}, tool_call_id=next(calls))
            ]
        )

    return FunctionModel(respond)


def _agent(tools: Tools, ids: list[str] | None = None, ledger: bool = True) -> Agent[None, str]:
    toolset: Any = FunctionToolset([tools.shell])
    return Agent(_model(ids), toolsets=[owned.ledgered(toolset) if ledger else toolset])


async def _plain_turn(agent: Agent[None, str], store: Any, prompt: str) -> Any:
    conversation = await store.load("c1") or Conversation(conversation_id="c1")
    result = await agent.run(prompt, conversation=conversation)
    await store.save(result)
    return result


async def test_without_leasehold_the_second_run_acts_then_loses_its_turn() -> None:
    store, tools = InMemoryConversationStore(), Tools()
    tools.gate.clear()
    first = asyncio.ensure_future(_plain_turn(_agent(tools, ledger=False), store, "ls"))
    await asyncio.wait_for(tools.entered.wait(), 10)
    second = asyncio.ensure_future(
        _plain_turn(_agent(tools, ["call_b"], ledger=False), store, "rm -rf build")
    )
    await asyncio.sleep(0.1)
    tools.gate.set()
    outcomes = await asyncio.gather(first, second, return_exceptions=True)
    # Both tools ran; one run's turn is then refused by the store.
    assert sorted(tools.effects) == ["ls", "rm -rf build"]
    assert any(isinstance(o, ConversationConflict) for o in outcomes), outcomes


async def test_one_run_owns_the_conversation(server: Server) -> None:
    store, tools = InMemoryConversationStore(), Tools()
    async with (
        leasehold.AsyncClient(server.address, owner="a") as ca,
        leasehold.AsyncClient(server.address, owner="b") as cb,
    ):
        tools.gate.clear()
        first = asyncio.ensure_future(
            owned.run(ca, _agent(tools), "ls", conversation_id="c1", store=store)
        )
        await asyncio.wait_for(tools.entered.wait(), 10)
        with pytest.raises(leasehold.Busy) as busy:
            await owned.run(cb, _agent(tools, ["call_x"]), "rm", conversation_id="c1", store=store)
        assert busy.value.holder == "a"
        second = asyncio.ensure_future(
            owned.run(
                cb, _agent(tools, ["call_b"]), "cat", conversation_id="c1", store=store, wait=20.0
            )
        )
        await asyncio.sleep(0.2)
        tools.gate.set()
        assert (await first).output == "done: ran ls"
        assert (await second).output == "done: ran cat"
        assert tools.effects == ["ls", "cat"]
        stored = await store.load("c1")
        assert stored is not None and len(stored.messages) == 8


async def test_a_tool_call_id_seen_before_never_runs_again(server: Server) -> None:
    store, tools = InMemoryConversationStore(), Tools()
    async with leasehold.AsyncClient(server.address) as client:
        agent = _agent(tools, ["call_1", "call_1"])
        await owned.run(client, agent, "rm -rf build", conversation_id="c1", store=store)
        again = await owned.run(client, agent, "rm -rf build", conversation_id="c1", store=store)
        assert tools.effects == ["rm -rf build"]
        assert again.output == "done: ran rm -rf build"


async def test_a_lost_owner_neither_steps_nor_saves(server: Server) -> None:
    store, tools = InMemoryConversationStore(), Tools()

    async def lose_then_shell(cmd: str) -> str:
        """Runs a shell command, after the run's lease has ended under it."""
        current = owned._CURRENT.get()
        assert current is not None
        await current.lease.release()  # type: ignore[misc]
        return await tools.shell(cmd)

    agent = Agent(_model(), toolsets=[owned.ledgered(FunctionToolset([lose_then_shell]))])
    async with leasehold.AsyncClient(server.address) as client:
        with pytest.raises(leasehold.LeaseLost):
            await owned.run(client, agent, "ls", conversation_id="c1", store=store)
        # The tool's body ran (the loss came during it); its settlement was
        # refused, the run stopped there and nothing was saved.
        assert tools.effects == ["ls"]
        assert await store.load("c1") is None


async def test_a_ledgered_toolset_outside_an_owned_run_is_refused() -> None:
    tools = Tools()
    with pytest.raises(owned.NotOwned):
        await _agent(tools).run("ls")
    assert tools.effects == []
