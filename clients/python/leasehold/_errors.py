"""The client's one exception hierarchy, and the one place statuses become it.

Every refusal the server sends carries its details (holder, fence, reason)
as status metadata, or, on the Session stream, in ``SessionResponse.details``
under the same names. Both are read here and nowhere else, so callers never
parse messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import grpc

#: Metadata names the server uses for refusal details (see the proto's header).
KEY = "leasehold-key-bin"
HOLDER = "leasehold-holder-bin"
FENCE = "leasehold-fence"
REMAINING = "leasehold-remaining-ms"
REASON = "leasehold-reason"
AT = "leasehold-at-ms"
BY = "leasehold-superseded-by"
LIMIT = "leasehold-limit"
SUCCESSOR = "leasehold-successor-bin"
FAILURES = "leasehold-failures"
OLDEST = "leasehold-oldest-revision"


class Error(Exception):
    """Any failure of a leasehold call.

    ``code`` is the gRPC status code name (``"ABORTED"``, ...) when the server
    or the transport said so; ``details`` holds the refusal's metadata as the
    server sent it (``-bin`` names as bytes, the others as text).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        key: str = "",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.key = key
        self.details: dict[str, str | bytes] = dict(details or {})


class Busy(Error):
    """The key is held by another term (``ABORTED``).

    ``holder`` is the owner holding it, ``fence`` its fence, ``remaining``
    the seconds left of its TTL when the server answered.
    """

    def __init__(
        self,
        message: str,
        *,
        holder: str = "",
        fence: int = 0,
        remaining: float = 0.0,
        key: str = "",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code="ABORTED", key=key, details=details)
        self.holder = holder
        self.fence = fence
        self.remaining = remaining


class Reserved(Busy):
    """The key is free but reserved (``ABORTED`` with a reason), so only
    someone else may take it for now. A subclass of :class:`Busy`, so code
    that waits out a busy key waits this out too.

    ``reason`` is ``"lock_delay"`` (the last term expired and asked for a
    lock-delay: nobody may acquire the key yet; ``fence`` is that expired
    term's) or ``"handoff"`` (the last holder handed the key to
    ``successor``: only an acquire by that owner gets it). ``remaining`` is
    the seconds left of the reservation when the server answered; ``holder``
    is empty.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        successor: str = "",
        fence: int = 0,
        remaining: float = 0.0,
        key: str = "",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, fence=fence, remaining=remaining, key=key, details=details)
        self.reason = reason
        self.successor = successor


class Quarantined(Error):
    """An acquire of a quarantined key (``FAILED_PRECONDITION``, reason
    ``quarantined``): ``failures`` terms in a row ended by expiry or
    suspension, so the server stopped handing the key out until an admin
    calls ``unquarantine(key)`` (or acquires with ``force=True``). The
    message lists the failed terms; ``history(key)`` has them in full."""

    def __init__(
        self,
        message: str,
        *,
        failures: int = 0,
        key: str = "",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code="FAILED_PRECONDITION", key=key, details=details)
        self.failures = failures


class Compacted(Error):
    """A watch asked for a revision the server's event log no longer holds
    (``OUT_OF_RANGE``). List the keys again, then watch from the
    ``next_revision`` of a watch started at 0. ``oldest_revision`` is the
    oldest revision still held (watching from it works, but the events
    before it are gone)."""

    def __init__(
        self,
        message: str,
        *,
        oldest_revision: int,
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code="OUT_OF_RANGE", details=details)
        self.oldest_revision = oldest_revision


class Unsupported(Error):
    """The server does not have this feature (``UNIMPLEMENTED``): its
    storage backend lacks it, or the server is older than this client and
    lacks the call itself (the message then says so). Never silently
    ignored by the server."""


class LeaseLost(Error):
    """The lease is gone, or the client can no longer be sure it holds it.

    ``reason`` is one of the server's stale-fence reasons (``"expired"``,
    ``"released"``, ``"suspended"``, ``"superseded"``, ``"unknown"``: the
    server refused the fence, final) or one the client adds:
    ``"deadline"`` (no renewal succeeded before the local deadline; the lease
    may become valid again if a later renewal succeeds) and ``"ended"`` (this
    lease was released or suspended by its holder). ``superseded_by`` is the
    newer fence for ``"superseded"``; ``at_ms`` the server time of the end.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str = "",
        fence: int = 0,
        reason: str = "unknown",
        superseded_by: int = 0,
        at_ms: int = 0,
        code: str = "FAILED_PRECONDITION",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code=code, key=key, details=details)
        self.fence = fence
        self.reason = reason
        self.superseded_by = superseded_by
        self.at_ms = at_ms

    @property
    def final(self) -> bool:
        """Whether the lease can never become valid again."""
        return self.reason != "deadline"


