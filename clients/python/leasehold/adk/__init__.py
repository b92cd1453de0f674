"""One owner per Google ADK session (``pip install 'leasehold[adk]'``).

::

    import leasehold
    from leasehold.adk import own

    runner = own(Runner(agent=agent, app_name="app", session_service=service), client)
    async for event in runner.run_async(user_id=u, session_id=s, new_message=msg):
        ...

``own`` (the runner itself, changed in place and returned) makes each
``run_async`` hold the session's lease (key ``adk:<app>:<user>:<session>``)
until its events end: released when they end, suspended when the run
raises or its generator is closed early. A second run of the session
anywhere waits up to ``wait`` seconds, then raises ``leasehold.Busy``
before it reads the session. A plugin gates each model call and sends each
tool call through the session's ledger (a call id never runs twice); the
session service's writes of a run that lost its lease are refused, for
``SqliteSessionService`` by the database itself in the write's
transaction. See ``docs/adk.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import AsyncIterator
from typing import Any

from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.sessions.sqlite_session_service import SqliteSessionService

from .._async import AsyncClient, AsyncLease
from .._ownership import (
    UNKNOWN_RESULT,
    NotOwned,
    OnUnsettled,
    Run,
    UnsettledToolCalls,
    arecover,
    async_lease_of,
    digest,
    leasehold_cause,
)
from .._types import ToolCallRequest
from ..fence import StaleFence
from ..fence import sqlite as sqlite_fence

__all__ = ["UNKNOWN_RESULT", "NotOwned", "OwnedSessionService", "UnsettledToolCalls", "own"]

#: The run the current task belongs to.
_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "leasehold_adk_run", default=None
)


def _key(prefix: str, app: str, user: str, session: str) -> str:
    return f"{prefix}{app}:{user}:{session}"


class OwnedSessionService(BaseSessionService):
    """A session service whose event appends are the session owner's alone.

    ``append_event`` must run inside an owned run of that session (else
    ``NotOwned``); it checks the lease locally, then for
    ``SqliteSessionService`` (that exact class) advances the fence in the
    append's own transaction, and for any other service runs ``gate()``
    right before it. Everything else passes through."""

    def __init__(self, inner: BaseSessionService, prefix: str) -> None:
        self.prefix = prefix
        fenced = type(inner) is SqliteSessionService
        if fenced:
            copy: Any = object.__new__(_FencedSqliteSessionService)
            copy.__dict__.update(inner.__dict__)
            inner = copy
        self.inner = inner
        self.fenced_in_transaction = fenced

    async def create_session(self, **kwargs: Any) -> Any:
        return await self.inner.create_session(**kwargs)

    async def get_session(self, **kwargs: Any) -> Any:
        return await self.inner.get_session(**kwargs)

    async def list_sessions(self, **kwargs: Any) -> Any:
        return await self.inner.list_sessions(**kwargs)

    async def delete_session(self, **kwargs: Any) -> None:
        await self.inner.delete_session(**kwargs)

    async def get_user_state(self, **kwargs: Any) -> Any:
        return await self.inner.get_user_state(**kwargs)

    async def flush(self) -> None:
        await self.inner.flush()

    async def append_event(self, session: Any, event: Any) -> Any:
        if event.partial:
            return await self.inner.append_event(session, event)
        key = _key(self.prefix, session.app_name, session.user_id, session.id)
        run = _CURRENT.get()
        if run is None or run.key != key:
            raise NotOwned(f"an event for session {key!r} was appended outside its owned run")
        run.check()
        if self.fenced_in_transaction:
            token = _SCOPE.set((run.key, run.fence))
            try:
                return await self.inner.append_event(session, event)
            finally:
                _SCOPE.reset(token)
        lease = run.lease
        assert isinstance(lease, AsyncLease)
        await lease.gate()
        return await self.inner.append_event(session, event)

    async def claim(self, run: Run) -> None:
        """Records the fence before the run reads the session."""
        if self.fenced_in_transaction:
            run.check()
            token = _SCOPE.set((run.key, run.fence))
            try:
                inner: Any = self.inner
                async with inner._get_db_connection() as db:
                    await db.commit()
            finally:
                _SCOPE.reset(token)


_SCOPE: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "leasehold_adk_scope", default=None
)


class _FencedSqliteSessionService(SqliteSessionService):
    """SqliteSessionService whose connection, inside a fenced append, is
    handed over in a ``BEGIN IMMEDIATE`` transaction that has already
    advanced the fence: the append's own ``commit()`` ends it, and a
    connection closed without one rolls both back."""

    _leasehold_installed: bool = False

    @contextlib.asynccontextmanager
    async def _get_db_connection(self) -> AsyncIterator[Any]:
        async with super()._get_db_connection() as db:
            scope = _SCOPE.get()
            if scope is None:
                yield db
                return
            key, fence = scope
            # SQLITE_BUSY (the write lock held, e.g. by a paused earlier
            # owner) as the library's FenceTimeout, at BEGIN or the commit.
            with sqlite_fence.translate(key):
                if not self._leasehold_installed:
                    await db.execute(sqlite_fence.CREATE_TABLE)
                    self._leasehold_installed = True
                if not db.in_transaction:
                    await db.execute("BEGIN IMMEDIATE")
                cur = await db.execute(sqlite_fence.ADVANCE, {"key": key, "fence": fence})
                if cur.rowcount != 1:
                    await db.rollback()
                    row = await (await db.execute(sqlite_fence.HIGHEST, {"key": key})).fetchone()
                    raise StaleFence(key, fence, 0 if row is None else int(row[0]))
                yield db


class _Ledger(BasePlugin):
    """Gates each model call; sends each tool call through the ledger.

    With ``SqliteSessionService`` (fenced in each append's own transaction)
    what a model call leads to is written under the fence: the session's
    appends, and every tool call's Begin (this plugin ledgers them all). A
    fresh lease then passes the model call's gate locally, without a round
    trip (``gate(storage_fenced=True)``); with any other service the gate
    asks the server each time."""

    def __init__(self, storage_fenced: bool = False) -> None:
        super().__init__(name="leasehold")
        self._storage_fenced = storage_fenced

    @staticmethod
    def _lease() -> AsyncLease:
        return async_lease_of(_CURRENT.get(), "a model or tool call")

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> Any:
        await self._lease().gate(storage_fenced=self._storage_fenced)
        return None

    async def before_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any
    ) -> dict[str, Any] | None:
        lease = self._lease()
        call = ToolCallRequest(
            call_id=str(tool_context.function_call_id),
            name=tool.name,
            input_digest=digest(tool_args),
        )
        begun = await lease.begin_tool_calls([call])
        if not begun.duplicate:
            return None
        record = begun.calls[0]
        if record.state == "running":
            return {"error": "leasehold: this tool call is already running; not started again"}
        try:
            stored: dict[str, Any] = json.loads(record.result.decode())
            return stored
        except ValueError:
            return {"error": record.result.decode(errors="replace")}

    async def after_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, result: Any
    ) -> dict[str, Any] | None:
        body = json.dumps(result, default=str).encode()
        await self._lease().settle_tool_call(str(tool_context.function_call_id), "succeeded", body)
        return None

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, error: Exception
    ) -> dict[str, Any] | None:
        body = json.dumps({"error": repr(error)}).encode()
        await self._lease().settle_tool_call(str(tool_context.function_call_id), "failed", body)
        return None


_CLASSES: dict[type, type] = {}


def own(
    runner: Runner,
    client: AsyncClient,
    *,
    ttl: float = 30.0,
    wait: float = 0.0,
    prefix: str = "adk:",
    on_unsettled: OnUnsettled = "unknown",
) -> Runner:
    """Makes ``runner`` (changed in place, and returned) the owner of each
    session it runs: see the module doc."""
    if isinstance(runner.session_service, OwnedSessionService):
        raise TypeError("this runner is already owned")
    service = OwnedSessionService(runner.session_service, prefix)
    runner.session_service = service
    runner.plugin_manager.register_plugin(_Ledger(storage_fenced=service.fenced_in_transaction))
    cls = type(runner)
    made = _CLASSES.get(cls)
    if made is None:
        made = _CLASSES[cls] = type(f"Owned{cls.__name__}", (_OwnedRunner, cls), {})
    runner.__class__ = made
    runner._leasehold = (client, ttl, wait, prefix, on_unsettled)  # type: ignore[attr-defined]
    return runner


class _OwnedRunner:
    _leasehold: tuple[AsyncClient, float, float, str, OnUnsettled]
    app_name: str
    session_service: OwnedSessionService

    async def run_async(
        self, *, user_id: str, session_id: str, **kwargs: Any
    ) -> AsyncIterator[Any]:
        client, ttl, wait, prefix, on_unsettled = self._leasehold
        key = _key(prefix, self.app_name, user_id, session_id)
        current = _CURRENT.get()
        if current is not None and current.key == key:
            async for event in super().run_async(  # type: ignore[misc]
                user_id=user_id, session_id=session_id, **kwargs
            ):
                yield event
            return
        async with client.acquire(key, ttl=ttl, wait=wait) as lease:
            run = Run(key, lease)
            await self.session_service.claim(run)
            await arecover(lease, key, on_unsettled)
            token = _CURRENT.set(run)
            try:
                async for event in super().run_async(  # type: ignore[misc]
                    user_id=user_id, session_id=session_id, **kwargs
                ):
                    yield event
            except Exception as err:
                cause = leasehold_cause(err)
                if cause is None or cause is err:
                    raise
                raise cause from err
            finally:
                with contextlib.suppress(ValueError):  # closed from another context
                    _CURRENT.reset(token)
