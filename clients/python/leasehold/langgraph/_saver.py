"""The checkpointer wrapper: every write of a thread under that thread's lease.

A write that belongs to an owned run presents the run's lease; any other
write (``update_state``, ``delete_thread``, ``copy_thread``, ``prune``, a
direct ``put``) takes the thread's lease for just that write, so it waits
out (or is refused by) a run that owns the thread. Each write first checks
the lease locally (no round trip); then, for the savers the database can
fence (``_fenced``), the fence is advanced in the write's own transaction,
and for any other saver ``lease.gate()`` runs right before the write.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from .._ownership import NotOwned
from .._sync import Lease
from ._fenced import SCOPE, adopt
from ._run import Ownership, Run, run_in

T = TypeVar("T")


def _thread(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


class LeaseholdSaver(BaseCheckpointSaver[Any]):
    """Wraps a LangGraph checkpointer so that only the thread's owner writes.

    Made by :func:`leasehold.langgraph.own`; reads pass straight through.
    ``fenced_in_transaction`` says whether the database itself refuses a
    stale owner's write (SqliteSaver, AsyncSqliteSaver, PostgresSaver and
    AsyncPostgresSaver without a shared pipeline) or the wrapper gates each
    write with a round trip first (any other saver)."""

    def __init__(self, inner: BaseCheckpointSaver[Any], ownership: Ownership) -> None:
        adopted = adopt(inner)
        self.inner: BaseCheckpointSaver[Any] = adopted if adopted is not None else inner
        self.fenced_in_transaction = adopted is not None
        self.ownership = ownership
        self.serde = self.inner.serde

    def __repr__(self) -> str:
        how = "fenced in the write's transaction" if self.fenced_in_transaction else "gated"
        return f"LeaseholdSaver({type(self.inner).__name__}, {how})"

    @property
    def config_specs(self) -> list[Any]:
        return self.inner.config_specs

    def with_allowlist(self, extra_allowlist: Any) -> BaseCheckpointSaver[Any]:
        inner = self.inner.with_allowlist(extra_allowlist)
        if inner is self.inner:
            return self
        clone = object.__new__(LeaseholdSaver)
        clone.__dict__.update(self.__dict__)
        clone.inner, clone.serde = inner, inner.serde
        return clone

    # -- reads ---------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.inner.get_tuple(config)

    def list(self, config: RunnableConfig | None, **kwargs: Any) -> Iterator[CheckpointTuple]:
        return self.inner.list(config, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.inner.aget_tuple(config)

    async def alist(
        self, config: RunnableConfig | None, **kwargs: Any
    ) -> AsyncIterator[CheckpointTuple]:
        async for item in self.inner.alist(config, **kwargs):
            yield item

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]) -> Any:
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Any:
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)

    # -- the fence -------------------------------------------------------------
    def claim(self, run: Run) -> None:
        """Records the run's fence in the database right after the grant,
        before the run reads the thread: from then on an earlier owner's
        late write is refused, so what the run reads is final."""
        claim = getattr(self.inner, "claim", None)
        if claim is not None:
            run.check()
            claim(run.key, run.fence)

    async def aclaim(self, run: Run) -> None:
        aclaim = getattr(self.inner, "aclaim", None)
        if aclaim is not None:
            run.check()
            await aclaim(run.key, run.fence)
        else:
            self.claim(run)

    def _run(self, thread_id: str, config: Mapping[str, Any] | None) -> Run | None:
        run = run_in(config)
        if run is not None and run.key == self.ownership.key(thread_id):
            return run
        return None

    def _write(self, thread_id: str, config: Mapping[str, Any] | None, op: Callable[[], T]) -> T:
        run = self._run(thread_id, config)
        if run is not None:
            return self._fenced(run, op)
        with self.ownership.borrow(self.ownership.key(thread_id)) as borrowed:
            return self._fenced(borrowed, op)

    def _fenced(self, run: Run, op: Callable[[], T]) -> T:
        run.check()
        if self.fenced_in_transaction:
            token = SCOPE.set((run.key, run.fence))
            try:
                return op()
            finally:
                SCOPE.reset(token)
        if not isinstance(run.lease, Lease):
            raise TypeError("a synchronous checkpoint write cannot gate an AsyncLease")
        run.lease.gate()
        return op()

    async def _awrite(
        self, thread_id: str, config: Mapping[str, Any] | None, op: Callable[[], Awaitable[T]]
    ) -> T:
        run = self._run(thread_id, config)
        if run is not None:
            return await self._afenced(run, op)
        async with self.ownership.aborrow(self.ownership.key(thread_id)) as borrowed:
            return await self._afenced(borrowed, op)

    async def _afenced(self, run: Run, op: Callable[[], Awaitable[T]]) -> T:
        run.check()
        if self.fenced_in_transaction:
            token = SCOPE.set((run.key, run.fence))
            try:
                return await op()
            finally:
                SCOPE.reset(token)
        if isinstance(run.lease, Lease):
            run.lease.gate()
        else:
            await run.lease.gate()
        return await op()

    # -- writes ----------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._write(
            _thread(config),
            config,
            lambda: self.inner.put(config, checkpoint, metadata, new_versions),
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._write(
            _thread(config),
            config,
            lambda: self.inner.put_writes(config, writes, task_id, task_path),
        )

    def delete_thread(self, thread_id: str) -> None:
        self._write(str(thread_id), None, lambda: self.inner.delete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._write(
            str(target_thread_id),
            None,
            lambda: self.inner.copy_thread(source_thread_id, target_thread_id),
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            self._write(str(thread_id), None, functools.partial(self._prune, thread_id, strategy))

    def _prune(self, thread_id: str, strategy: str) -> None:
        self.inner.prune([thread_id], strategy=strategy)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        raise NotOwned(
            "delete_for_runs spans threads, so no one lease covers it: call it on the "
            "inner saver while no run owns those threads"
        )

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._awrite(
            _thread(config),
            config,
            lambda: self.inner.aput(config, checkpoint, metadata, new_versions),
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._awrite(
            _thread(config),
            config,
            lambda: self.inner.aput_writes(config, writes, task_id, task_path),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        await self._awrite(str(thread_id), None, lambda: self.inner.adelete_thread(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._awrite(
            str(target_thread_id),
            None,
            lambda: self.inner.acopy_thread(source_thread_id, target_thread_id),
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            await self._awrite(
                str(thread_id),
                None,
                functools.partial(self.inner.aprune, [thread_id], strategy=strategy),
            )

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)
