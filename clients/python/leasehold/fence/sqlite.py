"""Fencing inside an application's own SQLite database (Python's ``sqlite3``).

One table remembers, per key, the highest fence that has written. Every
write transaction on a key first *advances* that fence: it records the
writer's fence if it is at least the stored one and changes nothing
otherwise, and a write whose fence changed nothing is rolled back. An equal
fence is accepted, so one holder can write many times. The SQL is exactly
the Rust helper's (``src/fence/sqlite.rs``)::

    import sqlite3
    from leasehold.fence import sqlite as fence

    conn = sqlite3.connect("sessions.db")
    fence.install(conn)
    with fence.write(conn, "session:42", lease.fence):   # BEGIN IMMEDIATE .. COMMIT
        conn.execute("INSERT INTO items (session, body) VALUES (?, ?)", ("session:42", body))
    # raises leasehold.fence.StaleFence (and rolls back) if a higher fence wrote

Locking: ``write()`` begins with ``BEGIN IMMEDIATE``, taking the write lock
at once, so the comparison and the writes see the latest committed fence and
nothing commits in between. Compatibility: the upsert needs SQLite 3.24 or
later; fences are stored as INTEGER (signed 64-bit).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from . import NotInTransaction, StaleFence

#: The table that holds the highest fence seen per key.
CREATE_TABLE = """CREATE TABLE IF NOT EXISTS leasehold_fence (
    key   TEXT PRIMARY KEY NOT NULL,
    fence INTEGER NOT NULL
)"""

#: Records ``:fence`` for ``:key`` unless a higher fence is recorded; one
#: changed row means the fence is current, zero means it is stale.
ADVANCE = """INSERT INTO leasehold_fence (key, fence) VALUES (:key, :fence)
ON CONFLICT (key) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= leasehold_fence.fence"""

#: The highest fence recorded for ``:key``.
HIGHEST = "SELECT fence FROM leasehold_fence WHERE key = :key"

_MAX = 2**63 - 1


def install(conn: sqlite3.Connection) -> None:
    """Creates the fence table if it does not exist (idempotent)."""
    conn.execute(CREATE_TABLE)
    if conn.in_transaction:
        conn.commit()


def advance(conn: sqlite3.Connection, key: str, fence: int) -> None:
    """Inside the caller's open transaction on ``conn``, records ``fence`` as
    the highest fence of ``key``, or raises ``StaleFence`` if a higher one has
    written (the caller must then roll back). Raises ``NotInTransaction``
    when no transaction is open."""
    if not conn.in_transaction:
        raise NotInTransaction(key)
    if not 0 <= fence <= _MAX:
        raise ValueError(f"fence {fence} does not fit in an SQLite INTEGER")
    changed = conn.execute(ADVANCE, {"key": key, "fence": fence}).rowcount
    if changed != 1:
        raise StaleFence(key, fence, highest(conn, key) or 0)


def highest(conn: sqlite3.Connection, key: str) -> int | None:
    """The highest fence that has written ``key``, if any has."""
    row = conn.execute(HIGHEST, {"key": key}).fetchone()
    return None if row is None else int(row[0])


@contextmanager
def write(conn: sqlite3.Connection, key: str, fence: int) -> Iterator[sqlite3.Connection]:
    """One fenced write: ``BEGIN IMMEDIATE``, advance the fence of ``key``,
    run the block, ``COMMIT``; on a stale fence or any exception in the block,
    ``ROLLBACK`` and re-raise. ``conn`` must not be in a transaction already."""
    if conn.in_transaction:
        raise RuntimeError("leasehold.fence.sqlite.write() opens its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")
    try:
        advance(conn, key, fence)
        yield conn
    except BaseException:
        conn.rollback()
        raise
    conn.commit()
