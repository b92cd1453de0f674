"""What a run owns: the thread's lease, carried in the run's config.

LangGraph copies a run's ``configurable`` entries into every config it hands
the checkpointer and the nodes (subgraphs included), and leaves names that
start with ``__`` out of checkpoint metadata, so the run's lease travels
under ``RUN`` to every write and tool call that belongs to it, and to
nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .._async import AsyncClient, AsyncLease
from .._errors import Error
from .._sync import Client, Lease
from .._types import ToolCallRecord

#: The configurable entry that carries the run's :class:`Run`.
RUN = "__leasehold_run"

#: What a recovered thread's unsettled tool calls are settled with.
UNKNOWN_RESULT = (
    b"leasehold: this tool call was begun by an earlier owner of the thread, "
    b"which was lost before it recorded a result; whether it ran is unknown"
)

Durability = Literal["sync", "async", "exit"]
OnUnsettled = Literal["unknown", "raise"]


class UnsettledToolCalls(Error):
    """A recovered thread has tool calls an earlier owner began and never
    settled, and the graph was owned with ``on_unsettled="raise"``. The run
    did not start; ``calls`` are the ledger's records (settle each with a
    lease of your own, then run again)."""

    def __init__(self, key: str, calls: list[ToolCallRecord]) -> None:
        ids = ", ".join(c.call_id for c in calls)
        super().__init__(
            f"thread {key!r} was recovered with {len(calls)} unsettled tool call(s): {ids}",
            key=key,
        )
        self.calls = calls


@dataclass(frozen=True)
class Run:
    """The lease one run (or one write outside a run) holds on its thread."""

    key: str
    lease: Lease | AsyncLease

    @property
    def fence(self) -> int:
        return self.lease.fence

    def check(self) -> None:
        """The local check, no round trip: raises ``LeaseLost`` once the
        lease is lost or its local deadline has passed."""
        if isinstance(self.lease, Lease):
            self.lease._same_process()
        self.lease._core.ensure_valid()


def run_in(config: Mapping[str, Any] | None) -> Run | None:
    """The run a config belongs to, if any."""
    if not config:
        return None
    found = (config.get("configurable") or {}).get(RUN)
    return found if isinstance(found, Run) else None


@dataclass(frozen=True)
class Ownership:
    """How an owned graph takes its threads: the client, the lease's terms
    and the key each thread id maps to."""

    client: Client | AsyncClient
    ttl: float
    wait: float
    prefix: str
    durability: Durability | None
    on_unsettled: OnUnsettled

    def key(self, thread_id: object) -> str:
        return f"{self.prefix}{thread_id}"

    def sync_client(self) -> Client:
        if not isinstance(self.client, Client):
            raise TypeError(
                "this graph was owned with an AsyncClient: run it with ainvoke/astream, "
                "or own it with a leasehold.Client for invoke/stream"
            )
        return self.client

    def async_client(self) -> AsyncClient:
        if not isinstance(self.client, AsyncClient):
            raise TypeError(
                "this graph was owned with a leasehold.Client: run it with invoke/stream, "
                "or own it with a leasehold.AsyncClient for ainvoke/astream"
            )
        return self.client

    # -- a run's whole term ------------------------------------------------
    @contextlib.contextmanager
    def term(self, key: str) -> Iterator[Run]:
        """A run's lease: released when the block ends, suspended when it
        raises (or the generator is closed early), so the thread becomes
        recoverable."""
        with self.sync_client().acquire(key, ttl=self.ttl, wait=self.wait) as lease:
            run = Run(key, lease)
            if lease.unsettled_tool_calls:
                self._recover(run, lease.unsettled_tool_calls_list())
            yield run

    @contextlib.asynccontextmanager
    async def aterm(self, key: str) -> AsyncIterator[Run]:
        client = self.async_client()
        async with client.acquire(key, ttl=self.ttl, wait=self.wait) as lease:
            run = Run(key, lease)
            if lease.unsettled_tool_calls:
                calls = await lease.unsettled_tool_calls_list()
                if self.on_unsettled == "raise":
                    raise UnsettledToolCalls(key, calls)
                for call in calls:
                    await lease.settle_tool_call(
                        call.call_id, "unknown", UNKNOWN_RESULT, turn=call.turn
                    )
            yield run

    def _recover(self, run: Run, calls: list[ToolCallRecord]) -> None:
        assert isinstance(run.lease, Lease)
        if self.on_unsettled == "raise":
            raise UnsettledToolCalls(run.key, calls)
        for call in calls:
            run.lease.settle_tool_call(call.call_id, "unknown", UNKNOWN_RESULT, turn=call.turn)

    # -- one write outside any run ----------------------------------------
    @contextlib.contextmanager
    def borrow(self, key: str) -> Iterator[Run]:
        """A lease for one write that no run covers (``update_state``,
        ``delete_thread``, ...), released after it whatever happens: a failed
        single write is not unfinished work to recover."""
        lease = self.sync_client().acquire(key, ttl=self.ttl, wait=self.wait)
        try:
            yield Run(key, lease)
        finally:
            with contextlib.suppress(Error):
                lease.release()

    @contextlib.asynccontextmanager
    async def aborrow(self, key: str) -> AsyncIterator[Run]:
        lease = await self.async_client().acquire(key, ttl=self.ttl, wait=self.wait)
        try:
            yield Run(key, lease)
        finally:
            with contextlib.suppress(Error):
                await lease.release()
