"""Tool calls through the ledger, as ToolNode interceptors.

``ToolNode(tools, wrap_tool_call=..., awrap_tool_call=...)`` hands each call
to an interceptor with a function that runs it. Ours registers the call's id
in the thread's ledger first: an id already begun on this thread (in this
run, an earlier run, or by an owner since lost) is never run again; its
stored outcome comes back as the ToolMessage instead (or, for a call whose
outcome nobody recorded, an error message that says so, for the model).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode as _ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest as _Request
from langgraph.types import Command

from .._async import AsyncLease
from .._ownership import NotOwned, Replayed, aledgered_call, digest, ledgered_call
from .._sync import Lease
from .._types import ToolCallRecord, ToolCallRequest
from ._run import run_in

#: What a call whose result is a ``Command`` stores (a Command is not replayed).
COMMAND_RESULT = "leasehold: this tool call already ran; its result was a Command, not replayed"
#: What a call still recorded as running (begun twice in one step) answers.
RUNNING_RESULT = "leasehold: this tool call is already running; it was not started again"

Result = ToolMessage | Command[Any]


def _lease(request: _Request) -> Lease | AsyncLease:
    run = run_in(request.runtime.config if request.runtime is not None else None)
    if run is None:
        raise NotOwned(
            "a ledgered tool call ran outside an owned run: build the graph with "
            "leasehold.langgraph.own(...) and run it through the owned graph"
        )
    run.check()
    return run.lease


def _call(request: _Request) -> ToolCallRequest:
    call = request.tool_call
    return ToolCallRequest(
        call_id=str(call["id"]), name=str(call["name"]), input_digest=digest(call.get("args", {}))
    )


def _stored(result: Result) -> tuple[str, bytes]:
    """The outcome and result bytes the ledger keeps for a call's answer."""
    if isinstance(result, ToolMessage):
        outcome = "failed" if result.status == "error" else "succeeded"
        body = {"content": result.content, "status": result.status}
        return outcome, json.dumps(body, default=str).encode()
    return "succeeded", json.dumps({"content": COMMAND_RESULT, "status": "success"}).encode()


def _replayed(record: ToolCallRecord, request: _Request) -> ToolMessage:
    """The ToolMessage for a call the ledger already holds (not run again)."""
    call_id, name = str(request.tool_call["id"]), request.tool_call["name"]
    if record.state == "running":
        return ToolMessage(RUNNING_RESULT, tool_call_id=call_id, name=name, status="error")
    try:
        body = json.loads(record.result.decode())
        content, status = body["content"], body.get("status", "success")
    except (ValueError, KeyError, TypeError):
        # Settled by someone else (a recoverer's "unknown", say): its text.
        content = record.result.decode(errors="replace")
        status = "success" if record.state == "succeeded" else "error"
    return ToolMessage(content, tool_call_id=call_id, name=name, status=status)


def wrap_tool_call(request: _Request, execute: Callable[[_Request], Result]) -> Result:
    """The ledger as a ``ToolNode(wrap_tool_call=...)`` interceptor."""
    lease = _lease(request)
    if not isinstance(lease, Lease):
        raise TypeError("a synchronous tool call inside an async run: use awrap_tool_call")
    # interrupt() inside a ledgered tool (GraphBubbleUp) settles the call as
    # unknown: on resume the tool would run again with the same id, which
    # the ledger refuses; see the docs.
    result = ledgered_call(
        lease, _call(request), lambda: execute(request), _stored, unknown_on=(GraphBubbleUp,)
    )
    return _replayed(result.record, request) if isinstance(result, Replayed) else result


async def awrap_tool_call(
    request: _Request, execute: Callable[[_Request], Awaitable[Result]]
) -> Result:
    """The ledger as a ``ToolNode(awrap_tool_call=...)`` interceptor."""
    lease = _lease(request)
    if not isinstance(lease, AsyncLease):
        raise TypeError("an async tool call inside a synchronous run: use wrap_tool_call")
    result = await aledgered_call(
        lease, _call(request), lambda: execute(request), _stored, unknown_on=(GraphBubbleUp,)
    )
    return _replayed(result.record, request) if isinstance(result, Replayed) else result


class ToolNode(_ToolNode):
    """``langgraph.prebuilt.ToolNode`` whose calls go through the thread's
    ledger (the same arguments; the interceptors are leasehold's)."""

    def __init__(self, tools: Iterable[Any], **kwargs: Any) -> None:
        if "wrap_tool_call" in kwargs or "awrap_tool_call" in kwargs:
            raise TypeError(
                "leasehold.langgraph.ToolNode sets the interceptors itself; to compose "
                "with your own, call leasehold.langgraph.wrap_tool_call / "
                "awrap_tool_call from them and use langgraph's ToolNode"
            )
        super().__init__(
            list(tools), wrap_tool_call=wrap_tool_call, awrap_tool_call=awrap_tool_call, **kwargs
        )
