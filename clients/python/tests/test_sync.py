"""The synchronous client against a real server."""

from __future__ import annotations

import asyncio
import gc
import os
import pathlib
import signal
import threading
import time
import uuid
from typing import Any

import pytest
from conftest import Server, answered, metrics_address, wait_until

import leasehold
from leasehold import ToolCallRequest, ToolInvocation, ToolOutcome


def test_busy_names_the_holder_fence_and_time_left(server: Server) -> None:
    """A second acquire of a held key raises Busy with the holder's details."""
    client = leasehold.Client(server.address)
    with client.acquire("session:1", ttl=5.0, owner="graph-a") as lease:
        with pytest.raises(leasehold.Busy) as caught:
            client.acquire("session:1", ttl=5.0, owner="graph-b")
        err = caught.value
        assert isinstance(err, leasehold.Error)
        assert err.holder == "graph-a"
        assert err.fence == lease.fence
        assert err.key == "session:1"
        assert 0 < err.remaining <= 5.0
        assert "graph-a" in str(err)


def test_wait_queues_until_the_holder_releases(server: Server) -> None:
    """An acquire with a wait gets the key as soon as the holder releases it."""
    client = leasehold.Client(server.address)
    first = client.acquire("session:1", ttl=5.0)
    threading.Timer(0.3, first.release).start()
    started = time.monotonic()
    second = client.acquire("session:1", ttl=5.0, wait=5.0)
    waited = time.monotonic() - started
    assert 0.25 <= waited < 4.0
    assert second.fence > first.fence
    assert second.previous is not None and second.previous.end == "released"
    assert not second.recovered
    second.release()


def test_waiters_are_granted_in_arrival_order(server: Server) -> None:
    """Waiters queue FIFO: the one that asked first gets the key first."""
    client = leasehold.Client(server.address)
    holder = client.acquire("session:1", ttl=5.0)
    granted: list[str] = []

    def wait_for(name: str) -> None:
        lease = client.acquire("session:1", ttl=5.0, wait=10.0, owner=name)
        granted.append(name)
        time.sleep(0.05)
        lease.release()

    waiters = []
    for name in ("first", "second", "third"):
        t = threading.Thread(target=wait_for, args=(name,))
        t.start()
        waiters.append(t)
        time.sleep(0.15)  # so each is surely in line before the next
    holder.release()
    for t in waiters:
        t.join(timeout=10)
    assert granted == ["first", "second", "third"]


def test_a_retried_acquire_with_the_same_request_id_replays_the_term(server: Server) -> None:
    """The same owner and request id while the term is live return the same
    term (replayed) instead of a conflict, and the replayed lease is valid."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0, owner="w", request_id="req-1")
    again = client.acquire("session:1", ttl=5.0, owner="w", request_id="req-1")
    assert again.replayed and not lease.replayed
    assert again.fence == lease.fence
    assert again.is_valid()
    with pytest.raises(leasehold.Busy):
        client.acquire("session:1", ttl=5.0, owner="w", request_id="req-2")
    ended = again.release()
    assert ended.fence == lease.fence
    with pytest.raises(leasehold.LeaseLost):
        lease.gate()


def test_a_replay_of_a_supplied_request_id_trusts_nothing_until_a_renewal(
    tmp_path: pathlib.Path,
) -> None:
    """A replay of a caller-supplied request id may answer a grant made long
    ago by another process: with every renewal refused (the server allows no
    Session stream), the replayed lease is never valid. The same case as the
    Rust (client_guard.rs) and TypeScript (replay.test.ts) clients' tests."""
    # The acquires wait (a little), so that they are unary calls: an
    # Acquire without a wait goes on the Session stream, which this server
    # refuses.
    srv = Server(tmp_path / "db", extra=("--max-streams-per-connection", "0"))
    try:
        worker = leasehold.Client(srv.address)
        first = worker.acquire("session:r", ttl=3.0, owner="w", request_id="R1", wait=0.01)
        late = leasehold.Client(srv.address)
        try:
            again = late.acquire("session:r", ttl=3.0, owner="w", request_id="R1", wait=0.01)
        except leasehold.Unavailable:
            pass
        else:
            assert again.replayed and again.fence == first.fence
            assert not again.is_valid(), "a replayed grant of unknown age was trusted"
            with pytest.raises(leasehold.LeaseLost):
                again.gate()
        late.close()
        worker.close()
    finally:
        srv.stop()


