"""The asyncio client against a real server."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import time

import pytest
from conftest import Server

import leasehold
from leasehold import ToolCallRequest, ToolInvocation


async def test_busy_names_the_holder(server: Server) -> None:
    """A second acquire of a held key raises Busy with the holder's details."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=5.0, owner="graph-a") as lease:
        with pytest.raises(leasehold.Busy) as caught:
            await client.acquire("session:1", ttl=5.0)
        assert caught.value.holder == "graph-a"
        assert caught.value.fence == lease.fence
        assert 0 < caught.value.remaining <= 5.0
    await client.close()


async def test_wait_and_fifo(server: Server) -> None:
    """Waiters queue and are granted in arrival order once the holder releases."""
    client = leasehold.AsyncClient(server.address)
    holder = await client.acquire("session:1", ttl=5.0)
    granted: list[str] = []

    async def wait_for(name: str) -> None:
        lease = await client.acquire("session:1", ttl=5.0, wait=10.0, owner=name)
        granted.append(name)
        await asyncio.sleep(0.05)
        await lease.release()

    tasks = []
    for name in ("first", "second", "third"):
        tasks.append(asyncio.create_task(wait_for(name)))
        await asyncio.sleep(0.15)
    started = time.monotonic()
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert granted == ["first", "second", "third"]
    assert time.monotonic() - started < 5
    await client.close()


async def test_a_replay_of_a_supplied_request_id_trusts_nothing_until_a_renewal(
    tmp_path: pathlib.Path,
) -> None:
    """The asyncio twin of the sync test: with every renewal refused, a replay
    of a caller-supplied request id is never valid."""
    # The acquires wait (a little), so that they are unary calls: an
    # Acquire without a wait goes on the Session stream, which this server
    # refuses.
    srv = Server(tmp_path / "db", extra=("--max-streams-per-connection", "0"))
    try:
        worker = leasehold.AsyncClient(srv.address)
        first = await worker.acquire("session:r", ttl=3.0, owner="w", request_id="R1", wait=0.01)
        late = leasehold.AsyncClient(srv.address)
        try:
            again = await late.acquire("session:r", ttl=3.0, owner="w", request_id="R1", wait=0.01)
        except leasehold.Unavailable:
            pass
        else:
            assert again.replayed and again.fence == first.fence
            assert not again.is_valid(), "a replayed grant of unknown age was trusted"
            with pytest.raises(leasehold.LeaseLost):
                await again.gate()
        await late.close()
        await worker.close()
    finally:
        srv.stop()


async def test_request_id_replay(server: Server) -> None:
    """The same owner and request id return the same live term, replayed."""
    client = leasehold.AsyncClient(server.address)
    lease = await client.acquire("session:1", ttl=5.0, owner="w", request_id="req-1")
    again = await client.acquire("session:1", ttl=5.0, owner="w", request_id="req-1")
    assert again.replayed and again.fence == lease.fence and again.is_valid()
    await again.release()
    with pytest.raises(leasehold.LeaseLost):
        await lease.gate()
    await client.close()


async def test_release_then_suspend_then_recover(server: Server) -> None:
    """Normal exit releases; an exception suspends; the next holder recovers."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=5.0, owner="a") as first:
        assert await first.gate() == first.fence
    assert not first.is_valid()
    with pytest.raises(KeyError):
        async with client.acquire("session:1", ttl=5.0, owner="b") as second:
            assert second.previous is not None and second.previous.end == "released"
            assert not second.recovered
            raise KeyError("crash")
    third = await client.acquire("session:1", ttl=5.0)
    assert third.recovered
    assert third.previous == leasehold.EndedTerm(
        second.fence, "b", "suspended", third.previous.ended_at if third.previous else 0
    )
    with pytest.raises(leasehold.LeaseLost):
        await second.release()
    assert (await third.suspend()).end == "suspended"
    await client.close()


async def test_renewal_keeps_a_short_lease_alive(server: Server) -> None:
    """A lease held for several TTLs stays valid."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=0.6) as lease:
        await asyncio.sleep(1.5)
        assert lease.is_valid() and not lease.lost.is_set()
        assert await lease.gate() == lease.fence
    await client.close()


