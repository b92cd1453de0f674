"""What the framework adapters share: the lease a run holds, and what a
takeover does with the tool calls a lost owner left unsettled."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._async import AsyncLease
from ._errors import Error
from ._sync import Lease
from ._types import ToolCallRecord, ToolCallRequest

#: What a recovered thread's unsettled tool calls are settled with.
UNKNOWN_RESULT = (
    b"leasehold: this tool call was begun by an earlier owner of the thread, "
    b"which was lost before it recorded a result; whether it ran is unknown"
)

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


class NotOwned(Error):
    """A write, step or ledgered tool call that no owned run (or lease
    borrowed for one write) covers. One class for every adapter; each
    re-exports it as its own ``NotOwned``."""


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


def async_lease_of(run: Run | None, what: str) -> AsyncLease:
    """The valid ``AsyncLease`` of the current run (checked locally), or
    ``NotOwned`` naming ``what`` ran outside one."""
    if run is None:
        raise NotOwned(f"{what} ran outside an owned run")
    run.check()
    assert isinstance(run.lease, AsyncLease)
    return run.lease


def recover(lease: Lease, key: str, policy: OnUnsettled) -> None:
    """What a run that took over ``key`` does first with the tool calls the
    lost owner left running: settle each as unknown, or raise."""
    if not lease.unsettled_tool_calls:
        return
    calls = lease.unsettled_tool_calls_list()
    if policy == "raise":
        raise UnsettledToolCalls(key, calls)
    for call in calls:
        lease.settle_tool_call(call.call_id, "unknown", UNKNOWN_RESULT, turn=call.turn)


async def arecover(lease: AsyncLease, key: str, policy: OnUnsettled) -> None:
    """:func:`recover` for an ``AsyncLease``."""
    if not lease.unsettled_tool_calls:
        return
    calls = await lease.unsettled_tool_calls_list()
    if policy == "raise":
        raise UnsettledToolCalls(key, calls)
    for call in calls:
        await lease.settle_tool_call(call.call_id, "unknown", UNKNOWN_RESULT, turn=call.turn)


def leasehold_cause(err: BaseException) -> Error | None:
    """The leasehold error a framework wrapped in its own (the Agents SDK's
    ``UserError("Error running tool ...")``, say), so that every adapter
    reports a loss as the same ``leasehold`` exception."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, Error):
            return seen
        seen = seen.__cause__
    return None


@dataclass(frozen=True)
class Replayed:
    """A ledgered call that did not run: the ledger already held its id
    (``record.state`` says with what: succeeded, failed, unknown, or still
    running elsewhere)."""

    record: ToolCallRecord


#: How a call's result is kept in the ledger: (outcome, result bytes).
Keep = Callable[[Any], tuple[str, bytes]]


def digest(args: object) -> str:
    """The input digest stored with a call: sha256 of its arguments as JSON."""
    text = args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def ledgered_call(
    lease: Lease,
    call: ToolCallRequest,
    run: Callable[[], Any],
    keep: Keep,
    unknown_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """One tool call through the ledger: registered before ``run`` runs, and
    not run at all (``Replayed``) when its id was begun before; settled with
    ``keep(result)``, as failed when ``run`` raises, as unknown when it
    raises one of ``unknown_on`` (a framework's own control flow)."""
    begun = lease.begin_tool_calls([call])
    if begun.duplicate:
        return Replayed(begun.calls[0])
    try:
        result = run()
    except unknown_on:
        lease.settle_tool_call(call.call_id, "unknown", b"interrupted")
        raise
    except Exception as err:
        lease.settle_tool_call(call.call_id, "failed", repr(err).encode())
        raise
    outcome, body = keep(result)
    lease.settle_tool_call(call.call_id, outcome, body)
    return result


async def aledgered_call(
    lease: AsyncLease,
    call: ToolCallRequest,
    run: Callable[[], Awaitable[Any]],
    keep: Keep,
    unknown_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """:func:`ledgered_call` for an ``AsyncLease``."""
    begun = await lease.begin_tool_calls([call])
    if begun.duplicate:
        return Replayed(begun.calls[0])
    try:
        result = await run()
    except unknown_on:
        await lease.settle_tool_call(call.call_id, "unknown", b"interrupted")
        raise
    except Exception as err:
        await lease.settle_tool_call(call.call_id, "failed", repr(err).encode())
        raise
    outcome, body = keep(result)
    await lease.settle_tool_call(call.call_id, outcome, body)
    return result


def keep_json(result: Any) -> tuple[str, bytes]:
    """Keeps a result as JSON, as succeeded."""
    return "succeeded", json.dumps(result, default=str).encode()
