"""Storage-side fencing: the resource itself refuses a stale holder.

A gate (``lease.gate()``) cannot stop a process that passed its check and
was then paused (a GC pause, a stopped VM) while its write was on its way.
The storage must compare fencing tokens: every write carries the writer's
fence, the storage remembers the highest fence that has written each key,
and refuses a lower one. leasehold's fences rise with every grant and
survive restarts, so a newer holder always presents a higher fence.

``leasehold.fence.sqlite`` does this inside an application's own SQLite
database (the same SQL as the Rust helper); ``leasehold.fence.postgres``
inside a PostgreSQL transaction (psycopg 3, the ``postgres`` extra).
"""

from __future__ import annotations

from .._errors import Error


class FenceError(Error):
    """A fenced write that must not happen."""


class StaleFence(FenceError):
    """A higher fence has already written this key: the writer's lease is over.
    The transaction must roll back (``write()`` does)."""

    def __init__(self, key: str, fence: int, highest: int) -> None:
        super().__init__(
            f"fence {fence} for key {key!r} is stale: fence {highest} has already written "
            "(a newer holder wrote; or, if the lock server's store was reset or replaced, "
            "restart it with --fence-floor at least the highest fence stored, which "
            "fence_floor() reports: see leasehold's docs/deploy.md)",
            code="FAILED_PRECONDITION",
            key=key,
        )
        self.fence = fence
        self.highest = highest

    def __reduce__(self) -> tuple[type[StaleFence], tuple[str, int, int]]:
        # Picklable (e.g. to report from a worker process) despite the
        # positional constructor.
        return (StaleFence, (self.key, self.fence, self.highest))


class NotInTransaction(FenceError):
    """The fence check ran outside a transaction, where it would protect nothing."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"the fence check for key {key!r} must run inside the write's transaction", key=key
        )

    def __reduce__(self) -> tuple[type[NotInTransaction], tuple[str]]:
        return (NotInTransaction, (self.key,))


class FenceTimeout(FenceError):
    """A fenced transaction ran past its bound; nothing of it was committed.

    ``reason`` says which bound:

    - ``"busy"``: it waited too long for the key's fence (PostgreSQL's
      ``lock_timeout``) or the database's write lock (SQLite's busy timeout,
      ``sqlite3.connect(timeout=...)``): another transaction holds it, perhaps
      an earlier owner paused inside its own fenced write. Retry later.
    - ``"idle"``: PostgreSQL ended this transaction's session because it sat
      idle inside the transaction too long
      (``idle_in_transaction_session_timeout``), e.g. this process was paused.
    - ``"open"``: a SQLite fenced transaction stayed open longer than its
      bound (e.g. this process was paused) and was rolled back instead of
      committed.
    """

    def __init__(self, key: str, reason: str, detail: str) -> None:
        super().__init__(
            f"fenced write for key {key!r} {detail}; nothing of it was committed",
            code="DEADLINE_EXCEEDED",
            key=key,
        )
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[FenceTimeout], tuple[str, str, str]]:
        return (FenceTimeout, (self.key, self.reason, self.detail))


__all__ = ["FenceError", "FenceTimeout", "NotInTransaction", "StaleFence"]