async def test_loss_cancels_the_scope_and_the_key_moves_on(server: Server) -> None:
    """SIGSTOP past the TTL: lost is set before the server's expiry, gate()
    raises, scope() cancels its block with LeaseLost; after SIGCONT a new
    holder gets a higher fence and the old release is refused."""
    client = leasehold.AsyncClient(server.address)
    lease = await client.acquire("session:1", ttl=0.5, owner="old")
    reached_the_end = False
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(leasehold.LeaseLost) as caught:
            async with lease.scope():
                await asyncio.sleep(5.0)  # a long model call
                reached_the_end = True
        assert not reached_the_end
        assert time.monotonic() - started < 2.0
        assert time.time() * 1000 < lease.server_expires_at_ms
        assert caught.value.reason == "deadline"
        assert lease.lost.is_set() and not lease.is_valid()
        with pytest.raises(leasehold.LeaseLost):
            await lease.gate()
        with pytest.raises(leasehold.LeaseLost):
            async with lease.scope():
                pytest.fail("a scope must not start on a lost lease")
        while time.time() * 1000 < lease.server_expires_at_ms + 200:
            await asyncio.sleep(0.05)
    finally:
        server.resume()
    other = leasehold.AsyncClient(server.address)
    nxt = await other.acquire("session:1", ttl=5.0, wait=5.0, owner="new")
    assert nxt.fence > lease.fence
    assert nxt.previous is not None and nxt.previous.end == "expired"
    with pytest.raises(leasehold.LeaseLost) as refused:
        await lease.release()
    assert refused.value.final
    await nxt.release()
    await client.close()
    await other.close()


async def test_a_scope_that_finishes_in_time_returns_normally(server: Server) -> None:
    """scope() does not disturb a block that ends while the lease is held."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=0.5) as lease:
        async with lease.scope() as held:
            await asyncio.sleep(0.6)
            assert held is lease
        assert lease.is_valid()
    await client.close()


async def test_tool_calls_run_concurrently_and_once_per_id(server: Server) -> None:
    """New calls run concurrently; a duplicate id inside a batch and across
    turns runs its side effect once; results keep the provider's order."""
    client = leasehold.AsyncClient(server.address)
    effects: list[str] = []
    running = 0
    peak = 0

    async def runner(invocation: ToolInvocation) -> bytes:
        nonlocal running, peak
        effects.append(invocation.call.call_id)
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1
        if invocation.call.name == "fail":
            raise RuntimeError("exit status 2")
        return invocation.call.call_id.encode()

    async with client.acquire("session:1", ttl=5.0) as lease:
        turn1 = [
            ToolCallRequest("call_0", "a"),
            ToolCallRequest("call_1", "fail"),
            ToolCallRequest("call_0", "a"),
            ToolCallRequest("call_2", "b"),
        ]
        results = await lease.run_tool_calls(turn1, runner)
        assert sorted(effects) == ["call_0", "call_1", "call_2"]
        assert peak == 3
        assert [(r.call_id, r.state, r.reused) for r in results] == [
            ("call_0", "succeeded", False),
            ("call_1", "failed", False),
            ("call_0", "succeeded", True),
            ("call_2", "succeeded", False),
        ]
        # The model reuses call_0 in the next turn: the ledger has it already.
        results = await lease.run_tool_calls(
            [ToolCallRequest("call_0", "a"), ToolCallRequest("call_3", "c")], runner
        )
        assert sorted(effects) == ["call_0", "call_1", "call_2", "call_3"]
        assert [(r.call_id, r.reused, r.result) for r in results] == [
            ("call_0", True, b"call_0"),
            ("call_3", False, b"call_3"),
        ]
        peak = 0
        await lease.run_tool_calls(
            [ToolCallRequest(f"call_x{i}", "n") for i in range(4)], runner, concurrency=2
        )
        assert peak == 2
    await client.close()


async def test_turns_scope_call_ids(server: Server) -> None:
    """asyncio: a reused id runs again in a new turn and once within it;
    across_turns reuses an earlier turn's outcome; settle names the turn."""
    client = leasehold.AsyncClient(server.address)
    ran: list[str] = []

    async def runner(invocation: ToolInvocation) -> str:
        ran.append(f"{invocation.turn}:{invocation.call.call_id}")
        return invocation.turn

    call_0 = ToolCallRequest("call_0", "a")
    async with client.acquire("session:t", ttl=5.0) as lease:
        await lease.run_tool_calls([call_0], runner, turn="t1")
        second = await lease.run_tool_calls([call_0, call_0], runner, turn="t2")
        assert ran == ["t1:call_0", "t2:call_0"]
        assert [(r.result, r.reused) for r in second] == [(b"t2", False), (b"t2", True)]
        across = await lease.run_tool_calls([call_0], runner, turn="t3", across_turns=True)
        assert len(ran) == 2 and across[0].reused and across[0].result == b"t1"
        with pytest.raises(leasehold.InvalidArgument):
            await lease.settle_tool_call("call_0", "unknown")
        record = await lease.settle_tool_call("call_0", "unknown", turn="t2")
        assert (record.turn, record.result) == ("t2", b"t2"), "the first outcome won"
        assert lease.is_valid()
    await client.close()


