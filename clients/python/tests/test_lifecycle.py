"""The ownership lifecycle (#15) against a real server: lock-delay,
handoff, quarantine, history and watch, sync and asyncio."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, wait_until

import leasehold


def crash_holding(server: Server, key: str, **acquire: object) -> int:
    """Acquires ``key`` in a child process that then dies without releasing
    (``os._exit``: no finalizer, no suspend), as a crashed worker; returns the
    fence. The term expires at its TTL."""
    args = ", ".join(f"{k}={v!r}" for k, v in acquire.items())
    code = (
        "import os, leasehold\n"
        f"lease = leasehold.Client({server.address!r}).acquire({key!r}, {args})\n"
        "print(lease.fence, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    return int(out.stdout.strip())


def test_lock_delay_refuses_with_reserved_after_expiry_and_not_after_release(
    server: Server,
) -> None:
    """After a holder with a lock-delay dies, its key is Reserved (reason
    lock_delay, the dead term's fence, time left) even though its TTL ran
    out; a waiter gets it once the delay ends; a clean release skips it."""
    client = leasehold.Client(server.address)
    fence = crash_holding(server, "s:delay", ttl=0.3, lock_delay=1.5, owner="dead")
    wait_until(lambda: False, 0.5)  # the TTL (0.3 s) runs out
    with pytest.raises(leasehold.Reserved) as caught:
        client.acquire("s:delay", ttl=5.0)
    err = caught.value
    assert isinstance(err, leasehold.Busy)
    assert err.reason == "lock_delay" and err.fence == fence and err.holder == ""
    assert 0 < err.remaining <= 1.5
    state = client.get("s:delay")
    assert state.lease is None and state.reservation is not None
    assert state.reservation.kind == "lock_delay" and state.reservation.after_fence == fence
    # A waiter keeps its place and gets the key when the delay is over.
    with client.acquire("s:delay", ttl=5.0, wait=5.0) as lease:
        assert lease.previous is not None and lease.previous.end == "expired"
    # Released cleanly: no lock-delay.
    client.acquire("s:delay", ttl=5.0, lock_delay=5.0).release()
    client.acquire("s:delay", ttl=5.0).release()


def test_hand_off_goes_to_the_successor_ahead_of_a_waiter(server: Server) -> None:
    """hand_off keeps the key for the named owner: others are Reserved (reason
    handoff, successor named), a waiter stays queued, the successor gets it
    at once with previous.handed_off, and the waiter gets it after."""
    client = leasehold.Client(server.address)
    worker = client.acquire("s:ho", ttl=5.0, owner="worker")
    waited: list[leasehold.Lease] = []
    waiter = threading.Thread(
        target=lambda: waited.append(client.acquire("s:ho", ttl=5.0, wait=10.0, owner="waiter"))
    )
    waiter.start()
    time.sleep(0.2)  # the waiter is queued
    ended = worker.hand_off("ui", within=5.0)
    assert ended.end == "released" and ended.fence == worker.fence
    with pytest.raises(leasehold.Reserved) as caught:
        client.acquire("s:ho", ttl=5.0, owner="someone-else")
    assert caught.value.reason == "handoff" and caught.value.successor == "ui"
    reservation = client.get("s:ho").reservation
    assert reservation is not None and reservation.kind == "handoff"
    assert reservation.successor == "ui" and reservation.after_fence == worker.fence
    assert not waited
    ui = client.acquire("s:ho", ttl=5.0, owner="ui")
    assert ui.previous is not None
    assert ui.previous.handed_off and ui.previous.end == "released"
    assert ui.previous.fence == worker.fence
    ui.release()
    waiter.join(10)
    assert len(waited) == 1 and waited[0].owner == "waiter"
    assert waited[0].previous is not None and not waited[0].previous.handed_off
    waited[0].release()


def test_a_suspending_hand_off_is_recovered_by_the_successor(server: Server) -> None:
    """hand_off(suspend=True): the successor's previous says suspended and handed off."""
    client = leasehold.Client(server.address)
    client.acquire("s:hos", ttl=5.0).hand_off("ui", within=5.0, suspend=True)
    with client.acquire("s:hos", ttl=5.0, owner="ui") as lease:
        assert lease.recovered
        assert lease.previous is not None and lease.previous.end == "suspended"
        assert lease.previous.handed_off


def test_quarantine_after_k_failed_terms_listed_forced_and_lifted(server: Server) -> None:
    """Two suspensions in a row with max_recoveries=2 quarantine the key:
    Acquire raises Quarantined (failures 2), get and list_keys(quarantined)
    show it and recoverable does not, force still acquires, unquarantine
    lets everyone in again."""
    client = leasehold.Client(server.address)
    for _ in range(2):
        client.acquire("s:q", ttl=5.0, max_recoveries=2).suspend()
    with pytest.raises(leasehold.Quarantined) as caught:
        client.acquire("s:q", ttl=5.0, max_recoveries=2)
    assert caught.value.failures == 2 and caught.value.key == "s:q"
    assert not isinstance(caught.value, leasehold.LeaseLost)
    state = client.get("s:q")
    assert state.quarantined and not state.recoverable
    listed = client.list_keys("s:", filter="quarantined")
    assert [k.key for k in listed.keys] == ["s:q"] and listed.keys[0].quarantined
    assert client.list_keys("s:", filter="recoverable").keys == []
    with client.acquire("s:q", ttl=5.0, force=True) as forced:
        assert forced.recovered
    lifted = client.unquarantine("s:q")
    assert lifted.key == "s:q" and not lifted.quarantined
    assert client.list_keys("s:", filter="quarantined").keys == []
    client.acquire("s:q", ttl=5.0).release()


def test_history_pages_newest_first_without_gaps_or_repeats(server: Server) -> None:
    """history(page_size=2) walks every ended term, newest first, through next_before."""
    client = leasehold.Client(server.address)
    fences = []
    for i in range(5):
        lease = client.acquire("s:h", ttl=5.0, owner=f"w{i}")
        fences.append(lease.fence)
        if i % 2:
            lease.suspend()
        else:
            lease.release()
    seen: list[leasehold.HistoryEntry] = []
    before: int | None = None
    pages = 0
    while True:
        page = client.history("s:h", page_size=2, before=before)
        pages += 1
        assert len(page.entries) <= 2
        seen.extend(page.entries)
        if page.next_before is None:
            break
        before = page.next_before
    assert pages == 3
    assert [e.fence for e in seen] == list(reversed(fences))
    assert [e.owner for e in seen] == [f"w{i}" for i in reversed(range(5))]
    assert [e.end for e in seen] == ["released", "suspended", "released", "suspended", "released"]
    assert all(e.ended_at_ms >= e.acquired_at_ms > 0 for e in seen)
    with pytest.raises(leasehold.NotFound):
        client.history("s:never")


def test_watch_sees_changes_in_order_and_resumes_exactly(server: Server) -> None:
    """A watch from now reports grants and releases in revision order; after
    it is closed, watching from next_revision continues with the next event
    (including those that happened meanwhile), none missed or repeated."""
    client = leasehold.Client(server.address)
    client.acquire("other:x", ttl=5.0).release()  # outside the prefix
    watch = client.watch(prefix="w:")
    start = watch.next_revision
    for i in range(3):
        with client.acquire(f"w:{i}", ttl=5.0, owner=f"o{i}"):
            pass
    got = [next(watch) for _ in range(4)]
    assert [(e.key, e.kind) for e in got] == [
        ("w:0", "granted"),
        ("w:0", "released"),
        ("w:1", "granted"),
        ("w:1", "released"),
    ]
    assert got[0].revision >= start
    assert [e.revision for e in got] == sorted(e.revision for e in got)
    assert got[0].owner == "o0" and got[0].fence == got[1].fence and got[0].at_ms > 0
    resume = watch.next_revision
    assert resume == got[-1].revision + 1
    watch.close()
    # Changes while nobody watches are delivered on resume.
    client.acquire("w:3", ttl=5.0).suspend()
    with client.watch(prefix="w:", start_revision=resume) as again:
        rest = [next(again) for _ in range(4)]
        assert again.next_revision == rest[-1].revision + 1
    assert [(e.key, e.kind) for e in rest] == [
        ("w:2", "granted"),
        ("w:2", "released"),
        ("w:3", "granted"),
        ("w:3", "suspended"),
    ]
    revisions = [e.revision for e in got + rest]
    assert revisions == sorted(set(revisions))
    assert rest[0].revision == resume


def test_watch_resumes_exactly_across_a_server_restart(server: Server) -> None:
    """A watch cut by a server restart ends (or raises Unavailable); watching
    again from its next_revision gets the next change, revisions continuing
    with no gap and no repeat (they are stored)."""
    client = leasehold.Client(server.address)
    watch = client.watch(prefix="r:")
    client.acquire("r:1", ttl=5.0).release()
    before = [next(watch), next(watch)]
    server.restart()
    try:
        for extra in watch:
            pytest.fail(f"an event after the restart on the old stream: {extra}")
    except leasehold.Unavailable:
        pass
    resume = watch.next_revision
    assert resume == before[-1].revision + 1
    client.acquire("r:2", ttl=5.0, wait=5.0).release()
    with client.watch(prefix="r:", start_revision=resume) as again:
        after = [next(again), next(again)]
    assert [(e.key, e.kind) for e in after] == [("r:2", "granted"), ("r:2", "released")]
    assert after[0].revision == resume


def test_a_fork_ends_an_open_watch_which_resumes_after(server: Server) -> None:
    """fork() ends the parent's open watch (no gRPC call may be in progress
    across fork): it raises Unavailable, and resuming from next_revision
    misses nothing; the child can watch on its own channel."""
    client = leasehold.Client(server.address)
    watch = client.watch(prefix="f:")
    client.acquire("f:1", ttl=5.0).release()
    first = next(watch)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            signal.alarm(20)
            with client.watch(prefix="f:", start_revision=first.revision) as mine:
                code = 0 if next(mine) == first else 3
        except BaseException as err:
            code = 2
            with open(os.environ.get("LH_CHILD_ERR", os.devnull), "w") as out:
                out.write(repr(err))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The buffered event (released) may still come; then the watch is over.
    with pytest.raises(leasehold.Unavailable):
        for event in watch:
            assert (event.key, event.kind) == ("f:1", "released")
    expected = [("f:2", "granted"), ("f:2", "released")]
    if watch.next_revision == first.revision + 1:  # the release was not yielded
        expected.insert(0, ("f:1", "released"))
    with client.watch(prefix="f:", start_revision=watch.next_revision) as again:
        client.acquire("f:2", ttl=5.0).release()
        got = [next(again) for _ in expected]
    assert [(e.key, e.kind) for e in got] == expected
    assert got[0].revision == watch.next_revision


def freeze(server: Server) -> None:
    """SIGSTOPs the server and waits until every thread of it has stopped
    (kill() returns before a thread running on another core is stopped)."""
    server.pause()

    def stopped() -> bool:
        with open(f"/proc/{server.process.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"

    assert wait_until(stopped, 5.0)


def test_watch_of_a_frozen_server_fails_in_time_instead_of_hanging(server: Server) -> None:
    """watch() waits for the server's first reply at most the client's
    timeout (sync and asyncio), rather than hanging on a frozen server."""
    client = leasehold.Client(server.address, timeout=0.5)
    client.acquire("z:1", ttl=5.0).release()  # the channel is connected
    freeze(server)
    try:
        started = time.monotonic()
        with pytest.raises(leasehold.Unavailable, match="no first reply"):
            client.watch(prefix="z:")
        assert time.monotonic() - started < 3.0
    finally:
        server.resume()

    async def via_asyncio() -> None:
        async with leasehold.AsyncClient(server.address, timeout=0.5) as aclient:
            await (await aclient.acquire("z:2", ttl=5.0)).release()
            freeze(server)
            try:
                started = time.monotonic()
                with pytest.raises(leasehold.Unavailable, match="no first reply"):
                    await aclient.watch(prefix="z:")
                assert time.monotonic() - started < 3.0
            finally:
                server.resume()

    asyncio.run(via_asyncio())


def test_watch_of_one_key_reports_an_expiry(server: Server) -> None:
    """watch(key=...) reports only that key, and a crashed holder's expiry."""
    client = leasehold.Client(server.address)
    with client.watch(key="s:one") as watch:
        client.acquire("s:one-not", ttl=5.0).release()
        fence = crash_holding(server, "s:one", ttl=0.3)
        events = [next(watch), next(watch)]
    assert [(e.kind, e.fence) for e in events] == [("granted", fence), ("expired", fence)]


PG_URL = os.environ.get("LEASEHOLD_TEST_PG_URL")


@pytest.mark.skipif(not PG_URL, reason="LEASEHOLD_TEST_PG_URL is not set")
def test_the_postgres_backend_watches_and_has_the_lifecycle(
    tmp_path: Path,
) -> None:
    """The PostgreSQL backend has the whole lifecycle, typed as on SQLite: a
    watch sees a grant and its release in order, and a handoff keeps the
    key for its successor."""
    import psycopg

    assert PG_URL is not None
    schema = f"leasehold_lc_{uuid.uuid4().hex[:12]}"
    url = PG_URL.replace("postgresql://", "postgres://", 1)
    srv = Server(tmp_path / "unused.db", store=("--store", url, "--pg-schema", schema))
    try:
        client = leasehold.Client(srv.address)
        with client.watch(prefix="pg:") as watch:
            lease = client.acquire("pg:1", ttl=5.0, lock_delay=1.0)
            lease.hand_off("ui", within=5.0)
            events = [next(watch), next(watch)]
        assert [(e.kind, e.key, e.fence) for e in events] == [
            ("granted", "pg:1", lease.fence),
            ("released", "pg:1", lease.fence),
        ]
        assert events[0].revision < events[1].revision
        with pytest.raises(leasehold.Reserved) as reserved:
            client.acquire("pg:1", ttl=5.0, owner="other")
        assert reserved.value.successor == "ui"
        with client.acquire("pg:1", ttl=5.0, owner="ui") as held:
            assert held.previous is not None and held.previous.handed_off
        assert [e.handed_off for e in client.history("pg:1").entries] == [True, False]
    finally:
        srv.stop()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def short_log_server(tmp_path: Path) -> Iterator[Server]:
    """A server whose event log keeps only the last 4 events."""
    srv = Server(tmp_path / "leasehold.db", extra=("--event-log-len", "4"))
    try:
        yield srv
    finally:
        srv.stop()


def test_a_compacted_revision_raises_compacted(short_log_server: Server) -> None:
    """A watch from a revision older than the event log holds raises
    Compacted with the oldest revision held; watching from that one works."""
    client = leasehold.Client(short_log_server.address)
    for i in range(5):
        client.acquire(f"c:{i}", ttl=5.0).release()  # ten events
    with pytest.raises(leasehold.Compacted) as caught:
        client.watch(start_revision=2)
    oldest = caught.value.oldest_revision
    assert 2 < oldest <= 10 and caught.value.code == "OUT_OF_RANGE"
    with client.watch(start_revision=oldest) as watch:
        first = next(watch)
    assert first.revision == oldest

    async def via_asyncio() -> None:
        async with leasehold.AsyncClient(short_log_server.address) as aclient:
            with pytest.raises(leasehold.Compacted):
                await aclient.watch(start_revision=2)

    asyncio.run(via_asyncio())


def test_async_watch_iterates_and_resumes(server: Server) -> None:
    """The asyncio watch: awaited to start, async-iterated, resumed from next_revision."""

    async def main() -> None:
        async with leasehold.AsyncClient(server.address) as client:
            watch = await client.watch(prefix="a:")
            for i in range(2):
                async with client.acquire(f"a:{i}", ttl=5.0):
                    pass
            first = []
            async for event in watch:
                first.append(event)
                if len(first) == 3:
                    break
            await watch.aclose()
            assert [(e.key, e.kind) for e in first] == [
                ("a:0", "granted"),
                ("a:0", "released"),
                ("a:1", "granted"),
            ]
            rest = []
            async for event in client.watch(prefix="a:", start_revision=watch.next_revision):
                rest.append(event)
                break
            assert [(e.key, e.kind) for e in rest] == [("a:1", "released")]
            assert rest[0].revision == first[-1].revision + 1
            # The lifecycle options and errors over asyncio too.
            lease = await client.acquire("a:h", ttl=5.0, owner="bg")
            await lease.hand_off("ui", within=5.0)
            with pytest.raises(leasehold.Reserved):
                await client.acquire("a:h", ttl=5.0, owner="other")
            ui = await client.acquire("a:h", ttl=5.0, owner="ui")
            assert ui.previous is not None and ui.previous.handed_off
            await ui.release()
            page = await client.history("a:h")
            assert [e.handed_off for e in page.entries] == [True, False]
            with pytest.raises(leasehold.NotFound):
                await client.history("a:none")

    asyncio.run(main())
