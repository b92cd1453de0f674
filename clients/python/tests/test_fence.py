"""Storage-side fencing helpers: SQLite (always) and PostgreSQL (when
$LEASEHOLD_TEST_PG_URL names a server)."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, needs_pg

import leasehold
from leasehold.fence import NotInTransaction, StaleFence
from leasehold.fence import postgres as pg_fence
from leasehold.fence import sqlite as sqlite_fence

RUST_HELPER = (
    Path(__file__).resolve().parents[3]
    / "crates"
    / "leasehold-client"
    / "src"
    / "fence"
    / "sqlite.rs"
)


def _rust_const(name: str) -> str:
    text = RUST_HELPER.read_text()
    match = re.search(rf'pub const {name}: &str = "(.*?)";', text, re.S)
    assert match, name
    return match.group(1)


@pytest.mark.skipif(not RUST_HELPER.exists(), reason="not inside the leasehold repository")
def test_the_sqlite_sql_is_the_rust_helpers() -> None:
    """The Python helper runs exactly the Rust helper's statements."""
    assert sqlite_fence.CREATE_TABLE == _rust_const("CREATE_TABLE")
    assert sqlite_fence.ADVANCE == _rust_const("ADVANCE")
    assert sqlite_fence.HIGHEST == _rust_const("HIGHEST")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "app.db")
    sqlite_fence.install(conn)
    sqlite_fence.install(conn)  # a second install is a no-op
    conn.execute("CREATE TABLE items (session TEXT, body TEXT)")
    conn.commit()
    yield conn
    conn.close()