def test_release_ends_the_term_and_cannot_be_repeated(server: Server) -> None:
    """Release returns the ended term; the next holder sees it released, not
    recoverable; a second release of the same lease is refused."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0, owner="graph-a")
    assert lease.gate() == lease.fence
    ended = lease.release()
    assert (ended.fence, ended.owner, ended.end) == (lease.fence, "graph-a", "released")
    assert not lease.is_valid() and lease.lost.is_set()
    with pytest.raises(leasehold.LeaseLost) as caught:
        lease.release()
    assert caught.value.reason == "ended"
    with pytest.raises(leasehold.LeaseLost):
        lease.gate()
    nxt = client.acquire("session:1", ttl=5.0)
    assert nxt.previous == leasehold.EndedTerm(lease.fence, "graph-a", "released", ended.ended_at)
    assert not nxt.recovered
    nxt.release()


def test_an_exception_in_the_block_suspends_and_the_next_holder_recovers(server: Server) -> None:
    """Leaving the with-block by an exception suspends the term; the next
    acquire sees recovered and previous."""
    client = leasehold.Client(server.address)
    with pytest.raises(RuntimeError, match="tool crashed"):
        with client.acquire("session:1", ttl=5.0, owner="graph-a") as lease:
            raise RuntimeError("tool crashed")
    assert not lease.is_valid()
    with client.acquire("session:1", ttl=5.0) as nxt:
        assert nxt.recovered
        assert nxt.previous is not None
        assert nxt.previous.end == "suspended"
        assert (nxt.previous.fence, nxt.previous.owner) == (lease.fence, "graph-a")
        assert nxt.fence > lease.fence


def test_explicit_suspend_makes_the_key_recoverable(server: Server) -> None:
    """suspend() without a with-block does the same."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0)
    assert lease.suspend().end == "suspended"
    nxt = client.acquire("session:1", ttl=5.0)
    assert nxt.recovered and nxt.previous is not None and nxt.previous.end == "suspended"
    nxt.release()


def test_renewal_keeps_a_short_lease_alive(server: Server) -> None:
    """A lease held for several TTLs stays valid: it renews in the background."""
    client = leasehold.Client(server.address)
    with client.acquire("session:1", ttl=0.6) as lease:
        first_expiry = lease.server_expires_at_ms
        time.sleep(1.5)
        assert lease.is_valid() and not lease.lost.is_set()
        assert lease.gate() == lease.fence
        assert lease.server_expires_at_ms > first_expiry
        with pytest.raises(leasehold.Busy):
            client.acquire("session:1", ttl=1.0)


