"""One agent server process for the OpenAI Agents SDK and Google ADK tests:
runs one turn of a session in a shared SQLite file, owned through
leasehold or not, and prints how it ended as one JSON line.

    python fw_worker.py '{"framework": "agents" | "adk", "db": ..., ...}'
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import leasehold


def _effect(spec: dict[str, Any], cmd: str) -> None:
    conn = sqlite3.connect(spec["effects"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (worker TEXT, tool TEXT, cmd TEXT)")
    conn.execute("INSERT INTO effects VALUES (?, 'shell', ?)", (spec["name"], cmd))
    conn.close()


async def _shell_body(spec: dict[str, Any], cmd: str) -> str:
    Path(spec["marker"]).write_text("in shell")
    hold = spec.get("hold")
    deadline = time.monotonic() + 30
    while hold and not Path(hold).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    _effect(spec, cmd)
    return f"{spec['name']} ran {cmd}"


async def agents_turn(spec: dict[str, Any]) -> Any:
    import agents_fake
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.memory import SQLiteSession

    from leasehold import agents as owned

    set_tracing_disabled(True)

    @function_tool
    async def shell(cmd: str) -> str:
        """Runs a shell command."""
        return await _shell_body(spec, cmd)

    session = SQLiteSession("s1", spec["db"])
    model = agents_fake.FakeModel(ids=iter(spec["ids"]) if spec.get("ids") else None)
    if spec.get("addr") is None:
        agent = Agent(name="agent", instructions="help", model=model, tools=[shell])
        result = await Runner.run(agent, spec["message"], session=session)
    else:
        agent = Agent(name="agent", instructions="help", model=model, tools=[owned.ledgered(shell)])
        async with leasehold.AsyncClient(spec["addr"], owner=spec["name"]) as client:
            result = await owned.run(
                client,
                agent,
                spec["message"],
                session=session,
                ttl=spec.get("ttl", 30.0),
                wait=spec.get("wait", 0.0),
            )
    return result.final_output


async def adk_turn(spec: dict[str, Any]) -> Any:
    import adk_fake
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner
    from google.adk.sessions.sqlite_session_service import SqliteSessionService
    from google.genai import types

    from leasehold.adk import own

    async def shell(cmd: str) -> dict[str, str]:
        """Runs a shell command."""
        return {"out": await _shell_body(spec, cmd)}

    model = adk_fake.FakeLlm(ids=spec.get("ids"))
    agent = LlmAgent(name="agent", model=model, instruction="help", tools=[shell])
    service = SqliteSessionService(spec["db"])
    runner = Runner(agent=agent, app_name="app", session_service=service)
    message = types.Content(role="user", parts=[types.Part(text=spec["message"])])
    texts: list[str] = []

    async def go(r: Any) -> None:
        async for event in r.run_async(user_id="u", session_id="s1", new_message=message):
            for part in (event.content.parts or []) if event.content else []:
                if part.text:
                    texts.append(part.text)

    if spec.get("addr") is None:
        await go(runner)
    else:
        async with leasehold.AsyncClient(spec["addr"], owner=spec["name"]) as client:
            await go(own(runner, client, ttl=spec.get("ttl", 30.0), wait=spec.get("wait", 0.0)))
    return texts[-1] if texts else None


def main(spec: dict[str, Any]) -> dict[str, Any]:
    turn = agents_turn if spec["framework"] == "agents" else adk_turn
    try:
        out = asyncio.run(turn(spec))
    except leasehold.Error as err:
        return {"name": spec["name"], "status": type(err).__name__, "detail": str(err)}
    except Exception as err:
        return {"name": spec["name"], "status": type(err).__name__, "detail": str(err)[:300]}
    return {"name": spec["name"], "status": "ok", "detail": out}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
