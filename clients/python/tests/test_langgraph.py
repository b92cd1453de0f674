"""leasehold.langgraph against the real LangGraph: the failures of two
processes on one thread reproduced without it (a forked thread, the
provider's "No tool output found", a tool run twice by a recoverer), and
each prevented with it, on SqliteSaver, AsyncSqliteSaver, PostgresSaver,
AsyncPostgresSaver and an in-memory saver.

Two "processes" in one test are two graphs with their own saver connection
and their own leasehold client: nothing in-process is shared between them
but the database file, as between two servers. The pause test uses real
processes (lg_worker.py) and SIGSTOP."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import lg_agent
import pytest
from conftest import (
    PG_URL,
    Server,
    finish_worker,
    kill_worker,
    needs_pg,
    spawn_worker,
    wait_until,
    worker_effects,
)
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.prebuilt import ToolNode as PlainToolNode

import leasehold
from leasehold.fence import StaleFence
from leasehold.langgraph import (
    UNKNOWN_RESULT,
    LeaseholdSaver,
    NotOwned,
    ToolNode,
    UnsettledToolCalls,
    own,
)
from leasehold.langgraph._fenced import SCOPE

HERE = Path(__file__).parent
THREAD = {"configurable": {"thread_id": "t1"}}


def _saver(path: Path) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False, timeout=30))


def _root_checkpoints(path: Path, thread: str = "t1") -> list[tuple[str, str | None]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints "
            "WHERE thread_id = ? AND checkpoint_ns = '' ORDER BY checkpoint_id",
            (thread,),
        ).fetchall()
    finally:
        conn.close()


def _settled(path: Path) -> list[tuple[str, str | None]]:
    """The thread's checkpoints once the running owner's last save has
    landed (unchanged for 0.3 s): LangGraph may still be writing the step
    that started the tool when the tool signals it is running."""
    rows = _root_checkpoints(path)
    for _ in range(50):
        threading.Event().wait(0.3)
        again = _root_checkpoints(path)
        if again == rows:
            return rows
        rows = again
    return rows


def _forks(rows: list[tuple[str, str | None]]) -> list[str]:
    """Parents with more than one child: the thread forked there, and every
    branch but the newest is unreachable from the thread's head."""
    children: dict[str | None, int] = {}
    for _, parent in rows:
        children[parent] = children.get(parent, 0) + 1
    return [p for p, n in children.items() if n > 1 and p is not None]


def _transcript(graph: Any) -> list[Any]:
    return list(graph.get_state(THREAD).values["messages"])


class Process:
    """One agent server: its own saver connection, client, tools and graph."""

    def __init__(self, cp: Path, addr: str | None, name: str, **own_args: Any) -> None:
        self.tools = lg_agent.Tools()
        self.model = lg_agent.ProviderModel(ids=own_args.pop("ids", None))
        self.client = leasehold.Client(addr, owner=name) if addr else None
        node = ToolNode(self.tools.all) if addr else PlainToolNode(self.tools.all)
        graph: Any = lg_agent.build(self.model, node).compile(checkpointer=_saver(cp))
        self.graph = own(graph, self.client, **own_args) if self.client else graph
        self.result: Any = None
        self.error: BaseException | None = None

    def start(self, message: str | None) -> threading.Thread:
        def run() -> None:
            try:
                inp = None if message is None else {"messages": [("user", message)]}
                self.result = self.graph.invoke(inp, THREAD)
            except BaseException as err:
                self.error = err

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


# -- the failures, reproduced without leasehold ------------------------------


def test_without_leasehold_two_processes_fork_the_thread_and_the_provider_refuses(
    tmp_path: Path,
) -> None:
    cp = tmp_path / "checkpoints.db"
    a, b = Process(cp, None, "a"), Process(cp, None, "b")
    a.tools.release_shell.clear()
    first = a.start("ls")
    assert a.tools.in_shell.wait(10)
    # LangGraph's default durability saves A's step in the background.
    assert wait_until(lambda: len(b.graph.get_state(THREAD).values.get("messages", [])) == 2, 5)
    # B takes the same thread while A's shell call has no output yet.
    second = b.start("cat notes")
    second.join(10)
    a.tools.release_shell.set()
    first.join(10)
    assert a.error is None, a.error
    # The provider refuses B's request: A's call has no output in it.
    assert isinstance(b.error, lg_agent.ProviderError)
    assert str(b.error) == "No tool output found for function call call_1."
    # And the thread forked: two histories from one checkpoint.
    assert _forks(_root_checkpoints(cp)), _root_checkpoints(cp)


