"""One owner per LangGraph thread (``pip install 'leasehold[langgraph]'``).

::

    import leasehold
    from leasehold.langgraph import own

    graph = own(builder.compile(checkpointer=saver), leasehold.Client(addr))
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "42"}})

A run on a ``thread_id`` holds that thread's lease (key ``langgraph:42``)
from before it reads the thread until it ends: released when it finishes
(an ``interrupt()`` included), suspended when it raises or its stream is
closed early, so the thread becomes recoverable. A second run of the thread
anywhere waits up to ``wait`` seconds, then raises ``leasehold.Busy``; it
never writes. Every checkpoint write of a run that lost its lease is
refused; for SqliteSaver, AsyncSqliteSaver, PostgresSaver and
AsyncPostgresSaver by the database itself, in the write's transaction.

``ToolNode`` (or ``wrap_tool_call`` / ``awrap_tool_call`` on LangGraph's
own) sends each tool call through the thread's ledger: an id begun once on
the thread never runs again. See ``docs/langgraph.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from langchain_core.runnables.config import ensure_config, merge_configs
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel

from .._async import AsyncClient
from .._ownership import NotOwned
from .._sync import Client
from ._run import (
    RUN,
    UNKNOWN_RESULT,
    Durability,
    OnUnsettled,
    Ownership,
    Run,
    UnsettledToolCalls,
    run_in,
)
from ._saver import LeaseholdSaver
from ._tools import ToolNode, awrap_tool_call, wrap_tool_call

try:
    from langgraph._internal._constants import CONFIG_KEY_DURABILITY
except ImportError:  # pragma: no cover - the name LangGraph has used since 0.6
    CONFIG_KEY_DURABILITY = "__pregel_durability"

G = TypeVar("G", bound="Pregel[Any, Any, Any, Any]")

__all__ = [
    "UNKNOWN_RESULT",
    "LeaseholdSaver",
    "NotOwned",
    "Run",
    "ToolNode",
    "UnsettledToolCalls",
    "awrap_tool_call",
    "own",
    "run_in",
    "wrap_tool_call",
]


def own(
    graph: G,
    client: Client | AsyncClient,
    *,
    ttl: float = 30.0,
    wait: float = 0.0,
    prefix: str = "langgraph:",
    durability: Durability | None = "sync",
    on_unsettled: OnUnsettled = "unknown",
) -> G:
    """The same compiled graph, whose runs own their thread.

    ``client``: a ``leasehold.Client`` for ``invoke``/``stream`` or an
    ``AsyncClient`` for ``ainvoke``/``astream``. ``ttl``: the lease's TTL in
    seconds (renewed in the background while the run lasts). ``wait``: how
    long a run waits for a thread another run owns before ``Busy``.
    ``prefix``: the lease key is ``prefix + thread_id``. ``durability``: the
    run's durability when neither the call nor its config names one
    (``"sync"``: each step's checkpoint is written, and refused, before the
    next step starts; None leaves LangGraph's default, ``"async"``).
    ``on_unsettled``: what a run that takes over a recovered thread does with
    tool calls the lost owner began and never settled: ``"unknown"`` settles
    each as unknown (a ledgered tool call then answers the model with
    ``UNKNOWN_RESULT``), ``"raise"`` raises ``UnsettledToolCalls`` before the
    run starts.
    """
    saver = graph.checkpointer
    if isinstance(saver, LeaseholdSaver) or isinstance(graph, _Owned):
        raise TypeError("this graph is already owned")
    if not isinstance(saver, BaseCheckpointSaver):
        raise TypeError(
            "own() needs a graph compiled with a checkpointer: "
            "builder.compile(checkpointer=SqliteSaver(...)), say"
        )
    if ttl <= 0 or wait < 0:
        raise ValueError("ttl must be positive and wait not negative")
    ownership = Ownership(client, ttl, wait, prefix, durability, on_unsettled)
    attrs = {k: v for k, v in graph.__dict__.items() if k != "__orig_class__"}
    attrs["checkpointer"] = LeaseholdSaver(saver, ownership)
    owned: G = _owned_class(type(graph))(**attrs)
    return owned


_CLASSES: dict[type, type] = {}


def _owned_class(cls: type) -> type:
    made = _CLASSES.get(cls)
    if made is None:
        made = _CLASSES[cls] = type(f"Owned{cls.__name__}", (_Owned, cls), {"__module__": __name__})
    return made


class _Owned:
    """Mixed in before the graph's own class: ``stream`` and ``astream``
    (which ``invoke``, ``ainvoke`` and the event streams go through) hold
    the thread's lease around the run. ``Pregel.copy`` and ``with_config``
    keep the class, and the ownership lives on the checkpointer."""

    checkpointer: Any
    config: Any

    def _owned_run(self, config: Any, kwargs: dict[str, Any]) -> tuple[str | None, Ownership, Any]:
        saver: LeaseholdSaver = self.checkpointer
        merged = ensure_config(merge_configs(self.config, config))
        conf = merged.get("configurable") or {}
        thread = conf.get("thread_id")
        if thread is None:
            # LangGraph refuses a checkpointed run without a thread itself.
            return None, saver.ownership, config
        key = saver.ownership.key(thread)
        present = run_in(merged)
        if present is not None and present.key == key:
            return None, saver.ownership, config  # a subgraph call inside the run
        if (
            saver.ownership.durability is not None
            and kwargs.get("durability") is None
            and "checkpoint_during" not in kwargs
            and CONFIG_KEY_DURABILITY not in conf
        ):
            kwargs["durability"] = saver.ownership.durability
        return key, saver.ownership, config

    def stream(self, input: Any, config: Any = None, **kwargs: Any) -> Iterator[Any]:
        key, ownership, config = self._owned_run(config, kwargs)
        if key is None:
            yield from super().stream(input, config, **kwargs)  # type: ignore[misc]
            return
        with ownership.term(key) as run:
            self.checkpointer.claim(run)
            config = merge_configs(config, {"configurable": {RUN: run}})
            if _left_mid_step(run, input) and self.get_state(config).next:  # type: ignore[attr-defined]
                for _ in super().stream(None, config, **kwargs):  # type: ignore[misc]
                    pass  # the lost owner's step, finished first (see _left_mid_step)
            yield from super().stream(input, config, **kwargs)  # type: ignore[misc]

    async def astream(self, input: Any, config: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        key, ownership, config = self._owned_run(config, kwargs)
        if key is None:
            async for item in super().astream(input, config, **kwargs):  # type: ignore[misc]
                yield item
            return
        async with ownership.aterm(key) as run:
            await self.checkpointer.aclaim(run)
            config = merge_configs(config, {"configurable": {RUN: run}})
            if _left_mid_step(run, input) and (await self.aget_state(config)).next:  # type: ignore[attr-defined]
                async for _ in super().astream(None, config, **kwargs):  # type: ignore[misc]
                    pass  # the lost owner's step, finished first (see _left_mid_step)
            async for item in super().astream(input, config, **kwargs):  # type: ignore[misc]
                yield item


def _left_mid_step(run: Run, input: Any) -> bool:
    """Whether a run brings new input to a thread it took over from a lost
    owner: if that owner stopped mid-step (a tool call checkpointed, its
    answer never), the new input would send the call with no output, so the
    step is finished first, its calls answered by the ledger (as unknown),
    and the model's reply to that recorded, before the input is taken."""
    return input is not None and run.lease.recovered