def _bodies(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT body FROM items ORDER BY rowid")]


def test_sqlite_accepts_rising_and_equal_fences_and_refuses_lower(db: sqlite3.Connection) -> None:
    """Fences 1, 2, 2 write; 1 after 2 is refused and its write rolled back."""
    for fence, body in [(1, "a"), (2, "b"), (2, "c")]:
        with sqlite_fence.write(db, "session:1", fence):
            db.execute("INSERT INTO items VALUES (?, ?)", ("session:1", body))
    with pytest.raises(StaleFence) as caught:
        with sqlite_fence.write(db, "session:1", 1):
            db.execute("INSERT INTO items VALUES (?, ?)", ("session:1", "late"))
    assert (caught.value.fence, caught.value.highest) == (1, 2)
    assert isinstance(caught.value, leasehold.Error)
    assert not db.in_transaction
    assert _bodies(db) == ["a", "b", "c"]
    assert sqlite_fence.highest(db, "session:1") == 2
    assert sqlite_fence.highest(db, "session:2") is None
    # Keys are fenced independently.
    with sqlite_fence.write(db, "session:2", 1):
        db.execute("INSERT INTO items VALUES (?, ?)", ("session:2", "other"))
    assert _bodies(db)[-1] == "other"


def test_sqlite_stale_check_happens_before_the_block(db: sqlite3.Connection) -> None:
    """A stale fence never runs the block."""
    with sqlite_fence.write(db, "k", 5):
        pass
    ran = []
    with pytest.raises(StaleFence):
        with sqlite_fence.write(db, "k", 4):
            ran.append(True)
    assert ran == []


def test_sqlite_an_error_in_the_block_rolls_back(db: sqlite3.Connection) -> None:
    """An exception in the block rolls back the write and the fence advance."""
    with pytest.raises(ZeroDivisionError):
        with sqlite_fence.write(db, "k", 3):
            db.execute("INSERT INTO items VALUES ('k', 'x')")
            1 / 0  # noqa: B018
    assert _bodies(db) == []
    assert sqlite_fence.highest(db, "k") is None


def test_sqlite_advance_needs_a_transaction(db: sqlite3.Connection) -> None:
    """advance() outside a transaction refuses; inside the caller's own it works."""
    with pytest.raises(NotInTransaction):
        sqlite_fence.advance(db, "k", 1)
    db.execute("BEGIN IMMEDIATE")
    sqlite_fence.advance(db, "k", 7)
    db.execute("INSERT INTO items VALUES ('k', 'mine')")
    db.commit()
    assert sqlite_fence.highest(db, "k") == 7


def test_sqlite_write_inside_the_callers_transaction(db: sqlite3.Connection) -> None:
    """Called inside a transaction the caller opened, write() records the
    fence there and leaves commit and rollback to the caller."""
    db.execute("BEGIN IMMEDIATE")
    sqlite_fence.write(db, "k", 3)
    db.execute("INSERT INTO items VALUES ('k', 'mine')")
    assert db.in_transaction
    db.commit()
    assert (_bodies(db), sqlite_fence.highest(db, "k")) == (["mine"], 3)
    db.execute("BEGIN IMMEDIATE")
    with pytest.raises(StaleFence):
        sqlite_fence.write(db, "k", 2)
    assert db.in_transaction  # the caller's to roll back
    db.rollback()
    # Without an open transaction, a plain call begins one for the caller.
    sqlite_fence.write(db, "k", 4)
    assert db.in_transaction
    db.execute("INSERT INTO items VALUES ('k', 'next')")
    db.commit()
    assert (_bodies(db), sqlite_fence.highest(db, "k")) == (["mine", "next"], 4)


def test_sqlite_two_connections_a_newer_holder_wins(tmp_path: Path) -> None:
    """A paused old holder's write, arriving after a newer holder's, is refused
    even though it uses a separate connection."""
    path = tmp_path / "shared.db"
    old, new = sqlite3.connect(path, timeout=5), sqlite3.connect(path, timeout=5)
    sqlite_fence.install(old)
    old.execute("CREATE TABLE items (session TEXT, body TEXT)")
    old.commit()
    with sqlite_fence.write(new, "s", 2):
        new.execute("INSERT INTO items VALUES ('s', 'new')")
    with pytest.raises(StaleFence):
        with sqlite_fence.write(old, "s", 1):
            old.execute("INSERT INTO items VALUES ('s', 'old')")
    assert _bodies(new) == ["new"]


def _pg_connect(schema: str) -> Any:
    import psycopg

    assert PG_URL is not None
    return psycopg.connect(PG_URL, options=f"-c search_path={schema}")


@needs_pg
def test_postgres_accepts_rising_and_equal_fences_and_refuses_lower(pg_schema: str) -> None:
    """The same rule in PostgreSQL, inside the caller's transaction."""
    with _pg_connect(pg_schema) as conn:
        pg_fence.install(conn)
        pg_fence.install(conn)
        conn.execute("CREATE TABLE items (session TEXT, body TEXT)")
        conn.commit()
        for fence, body in [(1, "a"), (2, "b"), (2, "c")]:
            with pg_fence.write(conn, "session:1", fence):
                conn.execute("INSERT INTO items VALUES (%s, %s)", ("session:1", body))
        with pytest.raises(StaleFence) as caught:
            with pg_fence.write(conn, "session:1", 1):
                conn.execute("INSERT INTO items VALUES ('session:1', 'late')")
        assert (caught.value.fence, caught.value.highest) == (1, 2)
        rows = conn.execute("SELECT body FROM items ORDER BY body").fetchall()
        assert [r[0] for r in rows] == ["a", "b", "c"]
        assert pg_fence.highest(conn, "session:1") == 2
        conn.commit()


@needs_pg
def test_postgres_advance_needs_a_transaction(pg_schema: str) -> None:
    """advance() refuses outside a transaction and works in the caller's own."""
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(PG_URL, options=f"-c search_path={pg_schema}", autocommit=True) as conn:
        pg_fence.install(conn)
        with pytest.raises(NotInTransaction):
            pg_fence.advance(conn, "k", 1)
        with conn.transaction():
            pg_fence.advance(conn, "k", 3)
        assert pg_fence.highest(conn, "k") == 3
        # write() inside the caller's transaction leaves it to the caller.
        with pytest.raises(StaleFence):
            with conn.transaction():
                pg_fence.write(conn, "k", 2)
        with conn.transaction():
            pg_fence.write(conn, "k", 5)
        assert pg_fence.highest(conn, "k") == 5
        # In autocommit mode, write() as a context manager opens its own.
        with pg_fence.write(conn, "k", 6):
            pass
        assert pg_fence.highest(conn, "k") == 6
        with pytest.raises(StaleFence):
            with pg_fence.write(conn, "k", 1):
                pass
        assert conn.info.transaction_status == 0  # IDLE: rolled back


@needs_pg
def test_postgres_a_concurrent_lower_fence_waits_then_is_refused(pg_schema: str) -> None:
    """Two writers of one key serialise on its row: the old holder, whose
    write raced a newer holder's open transaction, is refused once it commits."""
    with _pg_connect(pg_schema) as setup:
        pg_fence.install(setup)
        setup.commit()
    new, old = _pg_connect(pg_schema), _pg_connect(pg_schema)
    outcome: list[object] = []
    try:
        with new.transaction():
            pg_fence.advance(new, "s", 5)

            def late_write() -> None:
                try:
                    with pg_fence.write(old, "s", 4):
                        pass
                    outcome.append("written")
                except StaleFence as err:
                    outcome.append(err.highest)

            writer = threading.Thread(target=late_write)
            writer.start()
            writer.join(timeout=0.5)
            assert writer.is_alive(), "the lower fence should wait on the row lock"
        writer.join(timeout=5)
        assert outcome == [5]
    finally:
        new.close()
        old.close()


@needs_pg
def test_postgres_refuses_what_is_not_one_connection(pg_schema: str) -> None:
    """A pool (each statement may take another connection) or an async
    connection is refused before anything is sent; a connection taken from
    the pool for the whole write works."""
    from psycopg_pool import ConnectionPool

    assert PG_URL is not None
    with ConnectionPool(
        PG_URL, kwargs={"options": f"-c search_path={pg_schema}"}, min_size=1, open=True
    ) as pool:
        with pool.connection() as conn:
            pg_fence.install(conn)
        with pytest.raises(leasehold.InvalidArgument, match=r"one psycopg\.Connection"):
            pg_fence.write(pool, "k", 1)
        with pytest.raises(leasehold.InvalidArgument):
            pg_fence.advance(pool, "k", 1)
        with pool.connection() as conn:
            with pg_fence.write(conn, "k", 1):
                pass
            assert pg_fence.highest(conn, "k") == 1


@needs_pg
def test_postgres_threads_sharing_a_connection_take_turns(pg_schema: str) -> None:
    """A second thread's write on a shared connection waits for the first's
    transaction instead of joining it: when the first rolls back, the second
    (which reported success) still committed its own rows."""
    with _pg_connect(pg_schema) as conn:
        pg_fence.install(conn)
        conn.execute("CREATE TABLE items (session TEXT, body TEXT)")
        conn.commit()
        inside = threading.Event()
        second_done = threading.Event()
        outcome: list[object] = []

        def second() -> None:
            inside.wait(5)
            with pg_fence.write(conn, "s", 2):
                conn.execute("INSERT INTO items VALUES ('s', 'second')")
            outcome.append("second committed")
            second_done.set()

        thread = threading.Thread(target=second)
        thread.start()
        with pytest.raises(RuntimeError):
            with pg_fence.write(conn, "s", 1):
                conn.execute("INSERT INTO items VALUES ('s', 'first')")
                inside.set()
                # Joined into this transaction, the second would finish now.
                second_done.wait(0.5)
                raise RuntimeError("the first writer fails")
        thread.join(5)
        assert outcome == ["second committed"]
        rows = conn.execute("SELECT body FROM items").fetchall()
        assert [r[0] for r in rows] == ["second"]
        assert pg_fence.highest(conn, "s") == 2
        conn.commit()