# -- one owner per thread ------------------------------------------------------


def test_a_second_process_is_busy_and_never_writes(server: Server, tmp_path: Path) -> None:
    cp = tmp_path / "checkpoints.db"
    a, b = Process(cp, server.address, "a"), Process(cp, server.address, "b")
    try:
        a.tools.release_shell.clear()
        first = a.start("ls")
        assert a.tools.in_shell.wait(10)
        before = _settled(cp)
        with pytest.raises(leasehold.Busy) as busy:
            b.graph.invoke({"messages": [("user", "cat notes")]}, THREAD)
        assert busy.value.holder == "a"
        assert _root_checkpoints(cp) == before
        assert b.model.requests == []
        a.tools.release_shell.set()
        first.join(10)
        assert a.error is None, a.error
        rows = _root_checkpoints(cp)
        assert not _forks(rows), rows
        assert [m.content for m in a.result["messages"]][-1] == "done: ran ls"
        state = server_state(a.client, "langgraph:t1")
        assert state.lease is None and state.last_ended is not None
        assert state.last_ended.end == "released"
    finally:
        a.close()
        b.close()


def server_state(client: Any, key: str) -> leasehold.KeyState:
    state: leasehold.KeyState = client.get(key)
    return state


def test_a_waiting_process_continues_the_same_history(server: Server, tmp_path: Path) -> None:
    cp = tmp_path / "checkpoints.db"
    a = Process(cp, server.address, "a")
    b = Process(cp, server.address, "b", wait=20.0, ids=["call_b1"])
    try:
        a.tools.release_shell.clear()
        first = a.start("ls")
        assert a.tools.in_shell.wait(10)
        second = b.start("cat notes")
        # B queues on the lease: it has not read the thread or asked its model.
        assert wait_until(lambda: server_state(a.client, "langgraph:t1").lease is not None, 5)
        assert b.model.requests == []
        a.tools.release_shell.set()
        first.join(10)
        second.join(20)
        assert a.error is None and b.error is None, (a.error, b.error)
        rows = _root_checkpoints(cp)
        assert not _forks(rows), rows
        messages = _transcript(b.graph)
        lg_agent.check_pairing(messages)
        assert [m.content for m in messages] == [
            "ls",
            "",
            "ran ls",
            "done: ran ls",
            "cat notes",
            "",
            "ran cat notes",
            "done: ran cat notes",
        ]
        # Every model request either process made was a valid transcript.
        for request in a.model.requests + b.model.requests:
            lg_agent.check_pairing(request)
    finally:
        a.close()
        b.close()


def test_the_database_refuses_a_stale_fence_that_passed_every_check(
    server: Server, tmp_path: Path
) -> None:
    """The window a gate cannot close: an owner that checked its lease and
    was then paused before its write. Its write reaches the database with
    an old fence after a newer owner has claimed the thread, and the
    database refuses it in the write's own transaction."""
    cp = tmp_path / "checkpoints.db"
    a = Process(cp, server.address, "a")
    try:
        a.graph.invoke({"messages": [("user", "ls")]}, THREAD)
        saver: LeaseholdSaver = a.graph.checkpointer
        assert saver.fenced_in_transaction
        head = saver.get_tuple(THREAD)
        assert head is not None
        newer = a.graph.invoke({"messages": [("user", "pwd")]}, THREAD)  # fence 2 now
        assert newer["messages"][-1].content == "done: ran pwd"
        before = _settled(cp)
        token = SCOPE.set(("langgraph:t1", 1))
        try:
            with pytest.raises(StaleFence) as stale:
                saver.inner.put(head.config, head.checkpoint, head.metadata, {})
            assert (stale.value.fence, stale.value.highest) == (1, 2)
            with pytest.raises(StaleFence):
                saver.inner.put_writes(head.config, [("messages", [])], "task")
            with pytest.raises(StaleFence):
                saver.inner.delete_thread("t1")
        finally:
            SCOPE.reset(token)
        assert _root_checkpoints(cp) == before
        # Nothing was left open: the owner's next run writes as usual.
        assert not saver.inner.conn.in_transaction
        a.graph.invoke({"messages": [("user", "whoami")]}, THREAD)
        assert len(_root_checkpoints(cp)) > len(before)
    finally:
        a.close()


