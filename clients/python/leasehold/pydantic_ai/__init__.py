"""One owner per pydantic-ai conversation (``pip install 'leasehold[pydantic-ai]'``).

::

    import leasehold
    from leasehold import pydantic_ai as owned

    agent = Agent(model, toolsets=[owned.ledgered(FunctionToolset([shell]))])
    result = await owned.run(client, agent, prompt, conversation_id=chat_id, store=store)

``run`` is pydantic-ai's own load, run, save cycle on a
``ConversationStore`` (``store.load`` -> ``agent.run(conversation=...)`` ->
``store.save``) held under the conversation's lease (key
``pydantic-ai:<conversation_id>``): a second run of the conversation
anywhere waits up to ``wait`` seconds, then raises ``leasehold.Busy``
before it loads anything; the save is gated; the lease is released after
the save, suspended when anything raises. ``ledgered(toolset)`` gates each
run step (before its model request) and sends each tool call through the
conversation's ledger by pydantic-ai's ``tool_call_id``. See
``docs/pydantic-ai.md``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from typing import Any

from pydantic_ai.conversation import Conversation
from pydantic_ai.toolsets.wrapper import WrapperToolset

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
    async_lease_of,
    digest,
    keep_json,
)
from .._types import ToolCallRequest

__all__ = ["UNKNOWN_RESULT", "LedgerToolset", "NotOwned", "UnsettledToolCalls", "ledgered", "run"]

_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "leasehold_pydantic_ai_run", default=None
)


def _lease() -> AsyncLease:
    return async_lease_of(_CURRENT.get(), "a ledgered toolset")


@dataclasses.dataclass
class LedgerToolset(WrapperToolset[Any]):
    """The wrapped toolset, gated each step and its calls through the ledger:
    a call id already begun in the conversation never runs again; its
    stored result is returned instead."""

    async def for_run_step(self, ctx: Any) -> Any:
        # Before every model request of the run: the gate.
        await _lease().gate()
        return await super().for_run_step(ctx)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        lease = _lease()
        call = ToolCallRequest(
            call_id=str(ctx.tool_call_id), name=name, input_digest=digest(tool_args)
        )
        result = await aledgered_call(
            lease,
            call,
            lambda: super(LedgerToolset, self).call_tool(name, tool_args, ctx, tool),
            keep_json,
        )
        if not isinstance(result, Replayed):
            return result
        if result.record.state == "running":
            return "leasehold: this tool call is already running; it was not started again"
        try:
            return json.loads(result.record.result.decode())
        except ValueError:
            return result.record.result.decode(errors="replace")


def ledgered(toolset: Any) -> LedgerToolset:
    """``toolset`` (any pydantic-ai toolset) through the ledger."""
    return LedgerToolset(toolset)


async def run(
    client: AsyncClient,
    agent: Any,
    user_prompt: Any = None,
    *,
    conversation_id: str,
    store: Any,
    ttl: float = 30.0,
    wait: float = 0.0,
    prefix: str = "pydantic-ai:",
    on_unsettled: OnUnsettled = "unknown",
    scope: str | None = None,
    **kwargs: Any,
) -> Any:
    """Loads the conversation from ``store`` (or starts it), runs
    ``agent.run(user_prompt, conversation=..., **kwargs)`` and saves the
    result, all as the conversation's owner. Returns the run's result."""
    key = f"{prefix}{conversation_id}"
    async with client.acquire(key, ttl=ttl, wait=wait) as lease:
        await arecover(lease, key, on_unsettled)
        current = Run(key, lease)
        token = _CURRENT.set(current)
        try:
            loaded = await store.load(conversation_id, scope=scope)
            conversation = loaded or Conversation(conversation_id=conversation_id)
            result = await agent.run(user_prompt, conversation=conversation, **kwargs)
            current.check()
            await lease.gate()
            await store.save(result, scope=scope)
            return result
        finally:
            _CURRENT.reset(token)
