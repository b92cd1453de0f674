"""Ownership of an Amplifier session (amplifier-core's kernel, pinned) by the
``hooks-leasehold`` module: two real worker processes (amp_worker.py) drive
session ``s1`` in one shared SQLite context file, each an
``AmplifierSession`` with our own small orchestrator, context and fake
provider modules; the provider refuses a call without its result as the
OpenAI Responses API does. Without the module the second process sends the
first one's running call; with it the second is denied and writes nothing,
a ``kill -9`` of the owner mid-tool leaves exactly one recoverer (which
repairs the transcript before its turn), and a frozen owner's late writes
are refused."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import amplifier_module_context_shared as shared_context
import amplifier_module_provider_fake as fake_provider
import pytest
from conftest import (
    Server,
    finish_worker,
    kill_worker,
    spawn_worker,
    wait_for_marker,
    worker_effects,
)

import leasehold

PLACEHOLDER = "[leasehold: tool result unknown]"


def _spec(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "db": str(tmp_path / "context.db"),
        "effects": str(tmp_path / "effects.db"),
        "marker": str(tmp_path / f"in-shell-{uuid.uuid4().hex}"),
        "message": "ls",
        **extra,
    }


def _second(spec: dict[str, Any], name: str, message: str, **extra: Any) -> dict[str, Any]:
    """Another process on the same session, whose tool does not hold."""
    return {
        **spec,
        "name": name,
        "message": message,
        "ids": [f"call_{name}"],
        "marker": spec["marker"] + name,
        "hold": None,
        **extra,
    }


def _spawn(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return spawn_worker("amp_worker.py", spec)


def _history(spec: dict[str, Any]) -> list[str]:
    """The stored session as user / call / output / answer marks."""
    out = []
    for m in shared_context.read(spec["db"], "s1"):
        if m["role"] == "user":
            out.append(f"user:{m['content']}")
        elif m["role"] == "tool":
            unknown = PLACEHOLDER in m["content"]
            out.append(f"{'unknown' if unknown else 'output'}:{m['tool_call_id']}")
        elif m.get("tool_calls"):
            out.extend(f"call:{c['id']}" for c in m["tool_calls"])
        else:
            out.append("answer")
    return out


def _effects(spec: dict[str, Any]) -> list[tuple[str, str]]:
    return [(worker, cmd) for worker, _, cmd in worker_effects(spec["effects"])]


def _requests(spec: dict[str, Any]) -> list[tuple[str, str]]:
    return fake_provider.requests(spec["effects"])


def test_without_leasehold_the_second_process_sends_the_running_call(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    spec = _spec(tmp_path, "a", hold=str(hold))
    a = _spawn(spec)
    try:
        wait_for_marker(a, spec["marker"])
        b = finish_worker(_spawn(_second(spec, "b", "cat")))
        hold.touch()
        first = finish_worker(a)
    finally:
        kill_worker(a)
    # B built its request from a history holding A's running call: the
    # provider refused it, as OpenAI does, and B's prompt stays in the
    # session between A's call and A's result.
    # (The kernel reports an orchestrator's exception as "Execution failed: ...".)
    assert "InvalidRequestError: No tool output found for function call call_a." in b["detail"], b
    assert ("b", "No tool output found for function call call_a.") in _requests(spec)
    assert "InvalidRequestError: No tool output found for function call" in first["detail"], first
    assert _history(spec)[:3] == ["user:ls", "call:call_a", "user:cat"], _history(spec)


def test_with_leasehold_the_second_process_is_denied_and_writes_nothing(
    server: Server, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    spec = _spec(tmp_path, "a", addr=server.address, hold=str(hold))
    a = _spawn(spec)
    try:
        wait_for_marker(a, spec["marker"])
        before = _history(spec)
        b = finish_worker(_spawn(_second(spec, "b", "cat")))
        assert b["status"] == "denied", b
        assert b["detail"].startswith("Operation denied: leasehold: session 'amplifier:s1'"), b
        assert "being run by another process (a, fence 1)" in b["detail"], b
        assert _history(spec) == before == ["user:ls", "call:call_a"]
        hold.touch()
        first = finish_worker(a)
    finally:
        kill_worker(a)
    assert first["status"] == "ok", first
    assert _effects(spec) == [("a", "ls")]
    assert [w for w, _ in _requests(spec)] == ["a", "a"]
    assert {v for _, v in _requests(spec)} == {"ok"}
    assert _history(spec) == ["user:ls", "call:call_a", "output:call_a", "answer"]
    state = leasehold.Client(server.address).get("amplifier:s1")
    assert state.lease is None and state.last_ended is not None
    assert state.last_ended.end == "released", state


def test_after_kill_9_mid_tool_exactly_one_recoverer_repairs_first(
    server: Server, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, "a", addr=server.address, ttl=2.0, hold=str(tmp_path / "never"))
    a = _spawn(spec)
    try:
        wait_for_marker(a, spec["marker"])
        a.kill()
        a.wait(10)
    finally:
        kill_worker(a)
    assert _history(spec) == ["user:ls", "call:call_a"]
    recoverers = [
        _spawn(_second(spec, n, m, wait=20.0, ttl=30.0)) for n, m in (("b", "cat"), ("c", "pwd"))
    ]
    results = [finish_worker(p) for p in recoverers]
    assert [r["status"] for r in results] == ["ok", "ok"], results
    # One of them took the session over from the dead owner and repaired
    # it (A's call got an unknown-outcome result) before its turn; the other
    # came after it and found nothing to repair.
    repaired = [r for r in results if r["repaired"]]
    assert len(repaired) == 1, results
    assert len(repaired[0]["repaired"]) == 1, repaired
    first, second = repaired[0]["name"], ({"b", "c"} - {repaired[0]["name"]}).pop()
    cmd = {"b": "cat", "c": "pwd"}
    assert _history(spec) == [
        "user:ls",
        "call:call_a",
        "unknown:call_a",
        f"user:{cmd[first]}",
        f"call:call_{first}",
        f"output:call_{first}",
        "answer",
        f"user:{cmd[second]}",
        f"call:call_{second}",
        f"output:call_{second}",
        "answer",
    ]
    # A's call never ran again, and no provider ever saw a malformed history.
    assert sorted(_effects(spec)) == [("b", "cat"), ("c", "pwd")]
    assert {v for _, v in _requests(spec)} == {"ok"}, _requests(spec)
    ends = [
        (h.owner, h.end) for h in leasehold.Client(server.address).history("amplifier:s1").entries
    ]
    assert ends[-1] == ("a", "expired"), ends
    assert sorted(ends[:2]) == [("b", "released"), ("c", "released")], ends


def test_a_frozen_owner_is_taken_over_and_its_late_writes_refused(
    server: Server, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    # 2 s, not 1: a loaded CI machine must not lose A's lease before its tool.
    spec = _spec(tmp_path, "a", addr=server.address, hold=str(hold), ttl=2.0)
    a = _spawn(spec)
    try:
        wait_for_marker(a, spec["marker"])
        a.send_signal(signal.SIGSTOP)
        b = finish_worker(_spawn(_second(spec, "b", "cat", wait=20.0, ttl=30.0)))
        assert b["status"] == "ok", b
        after_b = _history(spec)
        threading.Timer(0.2, hold.touch).start()
        a.send_signal(signal.SIGCONT)
        first = finish_worker(a)
    finally:
        kill_worker(a)
    # A's tool finished after the takeover; its result was never written
    # and it sent no further request.
    assert "LeaseLost" in first["detail"] or "StaleFence" in first["detail"], first
    assert _history(spec) == after_b
    assert "output:call_a" not in after_b and "unknown:call_a" in after_b, after_b
    assert [w for w, _ in _requests(spec)] == ["a", "b", "b"]
    assert {v for _, v in _requests(spec)} == {"ok"}


def test_a_mount_plan_without_an_address_refuses_every_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hook that cannot work fails closed: the kernel skips a hook whose
    mount raises, which would leave the session unowned."""
    import amp_worker
    from amplifier_core import AmplifierSession

    monkeypatch.delenv("LEASEHOLD_ADDRESS", raising=False)
    spec = _spec(tmp_path, "a", addr="unused")
    plan = amp_worker.mount_plan(spec)
    del plan["hooks"][0]["config"]["address"]

    async def go() -> str:
        async with AmplifierSession(plan, session_id="s1") as session:
            out: str = await session.execute("ls")
            return out

    out = asyncio.run(go())
    assert out.startswith("Operation denied: leasehold: hooks-leasehold needs the leasehold"), out
    assert _history(spec) == [] and _requests(spec) == []
