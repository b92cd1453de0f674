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
        with fence.write(conn, "session:42", lease.fence):   # BEGIN .. COMMIT
            conn.execute("INSERT INTO items (session, body) VALUES (%s, %s)", (key, body))

Locking: the upsert locks the key's row until the transaction ends, so two
writers of one key serialise on it and the later one compares against the
earlier one's committed fence (READ COMMITTED re-evaluates the WHERE on the
latest row version; REPEATABLE READ and SERIALIZABLE fail the later writer
with a serialization error instead, which is just as safe). Correctness rests
on this one row, not on reasoning across rows. Fences are BIGINT.
"""

from __future__ import annotations

from types import TracebackType
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

#: The highest fence recorded for any key (NULL when none is).
HIGHEST_OF_ALL = "SELECT max(fence) FROM leasehold_fence"

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
    from psycopg.rows import tuple_row

    # Tuples whatever the connection's row factory (LangGraph's is dict_row).
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(HIGHEST, {"key": key}).fetchone()
    return None if row is None else int(row[0])


def fence_floor(conn: Any) -> int:
    """The highest fence recorded for any key (0 when none is): the least
    ``leasehold serve --fence-floor`` that lets every key write again after
    the lock server's store was reset or replaced (its fences start at 1
    again). Take the highest over every database that fences writes with
    this lock server. Raises psycopg's ``UndefinedTable`` when the fence
    table is not in the connection's ``search_path``."""
    from psycopg.rows import tuple_row

    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(HIGHEST_OF_ALL).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


class FencedWrite:
    """What :func:`write` returns: the fence is already recorded; as a
    context manager it commits the transaction ``write`` began when the block
    ends normally and rolls it back on an exception. A transaction the
    caller opened (``with conn.transaction():`` or an implicit one) is left
    to the caller either way."""

    def __init__(self, conn: Any, began: bool) -> None:
        self.conn = conn
        #: Whether ``write`` began the transaction (and so ends it).
        self.began = began

    def __enter__(self) -> Any:
        return self.conn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.began:
            return
        if exc_type is None:
            self.conn.commit()
        else:
            self.conn.rollback()


def write(conn: Any, key: str, fence: int) -> FencedWrite:
    """Records ``fence`` as the highest fence of ``key`` before the caller's
    writes, inside the caller's open transaction or, if none is open, a new
    one. Raises ``StaleFence`` if a higher fence has written (a transaction
    ``write`` began is rolled back; roll back your own, which leaving a
    ``conn.transaction()`` block with the exception does). Either::

        with fence.write(conn, key, lease.fence):      # commits at the end
            conn.execute(...)

    or, inside a transaction you manage::

        with conn.transaction():
            fence.write(conn, key, lease.fence)
            conn.execute(...)
    """
    from psycopg import pq

    began = conn.info.transaction_status == pq.TransactionStatus.IDLE
    if began:
        conn.execute("BEGIN")
    try:
        advance(conn, key, fence)
    except BaseException:
        if began:
            conn.rollback()
        raise
    return FencedWrite(conn, began)
