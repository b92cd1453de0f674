"""Failover over several servers on one PostgreSQL database: leases keep
renewing through the next server when one is killed, new acquires go there,
and a refusal is an answer, not a reason to fail over. Needs
$LEASEHOLD_TEST_PG_URL (skipped when unset)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server, wait_until

import leasehold

PG_URL = os.environ.get("LEASEHOLD_TEST_PG_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="LEASEHOLD_TEST_PG_URL is not set")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    """Two servers on one fresh PostgreSQL schema, dropped afterwards."""
    import psycopg

    assert PG_URL is not None
    schema = f"leasehold_fo_{uuid.uuid4().hex[:12]}"
    store = ("--store", PG_URL.replace("postgresql://", "postgres://", 1), "--pg-schema", schema)
    # One after the other: the first applies the schema's migrations.
    first = Server(tmp_path / "unused-1.db", store=store)
    second = Server(tmp_path / "unused-2.db", store=store)
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def kill(server: Server) -> None:
    """kill -9: no drain, connections reset."""
    server.process.kill()
    server.process.wait(timeout=5)


@needs_pg
def test_a_lease_keeps_renewing_through_the_next_server(pair: tuple[Server, Server]) -> None:
    """kill -9 of the first server: the held lease renews through the second
    (same fence and lease id) and stays valid, gate() passes there, and a new
    acquire goes there; a Busy answer never moved a client on."""
    first, second = pair
    client = leasehold.Client([first.address, second.address])
    other = leasehold.Client(f"{first.address}, {second.address}", owner="other")
    assert other.targets == (first.address, second.address)
    lease = client.acquire("fo:1", ttl=1.5)
    with pytest.raises(leasehold.Busy):
        other.acquire("fo:1", ttl=1.5)
    assert other.current_target == first.address, "a refusal is an answer"

    kill(first)
    expires = lease.server_expires_at_ms
    assert wait_until(lambda: lease.server_expires_at_ms > expires, timeout=5.0)
    assert client.current_target == second.address
    assert lease.is_valid() and not lease.lost.is_set()
    assert lease.gate() == lease.fence
    with other.acquire("fo:2", ttl=1.5) as fresh:
        assert fresh.fence > lease.fence
    assert other.current_target == second.address
    with pytest.raises(leasehold.Busy) as busy:
        other.acquire("fo:1", ttl=1.5)
    assert busy.value.fence == lease.fence, "still held, as the second server sees it"
    assert lease.release().fence == lease.fence


@needs_pg
def test_an_async_lease_keeps_renewing_through_the_next_server(
    pair: tuple[Server, Server],
) -> None:
    """The asyncio twin: the same failover of renewals, gate and acquire."""
    first, second = pair

    async def main() -> None:
        client = leasehold.AsyncClient(f"{first.address},{second.address}")
        lease = await client.acquire("fo:a", ttl=1.5)
        with pytest.raises(leasehold.Busy):
            await client.acquire("fo:a", ttl=1.5, owner="other")
        assert client.current_target == first.address
        kill(first)
        expires = lease.server_expires_at_ms
        for _ in range(500):
            if lease.server_expires_at_ms > expires:
                break
            await asyncio.sleep(0.01)
        assert lease.server_expires_at_ms > expires, "renewed through the second server"
        assert client.current_target == second.address
        assert lease.is_valid() and await lease.gate() == lease.fence
        fresh = await client.acquire("fo:b", ttl=1.5)
        assert fresh.fence > lease.fence
        await fresh.release()
        await lease.release()
        await client.close()

    asyncio.run(main())


def test_a_comma_separated_target_is_several_servers() -> None:
    """A list, a comma-separated string and one target all work; no target
    at all is refused before anything is sent."""
    assert leasehold.Client("a:1, b:2").targets == ("a:1", "b:2")
    assert leasehold.Client(["a:1", "b:2"]).target == "a:1,b:2"
    assert leasehold.Client("a:1").targets == ("a:1",)
    with pytest.raises(leasehold.InvalidArgument):
        leasehold.Client(" , ")


def test_only_safe_calls_are_resent_and_a_refusal_is_final() -> None:
    """The failover rule itself (no server needed): a safe call meets an
    unavailable server and is resent to the next, which stays current; an
    unsafe one is not resent but the next call goes on; a refusal is final."""
    from leasehold._sync import _Connection, _Node

    conn = leasehold.Client(["a:1", "b:2", "c:3"])._connection()
    sent: list[str] = []

    def answer(node: _Node) -> str:
        sent.append(node.target)
        if node.target == "a:1":
            raise leasehold.Unavailable("connection refused")
        return node.target

    assert conn.run(True, answer) == "b:2" and sent == ["a:1", "b:2"]
    assert conn.current.target == "b:2"

    fresh: _Connection = leasehold.Client(["a:1", "b:2"])._connection()
    sent.clear()
    with pytest.raises(leasehold.Unavailable, match="not resent"):
        fresh.run(False, answer)
    assert sent == ["a:1"] and fresh.current.target == "b:2"

    def refuse(node: _Node) -> str:
        sent.append(node.target)
        raise leasehold.Busy("held", holder="x")

    sent.clear()
    with pytest.raises(leasehold.Busy):
        fresh.run(True, refuse)
    assert sent == ["b:2"] and fresh.current.target == "b:2"

    def down(node: _Node) -> str:
        raise leasehold.Unavailable(f"{node.target} is down")

    with pytest.raises(leasehold.Unavailable, match="no server answered") as caught:
        conn.run(True, down)
    assert all(t in caught.value.message for t in ("a:1", "b:2", "c:3"))