def test_a_write_outside_any_run_takes_the_thread_for_just_that_write(
    server: Server, tmp_path: Path
) -> None:
    cp = tmp_path / "checkpoints.db"
    a, b = Process(cp, server.address, "a"), Process(cp, server.address, "b")
    try:
        a.graph.invoke({"messages": [("user", "ls")]}, THREAD)
        a.tools.release_shell.clear()
        first = a.start("pwd")
        assert a.tools.in_shell.wait(10)
        # While A's run owns the thread, B's update_state is refused, unwritten.
        before = _settled(cp)
        with pytest.raises(leasehold.Busy):
            b.graph.update_state(THREAD, {"messages": [AIMessage("edited")]}, as_node="agent")
        with pytest.raises(leasehold.Busy):
            b.graph.checkpointer.delete_thread("t1")
        assert _root_checkpoints(cp) == before
        a.tools.release_shell.set()
        first.join(10)
        # Once the thread is free, the same edit goes through and lets go.
        b.graph.update_state(THREAD, {"messages": [AIMessage("edited")]}, as_node="agent")
        assert _transcript(b.graph)[-1].content == "edited"
        state = server_state(b.client, "langgraph:t1")
        assert state.lease is None and state.last_ended is not None
        assert (state.last_ended.owner, state.last_ended.end) == ("b", "released")
        b.graph.checkpointer.delete_thread("t1")
        assert _root_checkpoints(cp) == []
    finally:
        a.close()
        b.close()


def test_a_run_that_raises_suspends_the_thread_for_recovery(server: Server, tmp_path: Path) -> None:
    cp = tmp_path / "checkpoints.db"
    a = Process(cp, server.address, "a")
    try:
        broken = lg_agent.ProviderModel()
        graph = own(
            lg_agent.build(broken, ToolNode(a.tools.all)).compile(checkpointer=_saver(cp)),
            a.client,
        )
        # A transcript the provider refuses makes the run raise.
        graph.update_state(
            THREAD, {"messages": [AIMessage("", tool_calls=[_call("call_x")])]}, as_node="tools"
        )
        with pytest.raises(lg_agent.ProviderError):
            graph.invoke({"messages": [("user", "ls")]}, THREAD)
        state = server_state(a.client, "langgraph:t1")
        assert state.lease is None and state.recoverable
        assert state.last_ended is not None and state.last_ended.end == "suspended"
    finally:
        a.close()


def _call(call_id: str) -> Any:
    return {"id": call_id, "name": "shell", "args": {"cmd": "x"}}


# -- the ledger ----------------------------------------------------------------


def test_a_tool_call_id_seen_before_never_runs_again(server: Server, tmp_path: Path) -> None:
    cp = tmp_path / "checkpoints.db"
    # A model that reuses its call id in the next turn.
    a = Process(cp, server.address, "a", ids=["call_1", "call_1"])
    try:
        a.graph.invoke({"messages": [("user", "rm -rf build")]}, THREAD)
        out = a.graph.invoke({"messages": [("user", "rm -rf build")]}, THREAD)
        assert a.tools.effects == [("shell", "rm -rf build")]
        replay = out["messages"][-2]
        assert isinstance(replay, ToolMessage)
        assert (replay.tool_call_id, replay.content) == ("call_1", "ran rm -rf build")
    finally:
        a.close()


