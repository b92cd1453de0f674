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
from ._errors import (
    Busy,
    Error,
    InvalidArgument,
    LeaseLost,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from ._sync import Client, Lease
from ._types import (
    BeginResult,
    EndedTerm,
    ToolCallRecord,
    ToolCallRequest,
    ToolInvocation,
    ToolOutcome,
    ToolResult,
    TranscriptFinding,
    TranscriptRepair,
    TranscriptReport,
)

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "BeginResult",
    "Busy",
    "Client",
    "EndedTerm",
    "Error",
    "InvalidArgument",
    "Lease",
    "LeaseLost",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
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
]
