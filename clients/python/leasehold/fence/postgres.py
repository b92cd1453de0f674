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

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from .._errors import InvalidArgument
from . import FenceTimeout, NotInTransaction, StaleFence

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

#: How long, in seconds, the fence advance waits for the key's row while
#: another transaction holds it (``SET LOCAL lock_timeout``), then
#: ``FenceTimeout("busy")``.
LOCK_TIMEOUT = 10.0

#: How long, in seconds, a fenced transaction may sit idle between
#: statements before the server ends its session and rolls it back
#: (``SET LOCAL idle_in_transaction_session_timeout``): a writer paused
#: inside its transaction holds the key's row no longer than this. Below
#: LOCK_TIMEOUT, so a newer writer waits out a paused one instead of failing.
IDLE_TIMEOUT = 5.0

#: The bounds, local to the transaction (values in milliseconds).
BOUND = """SELECT set_config('lock_timeout', %(lock)s, true),
    set_config('idle_in_transaction_session_timeout', %(idle)s, true)"""

_LOCK_NOT_AVAILABLE = "55P03"
_IDLE_IN_TRANSACTION_TIMEOUT = "25P03"


def _ms(name: str, seconds: float) -> str:
    if not seconds >= 0:
        raise InvalidArgument(f"{name} must be at least 0 seconds (got {seconds})")
    return str(int(seconds * 1000))


def bound_params(lock_timeout: float, idle_timeout: float) -> dict[str, str]:
    """The parameters of :data:`BOUND`."""
    return {"lock": _ms("lock_timeout", lock_timeout), "idle": _ms("idle_timeout", idle_timeout)}


def bound_error(key: str, err: BaseException) -> FenceTimeout | None:
    """The library's error for a driver error inside a fenced transaction of
    ``key`` (a bound's, from psycopg sync or async), or None."""
    import psycopg

    if not isinstance(err, psycopg.Error):
        return None
    state = err.sqlstate or ""
    if state == _LOCK_NOT_AVAILABLE:
        return FenceTimeout(
            key, "busy", "waited too long for the key's fence (another transaction holds it)"
        )
    if state == _IDLE_IN_TRANSACTION_TIMEOUT or "idle-in-transaction timeout" in str(err):
        return FenceTimeout(
            key, "idle", "sat idle in its transaction too long and the server ended its session"
        )
    return None


@contextmanager
def translate(key: str) -> Iterator[None]:
    """Raises :class:`FenceTimeout` (from the driver's error) for a bound's
    error inside the block: around a fenced transaction an adapter runs
    itself (a sync context manager, so it wraps awaits as well)."""
    try:
        yield
    except Exception as err:
        mapped = bound_error(key, err)
        if mapped is None:
            raise
        raise mapped from err


def _connection(conn: Any) -> None:
    """Refuses what is not one psycopg (sync) connection: a pool, whose
    every statement may run on another connection, an async connection, a
    cursor."""
    import psycopg

    if not isinstance(conn, psycopg.Connection):
        raise InvalidArgument(
            f"fence.postgres needs one psycopg.Connection, not {type(conn).__name__}: "
            "take one from a pool for the whole write (with pool.connection() as conn: ...)"
        )


#: Per connection, held by the thread whose ``write`` began a transaction
#: on it until that transaction ends: psycopg lets threads share a
#: connection, and a second thread's write would otherwise join the first's
#: transaction (its fence and rows committed or rolled back by the other).
_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _lock(conn: Any) -> threading.RLock:
    with _LOCKS_GUARD:
        lock = _LOCKS.get(conn)
        if lock is None:
            lock = _LOCKS[conn] = threading.RLock()
        return lock


def install(conn: Any) -> None:
    """Creates the fence table if it does not exist (idempotent), in the
    connection's ``search_path``, in a transaction of its own (a savepoint
    when a transaction is already open)."""
    with conn.transaction():
        conn.execute(CREATE_TABLE)


def advance(
    conn: Any,
    key: str,
    fence: int,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
) -> None:
    """Inside the caller's open transaction on ``conn`` (a ``psycopg.Connection``),
    bounds the transaction (``lock_timeout`` and ``idle_timeout`` seconds, 0
    for none: see :data:`LOCK_TIMEOUT`, :data:`IDLE_TIMEOUT`; local to the
    transaction) and records ``fence`` as the highest fence of ``key``, or
    raises ``StaleFence`` if a higher one has written (the caller must roll
    back; leaving a ``conn.transaction()`` block with the exception does).
    Raises ``NotInTransaction`` when no transaction is open,
    ``FenceTimeout("busy")`` when the key's row stayed locked past
    ``lock_timeout``, ``InvalidArgument`` for what is not one connection."""
    from psycopg import pq

    _connection(conn)
    if conn.info.transaction_status != pq.TransactionStatus.INTRANS:
        raise NotInTransaction(key)
    if not 0 <= fence <= _MAX:
        raise ValueError(f"fence {fence} does not fit in a BIGINT")
    with translate(key):
        conn.execute(BOUND, bound_params(lock_timeout, idle_timeout))
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

    def __init__(
        self, conn: Any, began: bool, key: str = "", lock: threading.RLock | None = None
    ) -> None:
        self.conn = conn
        #: Whether ``write`` began the transaction (and so ends it).
        self.began = began
        self.key = key
        #: The connection's lock, held since ``write`` began the transaction.
        self.lock = lock

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
        try:
            if exc_type is None:
                with translate(self.key):
                    self.conn.commit()
                return
            try:
                self.conn.rollback()
            except Exception:
                # A connection the server ended: its transaction is gone
                # already; the block's error is the one to report.
                pass
            if exc is not None:
                mapped = bound_error(self.key, exc)
                if mapped is not None:
                    raise mapped from exc
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None


def write(
    conn: Any,
    key: str,
    fence: int,
    *,
    lock_timeout: float = LOCK_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
) -> FencedWrite:
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

    The transaction is bounded (see :func:`advance`): an idle one is ended by
    the server after ``idle_timeout`` (``FenceTimeout("idle")`` from the
    block). ``conn`` is one ``psycopg.Connection`` (from a pool: ``with
    pool.connection() as conn``), in autocommit mode or not. Threads that
    share it take turns: a ``write`` that begins a transaction holds the
    connection until its block ends, so another thread's ``write`` waits
    rather than joining it (a transaction you opened yourself is yours to
    keep to one thread).
    """
    from psycopg import pq

    _connection(conn)
    lock = _lock(conn)
    lock.acquire()
    began = conn.info.transaction_status == pq.TransactionStatus.IDLE
    try:
        if began:
            conn.execute("BEGIN")
        advance(conn, key, fence, lock_timeout=lock_timeout, idle_timeout=idle_timeout)
    except BaseException:
        try:
            if began:
                conn.rollback()
        finally:
            lock.release()
        raise
    if not began:
        lock.release()
        return FencedWrite(conn, began, key)
    return FencedWrite(conn, began, key, lock)
