"""One owner per OpenAI Agents SDK session (``pip install 'leasehold[agents]'``).

::

    import leasehold
    from leasehold import agents as owned

    client = leasehold.AsyncClient(addr)
    session = SQLiteSession(chat_id, "conversations.db")
    result = await owned.run(client, agent, message, session=session)   # was Runner.run(...)

``run`` holds the session's lease (key ``agents:<session_id>``) for the
whole run: released when it returns, suspended when it raises or is
cancelled, so the session becomes recoverable. A second run of the session
anywhere waits up to ``wait`` seconds, then raises ``leasehold.Busy``
before it reads the history, calls the model or writes. Each model call is
gated; each session write of a run that lost its lease is refused, for
``SQLiteSession`` by the database itself in the write's transaction.
``ledgered(tool)`` sends a function tool's calls through the session's
ledger, so a call id is never run twice. See ``docs/agents.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Iterator
from typing import Any

from agents import FunctionTool, RunHooks, Runner
from agents.memory import SessionABC, SQLiteSession
from agents.tool_context import ToolContext

from .._async import AsyncClient, AsyncLease
from .._ownership import (
    UNKNOWN_RESULT,
    NotOwned,
    OnUnsettled,
    Replayed,
    Run,
    UnsettledToolCalls,
    aledgered_call,
    arecover,
    digest,
    leasehold_cause,
)
from .._types import ToolCallRequest
from ..fence import sqlite as sqlite_fence

__all__ = [
    "UNKNOWN_RESULT",
    "NotOwned",
    "OwnedSession",
    "UnsettledToolCalls",
    "ledgered",
    "owned",
    "run",
]

#: The run the current task belongs to (set by ``owned``), for ledgered tools.
_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "leasehold_agents_run", default=None
)


class OwnedSession(SessionABC):
    """A session whose writes are its owner's alone (made by :func:`owned`).

    Reads check the lease locally; writes (``add_items``, ``pop_item``,
    ``clear_session``) are refused once it is lost: for ``SQLiteSession``
    by the database in the write's own transaction, for any other session
    by ``lease.gate()`` right before the write."""

    def __init__(self, inner: Any, run: Run) -> None:
        self.session_id = inner.session_id
        self.session_settings = getattr(inner, "session_settings", None)
        self.run = run
        fenced = _fenced(inner, run)
        self.inner = fenced if fenced is not None else inner
        self.fenced_in_transaction = fenced is not None

    async def _before_write(self) -> None:
        self.run.check()
        if not self.fenced_in_transaction:
            lease = self.run.lease
            assert isinstance(lease, AsyncLease)
            await lease.gate()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        self.run.check()
        items: list[Any] = await self.inner.get_items(limit)
        return items

    async def add_items(self, items: list[Any]) -> None:
        await self._before_write()
        await self.inner.add_items(items)

    async def pop_item(self) -> Any:
        await self._before_write()
        return await self.inner.pop_item()

    async def clear_session(self) -> None:
        await self._before_write()
        await self.inner.clear_session()

    async def claim(self) -> None:
        """Records the fence in the database before the run reads anything,
        so an earlier owner's late write is refused from now on."""
        if self.fenced_in_transaction:
            self.run.check()
            await asyncio.to_thread(self.inner._leasehold_claim)


def _fenced(inner: Any, run: Run) -> Any | None:
    """A copy of a ``SQLiteSession`` (exactly that class) whose every write
    transaction first advances the fence; None for any other session."""
    if type(inner) is not SQLiteSession:
        return None
    copy: Any = object.__new__(_FencedSQLiteSession)
    copy.__dict__.update(inner.__dict__)
    copy._leasehold_scope = (run.key, run.fence)
    copy._leasehold_installed = False
    return copy


class _FencedSQLiteSession(SQLiteSession):
    """SQLiteSession whose write connection begins ``BEGIN IMMEDIATE`` and
    advances the fence before the session's statements; the session's own
    ``commit()`` ends it, its rollback on an error undoes both."""

    _leasehold_scope: tuple[str, int]
    _leasehold_installed: bool = False

    @contextlib.contextmanager
    def _write_connection(self) -> Iterator[sqlite3.Connection]:
        key, fence = self._leasehold_scope
        # SQLITE_BUSY (the write lock held, e.g. by a paused earlier owner)
        # as the library's FenceTimeout, whether at BEGIN or the session's commit.
        with sqlite_fence.translate(key), super()._write_connection() as conn:
            if not self._leasehold_installed:
                sqlite_fence.install(conn)
                self._leasehold_installed = True
            if not conn.in_transaction:
                conn.execute("BEGIN IMMEDIATE")
            sqlite_fence.advance(conn, key, fence)
            yield conn

    def _leasehold_claim(self) -> None:
        with self._write_connection() as conn:
            conn.commit()