def test_a_dropped_lease_is_suspended(server: Server) -> None:
    """A lease dropped without release stops renewing and suspends its term."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0, owner="dropped")
    fence = lease.fence
    del lease
    gc.collect()
    nxt = client.acquire("session:1", ttl=5.0, wait=3.0)
    assert nxt.previous is not None
    assert (nxt.previous.fence, nxt.previous.end) == (fence, "suspended")
    nxt.release()


def test_server_refusals_map_to_the_hierarchy(server: Server) -> None:
    """Malformed input is InvalidArgument; a stale fence check is LeaseLost
    with the reason; an unreachable server is Unavailable."""
    client = leasehold.Client(server.address)
    with pytest.raises(leasehold.InvalidArgument):
        client.acquire("", ttl=1.0)
    with pytest.raises(leasehold.InvalidArgument):
        client.acquire("session:1", ttl=0.05)  # below the 100 ms minimum
    with pytest.raises(leasehold.InvalidArgument):
        client.acquire("session:1", ttl=1.0, renew_every=2.0)  # client-side timing check
    first = client.acquire("session:1", ttl=5.0)
    first.release()
    second = client.acquire("session:1", ttl=5.0)
    assert client.check("session:1", second.fence) == second.fence
    with pytest.raises(leasehold.LeaseLost) as caught:
        client.check("session:1", first.fence)
    assert caught.value.reason == "superseded"
    assert caught.value.superseded_by == second.fence
    second.release()
    server.stop()
    with pytest.raises(leasehold.Unavailable):
        leasehold.Client(server.address).acquire("session:2", ttl=1.0)


def test_a_storage_fenced_gate_of_a_fresh_lease_needs_no_round_trip(server: Server) -> None:
    """As in the async twin: answered with the server frozen while fresh;
    asks the server once a renewal went unanswered."""
    client = leasehold.Client(server.address)
    with client.acquire("session:1", ttl=10.0, renew_every=0.3, rpc_timeout=0.3) as lease:
        server.pause()
        try:
            assert lease.gate(storage_fenced=True) == lease.fence
            with pytest.raises(leasehold.Unavailable):
                lease.gate()
            assert wait_until(lambda: lease._core.renewal_failing, 3.0)
            assert lease.is_valid()
            with pytest.raises(leasehold.Unavailable):
                lease.gate(storage_fenced=True)
        finally:
            server.resume()
        assert wait_until(lambda: not lease._core.renewal_failing, 3.0)
        server.pause()
        try:
            assert lease.gate(storage_fenced=True) == lease.fence
        finally:
            server.resume()
    client.close()


def test_loss_when_the_server_is_frozen_past_the_ttl(server: Server) -> None:
    """SIGSTOP past the TTL: is_valid() turns false before the server's expiry,
    lost is set and gate() raises; after SIGCONT the key goes to a new holder
    with a higher fence and the old lease's release is refused."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=0.5, owner="old")
    assert lease.is_valid()
    server.pause()
    try:
        assert lease.lost.wait(timeout=3.0), "lost was never set"
        noticed_ms = time.time() * 1000
        # The server would not grant the key again before its expiry.
        assert noticed_ms < lease.server_expires_at_ms
        assert not lease.is_valid()
        with pytest.raises(leasehold.LeaseLost) as caught:
            lease.gate()  # local check: no round trip to the frozen server
        assert caught.value.reason == "deadline"
        # Stay frozen until the server's own expiry has passed.
        wait_until(lambda: time.time() * 1000 > lease.server_expires_at_ms + 200, 3.0)
    finally:
        server.resume()
    other = leasehold.Client(server.address)
    nxt = other.acquire("session:1", ttl=5.0, wait=5.0, owner="new")
    assert nxt.fence > lease.fence
    assert nxt.recovered and nxt.previous is not None and nxt.previous.end == "expired"
    with pytest.raises(leasehold.LeaseLost) as refused:
        lease.release()
    assert refused.value.final
    assert not lease.is_valid() and lease.lost.is_set()
    assert other.check("session:1", nxt.fence) == nxt.fence
    nxt.release()


def test_a_client_created_before_fork_works_in_the_child(server: Server) -> None:
    """The channel is per process: the child opens its own and can hold leases."""
    client = leasehold.Client(server.address)
    client.acquire("session:parent", ttl=5.0).release()
    held = client.acquire("session:held", ttl=5.0)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            signal.alarm(20)
            # A lease does not cross fork: its renewal stayed in the parent.
            assert not held.is_valid()
            try:
                held.gate()
                code = 3
            except leasehold.LeaseLost as err:
                assert err.reason == "forked"
                with client.acquire("session:child", ttl=5.0, owner="child") as lease:
                    lease.gate()
                    code = 0 if lease.fence >= 1 else 1
        except BaseException:
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert held.gate() == held.fence
    held.release()
    # The parent's channel still works, and the child's term was released.
    lease = client.acquire("session:child", ttl=5.0)
    assert lease.previous is not None and lease.previous.owner == "child"
    assert lease.previous.end == "released"
    lease.release()


def test_tool_calls_run_once_per_id_within_a_turn_and_across_turns(server: Server) -> None:
    """A duplicate call id inside a batch and in a later turn runs its side
    effect once; the stored outcome comes back in the provider's order."""
    client = leasehold.Client(server.address)
    effects: list[str] = []

    def runner(invocation: ToolInvocation) -> str:
        effects.append(invocation.call.call_id)
        assert invocation.fence == lease.fence
        assert invocation.idempotency_key
        if invocation.call.name == "fail":
            raise ValueError("no such file")
        return f"ran {invocation.call.call_id}"

    with client.acquire("session:1", ttl=5.0) as lease:
        turn1 = [
            ToolCallRequest("call_1", "shell"),
            ToolCallRequest("call_2", "fail"),
            ToolCallRequest("call_1", "shell"),
        ]
        results = lease.run_tool_calls(turn1, runner)
        assert effects == ["call_1", "call_2"]
        assert [(r.call_id, r.state, r.reused) for r in results] == [
            ("call_1", "succeeded", False),
            ("call_2", "failed", False),
            ("call_1", "succeeded", True),
        ]
        assert results[0].result == b"ran call_1"
        assert b"no such file" in results[1].result
        turn2 = [ToolCallRequest("call_3", "shell"), ToolCallRequest("call_1", "shell")]
        results = lease.run_tool_calls(turn2, runner)
        assert effects == ["call_1", "call_2", "call_3"]
        assert [(r.call_id, r.reused, r.result) for r in results] == [
            ("call_3", False, b"ran call_3"),
            ("call_1", True, b"ran call_1"),
        ]
        assert lease.unsettled_tool_calls_list() == []