class PermissionDenied(Error):
    """The fence is live but the lease id presented with it is not its own."""

    def __init__(
        self,
        message: str,
        *,
        key: str = "",
        fence: int = 0,
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code="PERMISSION_DENIED", key=key, details=details)
        self.fence = fence


class InvalidArgument(Error):
    """Malformed input: key, owner, TTL (100 ms to 24 h), wait (at most 5 min),
    a transcript that cannot be read, or inconsistent client options."""


class NotFound(Error):
    """The key, or the tool call, was never recorded."""


class Unauthenticated(Error):
    """The server runs with ``--auth`` and the client sent no token, or one
    it does not know (give ``token=`` to the client)."""


class ResourceExhausted(Error):
    """A server limit was reached (``RESOURCE_EXHAUSTED``); other clients are
    still served. ``limit`` names it: ``"keys_per_principal"`` (release
    keys first), ``"waiters_per_key"``, ``"waits_per_connection"``,
    ``"streams_per_connection"``, ``"ops_per_second"`` (back off); empty
    when gRPC itself refused (a message over the size limit)."""

    def __init__(
        self,
        message: str,
        *,
        limit: str = "",
        key: str = "",
        details: Mapping[str, str | bytes] | None = None,
    ) -> None:
        super().__init__(message, code="RESOURCE_EXHAUSTED", key=key, details=details)
        self.limit = limit


class Unavailable(Error):
    """The server could not be reached, did not answer in time, is shutting
    down, or its storage failed. Retrying later may succeed."""