async def test_losing_the_lease_cancels_running_tools(server: Server) -> None:
    """When the lease is lost mid-turn the runners are cancelled and their
    calls stay recorded as running for the recoverer."""
    client = leasehold.AsyncClient(server.address)
    lease = await client.acquire("session:1", ttl=0.5)
    cancelled: list[str] = []

    async def runner(invocation: ToolInvocation) -> bytes:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(invocation.call.call_id)
            raise
        return b""

    turn = asyncio.create_task(
        lease.run_tool_calls(
            [ToolCallRequest("call_1", "slow"), ToolCallRequest("call_2", "slow")], runner
        )
    )
    await asyncio.sleep(0.2)
    server.pause()
    try:
        with pytest.raises(leasehold.LeaseLost):
            await asyncio.wait_for(turn, 5)
        assert sorted(cancelled) == ["call_1", "call_2"]
        while time.time() * 1000 < lease.server_expires_at_ms + 200:
            await asyncio.sleep(0.05)
    finally:
        server.resume()
    nxt = await client.acquire("session:1", ttl=5.0, wait=5.0)
    assert nxt.recovered and nxt.unsettled_tool_calls == 2
    assert sorted(c.call_id for c in await nxt.unsettled_tool_calls_list()) == ["call_1", "call_2"]
    await nxt.release()
    await client.close()


async def test_transcripts(server: Server) -> None:
    """check_transcript and repair_transcript over the Transcripts service."""
    client = leasehold.AsyncClient(server.address)
    items = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "call_9", "name": "ls", "arguments": "{}"},
        {"type": "message", "role": "user", "content": "and?"},
    ]
    report = await client.check_transcript(items)
    assert not report.healthy and report.format == "openai-responses"
    assert report.findings[0].call_id == "call_9"
    assert "No tool output found for function call call_9" in report.findings[0].provider_error
    repair = await client.repair_transcript(items)
    assert repair.healthy
    assert (await client.check_transcript(repair.messages)).healthy
    await client.close()


FORK_SCRIPT = """
import asyncio, os, signal, sys
import leasehold

client = leasehold.AsyncClient(sys.argv[1])  # made before fork, as a pre-fork master does


async def hold(key, owner):
    async with client.acquire(key, ttl=5.0, owner=owner) as lease:
        return await lease.gate()


async def parent_then_close():
    fence = await hold("session:parent", "parent")
    await client.close()
    return fence


if sys.argv[2] == "used":
    assert asyncio.run(parent_then_close()) >= 1
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    try:
        os._exit(0 if asyncio.run(hold("session:child-" + sys.argv[2], "child")) >= 1 else 1)
    except BaseException:
        os._exit(2)
_, status = os.waitpid(pid, 0)
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 3)
"""


@pytest.mark.parametrize("parent", ["unused", "used"])
def test_an_async_client_created_before_fork_works_in_the_child(
    server: Server, parent: str
) -> None:
    """An AsyncClient made before fork opens its own channel in the child,
    whether the parent never opened one or closed it first. (grpc.aio cannot
    fork with a channel object alive, so this runs in a fresh interpreter
    rather than in pytest's, which holds earlier tests' channels.)"""
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, server.address, parent], timeout=60, check=False
    )
    assert done.returncode == 0

    async def after() -> leasehold.EndedTerm | None:
        client = leasehold.AsyncClient(server.address)
        lease = await client.acquire(f"session:child-{parent}", ttl=5.0)
        previous = lease.previous
        await lease.release()
        await client.close()
        return previous

    previous = asyncio.run(after())
    assert previous is not None and (previous.owner, previous.end) == ("child", "released")


