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

Inside a transaction you opened yourself, ``fence.write(conn, key, fence)``
(or ``advance``) records the fence in it and leaves the commit to you.

Locking: ``write()`` begins with ``BEGIN IMMEDIATE``, taking the write lock
at once, so the comparison and the writes see the latest committed fence and
nothing commits in between. Compatibility: the upsert needs SQLite 3.24 or
later; fences are stored as INTEGER (signed 64-bit).

Transaction control (Python 3.12's ``autocommit``): every mode works, and
``with fence.write(...)`` always ends in a real COMMIT or ROLLBACK:

- the legacy mode (the default, and the only one before 3.12), with any
  ``isolation_level``: ``write()`` begins ``BEGIN IMMEDIATE`` when no
  transaction is open and ends it with ``commit()`` / ``rollback()``;
- ``autocommit=True``: the same, but ended with ``COMMIT`` / ``ROLLBACK``
  statements, since ``commit()`` and ``rollback()`` do nothing in that mode;
- ``autocommit=False``: a transaction is always open (sqlite3 begins it,
  deferred), so ``write()`` records the fence in it and the ``with`` block
  ends it: ``commit()`` at the end, ``rollback()`` on an exception or a stale
  fence, taking any earlier uncommitted writes on the connection with it.
  The fence's upsert is the transaction's first write, so it takes the
  write lock; if the transaction had already read, SQLite may refuse the
  upgrade (``database is locked``) rather than compare against an old
  snapshot. Call ``conn.commit()`` before the block to start afresh.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from . import FenceTimeout, NotInTransaction, StaleFence

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

#: The highest fence recorded for any key (NULL when none is).
HIGHEST_OF_ALL = "SELECT max(fence) FROM leasehold_fence"

_MAX = 2**63 - 1

#: The longest, in seconds, a transaction ``write`` began may stay open:
#: one open longer (its process was paused inside it) is rolled back at the
#: end of the block instead of committed.
OPEN_TIMEOUT = 10.0

#: Python 3.12's sqlite3.LEGACY_TRANSACTION_CONTROL (-1), for older Pythons too.
_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


def _mode(conn: sqlite3.Connection) -> object:
    """The connection's transaction control: True, False or legacy."""
    return getattr(conn, "autocommit", _LEGACY)


def _end(conn: sqlite3.Connection, commit: bool) -> None:
    """Ends the transaction ``write`` owns, by SQL where the connection's
    ``commit()`` / ``rollback()`` would do nothing (``autocommit=True``)."""
    if _mode(conn) is True:
        if conn.in_transaction:
            conn.execute("COMMIT" if commit else "ROLLBACK")
    elif commit:
        conn.commit()
    else:
        conn.rollback()


#: SQLite's result code (sqlite3.SQLITE_BUSY from Python 3.11 on).
_SQLITE_BUSY = 5


def _busy(err: BaseException) -> bool:
    """Whether ``err`` is SQLITE_BUSY: the write lock is held elsewhere."""
    if not isinstance(err, sqlite3.OperationalError):
        return False
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return bool(code & 0xFF == _SQLITE_BUSY)
    return "database is locked" in str(err)


def busy_error(key: str, err: BaseException) -> FenceTimeout | None:
    """The library's error for a driver error inside a fenced transaction
    of ``key`` (SQLITE_BUSY, from ``sqlite3`` or ``aiosqlite``), or None."""
    if _busy(err):
        return FenceTimeout(
            key,
            "busy",
            "waited too long for the database's write lock (another transaction holds it)",
        )
    return None


@contextmanager
def translate(key: str) -> Iterator[None]:
    """Raises :class:`FenceTimeout` (from the driver's error) for SQLITE_BUSY
    inside the block: around a fenced transaction an adapter runs itself
    (a sync context manager, so it wraps awaits as well)."""
    try:
        yield
    except sqlite3.OperationalError as err:
        mapped = busy_error(key, err)
        if mapped is None:
            raise
        raise mapped from err


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


def fence_floor(conn: sqlite3.Connection) -> int:
    """The highest fence recorded for any key (0 when none is): the least
    ``leasehold serve --fence-floor`` that lets every key write again after
    the lock server's store was reset or replaced (its fences start at 1
    again). Take the highest over every database that fences writes with
    this lock server. Raises ``sqlite3.OperationalError`` when the fence
    table does not exist (not the database you meant)."""
    row = conn.execute(HIGHEST_OF_ALL).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


class FencedWrite:
    """What :func:`write` returns: the fence is already recorded; as a
    context manager it commits the transaction ``write`` began when the block
    ends normally and rolls it back on an exception. A transaction the
    caller opened is left to the caller either way."""

    def __init__(
        self, conn: sqlite3.Connection, began: bool, key: str = "", timeout: float = OPEN_TIMEOUT
    ) -> None:
        self.conn = conn
        #: Whether ``write`` began the transaction (and so ends it).
        self.began = began
        self.key = key
        #: The open bound (seconds, 0 for none) and when the transaction began (monotonic).
        self.timeout = timeout
        self.since = time.monotonic()

    def __enter__(self) -> sqlite3.Connection:
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
            # Monotonic: a paused process's clock ran on while it was stopped.
            open_for = time.monotonic() - self.since
            if self.timeout > 0 and open_for > self.timeout:
                _end(self.conn, False)
                raise FenceTimeout(
                    self.key,
                    "open",
                    f"stayed open {open_for:.1f} s, past its bound of {self.timeout} s, "
                    "and was rolled back",
                )
        with translate(self.key):
            _end(self.conn, exc_type is None)
        if exc is not None:
            mapped = busy_error(self.key, exc)
            if mapped is not None:
                raise mapped from exc


def write(
    conn: sqlite3.Connection, key: str, fence: int, *, timeout: float = OPEN_TIMEOUT
) -> FencedWrite:
    """Records ``fence`` as the highest fence of ``key`` before the caller's
    writes, inside the caller's open transaction or, if none is open, a new
    ``BEGIN IMMEDIATE`` one (under ``autocommit=False``, inside the
    transaction sqlite3 keeps open, which the ``with`` block then ends).
    Raises ``StaleFence`` if a higher fence has written (a transaction
    ``write`` began is rolled back; roll back your own), ``FenceTimeout``
    (``"busy"``) when the write lock stayed held past the connection's busy
    timeout (``sqlite3.connect(timeout=...)``, 5 s by default), and, at the
    end of the block, ``FenceTimeout`` (``"open"``) when a transaction
    ``write`` began stayed open longer than ``timeout`` seconds (0: no
    bound): it is rolled back instead of committed, since its process was
    most likely paused inside it and its lease is over. Either::

        with fence.write(conn, key, lease.fence):   # commits at the end
            conn.execute(...)

    or, inside a transaction you manage::

        conn.execute("BEGIN IMMEDIATE")
        fence.write(conn, key, lease.fence)
        conn.execute(...)
        conn.commit()
    """
    if _mode(conn) is False:
        # sqlite3 keeps a transaction open at all times: there is no "caller's
        # own" transaction to tell apart, so this one is ours to end.
        began = True
    else:
        began = not conn.in_transaction
        if began:
            with translate(key):
                conn.execute("BEGIN IMMEDIATE")
    try:
        with translate(key):
            advance(conn, key, fence)
    except BaseException:
        if began:
            _end(conn, False)
        raise
    return FencedWrite(conn, began, key, timeout)