def test_a_reused_id_runs_again_in_a_new_turn_and_once_within_it(server: Server) -> None:
    """With ``turn``, an id reused in a new turn runs its side effect again
    (with its own idempotency key); a duplicate within the turn runs once."""
    client = leasehold.Client(server.address)
    effects: list[tuple[str, str, str]] = []

    def runner(inv: ToolInvocation) -> str:
        effects.append((inv.turn, inv.call.call_id, inv.idempotency_key))
        return f"{inv.turn}:{inv.call.call_id}"

    with client.acquire("session:t", ttl=5.0) as lease:
        call_0 = ToolCallRequest("call_0", "shell")
        first = lease.run_tool_calls([call_0], runner, turn="t1")
        second = lease.run_tool_calls([call_0, call_0], runner, turn="t2")
        again = lease.run_tool_calls([call_0], runner, turn="t2")
        assert [(t, c) for t, c, _ in effects] == [("t1", "call_0"), ("t2", "call_0")]
        assert effects[0][2] != effects[1][2]
        assert effects[1][2] == str(
            uuid.uuid5(uuid.UUID("ab524bdc-58dc-56d8-b437-c4cf5ed10325"), "session:t\0t2\0call_0")
        )
        assert [(r.result, r.reused) for r in first] == [(b"t1:call_0", False)]
        assert [(r.result, r.reused) for r in second] == [
            (b"t2:call_0", False),
            (b"t2:call_0", True),
        ]
        assert [(r.result, r.reused) for r in again] == [(b"t2:call_0", True)]
        known = lease.begin_tool_calls([call_0], turn="t2")
        assert known.duplicate and known.calls[0].turn == "t2"
        assert known.calls[0].idempotency_key == effects[1][2], "the server's key"


def test_across_turns_refuses_an_id_from_an_earlier_turn(server: Server) -> None:
    """``across_turns`` reuses the outcome of an id any earlier turn declared
    instead of running it; so does a run that names no turn."""
    client = leasehold.Client(server.address)
    ran: list[str] = []

    def runner(inv: ToolInvocation) -> str:
        ran.append(f"{inv.turn}:{inv.call.call_id}")
        return inv.turn

    with client.acquire("session:a", ttl=5.0) as lease:
        lease.run_tool_calls([ToolCallRequest("call_0", "x")], runner, turn="t1")
        results = lease.run_tool_calls(
            [ToolCallRequest("call_0", "x"), ToolCallRequest("call_1", "x")],
            runner,
            turn="t2",
            across_turns=True,
        )
        assert ran == ["t1:call_0", "t2:call_1"]
        assert [(r.call_id, r.result, r.reused) for r in results] == [
            ("call_0", b"t1", True),
            ("call_1", b"t2", False),
        ]
        begun = lease.begin_tool_calls(
            [ToolCallRequest("call_1", "x")], turn="t3", across_turns=True
        )
        assert begun.duplicate and [c.turn for c in begun.calls] == ["t2"]
        no_turn = lease.run_tool_calls([ToolCallRequest("call_1", "x")], runner)
        assert no_turn[0].reused and len(ran) == 2


def test_settling_an_id_begun_in_two_turns_names_the_turn(server: Server) -> None:
    """An id running in two turns is settled by naming its turn; without
    one the server refuses (InvalidArgument) and the lease stays valid."""
    client = leasehold.Client(server.address)
    with client.acquire("session:s", ttl=5.0) as lease:
        for turn in ("t1", "t2"):
            begun = lease.begin_tool_calls([ToolCallRequest("call_0", "x")], turn=turn)
            assert not begun.duplicate and begun.calls[0].turn == turn
        with pytest.raises(leasehold.InvalidArgument):
            lease.settle_tool_call("call_0", "unknown")
        assert lease.is_valid(), "a refused settle is about the call, not the lease"
        record = lease.settle_tool_call("call_0", "succeeded", b"done", turn="t2")
        assert (record.turn, record.state, record.result) == ("t2", "succeeded", b"done")
        with pytest.raises(leasehold.NotFound):
            lease.settle_tool_call("call_0", "unknown", turn="t9")
        assert lease.is_valid()
        left = lease.unsettled_tool_calls_list()
        assert [(c.call_id, c.turn) for c in left] == [("call_0", "t1")]
        lease.settle_tool_call("call_0", "unknown", turn="t1")
        with pytest.raises(leasehold.InvalidArgument):
            lease.run_tool_calls([ToolCallRequest("c", "x")], lambda inv: b"", turn="bad\nturn")