async def test_a_short_freeze_makes_the_lease_unsure_then_valid_again(server: Server) -> None:
    """As in the sync twin: lost is set at the local deadline and cleared by
    the next successful renewal of the same term."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=1.5, safety_margin=0.5, renew_every=0.3) as lease:
        server.pause()
        try:
            await asyncio.wait_for(lease.lost.wait(), 3.0)
            assert not lease.is_valid()
            assert time.time() * 1000 < lease.server_expires_at_ms - 200
        finally:
            server.resume()
        for _ in range(300):
            if not lease.lost.is_set():
                break
            await asyncio.sleep(0.01)
        assert lease.is_valid() and not lease.lost.is_set()
        assert await lease.gate() == lease.fence
    await client.close()


async def test_a_storage_fenced_gate_of_a_fresh_lease_needs_no_round_trip(server: Server) -> None:
    """gate(storage_fenced=True) of a fresh lease answers with the server
    frozen; gate() still asks it; once a renewal goes unanswered the
    storage-fenced gate asks the server too, until a renewal succeeds."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=10.0, renew_every=0.3, rpc_timeout=0.3) as lease:
        server.pause()
        try:
            assert await lease.gate(storage_fenced=True) == lease.fence
            with pytest.raises(leasehold.Unavailable):
                await lease.gate()
            for _ in range(300):
                if lease._core.renewal_failing:
                    break
                await asyncio.sleep(0.01)
            assert lease.is_valid()
            with pytest.raises(leasehold.Unavailable):
                await lease.gate(storage_fenced=True)
        finally:
            server.resume()
        for _ in range(300):
            if not lease._core.renewal_failing:
                break
            await asyncio.sleep(0.01)
        server.pause()
        try:
            assert await lease.gate(storage_fenced=True) == lease.fence
        finally:
            server.resume()
    await client.close()


async def test_many_leases_pipeline_over_one_stream(server: Server) -> None:
    """Thirty sessions held at once by one client renew, gate and release
    over its one Session stream, each answer reaching its own caller."""
    client = leasehold.AsyncClient(server.address)

    async def session(i: int) -> tuple[int, int]:
        async with client.acquire(f"session:{i}", ttl=0.6) as lease:
            fences = set()
            for _ in range(5):
                fences.add(await lease.gate())
                await asyncio.sleep(0.1)
            assert fences == {lease.fence} and lease.is_valid()
            return i, lease.fence

    done = await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(30))), 20)
    assert sorted(i for i, _ in done) == list(range(30))
    assert len({fence for _, fence in done}) == 30  # fences are global and rise
    await client.close()


async def test_a_lease_survives_a_server_restart(server: Server) -> None:
    """As in the sync twin: the async stream is reopened after a restart."""
    client = leasehold.AsyncClient(server.address)
    async with client.acquire("session:1", ttl=3.0) as lease:
        await asyncio.get_running_loop().run_in_executor(None, server.restart)
        await asyncio.sleep(1.5)
        assert lease.is_valid()
        assert await lease.gate() == lease.fence
    await client.close()


async def test_a_dropped_async_lease_is_suspended(server: Server) -> None:
    """An AsyncLease collected without release stops renewing and suspends."""
    import gc

    client = leasehold.AsyncClient(server.address)
    lease = await client.acquire("session:1", ttl=5.0, owner="dropped")
    fence = lease.fence
    del lease
    gc.collect()
    nxt = await client.acquire("session:1", ttl=5.0, wait=3.0)
    assert nxt.previous is not None
    assert (nxt.previous.fence, nxt.previous.end) == (fence, "suspended")
    await nxt.release()
    await client.close()


SHUTDOWN_SCRIPT = r"""
import asyncio, sys
import leasehold

address, case = sys.argv[1], sys.argv[2]

async def main() -> None:
    client = leasehold.AsyncClient(address, owner="w")
    held = await client.acquire(f"shutdown:{case}:held", ttl=0.9, renew_every=0.1)
    # A lost lease: its term is ended through a second handle (a replay).
    lost = await client.acquire(f"shutdown:{case}:lost", ttl=0.9, renew_every=0.1, request_id="r")
    twin = await client.acquire(f"shutdown:{case}:lost", ttl=0.9, renew_every=0.1, request_id="r")
    await twin.release()
    await asyncio.wait_for(lost.lost.wait(), 5)
    assert held.is_valid()
    if case == "close":
        # Closed with a lease held: its renewals must stop quietly.
        await client.close()
        await asyncio.sleep(0.4)
    elif case == "close-midway":
        # Closed while a renewal is on the wire (renew_every is 100 ms).
        await asyncio.sleep(0.1)
        await client.close()
    # "end": the event loop ends with the lease held and the client open.

asyncio.run(main(), debug=True)
"""


@pytest.mark.parametrize("case", ["end", "close", "close-midway"])
def test_shutdown_with_leases_held_or_lost_prints_nothing(server: Server, case: str) -> None:
    """Ending the event loop, or closing the client, while leases are held
    (and after one was lost) leaves no unretrieved task exception and no
    warning: the whole run under ``-W error``, ``-X dev`` and asyncio debug
    mode writes nothing to stderr."""
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", SHUTDOWN_SCRIPT, server.address, case],
        timeout=60,
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
