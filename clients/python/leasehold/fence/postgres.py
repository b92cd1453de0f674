"""Fencing inside a PostgreSQL transaction, with psycopg 3
(``pip install leasehold[postgres]``).

The same rule as ``leasehold.fence.sqlite``: one table keeps the highest
fence that has written each key; every write transaction first advances it
with a single-row conditional upsert, and a write whose fence changed
nothing is rolled back::

    import psycopg
    from leasehold.fence import postgres as fence

    with psycopg.connect(url) as conn:
        fence.install(conn)
        with fence.write(conn, "session:42", lease.fence):   # conn.transaction()
            conn.execute("INSERT INTO items (session, body) VALUES (%s, %s)", (key, body))

Locking: the upsert locks the key's row until the transaction ends, so two
writers of one key serialise on it and the later one compares against the
earlier one's committed fence (READ COMMITTED re-evaluates the WHERE on the
latest row version; REPEATABLE READ and SERIALIZABLE fail the later writer
with a serialization error instead, which is just as safe). Correctness rests
on this one row, not on reasoning across rows. Fences are BIGINT.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import NotInTransaction, StaleFence

#: The table that holds the highest fence seen per key.
CREATE_TABLE = """CREATE TABLE IF NOT EXISTS leasehold_fence (
    key   TEXT PRIMARY KEY NOT NULL,
    fence BIGINT NOT NULL
)"""

#: Records the fence for the key unless a higher one is recorded; one changed
#: row means the fence is current, zero means it is stale.
ADVANCE = """INSERT INTO leasehold_fence (key, fence) VALUES (%(key)s, %(fence)s)
ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence
WHERE EXCLUDED.fence >= leasehold_fence.fence"""

#: The highest fence recorded for the key.
HIGHEST = "SELECT fence FROM leasehold_fence WHERE key = %(key)s"

_MAX = 2**63 - 1


def install(conn: Any) -> None:
    """Creates the fence table if it does not exist (idempotent), in the
    connection's ``search_path``, in a transaction of its own (a savepoint
    when a transaction is already open)."""
    with conn.transaction():
        conn.execute(CREATE_TABLE)


def advance(conn: Any, key: str, fence: int) -> None:
    """Inside the caller's open transaction on ``conn`` (a ``psycopg.Connection``),
    records ``fence`` as the highest fence of ``key``, or raises ``StaleFence``
    if a higher one has written (the caller must roll back; leaving a
    ``conn.transaction()`` block with the exception does). Raises
    ``NotInTransaction`` when no transaction is open."""
    from psycopg import pq

    if conn.info.transaction_status != pq.TransactionStatus.INTRANS:
        raise NotInTransaction(key)
    if not 0 <= fence <= _MAX:
        raise ValueError(f"fence {fence} does not fit in a BIGINT")
    changed = conn.execute(ADVANCE, {"key": key, "fence": fence}).rowcount
    if changed != 1:
        raise StaleFence(key, fence, highest(conn, key) or 0)


def highest(conn: Any, key: str) -> int | None:
    """The highest fence that has written ``key``, if any has."""
    row = conn.execute(HIGHEST, {"key": key}).fetchone()
    return None if row is None else int(row[0])


@contextmanager
def write(conn: Any, key: str, fence: int) -> Iterator[Any]:
    """One fenced write: opens ``conn.transaction()``, advances the fence of
    ``key``, runs the block, and commits when the block ends; a stale fence or
    any exception rolls it back and propagates."""
    with conn.transaction():
        advance(conn, key, fence)
        yield conn
