"""What the framework adapters share: the lease a run holds, and what a
takeover does with the tool calls a lost owner left unsettled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._async import AsyncLease
from ._errors import Error
from ._sync import Lease
from ._types import ToolCallRecord

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