def test_without_leasehold_two_worker_processes_fork_the_thread(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    spec = _worker_spec(tmp_path, "a", addr=None, shell_seconds=0.0, hold=str(hold))
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        b = _run_worker({**spec, "name": "b", "message": "cat notes", "ids": ["call_b"]})
        hold.touch()
        assert json.loads(a.communicate(timeout=30)[0])["status"] == "ok"
    finally:
        _kill(a)
    assert b["status"] == "ProviderError", b
    assert b["detail"] == "No tool output found for function call call_1."
    assert _forks(_root_checkpoints(Path(spec["cp"])))


def test_two_worker_processes_one_owner_no_write_of_the_loser(
    server: Server, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    spec = _worker_spec(tmp_path, "a", addr=server.address, shell_seconds=0.0, hold=str(hold))
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        before = _settled(Path(spec["cp"]))
        b = _run_worker({**spec, "name": "b", "message": "cat notes", "ids": ["call_b"]})
        assert b["status"] == "Busy", b
        assert _root_checkpoints(Path(spec["cp"])) == before
        # A third process that waits continues the same history after A.
        threading.Timer(1.0, hold.touch).start()
        c = _run_worker(
            {
                **spec,
                "name": "c",
                "message": "pwd",
                "ids": ["call_c"],
                "wait": 20.0,
                "shell_seconds": 0.0,
            }
        )
        ended = json.loads(a.communicate(timeout=30)[0])
    finally:
        _kill(a)
    assert ended["status"] == "ok", ended
    assert c["status"] == "ok", c
    assert c["detail"] == [
        "ls",
        "",
        "a ran ls",
        "done: a ran ls",
        "pwd",
        "",
        "c ran pwd",
        "done: c ran pwd",
    ]
    assert not _forks(_root_checkpoints(Path(spec["cp"])))
    assert _effects(spec) == [("a", "shell", "ls"), ("c", "shell", "pwd")]


def test_after_kill_9_exactly_one_recoverer_takes_the_thread_over(
    server: Server, tmp_path: Path
) -> None:
    spec = _worker_spec(tmp_path, "a", addr=server.address, ttl=1.0, shell_seconds=30.0)
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        a.kill()
        a.wait(10)
    finally:
        _kill(a)
    # Two recoverers race for the thread once A's lease expires.
    recoverers = [
        _spawn(
            {
                **spec,
                "name": n,
                "message": None,
                "wait": 20.0,
                "ttl": 30.0,
                "marker": spec["marker"] + n,
            }
        )
        for n in ("b", "c")
    ]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in recoverers]
    assert [r["status"] for r in results] == ["ok", "ok"], results
    # The shell call A began never ran again; its outcome was settled once,
    # as unknown, and the thread answers it exactly once, unforked.
    assert _effects(spec) == []
    final = max(results, key=lambda r: len(r["detail"]))["detail"]
    assert final.count(UNKNOWN_RESULT.decode()) == 1, final
    assert not _forks(_root_checkpoints(Path(spec["cp"])))
    client = leasehold.Client(server.address)
    try:
        ends = [(h.owner, h.end) for h in client.history("langgraph:t1").entries]
    finally:
        client.close()
    assert ends[-1] == ("a", "expired") and len(ends) == 3, ends


def test_after_kill_9_a_recoverer_with_new_input_finishes_the_lost_step_first(
    server: Server, tmp_path: Path
) -> None:
    spec = _worker_spec(tmp_path, "a", addr=server.address, ttl=1.0, shell_seconds=30.0)
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        a.kill()
        a.wait(10)
    finally:
        _kill(a)
    # B brings the next user message, not a resume: A's call (checkpointed,
    # never answered) would reach the model with no output. B finishes A's
    # step first (the call answered as unknown), then takes its input.
    b = _spawn(
        {
            **spec,
            "name": "b",
            "message": "pwd",
            "ids": ["call_b1"],
            "wait": 20.0,
            "ttl": 30.0,
            "shell_seconds": 0.0,
            "marker": spec["marker"] + "b",
        }
    )
    result = json.loads(b.communicate(timeout=60)[0])
    assert result["status"] == "ok", result
    detail = result["detail"]
    assert detail.count(UNKNOWN_RESULT.decode()) == 1, detail
    unknown = detail.index(UNKNOWN_RESULT.decode())
    assert unknown < detail.index("pwd") < detail.index("b ran pwd"), detail
    assert _effects(spec) == [("b", "shell", "pwd")]


def test_without_leasehold_a_recoverer_runs_a_live_owners_tool_again(tmp_path: Path) -> None:
    spec = _worker_spec(tmp_path, "a", addr=None)
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        a.send_signal(signal.SIGSTOP)
        # "Restart recovery" on another process resumes the thread: the
        # pending shell call runs again while its first run is still alive.
        b = _run_worker({**spec, "name": "b", "message": None, "shell_seconds": 0.0})
        assert b["status"] == "ok", b
        a.send_signal(signal.SIGCONT)
        assert json.loads(a.communicate(timeout=30)[0])["status"] == "ok"
    finally:
        _kill(a)
    assert sorted(_effects(spec)) == [("a", "shell", "ls"), ("b", "shell", "ls")]


def test_a_paused_owner_is_taken_over_and_its_tool_never_runs_twice(
    server: Server, tmp_path: Path
) -> None:
    spec = _worker_spec(tmp_path, "a", addr=server.address, ttl=1.0)
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        a.send_signal(signal.SIGSTOP)
        # Another process recovers the thread once A's lease expires.
        b = _run_worker({**spec, "name": "b", "message": None, "wait": 20.0, "ttl": 30.0})
        assert b["status"] == "ok", b
        a.send_signal(signal.SIGCONT)
        ended = json.loads(a.communicate(timeout=30)[0])
    finally:
        _kill(a)
    # A's shell call ran once (it was running when A froze), never again,
    # and A's late result was refused rather than written.
    assert _effects(spec) == [("a", "shell", "ls")]
    assert ended["status"] == "LeaseLost", ended
    messages = b["detail"]
    assert messages[:2] == ["ls", ""]
    assert messages[2] == UNKNOWN_RESULT.decode()
    assert messages[3].startswith("done: leasehold:")
    with sqlite3.connect(spec["cp"]) as conn:
        rows = conn.execute("SELECT value FROM writes").fetchall()
    assert not any(b"a ran ls" in bytes(r[0]) for r in rows if r[0] is not None)
    client = leasehold.Client(server.address)
    try:
        history = client.history("langgraph:t1").entries
        assert [(h.owner, h.end) for h in history][:2] == [("b", "released"), ("a", "expired")]
    finally:
        client.close()


def test_on_unsettled_raise_leaves_the_decision_to_the_caller(
    server: Server, tmp_path: Path
) -> None:
    spec = _worker_spec(tmp_path, "a", addr=server.address, ttl=1.0)
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        a.kill()
        a.wait(10)
        b = Process(Path(spec["cp"]), server.address, "b", wait=20.0, on_unsettled="raise")
        try:
            with pytest.raises(UnsettledToolCalls) as unsettled:
                b.graph.invoke(None, THREAD)
            assert [c.call_id for c in unsettled.value.calls] == ["call_1"]
            assert b.model.requests == [] and b.tools.effects == []
            # The thread stays recoverable for whoever settles the call.
            assert server_state(b.client, "langgraph:t1").recoverable
        finally:
            b.close()
    finally:
        _kill(a)


def _worker_spec(tmp_path: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "cp": str(tmp_path / "checkpoints.db"),
        "effects": str(tmp_path / "effects.db"),
        "marker": str(tmp_path / f"in-shell-{uuid.uuid4().hex}"),
        "thread": "t1",
        "message": "ls",
        **extra,
    }


def _spawn(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return spawn_worker("lg_worker.py", spec)


def _run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    return finish_worker(_spawn({**spec, "marker": spec["marker"] + "-b"}))


_kill = kill_worker


def _effects(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    return worker_effects(spec["effects"])


# -- other savers, and async ---------------------------------------------------


def test_a_saver_without_a_transaction_of_ours_is_gated(server: Server) -> None:
    client = leasehold.Client(server.address)
    try:
        tools = lg_agent.Tools()
        saver = InMemorySaver()
        graph = own(
            lg_agent.build(lg_agent.ProviderModel(), ToolNode(tools.all)).compile(
                checkpointer=saver
            ),
            client,
        )
        assert not graph.checkpointer.fenced_in_transaction
        assert graph.invoke({"messages": [("user", "ls")]}, THREAD)["messages"][-1].content == (
            "done: ran ls"
        )
        # A write presenting a lease that is over is refused before the saver.
        lease = client.acquire("langgraph:t1", ttl=5.0)
        lease.release()
        run = leasehold.langgraph.Run("langgraph:t1", lease)
        head = saver.get_tuple(THREAD)
        assert head is not None
        config = {"configurable": {**head.config["configurable"], "__leasehold_run": run}}
        count = len(list(saver.list(THREAD)))
        with pytest.raises(leasehold.LeaseLost):
            graph.checkpointer.put(config, head.checkpoint, head.metadata, {})
        assert len(list(saver.list(THREAD))) == count
    finally:
        client.close()


def test_ledgered_tools_outside_an_owned_graph_are_refused(tmp_path: Path) -> None:
    tools = lg_agent.Tools()
    graph = lg_agent.build(lg_agent.ProviderModel(), ToolNode(tools.all)).compile(
        checkpointer=_saver(tmp_path / "cp.db")
    )
    with pytest.raises(NotOwned):
        graph.invoke({"messages": [("user", "ls")]}, THREAD)
    assert tools.effects == []


async def test_async_sqlite_one_owner_and_a_stale_fence_refused(
    server: Server, tmp_path: Path
) -> None:
    import aiosqlite

    cp = tmp_path / "checkpoints.db"
    async with (
        leasehold.AsyncClient(server.address, owner="a") as ca,
        leasehold.AsyncClient(server.address, owner="b") as cb,
        aiosqlite.connect(cp) as conn_a,
        aiosqlite.connect(cp) as conn_b,
    ):
        ta, tb = lg_agent.Tools(), lg_agent.Tools()
        ga = own(
            lg_agent.build(lg_agent.ProviderModel(), ToolNode(ta.all)).compile(
                checkpointer=AsyncSqliteSaver(conn_a)
            ),
            ca,
        )
        gb = own(
            lg_agent.build(lg_agent.ProviderModel(ids=["call_b1"]), ToolNode(tb.all)).compile(
                checkpointer=AsyncSqliteSaver(conn_b)
            ),
            cb,
        )
        assert ga.checkpointer.fenced_in_transaction
        ta.release_shell.clear()
        first = asyncio.ensure_future(ga.ainvoke({"messages": [("user", "ls")]}, THREAD))
        assert await asyncio.to_thread(ta.in_shell.wait, 10)
        with pytest.raises(leasehold.Busy):
            await gb.ainvoke({"messages": [("user", "cat")]}, THREAD)
        ta.release_shell.set()
        out = await first
        assert out["messages"][-1].content == "done: ran ls"
        await gb.ainvoke({"messages": [("user", "pwd")]}, THREAD)  # fence 2
        assert not _forks(_root_checkpoints(cp))
        saver: LeaseholdSaver = ga.checkpointer
        head = await saver.aget_tuple(THREAD)
        assert head is not None
        before = _settled(cp)
        token = SCOPE.set(("langgraph:t1", 1))
        try:
            with pytest.raises(StaleFence):
                await saver.inner.aput(head.config, head.checkpoint, head.metadata, {})
        finally:
            SCOPE.reset(token)
        assert _root_checkpoints(cp) == before
        assert not conn_a.in_transaction
        assert ta.effects == [("shell", "ls")] and tb.effects == [("shell", "pwd")]


# -- PostgreSQL ------------------------------------------------------------------


def _pg(schema: str) -> Any:
    import psycopg
    from psycopg.rows import dict_row

    assert PG_URL is not None
    return psycopg.connect(
        PG_URL,
        autocommit=True,
        prepare_threshold=0,
        row_factory=dict_row,
        options=f"-c search_path={schema}",
    )


@needs_pg
def test_postgres_one_owner_and_a_stale_fence_refused(server: Server, pg_schema: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with _pg(pg_schema) as conn_a, _pg(pg_schema) as conn_b:
        PostgresSaver(conn_a).setup()
        ca = leasehold.Client(server.address, owner="a")
        cb = leasehold.Client(server.address, owner="b")
        try:
            ta, tb = lg_agent.Tools(), lg_agent.Tools()
            ga = own(
                lg_agent.build(lg_agent.ProviderModel(), ToolNode(ta.all)).compile(
                    checkpointer=PostgresSaver(conn_a)
                ),
                ca,
            )
            gb = own(
                lg_agent.build(lg_agent.ProviderModel(ids=["call_b1"]), ToolNode(tb.all)).compile(
                    checkpointer=PostgresSaver(conn_b)
                ),
                cb,
            )
            assert ga.checkpointer.fenced_in_transaction
            ta.release_shell.clear()
            result: dict[str, Any] = {}
            first = threading.Thread(
                target=lambda: result.update(ga.invoke({"messages": [("user", "ls")]}, THREAD))
            )
            first.start()
            assert ta.in_shell.wait(10)
            with pytest.raises(leasehold.Busy):
                gb.invoke({"messages": [("user", "cat")]}, THREAD)
            ta.release_shell.set()
            first.join(10)
            assert result["messages"][-1].content == "done: ran ls"
            gb.invoke({"messages": [("user", "pwd")]}, THREAD)
            count = conn_a.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"]
            fences = conn_a.execute("SELECT key, fence FROM leasehold_fence").fetchall()
            assert fences == [{"key": "langgraph:t1", "fence": 2}]
            saver: LeaseholdSaver = ga.checkpointer
            head = saver.get_tuple(THREAD)
            assert head is not None
            token = SCOPE.set(("langgraph:t1", 1))
            try:
                with pytest.raises(StaleFence):
                    saver.inner.put(head.config, head.checkpoint, head.metadata, {})
            finally:
                SCOPE.reset(token)
            after = conn_a.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"]
            assert after == count
            messages = gb.get_state(THREAD).values["messages"]
            lg_agent.check_pairing(messages)
            assert len(messages) == 8
        finally:
            ca.close()
            cb.close()


@needs_pg
async def test_async_postgres_one_owner_and_a_stale_fence_refused(
    server: Server, pg_schema: str
) -> None:
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row

    assert PG_URL is not None
    async with (
        await psycopg.AsyncConnection.connect(
            PG_URL,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={pg_schema}",
        ) as conn,
        leasehold.AsyncClient(server.address, owner="a") as client,
    ):
        inner = AsyncPostgresSaver(conn)
        await inner.setup()
        tools = lg_agent.Tools()
        graph = own(
            lg_agent.build(lg_agent.ProviderModel(), ToolNode(tools.all)).compile(
                checkpointer=inner
            ),
            client,
        )
        assert graph.checkpointer.fenced_in_transaction
        await graph.ainvoke({"messages": [("user", "ls")]}, THREAD)
        await graph.ainvoke({"messages": [("user", "pwd")]}, THREAD)
        saver: LeaseholdSaver = graph.checkpointer
        head = await saver.aget_tuple(THREAD)
        assert head is not None
        count = await (await conn.execute("SELECT count(*) AS n FROM checkpoints")).fetchone()
        token = SCOPE.set(("langgraph:t1", 1))
        try:
            with pytest.raises(StaleFence):
                await saver.inner.aput(head.config, head.checkpoint, head.metadata, {})
        finally:
            SCOPE.reset(token)
        after = await (await conn.execute("SELECT count(*) AS n FROM checkpoints")).fetchone()
        assert after == count
        assert tools.effects == [("shell", "ls"), ("shell", "pwd")]


@needs_pg
def test_postgres_two_worker_processes_one_owner_and_a_frozen_owners_write_refused(
    server: Server, pg_schema: str, tmp_path: Path
) -> None:
    pg = {"pg_url": PG_URL, "pg_schema": pg_schema}
    hold = tmp_path / "hold"
    spec = _worker_spec(
        tmp_path, "a", addr=server.address, ttl=1.0, shell_seconds=0.0, hold=str(hold), **pg
    )
    a = _spawn(spec)
    try:
        assert wait_until(lambda: Path(spec["marker"]).exists(), 20)
        busy = _run_worker({**spec, "name": "b", "message": "cat notes", "ids": ["call_b"]})
        assert busy["status"] == "Busy", busy
        a.send_signal(signal.SIGSTOP)
        # Once A's lease expires, C recovers the thread on the same database.
        c = _run_worker({**spec, "name": "c", "message": None, "wait": 20.0, "ttl": 30.0})
        assert c["status"] == "ok", c
        hold.touch()
        a.send_signal(signal.SIGCONT)
        ended = json.loads(a.communicate(timeout=30)[0])
    finally:
        _kill(a)
    assert ended["status"] == "LeaseLost", ended
    assert _effects(spec) == [("a", "shell", "ls")]
    assert c["detail"][2] == UNKNOWN_RESULT.decode()
    with _pg(pg_schema) as conn:
        fences = conn.execute("SELECT key, fence FROM leasehold_fence").fetchall()
        writes = conn.execute("SELECT blob FROM checkpoint_writes").fetchall()
    assert fences == [{"key": "langgraph:t1", "fence": 2}]
    assert not any(b"a ran ls" in bytes(w["blob"]) for w in writes if w["blob"] is not None)