def test_a_recoverer_sees_and_settles_calls_left_running(server: Server) -> None:
    """Calls begun and never settled are counted at the next grant, listed,
    and settled by the recoverer; a rerun then reuses the settled outcome."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0)
    begun = lease.begin_tool_calls(
        [ToolCallRequest("call_a", "slow"), ToolCallRequest("call_b", "x")]
    )
    assert not begun.duplicate and [c.state for c in begun.calls] == ["running", "running"]
    lease.settle_tool_call("call_b", "succeeded", b"ok")
    lease.suspend()
    nxt = client.acquire("session:1", ttl=5.0)
    assert nxt.recovered and nxt.unsettled_tool_calls == 1
    left = nxt.unsettled_tool_calls_list()
    assert [(c.call_id, c.fence) for c in left] == [("call_a", lease.fence)]
    record = nxt.settle_tool_call("call_a", "unknown")
    assert record.state == "unknown" and record.settled_fence == nxt.fence
    ran: list[str] = []
    results = nxt.run_tool_calls(
        [ToolCallRequest("call_a", "slow")], lambda inv: ran.append("x") or ToolOutcome("succeeded")
    )
    assert ran == [] and results[0].state == "unknown" and results[0].reused
    with pytest.raises(leasehold.InvalidArgument):
        nxt.settle_tool_call("call_a", "running")
    nxt.release()


def test_a_lost_lease_runs_no_tool(server: Server) -> None:
    """run_tool_calls refuses to start when the lease is not valid."""
    client = leasehold.Client(server.address)
    lease = client.acquire("session:1", ttl=5.0)
    lease.release()
    with pytest.raises(leasehold.LeaseLost):
        lease.run_tool_calls([ToolCallRequest("call_1", "x")], lambda inv: b"")


UNHEALTHY = [
    {"role": "user", "content": "list files"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    },
    {"role": "user", "content": "and?"},
]


def test_transcripts_are_checked_and_repaired(server: Server) -> None:
    """check_transcript finds the unanswered call; repair_transcript inserts a
    result and reports the action."""
    client = leasehold.Client(server.address)
    report = client.check_transcript(UNHEALTHY)
    assert not report.healthy
    assert report.format == "openai-chat" and report.messages == 3
    assert [(f.kind, f.call_id) for f in report.findings] == [("missing", "call_1")]
    assert "call_1" in report.findings[0].provider_error
    repair = client.repair_transcript(UNHEALTHY)
    assert repair.healthy and not repair.unrecoverable
    assert any(a.get("action") == "inserted" for a in repair.actions)
    assert [m.get("tool_call_id") for m in repair.messages if m["role"] == "tool"] == ["call_1"]
    assert client.check_transcript(repair.transcript).healthy
    with pytest.raises(leasehold.InvalidArgument):
        client.check_transcript("this is not json")


def test_a_short_freeze_makes_the_lease_unsure_then_valid_again(server: Server) -> None:
    """A freeze past the local deadline but short of the server's expiry sets
    lost; the next successful renewal (same fence) clears it again."""
    client = leasehold.Client(server.address)
    with client.acquire("session:1", ttl=1.5, safety_margin=0.5, renew_every=0.3) as lease:
        server.pause()
        try:
            assert lease.lost.wait(timeout=3.0)
            assert not lease.is_valid()
            assert time.time() * 1000 < lease.server_expires_at_ms - 200
        finally:
            server.resume()
        assert wait_until(lambda: not lease.lost.is_set(), 3.0), "never valid again"
        assert lease.is_valid()
        assert lease.gate() == lease.fence


def test_many_threads_share_one_client(server: Server) -> None:
    """Twenty threads hold sessions through one client at once; each gate's
    answer reaches its own caller over the shared stream."""
    client = leasehold.Client(server.address)
    errors: list[BaseException] = []

    def session(i: int) -> None:
        try:
            with client.acquire(f"session:{i}", ttl=0.6) as lease:
                for _ in range(5):
                    assert lease.gate() == lease.fence
                    time.sleep(0.1)
                assert lease.is_valid()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert errors == []


def test_a_lease_survives_a_server_restart(server: Server) -> None:
    """The stream breaks when the server restarts; renewals reopen it and the
    lease stays valid with the same fence (a restart gives live terms their
    full TTL again)."""
    client = leasehold.Client(server.address)
    with client.acquire("session:1", ttl=3.0) as lease:
        server.restart()
        time.sleep(1.5)  # several renewals after the restart
        assert lease.is_valid()
        assert lease.gate() == lease.fence
        with pytest.raises(leasehold.Busy):
            leasehold.Client(server.address).acquire("session:1", ttl=1.0)


def _ledger_counts(binary: str | None, tmp_path: pathlib.Path) -> tuple[int, int, int, int, int]:
    metrics_at = metrics_address()
    server = Server(tmp_path / "l.db", extra=("--metrics-listen", metrics_at), binary=binary)
    try:
        with leasehold.Client(server.address) as client:
            protocol = client.server_info().protocol
            with client.acquire("session:counted", ttl=5.0) as lease:
                calls = [ToolCallRequest("a", "t"), ToolCallRequest("b", "t")]
                results = lease.run_tool_calls(calls, lambda inv: "out")
                assert [r.state for r in results] == ["succeeded", "succeeded"]
                again = lease.run_tool_calls(calls, lambda inv: pytest.fail("ran twice"))
                assert [r.reused for r in again] == [True, True]
        counts = [
            answered(metrics_at, rpc)
            for rpc in (
                "BeginToolCalls",
                "SettleToolCall",
                "Session.BeginToolCalls",
                "Session.SettleToolCall",
            )
        ]
        return (protocol, *counts)  # type: ignore[return-value]
    finally:
        server.stop()


def test_the_ledger_goes_on_the_session_stream(tmp_path: pathlib.Path) -> None:
    """Against a server of protocol revision 2, begin and settle travel on
    the shared Session stream: the server answers no unary ledger call."""
    assert _ledger_counts(None, tmp_path) == (2, 0, 0, 2, 2)


@pytest.mark.skipif(
    not os.environ.get("LEASEHOLD_PREV_BIN"),
    reason="needs a revision-1 server (LEASEHOLD_PREV_BIN)",
)
def test_the_ledger_falls_back_to_unary_calls_on_an_older_server(tmp_path: pathlib.Path) -> None:
    """A server of revision 1 gets unary BeginToolCalls and SettleToolCall."""
    assert _ledger_counts(os.environ["LEASEHOLD_PREV_BIN"], tmp_path) == (1, 2, 2, 0, 0)


def _acquire_counts(tmp_path: pathlib.Path, use: Any) -> list[int]:
    """Runs ``use(address)`` against a server with metrics and returns how
    many Acquire (unary), Session.Acquire and Session.Release it answered."""
    metrics_at = metrics_address()
    server = Server(tmp_path / "a.db", extra=("--metrics-listen", metrics_at))
    try:
        use(server.address)
        return [
            answered(metrics_at, rpc) for rpc in ("Acquire", "Session.Acquire", "Session.Release")
        ]
    finally:
        server.stop()


def test_an_acquire_that_does_not_wait_goes_on_the_session_stream(tmp_path: pathlib.Path) -> None:
    """A grant without a wait is an operation of the shared stream (with the
    same errors); one that waits is a unary call, so waiters never hold the
    stream's window ahead of the renewals sharing it."""

    def use(address: str) -> None:
        with leasehold.Client(address) as client:
            with client.acquire("session:fresh", ttl=5.0):
                with pytest.raises(leasehold.Busy) as busy:
                    client.acquire("session:fresh", ttl=5.0, owner="other")
                assert busy.value.fence >= 1
            with client.acquire("session:waited", ttl=5.0, wait=1.0):
                pass

    # Two fresh Acquires (one refused busy), one waited; two releases.
    assert _acquire_counts(tmp_path, use) == [1, 2, 2]


def test_an_async_acquire_that_does_not_wait_goes_on_the_session_stream(
    tmp_path: pathlib.Path,
) -> None:
    async def go(address: str) -> None:
        async with leasehold.AsyncClient(address) as client:
            async with client.acquire("session:fresh", ttl=5.0) as lease:
                assert not lease.recovered
            async with client.acquire("session:fresh", ttl=5.0) as again:
                assert again.previous is not None and again.previous.end == "released"
            async with client.acquire("session:waited", ttl=5.0, wait=1.0):
                pass

    assert _acquire_counts(tmp_path, lambda address: asyncio.run(go(address))) == [1, 2, 3]
