"""The savers whose database can refuse a stale owner itself.

For LangGraph's own SQLite and PostgreSQL savers, the fence is advanced in
the same transaction as the checkpoint write (``leasehold.fence``'s table and
SQL), so an owner that passed every check and was then paused cannot write
once a newer owner has written: its transaction finds a higher fence and
rolls back. Each saver is adopted as a private subclass sharing the user's
instance's connection and lock, overriding only the seam the saver already
has for its writes (``cursor()``, ``_cursor()``, or its lock).

The write in progress names its key and fence through ``SCOPE``, set by the
wrapper around each inner call. A write reaching an adopted saver with no
scope is refused: only the wrapper calls these instances.
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from .._ownership import NotOwned
from ..fence import StaleFence
from ..fence import postgres as pg_fence
from ..fence import sqlite as sqlite_fence

#: (key, fence) of the write in progress in this context.
SCOPE: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "leasehold_langgraph_scope", default=None
)


def _scope(what: str) -> tuple[str, int]:
    scope = SCOPE.get()
    if scope is None:
        raise NotOwned(f"{what} reached a fenced saver outside leasehold's wrapper")
    return scope


def adopt(inner: Any) -> Any | None:
    """A fenced copy of ``inner`` when it is one of the savers fenced in the
    write's own transaction (exactly that class, not a subclass, whose write
    path may differ), else None."""
    kind = type(inner)
    fenced = _fenced_kinds().get(kind)
    if fenced is None:
        return None
    if getattr(inner, "pipe", None) is not None:
        # A shared pipeline cannot hold one write's transaction apart from
        # another's: gated, not fenced in the transaction (see the docs).
        return None
    copy: Any = object.__new__(fenced)
    copy.__dict__.update(inner.__dict__)
    copy._leasehold_installed = False
    if isinstance(getattr(copy, "lock", None), asyncio.Lock):
        copy.lock = _ReentrantLock(inner.lock)
    return copy


def _fenced_kinds() -> dict[type, type]:
    kinds: dict[type, type] = {}
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver

        kinds[SqliteSaver] = _sqlite_kind(SqliteSaver)
    except ImportError:
        pass
    try:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        kinds[AsyncSqliteSaver] = _async_sqlite_kind(AsyncSqliteSaver)
    except ImportError:
        pass
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        kinds[PostgresSaver] = _postgres_kind(PostgresSaver)
        kinds[AsyncPostgresSaver] = _async_postgres_kind(AsyncPostgresSaver)
    except ImportError:
        pass
    return kinds


_KINDS: dict[type, type] = {}


def _once(base: type, make: Any) -> type:
    made = _KINDS.get(base)
    if made is None:
        made = _KINDS[base] = make(base)
    return made


# -- SQLite (sqlite3) -------------------------------------------------------


def _sqlite_kind(base: type) -> type:
    def make(base: type) -> type:
        class FencedSqliteSaver(base):  # type: ignore[misc]
            """SqliteSaver whose write cursor first advances the fence in a
            BEGIN IMMEDIATE transaction, committed with the write."""

            _leasehold_installed: bool = False

            @contextmanager
            def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
                if not transaction:
                    with super().cursor(transaction=False) as cur:
                        yield cur
                    return
                key, fence = _scope("a checkpoint write")
                with self.lock:
                    self.setup()
                    conn: sqlite3.Connection = self.conn
                    if not self._leasehold_installed:
                        sqlite_fence.install(conn)
                        self._leasehold_installed = True
                    cur = conn.cursor()
                    try:
                        with sqlite_fence.write(conn, key, fence):
                            yield cur
                    finally:
                        cur.close()

            def claim(self, key: str, fence: int) -> None:
                token = SCOPE.set((key, fence))
                try:
                    with self.cursor():
                        pass
                finally:
                    SCOPE.reset(token)

        return FencedSqliteSaver

    return _once(base, make)


# -- SQLite (aiosqlite) -----------------------------------------------------


class _ReentrantLock:
    """The saver's asyncio lock, re-entered by the task that holds it: the
    fenced write holds it across the fence, the saver's own write (which
    takes it again) and the commit."""

    def __init__(self, lock: asyncio.Lock) -> None:
        self.lock = lock
        self.held: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "leasehold_lock_held", default=False
        )

    async def __aenter__(self) -> None:
        if not self.held.get():
            await self.lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if not self.held.get():
            self.lock.release()

    @asynccontextmanager
    async def holding(self) -> AsyncIterator[None]:
        async with self.lock:
            token = self.held.set(True)
            try:
                yield
            finally:
                self.held.reset(token)


async def _aiosqlite_advance(conn: Any, key: str, fence: int) -> None:
    cur = await conn.execute(sqlite_fence.ADVANCE, {"key": key, "fence": fence})
    changed = cur.rowcount
    await cur.close()
    if changed != 1:
        cur = await conn.execute(sqlite_fence.HIGHEST, {"key": key})
        row = await cur.fetchone()
        await cur.close()
        raise StaleFence(key, fence, 0 if row is None else int(row[0]))


def _async_sqlite_kind(base: type) -> type:
    def make(base: type) -> type:
        class FencedAsyncSqliteSaver(base):  # type: ignore[misc]
            """AsyncSqliteSaver whose writes run inside one BEGIN IMMEDIATE
            transaction that first advances the fence (the saver's own
            ``commit()`` ends it)."""

            _leasehold_installed: bool = False

            @asynccontextmanager
            async def _transaction(self, what: str) -> AsyncIterator[None]:
                key, fence = _scope(what)
                await self.setup()
                lock: _ReentrantLock = self.lock
                async with lock.holding():
                    conn = self.conn
                    if not self._leasehold_installed:
                        await conn.execute(sqlite_fence.CREATE_TABLE)
                        await conn.commit()
                        self._leasehold_installed = True
                    # SQLITE_BUSY (the write lock held, e.g. by a paused
                    # earlier owner) as the library's FenceTimeout.
                    with sqlite_fence.translate(key):
                        await conn.execute("BEGIN IMMEDIATE")
                        try:
                            await _aiosqlite_advance(conn, key, fence)
                            yield
                            if conn.in_transaction:
                                await conn.commit()
                        except BaseException:
                            if conn.in_transaction:
                                await conn.rollback()
                            raise

            async def aput(self, *args: Any, **kwargs: Any) -> Any:
                async with self._transaction("a checkpoint write"):
                    return await super().aput(*args, **kwargs)

            async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
                async with self._transaction("a checkpoint write"):
                    await super().aput_writes(*args, **kwargs)

            async def adelete_thread(self, thread_id: str) -> None:
                async with self._transaction("a thread deletion"):
                    await super().adelete_thread(thread_id)

            async def aclaim(self, key: str, fence: int) -> None:
                token = SCOPE.set((key, fence))
                try:
                    async with self._transaction("a claim"):
                        pass
                finally:
                    SCOPE.reset(token)

        return FencedAsyncSqliteSaver

    return _once(base, make)


# -- PostgreSQL (psycopg 3) -------------------------------------------------


async def _apg_advance(conn: Any, key: str, fence: int) -> None:
    from psycopg.rows import tuple_row

    async with conn.cursor(row_factory=tuple_row) as cur:
        # The helper's bounds (lock and idle timeouts), local to the transaction.
        await cur.execute(
            pg_fence.BOUND, pg_fence.bound_params(pg_fence.LOCK_TIMEOUT, pg_fence.IDLE_TIMEOUT)
        )
        await cur.execute(pg_fence.ADVANCE, {"key": key, "fence": fence})
        if cur.rowcount == 1:
            return
        row = await (await cur.execute(pg_fence.HIGHEST, {"key": key})).fetchone()
    raise StaleFence(key, fence, 0 if row is None else int(row[0]))


def _postgres_kind(base: type) -> type:
    def make(base: type) -> type:
        from langgraph.checkpoint.postgres import _internal
        from psycopg.rows import dict_row

        class FencedPostgresSaver(base):  # type: ignore[misc]
            """PostgresSaver whose writes run in one transaction that first
            advances the fence (the saver otherwise sends them on an
            autocommit connection, one statement at a time)."""

            _leasehold_installed: bool = False

            @contextmanager
            def _cursor(self, *, pipeline: bool = False) -> Iterator[Any]:
                scope = SCOPE.get()
                if scope is None:
                    if pipeline:
                        raise NotOwned("a checkpoint write reached a fenced saver outside a run")
                    with super()._cursor(pipeline=False) as cur:
                        yield cur
                    return
                key, fence = scope
                with self.lock, _internal.get_connection(self.conn) as conn:
                    if not self._leasehold_installed:
                        pg_fence.install(conn)
                        self._leasehold_installed = True
                    # advance bounds the transaction (lock and idle
                    # timeouts); their errors become FenceTimeout.
                    with pg_fence.translate(key), conn.transaction():
                        pg_fence.advance(conn, key, fence)
                        with conn.cursor(binary=True, row_factory=dict_row) as cur:
                            yield cur

            def claim(self, key: str, fence: int) -> None:
                token = SCOPE.set((key, fence))
                try:
                    with self._cursor(pipeline=True):
                        pass
                finally:
                    SCOPE.reset(token)

        return FencedPostgresSaver

    return _once(base, make)


def _async_postgres_kind(base: type) -> type:
    def make(base: type) -> type:
        from langgraph.checkpoint.postgres import _ainternal
        from psycopg.rows import dict_row

        class FencedAsyncPostgresSaver(base):  # type: ignore[misc]
            """AsyncPostgresSaver whose writes run in one transaction that
            first advances the fence."""

            _leasehold_installed: bool = False

            @asynccontextmanager
            async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
                scope = SCOPE.get()
                if scope is None:
                    if pipeline:
                        raise NotOwned("a checkpoint write reached a fenced saver outside a run")
                    async with super()._cursor(pipeline=False) as cur:
                        yield cur
                    return
                key, fence = scope
                async with self.lock, _ainternal.get_connection(self.conn) as conn:
                    if not self._leasehold_installed:
                        async with conn.transaction():
                            await conn.execute(pg_fence.CREATE_TABLE)
                        self._leasehold_installed = True
                    with pg_fence.translate(key):
                        async with conn.transaction():
                            await _apg_advance(conn, key, fence)
                            async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                                yield cur

            async def aclaim(self, key: str, fence: int) -> None:
                token = SCOPE.set((key, fence))
                try:
                    async with self._cursor(pipeline=True):
                        pass
                finally:
                    SCOPE.reset(token)

        return FencedAsyncPostgresSaver

    return _once(base, make)
