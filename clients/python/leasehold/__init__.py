"""leasehold: session-ownership leases with fencing tokens, from Python.

::

    import leasehold

    client = leasehold.Client("127.0.0.1:7420")
    with client.acquire("session:42", ttl=15.0, wait=5.0) as lease:
        lease.gate()                      # before each model request / terminal write
        store.append(item, fence=lease.fence)

``AsyncClient`` is the asyncio twin. Storage-side fencing lives in
``leasehold.fence.sqlite`` and ``leasehold.fence.postgres``.
"""

from ._async import AsyncClient, AsyncLease
from ._async_rt import AsyncWatch
from ._errors import (
    Busy,
    Compacted,
    Error,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PermissionDenied,
    Quarantined,
    Reserved,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unsupported,
)
from ._sync import Client, Lease
from ._sync_rt import Watch
from ._types import (
    PROTOCOL,
    BeginResult,
    EndedTerm,
    HistoryEntry,
    HistoryPage,
    KeyPage,
    KeyState,
    LiveTerm,
    Reservation,
    ServerInfo,
    ToolCallRecord,
    ToolCallRequest,
    ToolInvocation,
    ToolOutcome,
    ToolResult,
    TranscriptFinding,
    TranscriptRepair,
    TranscriptReport,
    WatchEvent,
)

__all__ = [
    "PROTOCOL",
    "AsyncClient",
    "AsyncLease",
    "AsyncWatch",
    "BeginResult",
    "Busy",
    "Client",
    "Compacted",
    "EndedTerm",
    "Error",
    "HistoryEntry",
    "HistoryPage",
    "InvalidArgument",
    "KeyPage",
    "KeyState",
    "Lease",
    "LeaseLost",
    "LiveTerm",
    "NotFound",
    "PermissionDenied",
    "Quarantined",
    "Reservation",
    "Reserved",
    "ResourceExhausted",
    "ServerInfo",
    "ToolCallRecord",
    "ToolCallRequest",
    "ToolInvocation",
    "ToolOutcome",
    "ToolResult",
    "TranscriptFinding",
    "TranscriptRepair",
    "TranscriptReport",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "Watch",
    "WatchEvent",
]