@contextlib.asynccontextmanager
async def owned(
    session: Any,
    client: AsyncClient,
    *,
    ttl: float = 30.0,
    wait: float = 0.0,
    prefix: str = "agents:",
    on_unsettled: OnUnsettled = "unknown",
) -> AsyncIterator[OwnedSession]:
    """Holds ``session``'s lease for the block and yields the owned session
    to pass to ``Runner.run(..., session=...)``: released at the end,
    suspended if the block raises. A thread taken over from a lost owner
    first has the tool calls it left unsettled settled as unknown (or
    ``UnsettledToolCalls`` raised, with ``on_unsettled="raise"``)."""
    key = f"{prefix}{session.session_id}"
    async with client.acquire(key, ttl=ttl, wait=wait) as lease:
        run = Run(key, lease)
        mine = OwnedSession(session, run)
        await mine.claim()
        await arecover(lease, key, on_unsettled)
        token = _CURRENT.set(run)
        try:
            yield mine
        finally:
            _CURRENT.reset(token)


async def run(
    client: AsyncClient,
    starting_agent: Any,
    input: Any,
    *,
    session: Any,
    ttl: float = 30.0,
    wait: float = 0.0,
    prefix: str = "agents:",
    on_unsettled: OnUnsettled = "unknown",
    **kwargs: Any,
) -> Any:
    """``Runner.run(starting_agent, input, session=session, **kwargs)`` as
    the session's owner: the lease around the run (see :func:`owned`) and
    ``lease.gate()`` before every model call (before the hooks you pass;
    answered locally while the lease is fresh when the session is fenced in
    its writes' transaction, as ``SQLiteSession``)."""
    async with owned(
        session, client, ttl=ttl, wait=wait, prefix=prefix, on_unsettled=on_unsettled
    ) as mine:
        hooks = _Gated(mine.run, kwargs.pop("hooks", None), mine.fenced_in_transaction)
        try:
            return await Runner.run(starting_agent, input, session=mine, hooks=hooks, **kwargs)
        except Exception as err:
            cause = leasehold_cause(err)
            if cause is None or cause is err:
                raise
            raise cause from err


class _Gated(RunHooks[Any]):
    """Gates each model call on the lease, then hands every event to the
    caller's hooks.

    With a session fenced in the write's own transaction, what a model call
    leads to is written under the fence (the session's writes, a ledgered
    tool's Begin), so a fresh lease passes the gate locally, without a
    round trip (``gate(storage_fenced=True)``); with any other session, the
    gate asks the server each time."""

    def __init__(self, run: Run, inner: RunHooks[Any] | None, storage_fenced: bool) -> None:
        self._run = run
        self._inner = inner if inner is not None else RunHooks()
        self._storage_fenced = storage_fenced

    async def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        lease = self._run.lease
        assert isinstance(lease, AsyncLease)
        await lease.gate(storage_fenced=self._storage_fenced)
        await self._inner.on_llm_start(*args, **kwargs)

    async def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_llm_end(*args, **kwargs)

    async def on_agent_start(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_agent_start(*args, **kwargs)

    async def on_agent_end(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_agent_end(*args, **kwargs)

    async def on_handoff(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_handoff(*args, **kwargs)

    async def on_tool_start(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_tool_start(*args, **kwargs)

    async def on_tool_end(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.on_tool_end(*args, **kwargs)


def ledgered(tool: FunctionTool) -> FunctionTool:
    """The same function tool, its calls through the owned session's ledger:
    a call id already begun on the session is not run again; its stored
    result is returned instead (or, for a call a lost owner never settled,
    ``UNKNOWN_RESULT``'s text)."""
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        current = _CURRENT.get()
        if current is None:
            raise NotOwned(
                f"tool {tool.name!r} is ledgered but ran outside leasehold.agents.owned/run"
            )
        current.check()
        lease = current.lease
        assert isinstance(lease, AsyncLease)
        call = ToolCallRequest(
            call_id=ctx.tool_call_id, name=tool.name, input_digest=digest(arguments)
        )
        result = await aledgered_call(
            lease, call, lambda: invoke(ctx, arguments), lambda r: ("succeeded", str(r).encode())
        )
        if not isinstance(result, Replayed):
            return result
        if result.record.state == "running":
            return "leasehold: this tool call is already running; it was not started again"
        return result.record.result.decode(errors="replace")

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)