class StreamRefused(Unavailable):
    """A Session stream the server refused as a whole (no credential, too
    many streams): its operations fail as :class:`Unavailable`, so that a
    lease's renewals retry on a new stream, and keep the refusal in
    ``refusal`` for an operation that answers what its unary call would
    (Acquire). Not exported."""

    def __init__(self, message: str, refusal: Error | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


def _text(details: Mapping[str, str | bytes], name: str) -> str:
    value = details.get(name, "")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _int(details: Mapping[str, str | bytes], name: str) -> int:
    try:
        return int(_text(details, name) or 0)
    except ValueError:
        return 0


def _missing_rpc(message: str) -> str:
    from ._types import PROTOCOL  # _types imports the protos; keep _errors light

    said = f" ({message})" if message else ""
    return (
        f"the server does not implement this call{said}: it is an older leasehold than this "
        f"client (which speaks leasehold.v1 revision {PROTOCOL}) or not a leasehold server; "
        "`leasehold health` against it prints its version"
    )


def _strip(message: str, prefix: str) -> str:
    return message[len(prefix) :] if message.startswith(prefix) else message


def from_code(code: str, message: str, details: Mapping[str, str | bytes]) -> Error:
    """Builds the error for a refusal with status ``code`` (a name such as
    ``"ABORTED"``), its message and its metadata details."""
    key = _text(details, KEY)
    fence = _int(details, FENCE)
    if code == "INVALID_ARGUMENT":
        return InvalidArgument(
            _strip(message, "invalid argument: "), code=code, key=key, details=details
        )
    reason = _text(details, REASON)
    if code == "ABORTED" and reason in ("lock_delay", "handoff"):
        return Reserved(
            message,
            reason=reason,
            successor=_text(details, SUCCESSOR),
            fence=fence,
            remaining=_int(details, REMAINING) / 1000.0,
            key=key,
            details=details,
        )
    if code == "FAILED_PRECONDITION" and reason == "quarantined":
        return Quarantined(message, failures=_int(details, FAILURES), key=key, details=details)
    if code == "OUT_OF_RANGE" and OLDEST in details:
        return Compacted(message, oldest_revision=_int(details, OLDEST), details=details)
    if code == "UNIMPLEMENTED":
        # A leasehold server's own refusal says "unsupported: ..."; anything
        # else is the RPC itself missing (grpc answers an unknown method
        # with "Method not found!"), so name the likely cause.
        if not message.startswith("unsupported: "):
            message = _missing_rpc(message)
        return Unsupported(_strip(message, "unsupported: "), code=code, key=key, details=details)
    if code == "ABORTED":
        return Busy(
            message,
            holder=_text(details, HOLDER),
            fence=fence,
            remaining=_int(details, REMAINING) / 1000.0,
            key=key,
            details=details,
        )
    if code == "FAILED_PRECONDITION":
        return LeaseLost(
            message,
            key=key,
            fence=fence,
            reason=reason or "unknown",
            superseded_by=_int(details, BY),
            at_ms=_int(details, AT),
            details=details,
        )
    if code == "PERMISSION_DENIED":
        return PermissionDenied(message, key=key, fence=fence, details=details)
    if code == "NOT_FOUND":
        return NotFound(message, code=code, key=key, details=details)
    if code == "UNAUTHENTICATED":
        return Unauthenticated(
            _strip(message, "unauthenticated: "), code=code, key=key, details=details
        )
    if code == "RESOURCE_EXHAUSTED":
        return ResourceExhausted(message, limit=_text(details, LIMIT), key=key, details=details)
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
        return Unavailable(_strip(message, "unavailable: "), code=code, key=key, details=details)
    # INTERNAL (storage failed) and anything a proxy may send.
    return Error(message, code=code, key=key, details=details)


_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def from_refusal(code: int, message: str, details: Mapping[str, bytes]) -> Error:
    """The error for a refused operation on the Session stream
    (``SessionResponse.code``, ``.message``, ``.details``). Values of names
    without ``-bin`` are ASCII text, as in status metadata."""
    decoded: dict[str, str | bytes] = {}
    for name, value in details.items():
        decoded[name] = value if name.endswith("-bin") else value.decode("ascii", "replace")
    return from_code(_CODE_NAMES.get(code, "UNKNOWN"), message, decoded)


def from_rpc_error(err: grpc.RpcError) -> Error:
    """The error for a failed unary call, read from its status and trailing
    metadata (grpc gives ``-bin`` values as bytes already)."""
    code = err.code() if isinstance(err, grpc.Call) else None
    message = err.details() if isinstance(err, grpc.Call) else str(err)
    trailing: Iterable[tuple[str, str | bytes]] = ()
    if isinstance(err, grpc.Call):
        trailing = err.trailing_metadata() or ()
    details = {name: value for name, value in trailing if name.startswith("leasehold-")}
    return from_code(code.name if code is not None else "UNKNOWN", message or "", details)


def from_aio_error(err: grpc.aio.AioRpcError) -> Error:
    """As :func:`from_rpc_error`, for grpc.aio's error type."""
    trailing: Any = err.trailing_metadata() or ()
    details: dict[str, str | bytes] = {}
    for name, value in trailing:
        if isinstance(name, str) and name.startswith("leasehold-"):
            details[name] = value
    return from_code(err.code().name, err.details() or "", details)
