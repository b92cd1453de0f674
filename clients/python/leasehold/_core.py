"""What the sync and asyncio clients share: timing rules, a held term's
standing, request building and the tool-call bookkeeping. Nothing here does
I/O; the clients in ``_async`` and ``_sync`` (generated from it) drive it."""

from __future__ import annotations

import copy
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._errors import Error, InvalidArgument, LeaseLost, NotFound, PermissionDenied
from ._proto import leasehold_pb2 as pb
from ._types import (
    LIST_FILTERS,
    OUTCOMES,
    EndedTerm,
    ToolCallRecord,
    ToolCallRequest,
    ToolOutcome,
    ToolResult,
    WatchEvent,
)

#: The longest the default safety margin gets, whatever the TTL (seconds).
MAX_DEFAULT_MARGIN = 2.0
#: The longest the default per-call timeout gets, whatever the TTL (seconds).
MAX_DEFAULT_RPC_TIMEOUT = 5.0
#: What an acquire may take on top of its wait: it may have to connect first.
ACQUIRE_GRACE = 5.0
#: How many times an acquire or a release is sent when the server is unreachable.
ATTEMPTS = 3
#: HTTP/2 pings find a silently dead connection (no FIN or RST) in seconds
#: instead of the minutes TCP takes; as the Rust client sets them.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a server restart: a lease's renewals cannot
    # wait out gRPC's default 1 s-and-growing backoff when its TTL is short.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Each channel keeps its own connections: from gRPC's process-wide pool a
    # channel made in a fork()'s child would be handed the parent's
    # connection, whose socket belongs to the parent ("Wrong file descriptor
    # generation" on its first call).
    ("grpc.use_local_subchannel_pool", 1),
]


#: gRPC call metadata: (name, value) pairs.
Metadata = tuple[tuple[str, str], ...]


def bearer(token: str | None) -> Metadata:
    """The metadata that carries ``token`` (none without one)."""
    if token is None:
        return ()
    return (("authorization", f"Bearer {token}"),)


def default_owner() -> str:
    """``host:pid``, shown to others in busy errors."""
    return f"{socket.gethostname()}:{os.getpid()}"


