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

from .._async import AsyncClient
from .._errors import Error
from .._ownership import (
    UNKNOWN_RESULT,
    OnUnsettled,
    Run,
    UnsettledToolCalls,
    arecover,
    recover,
)
from .._sync import Client

__all__ = [
    "RUN",
    "UNKNOWN_RESULT",
    "Durability",
    "OnUnsettled",
    "Ownership",
    "Run",
    "UnsettledToolCalls",
    "run_in",
]

#: The configurable entry that carries the run's :class:`Run`.
RUN = "__leasehold_run"

Durability = Literal["sync", "async", "exit"]


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
            recover(lease, key, self.on_unsettled)
            yield Run(key, lease)

    @contextlib.asynccontextmanager
    async def aterm(self, key: str) -> AsyncIterator[Run]:
        client = self.async_client()
        async with client.acquire(key, ttl=self.ttl, wait=self.wait) as lease:
            await arecover(lease, key, self.on_unsettled)
            yield Run(key, lease)

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
