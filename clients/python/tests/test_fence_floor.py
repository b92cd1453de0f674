"""A lock server whose store was reset: its fences start at 1 again and
every fenced write of a key the application database had seen is refused
(StaleFence) until the server is started with ``--fence-floor`` at least
the highest fence stored, which ``fence_floor()`` reports."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, Server, needs_pg

import leasehold
from leasehold.fence import StaleFence
from leasehold.fence import postgres as pg_fence
from leasehold.fence import sqlite as sqlite_fence


def _owned_fences(server: Server, key: str, times: int) -> list[int]:
    """The fences of ``times`` terms of ``key``, one after the other."""
    client = leasehold.Client(server.address)
    try:
        fences = []
        for _ in range(times):
            with client.acquire(key, ttl=5.0) as lease:
                fences.append(lease.fence)
        return fences
    finally:
        client.close()


def _reset_and_cure(
    tmp_path: Path,
    write: Any,
    floor_of: Any,
) -> None:
    """Writes through one server, then a fresh one (a reset store): refused;
    then a fresh one with the floor ``floor_of()`` reports: written."""
    first = Server(tmp_path / "first.db")
    try:
        fences = _owned_fences(first, "thread-9", 4) + _owned_fences(first, "thread-1", 1)
        for key, fence in [("thread-9", fences[3]), ("thread-1", fences[4])]:
            write(key, fence)
    finally:
        first.stop()
    assert floor_of() == fences[4] == max(fences)

    reset = Server(tmp_path / "reset.db")
    try:
        (fence,) = _owned_fences(reset, "thread-9", 1)
        assert fence < fences[3]
        with pytest.raises(StaleFence) as caught:
            write("thread-9", fence)
        message = str(caught.value)
        assert f"fence {fences[3]} has already written" in message
        assert "--fence-floor" in message and "fence_floor()" in message
    finally:
        reset.stop()

    cured = Server(tmp_path / "cured.db", extra=("--fence-floor", str(floor_of())))
    try:
        for key in ["thread-9", "thread-1"]:
            (fence,) = _owned_fences(cured, key, 1)
            assert fence > max(fences)
            write(key, fence)
    finally:
        cured.stop()


def test_sqlite_a_reset_server_is_cured_by_the_reported_floor(tmp_path: Path) -> None:
    """SQLite: the floor from ``fence_floor(conn)`` lets every key write again."""
    conn = sqlite3.connect(tmp_path / "app.db")
    sqlite_fence.install(conn)
    assert sqlite_fence.fence_floor(conn) == 0
    conn.execute("CREATE TABLE items (session TEXT, fence INTEGER)")
    conn.commit()

    def write(key: str, fence: int) -> None:
        with sqlite_fence.write(conn, key, fence):
            conn.execute("INSERT INTO items VALUES (?, ?)", (key, fence))

    try:
        _reset_and_cure(tmp_path, write, lambda: sqlite_fence.fence_floor(conn))
    finally:
        conn.close()


def test_sqlite_fence_floor_refuses_a_database_without_the_table(tmp_path: Path) -> None:
    """A database that never fenced (the wrong file) is an error, not 0."""
    conn = sqlite3.connect(tmp_path / "other.db")
    try:
        with pytest.raises(sqlite3.OperationalError):
            sqlite_fence.fence_floor(conn)
    finally:
        conn.close()


@needs_pg
def test_postgres_a_reset_server_is_cured_by_the_reported_floor(
    tmp_path: Path, pg_schema: str
) -> None:
    """PostgreSQL: the floor from ``fence_floor(conn)`` lets every key write again."""
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(PG_URL, options=f"-c search_path={pg_schema}") as conn:
        pg_fence.install(conn)
        assert pg_fence.fence_floor(conn) == 0
        conn.execute("CREATE TABLE items (session TEXT, fence BIGINT)")
        conn.commit()

        def write(key: str, fence: int) -> None:
            with pg_fence.write(conn, key, fence):
                conn.execute("INSERT INTO items VALUES (%s, %s)", (key, fence))

        def floor_of() -> int:
            floor = pg_fence.fence_floor(conn)
            conn.commit()  # the read's transaction: the next write begins its own
            return floor

        _reset_and_cure(tmp_path, write, floor_of)