def millis(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def jittered(seconds: float) -> float:
    """Uniform in ``[d/2, d]``, so clients that failed together do not retry together."""
    return seconds / 2 + random.random() * seconds / 2


@dataclass(frozen=True)
class Timing:
    """A lease's timing, checked for consistency (all in seconds)."""

    ttl: float
    renew_every: float
    margin: float
    rpc_timeout: float

    @staticmethod
    def resolve(
        ttl: float,
        renew_every: float | None = None,
        safety_margin: float | None = None,
        rpc_timeout: float | None = None,
    ) -> Timing:
        if ttl <= 0:
            raise InvalidArgument(f"ttl {ttl} s must be above zero")
        margin = min(ttl / 10, MAX_DEFAULT_MARGIN) if safety_margin is None else safety_margin
        if margin < 0 or margin >= ttl:
            raise InvalidArgument(f"safety margin {margin} s must be shorter than the ttl {ttl} s")
        every = ttl / 3 if renew_every is None else renew_every
        if every <= 0 or every >= ttl - margin:
            raise InvalidArgument(
                f"renewal interval {every} s must be above zero and shorter than the ttl "
                f"{ttl} s less the safety margin {margin} s"
            )
        timeout = min(every, MAX_DEFAULT_RPC_TIMEOUT) if rpc_timeout is None else rpc_timeout
        if timeout <= 0:
            raise InvalidArgument("rpc timeout must be above zero")
        return Timing(ttl=ttl, renew_every=every, margin=margin, rpc_timeout=timeout)

    @property
    def valid_for(self) -> float:
        """How long after a successful renewal was sent the lease trusts itself."""
        return self.ttl - self.margin

    def retry_pause(self, failures: int) -> float:
        """The pause before retry number ``failures`` (1 = after the first
        failure): doubling from an eighth of the renewal interval (at least
        10 ms), never longer than the interval. The caller adds jitter."""
        base = max(self.renew_every / 8, 0.01)
        return min(base * float(1 << min(max(failures - 1, 0), 16)), self.renew_every)


def ends_the_term(err: Error) -> bool:
    """Whether ``err``, answering a Renew, Check or Release, means the term is
    over for good (retrying cannot help)."""
    return isinstance(err, (LeaseLost, PermissionDenied, InvalidArgument, NotFound))


def ledger_ends_the_term(err: Error) -> bool:
    """Whether ``err``, answering a tool-call ledger call, means the term is
    over: only a stale fence or a wrong lease id. An invalid argument or an
    unknown call id is about the call (an over-long result, an id begun in
    several turns settled without its turn), not about the term."""
    return isinstance(err, (LeaseLost, PermissionDenied))


def targets_of(target: str | Sequence[str]) -> list[str]:
    """The servers a client was given: one target, a comma-separated list,
    or a sequence of targets (each as ``Client`` takes it)."""
    if isinstance(target, str):
        items = target.split(",")
    else:
        items = list(target)
        for item in items:
            if not isinstance(item, str):
                raise InvalidArgument(f"a target must be a string, not {type(item).__name__}")
    found = [t.strip() for t in items if t.strip()]
    if not found:
        raise InvalidArgument("no server target given")
    return found


class Rotation:
    """Which of a client's servers calls go to first, and moving on from one
    that answered UNAVAILABLE (see the README's "Several servers")."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._current = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> int:
        return self._current

    def order(self) -> list[int]:
        """Every server once, starting with the current one."""
        start = self._current
        return [(start + i) % self.count for i in range(self.count)]

    def move_on_from(self, index: int) -> None:
        """Moves on to the server after ``index``, unless another call already
        did (two calls failing together skip one server, not two)."""
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % self.count


def not_resent(target: str, err: Error) -> Error:
    """The error of a call that met an unavailable server and is not safe to
    send again elsewhere (it may have been applied)."""
    from ._errors import Unavailable

    return Unavailable(
        f"{target}: {err.message} (not resent to another server: it may have been applied)"
    )


def none_answered(failures: Sequence[str]) -> Error:
    from ._errors import Unavailable

    return Unavailable(f"no server answered ({'; '.join(failures)})")


class Standing:
    """One held term and what its holder knows about it right now.

    Shared by a lease object and its background renewal (a thread or a task),
    which holds only this, not the lease, so an abandoned lease can be noticed.
    ``notify(valid)`` is called whenever validity may have changed; the twins
    use it to set or clear their ``lost`` event.
    """

    def __init__(
        self,
        *,
        reply: pb.AcquireResponse,
        timing: Timing,
        basis: float | None,
        notify: Callable[[bool], None],
    ) -> None:
        lease = reply.lease
        #: The key held.
        self.key = lease.key
        #: The term's fencing token.
        self.fence = lease.fence
        #: The owner name the term was granted to.
        self.owner = lease.owner
        #: The secret capability to renew and release the term; never shown.
        self.lease_id = lease.lease_id
        self.timing = timing
        self.previous = EndedTerm.from_pb(reply.previous) if reply.HasField("previous") else None
        self.replayed = reply.replayed
        self.unsettled_at_grant = reply.unsettled_tool_calls
        #: The term's expiry as the server last reported it (server clock, ms).
        self.expires_at_ms = lease.expires_at_ms
        now = time.monotonic()
        # Without a basis (a replayed grant of unknown age) trust nothing
        # until the first renewal.
        #: The local deadline on the monotonic clock: the send time of the
        #: last successful renewal (or the acquire) + ttl - margin.
        self.deadline = now if basis is None else basis + timing.valid_for
        #: Set once the lease is lost for good (refused, released, suspended).
        self.final: LeaseLost | None = None
        #: A renewal failed (unanswered, or refused for a passing reason) and
        #: none has succeeded since: the lease is not fresh, so a
        #: storage-fenced gate asks the server (see ``fresh``).
        self.renewal_failing = False
        self._lock = threading.Lock()
        self._notify = notify
        self._flagged = False  # whether notify(False) was sent for the deadline

    # -- requests ---------------------------------------------------------
    def renew_request(self) -> pb.SessionRequest:
        return pb.SessionRequest(
            renew=pb.RenewRequest(
                key=self.key,
                fence=self.fence,
                lease_id=self.lease_id,
                ttl_ms=millis(self.timing.ttl),
            )
        )

    def check_request(self) -> pb.SessionRequest:
        return pb.SessionRequest(check=pb.CheckRequest(key=self.key, fence=self.fence))

    def release_request(
        self, suspend: bool, successor: str = "", within: float = 0.0
    ) -> pb.SessionRequest:
        return pb.SessionRequest(
            release=pb.ReleaseRequest(
                key=self.key,
                fence=self.fence,
                lease_id=self.lease_id,
                suspend=suspend,
                successor=successor,
                handoff_ms=millis(within),
            )
        )

    # -- standing ---------------------------------------------------------
    def lost_error(self, reason: str, message: str) -> LeaseLost:
        return LeaseLost(
            f"the lease on key {self.key!r} (fence {self.fence}) is lost: {message}",
            key=self.key,
            fence=self.fence,
            reason=reason,
            code="",
        )

    def loss(self) -> LeaseLost | None:
        """Why the lease is not valid now, or None while it is (a fresh
        exception each time, so threads never raise one shared object)."""
        if self.final is not None:
            return copy.copy(self.final)
        if time.monotonic() >= self.deadline:
            self.refresh()
            return self.lost_error(
                "deadline",
                "no renewal succeeded before the local deadline, so the server may have expired it",
            )
        return None

    def refresh(self) -> None:
        """Tells the lease's ``lost`` event if the deadline has passed."""
        with self._lock:
            if self.final is None and not self._flagged and time.monotonic() >= self.deadline:
                self._flagged = True
                flag = True
            else:
                flag = False
        if flag:
            self._notify(False)

    def seconds_to_deadline(self) -> float | None:
        """Until the deadline, or None when it has passed or does not matter."""
        if self.final is not None or self._flagged:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def renewed(self, sent: float, lease: pb.Lease) -> None:
        """Records a successful renewal that was sent at ``sent``."""
        with self._lock:
            if self.final is not None:
                return
            self.deadline = max(self.deadline, sent + self.timing.valid_for)
            self.expires_at_ms = lease.expires_at_ms
            self.renewal_failing = False
            back = self._flagged and time.monotonic() < self.deadline
            if back:
                self._flagged = False
        if back:
            # The server never ended the term (same fence and lease id were
            # renewed), so nobody held the key in between: valid again.
            self._notify(True)

    def fresh(self) -> bool:
        """Whether a gate guarding a storage-fenced write may answer without a
        round trip: not lost, the local deadline (the send time of the last
        successful renewal + ttl - margin, which the server's expiry cannot
        come before) still ahead, and no renewal has failed since. While
        renewals fail, the gate asks the server, as it did before."""
        return self.final is None and not self.renewal_failing and time.monotonic() < self.deadline

    def end(self, err: LeaseLost) -> None:
        """Marks the lease lost for good, unless it already is."""
        with self._lock:
            if self.final is not None:
                return
            self.final = err
        self._notify(False)

    def judge(self, err: Error, *, ledger: bool = False) -> Error:
        """Turns an answer about the term into a final loss where it is one
        (for a tool-call ledger call, with ``ledger``: see
        :func:`ledger_ends_the_term`)."""
        if not (ledger_ends_the_term(err) if ledger else ends_the_term(err)):
            return err
        if isinstance(err, LeaseLost):
            lost = LeaseLost(
                f"the lease on key {self.key!r} (fence {self.fence}) is lost: {err.message}",
                key=self.key,
                fence=self.fence,
                reason=err.reason,
                superseded_by=err.superseded_by,
                at_ms=err.at_ms,
                details=err.details,
            )
        else:
            lost = self.lost_error(err.code.lower() or "refused", err.message)
        self.end(lost)
        return self.final or lost

    def ensure_valid(self) -> None:
        err = self.loss()
        if err is not None:
            raise err

    # -- tool calls -------------------------------------------------------
    def begin_request(
        self, calls: Sequence[ToolCallRequest], turn: str = "", across_turns: bool = False
    ) -> pb.BeginToolCallsRequest:
        return pb.BeginToolCallsRequest(
            key=self.key,
            fence=self.fence,
            lease_id=self.lease_id,
            calls=[
                pb.ToolCallSpec(call_id=c.call_id, name=c.name, input_digest=c.input_digest)
                for c in calls
            ],
            turn=turn_checked(turn),
            across_turns=across_turns,
        )

    def settle_request(
        self, call_id: str, outcome: str, result: bytes, turn: str = ""
    ) -> pb.SettleToolCallRequest:
        state = OUTCOMES.get(outcome)
        if state is None:
            raise InvalidArgument(
                f"outcome {outcome!r} must be one of succeeded, failed or unknown"
            )
        return pb.SettleToolCallRequest(
            key=self.key,
            fence=self.fence,
            lease_id=self.lease_id,
            call_id=call_id,
            outcome=state,  # type: ignore[arg-type]
            result=result,
            turn=turn_checked(turn),
        )

    def unsettled_request(self) -> pb.ListToolCallsRequest:
        return pb.ListToolCallsRequest(key=self.key, filter=pb.ListToolCallsRequest.UNSETTLED)


def acquire_request(
    *,
    key: str,
    owner: str,
    ttl: float,
    wait: float,
    request_id: str,
    lock_delay: float,
    max_recoveries: int,
    force: bool,
) -> pb.AcquireRequest:
    """An Acquire with the lifecycle options checked (the server checks the
    limits: a lock-delay of at most 60 s)."""
    if lock_delay < 0:
        raise InvalidArgument(f"lock_delay {lock_delay} s must not be negative")
    if max_recoveries < 0:
        raise InvalidArgument(f"max_recoveries {max_recoveries} must not be negative")
    return pb.AcquireRequest(
        key=key,
        owner=owner,
        ttl_ms=millis(ttl),
        wait_ms=millis(wait),
        request_id=request_id,
        lock_delay_ms=millis(lock_delay),
        max_recoveries=max_recoveries,
        force=force,
    )


def handoff_checked(successor: str, within: float) -> None:
    """Refuses a handoff that cannot be what the caller meant, before the
    term is ended (the server checks the owner's form and the 10 min limit)."""
    if not successor:
        raise InvalidArgument("hand_off needs a successor owner name")
    if within < 0:
        raise InvalidArgument(f"hand_off within {within} s must not be negative")


def list_request(prefix: str, filter: str, page_size: int, page_token: str) -> pb.ListRequest:
    state = LIST_FILTERS.get(filter)
    if state is None:
        raise InvalidArgument(
            f"filter {filter!r} must be one of all, live, recoverable or quarantined"
        )
    return pb.ListRequest(
        prefix=prefix,
        filter=state,  # type: ignore[arg-type]
        page_size=page_size,
        page_token=page_token,
    )


def watch_request(key: str, prefix: str, start_revision: int) -> pb.WatchRequest:
    if key and prefix:
        raise InvalidArgument("watch takes a key or a prefix, not both")
    if start_revision < 0:
        raise InvalidArgument(f"start_revision {start_revision} must not be negative")
    return pb.WatchRequest(key=key, prefix=prefix, start_revision=start_revision)


class WatchCursor:
    """A watch's position: the events received but not yet handed out, and
    the revision to resume from after those handed out."""

    def __init__(self, start_revision: int) -> None:
        self._start = start_revision
        self._ready: deque[WatchEvent] = deque()
        #: Where to watch from to continue exactly after the last event
        #: handed out (or after the revision the watch started at).
        self.next_revision = start_revision

    def first(self, response: pb.WatchResponse) -> None:
        """The watch's first response: where it starts, and the events the
        log still held from the start revision."""
        if self._start == 0:
            self.next_revision = response.revision + 1
        self.take(response)

    def take(self, response: pb.WatchResponse) -> None:
        self._ready.extend(WatchEvent.from_pb(e) for e in response.events)

    def pop(self) -> WatchEvent | None:
        if not self._ready:
            return None
        event = self._ready.popleft()
        self.next_revision = event.revision + 1
        return event


#: The server's namespace for idempotency keys (``ledger.rs``).
LEDGER_NAMESPACE = uuid.UUID("ab524bdc-58dc-56d8-b437-c4cf5ed10325")


def idempotency_key(key: str, call_id: str, turn: str = "") -> str:
    """UUIDv5 of key + NUL + call id (with a turn: key + NUL + turn + NUL +
    call id), as the server computes it."""
    name = f"{key}\0{call_id}" if not turn else f"{key}\0{turn}\0{call_id}"
    return str(uuid.uuid5(LEDGER_NAMESPACE, name))


def turn_checked(turn: str) -> str:
    """A turn as the server takes it (at most 256 bytes, no control
    characters; empty is none), refused here before anything is sent."""
    if not isinstance(turn, str):
        raise InvalidArgument(f"turn must be a string, not {type(turn).__name__}")
    if len(turn.encode("utf-8")) > 256:
        raise InvalidArgument("turn must be at most 256 bytes")
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in turn):
        raise InvalidArgument("turn must not contain control characters")
    return turn


def unique_calls(calls: Sequence[ToolCallRequest]) -> list[ToolCallRequest]:
    """The calls with repeated ids dropped, first occurrence kept, in order."""
    seen: set[str] = set()
    unique = []
    for call in calls:
        if call.call_id not in seen:
            seen.add(call.call_id)
            unique.append(call)
    return unique


def outcome_of(value: object) -> ToolOutcome:
    """What a runner returned, as an outcome: bytes or str means succeeded."""
    if isinstance(value, ToolOutcome):
        return value
    if isinstance(value, bytes):
        return ToolOutcome("succeeded", value)
    if isinstance(value, str):
        return ToolOutcome("succeeded", value.encode("utf-8"))
    if value is None:
        return ToolOutcome("succeeded", b"")
    raise InvalidArgument(
        f"a tool runner must return bytes, str, None or ToolOutcome, not {type(value).__name__}"
    )


def failure_of(err: Exception) -> ToolOutcome:
    """A runner's exception as a failed outcome, with the error as its result."""
    return ToolOutcome("failed", f"{type(err).__name__}: {err}".encode())


def assemble(
    calls: Sequence[ToolCallRequest],
    known: dict[str, ToolCallRecord],
    ran: dict[str, ToolCallRecord],
) -> list[ToolResult]:
    """One result per call, in the provider's order."""
    results = []
    seen: set[str] = set()
    for call in calls:
        if call.call_id in ran:
            # A repeat within the turn reuses the outcome of the one run.
            record, reused = ran[call.call_id], call.call_id in seen
            seen.add(call.call_id)
        else:
            record, reused = known[call.call_id], True
        results.append(
            ToolResult(
                call_id=call.call_id, state=record.state, result=record.result, reused=reused
            )
        )
    return results


def concurrent_registration(ids: Sequence[str]) -> Error:
    # Only this term's holder can register calls, so this means another
    # process holds our fence and lease id.
    from ._errors import Unavailable

    return Unavailable(
        f"tool calls {list(ids)} were registered concurrently by another holder of this term"
    )


#: The protocol revision that carries the ledger's BeginToolCalls and
#: SettleToolCall on the Session stream.
LEDGER_ON_STREAM = 2

#: The ledger's operations the Session stream carries (from revision
#: ``LEDGER_ON_STREAM``), by unary name: the request's and reply's field.
LEDGER_STREAM_OPS = {"BeginToolCalls": "begin_tool_calls", "SettleToolCall": "settle_tool_call"}
