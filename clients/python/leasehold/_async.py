# unasync: async-only
"""The asyncio client: ``AsyncClient`` and its ``AsyncLease`` (grpc.aio).

The same protocol as the sync twin: one pipelined ``Session`` stream per
client carries every lease's renewals, checks and releases, read by one
task; each lease renews in its own task. A grpc.aio channel belongs to one
event loop and one process, so the client opens one lazily per (process,
loop) pair. With several servers, one channel and stream per server, and
calls fail over as in the sync twin (``_Connection.run``).
"""

# The one source of both clients: scripts/unasync.py writes _sync.py from
# this file (token substitutions; a line ending in "# async-only" and a
# block between "# unasync: async-only" and "# unasync: end" are left out
# of it, a "# | " line is the sync client's alone). What cannot be written
# once lives in _async_rt.py and _sync_rt.py, by the same names.
# unasync: end
# | """The synchronous client: ``Client`` and its ``Lease``.
# |
# | Renewals, checks and releases of every lease a client holds travel over one
# | pipelined ``Session`` stream, fed from a queue and read by one daemon thread
# | that hands each response to the caller waiting for its id. Each lease has a
# | daemon thread that renews it. The gRPC channel is created lazily, once per
# | process: a client used after ``os.fork()`` opens a new one in the child.
# |
# | A client given several servers (on one PostgreSQL database) has a channel
# | and a Session stream per server, and sends each call to the current one,
# | moving on to the next when it answers UNAVAILABLE (``_Connection.run``).
# | """

from __future__ import annotations

import asyncio  # async-only
import contextlib  # async-only
import copy
import os
import sys  # async-only
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence  # async-only
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio  # async-only

from . import _core, _tls
from ._async_rt import AsyncWatch, Mux, Renewer, unary
from ._core import ATTEMPTS, Metadata, Standing, Timing, jittered
from ._errors import Error, LeaseLost, StreamRefused, Unavailable
from ._proto import leasehold_pb2 as pb
from ._proto import leasehold_pb2_grpc as pb_grpc
from ._tls import Pem
from ._types import (
    BeginResult,
    EndedTerm,
    HistoryPage,
    KeyPage,
    KeyState,
    ServerInfo,
    ToolCallRecord,
    ToolCallRequest,
    ToolInvocation,
    ToolOutcome,
    ToolResult,
    TranscriptRepair,
    TranscriptReport,
    transcript_text,
)

# | import threading
# | from collections.abc import Callable, Sequence
# |
# | from ._sync_rt import clients, inherited

# unasync: async-only
AsyncRunner = Callable[[ToolInvocation], Awaitable["bytes | str | ToolOutcome | None"]]
# unasync: end
# | Runner = Callable[[ToolInvocation], "bytes | str | ToolOutcome | None"]
T = TypeVar("T")


class _Node:
    """One server: its channel, stubs and Session stream."""

    def __init__(
        self,
        target: str,
        endpoint: _tls.Endpoint,
        options: Sequence[tuple[str, Any]],
        metadata: Metadata,
    ) -> None:
        #: The target as given, for messages.
        self.target = target
        opts = [*_core.CHANNEL_OPTIONS, *options]
        if endpoint.credentials is None:
            self.channel = grpc.aio.insecure_channel(endpoint.address, options=opts)
        else:
            self.channel = grpc.aio.secure_channel(
                endpoint.address, endpoint.credentials, options=opts
            )
        # The generated stubs are untyped; every call through them is wrapped.
        self.rpc: Any = pb_grpc.LeaseholdStub(self.channel)  # type: ignore[no-untyped-call]
        self.transcripts: Any = pb_grpc.TranscriptsStub(self.channel)  # type: ignore[no-untyped-call]
        self.mux = Mux(self.rpc, metadata)
        #: Whether the server takes the ledger's BeginToolCalls and
        #: SettleToolCall on the Session stream (protocol revision
        #: ``_core.LEDGER_ON_STREAM``): learned from ServerInfo on first use,
        #: forgotten when the server does not answer (it may be replaced).
        self.ledger_on_stream: bool | None = None

    async def close(self) -> None:
        self.mux.close()
        await self.channel.close(None)


class _Connection:
    """The channels to a client's servers and what hangs off them; valid only
    in the process (and, for asyncio, the event loop) that made them."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, _tls.Endpoint]],
        options: Sequence[tuple[str, Any]],
        metadata: Metadata,
    ) -> None:
        self.pid = os.getpid()
        #: Sent with every call (the bearer token, when there is one).
        self.metadata = metadata
        self.loop = asyncio.get_running_loop()  # async-only
        #: One per server, in the order given; channels connect on first use.
        self.nodes = [_Node(t, e, options, metadata) for t, e in endpoints]
        #: Which server calls go to first.
        self.rotation = _core.Rotation(len(self.nodes))
        # unasync: async-only
        #: The leases' keep-alive tasks, cancelled and awaited by close() so
        #: no task outlives the channels it calls through.
        self.tasks: set[asyncio.Task[None]] = set()
        #: Set by close(): a keep-alive task stopped by it leaves its term
        #: to expire at its TTL (as documented) instead of suspending it.
        self.closed = False
        # unasync: end
        # | #: Open watches, ended before a fork() (each is a call in progress).
        # | self.watches: weakref.WeakSet[Watch] = weakref.WeakSet()

    @property
    def current(self) -> _Node:
        return self.nodes[self.rotation.current]

    async def run(self, safe: bool, op: Callable[[_Node], Awaitable[T]]) -> T:
        """Runs ``op`` against the current server; on ``Unavailable`` moves on
        to the next and, when ``safe`` (a second delivery changes nothing the
        first did not), runs it there too, each server at most once. Any
        other answer, a refusal included, is final."""
        failures: list[str] = []
        for index in self.rotation.order():
            node = self.nodes[index]
            try:
                return await op(node)
            except Unavailable as err:
                self.rotation.move_on_from(index)
                if len(self.nodes) == 1:
                    raise
                if not safe:
                    raise _core.not_resent(node.target, err) from None
                failures.append(f"{node.target}: {err.message}")
        raise _core.none_answered(failures)

    def usable(self) -> bool:
        # unasync: async-only
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return self.pid == os.getpid() and self.loop is loop and not loop.is_closed()

    def track(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        # unasync: end
        # | return self.pid == os.getpid()

    async def close(self) -> None:
        # unasync: async-only
        self.closed = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        # Awaited, so their exceptions (if any) are retrieved here and never
        # reported as "Task exception was never retrieved".
        await asyncio.gather(*tasks, return_exceptions=True)
        # unasync: end
        for node in self.nodes:
            await node.close()


async def _grant(
    node: _Node, request: pb.AcquireRequest, timeout: float, conn: _Connection
) -> pb.AcquireResponse:
    """One Acquire attempt on ``node``. One that does not wait goes on the
    node's Session stream (every protocol revision takes it there, at a
    fraction of a unary call's cost); one that waits is a unary call, so that
    waiters never hold the stream's window (the server runs at most
    SESSION_WINDOW of its operations at once) ahead of the renewals sharing it."""
    if request.wait_ms > 0:
        reply: pb.AcquireResponse = await unary(
            node.rpc.Acquire, request, timeout, "Acquire", conn.metadata
        )
        return reply
    try:
        answer = await node.mux.call("Acquire", pb.SessionRequest(acquire=request), timeout)
    except StreamRefused as err:
        if err.refusal is None:
            raise
        raise copy.copy(err.refusal) from None
    granted = pb.AcquireResponse(
        lease=answer.lease,
        replayed=answer.replayed,
        unsettled_tool_calls=answer.unsettled_tool_calls,
    )
    if answer.HasField("previous"):
        granted.previous.CopyFrom(answer.previous)
    return granted


class AsyncClient:
    # unasync: async-only
    """The asyncio twin of :class:`leasehold.Client`; the same arguments
    (``https://`` targets and the ``tls_*`` options included), the same
    methods, awaited.

    The channel is opened lazily per process and per event loop. Use it from
    the event loop's thread.
    """

    # unasync: end
    # | """A synchronous leasehold client.
    # |
    # | ``target`` is ``host:port`` (plaintext), ``http://host:port`` or
    # | ``https://host:port`` (TLS, trusting the system roots unless ``tls_ca``
    # | is given). Several servers on one PostgreSQL database may be given, as a
    # | list or a comma-separated string: calls go to one at a time and move on
    # | to the next when it is unavailable, resending only what is safe to send
    # | twice (see the README's "Several servers"). ``tls_ca``, ``tls_cert``
    # | and ``tls_key`` are PEM, each a path or the bytes: a private CA to
    # | trust, and the client certificate and key a server run with
    # | ``--client-ca`` requires (any of them also means TLS).
    # | ``credentials`` instead takes ready-made ``grpc.ChannelCredentials``. A
    # | TLS failure (no CA, a refused client certificate, plaintext against a
    # | TLS server) surfaces as :class:`leasehold.Unavailable`.
    # |
    # | The channel is opened lazily and once per
    # | process (so a client made before ``fork()`` works in the child); all
    # | leases of a client share one Session stream for their renewals, checks
    # | and releases. Thread-safe.
    # | """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        owner: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        timeout: float = 5.0,
        token: str | None = None,
        tls_ca: Pem | None = None,
        tls_cert: Pem | None = None,
        tls_key: Pem | None = None,
    ) -> None:
        #: Every server, in the order given.
        self.targets: tuple[str, ...] = tuple(_core.targets_of(target))
        #: The target as given (several: joined with commas).
        self.target = target if isinstance(target, str) else ",".join(self.targets)
        #: Where each channel dials, and with which credentials (None: plaintext).
        self._endpoints = [
            (
                t,
                _tls.resolve(
                    t, credentials=credentials, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
                ),
            )
            for t in self.targets
        ]
        #: Sent with every call: the bearer token for a server run with ``--auth``.
        self._metadata: Metadata = _core.bearer(token)
        #: The default owner of this client's leases (``host:pid`` if None,
        #: computed at each acquire so a forked child names itself).
        self.owner = owner
        #: How long a call that is not part of a lease may take.
        self.timeout = timeout
        self._options = list(options)
        # | self._lock = threading.Lock()
        self._conn: _Connection | None = None
        # unasync: async-only
        #: Connections of other processes or loops, kept so they are never
        #: closed or collected from the wrong one.
        self._inherited: list[_Connection] = []
        # unasync: end
        # | clients.add(self)

    # | def _quiesce_for_fork(self, timeout: float) -> None:
    # |     """Ends this process's Session streams and watches before a fork()."""
    # |     conn = self._conn
    # |     if conn is not None and conn.pid == os.getpid():
    # |         for watch in list(conn.watches):
    # |             watch._end_for_fork(timeout)
    # |         for node in conn.nodes:
    # |             node.mux.quiesce(timeout)
    # |
    # | def _forget_after_fork(self) -> None:
    # |     """In a fork()'s child: the parent's connection is kept, never used."""
    # |     # Locks may have been held by threads that do not exist in the child.
    # |     self._lock = threading.Lock()
    # |     if self._conn is not None:
    # |         inherited.append(self._conn)
    # |         self._conn = None
    # |
    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        # unasync: async-only
        if conn is not None:
            self._inherited.append(conn)
        self._conn = _Connection(self._endpoints, self._options, self._metadata)
        return self._conn
        # unasync: end
        # | with self._lock:
        # |     if self._conn is None or self._conn.pid != os.getpid():
        # |         if self._conn is not None:
        # |             inherited.append(self._conn)
        # |         self._conn = _Connection(self._endpoints, self._options, self._metadata)
        # |     return self._conn

    @property
    def current_target(self) -> str:
        """As :attr:`leasehold.Client.current_target` (for this loop)."""  # async-only
        # | """The server calls go to now: the first given, then the next after
        # | each failover (in this process)."""
        conn = self._conn
        if conn is None or not conn.usable():
            return self.targets[0]
        return conn.current.target

    async def close(self) -> None:
        """Closes this loop's channel; leases still held expire at their TTL."""  # async-only
        conn, self._conn = self._conn, None  # async-only
        # | """Closes this process's channel. Leases still held stop renewing
        # | and expire at their TTL."""
        # | with self._lock:
        # |     conn, self._conn = self._conn, None
        if conn is not None and conn.usable():
            await conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def acquire(
        self,
        key: str,
        *,
        ttl: float,
        wait: float = 0.0,
        owner: str | None = None,
        request_id: str | None = None,
        renew_every: float | None = None,
        safety_margin: float | None = None,
        rpc_timeout: float | None = None,
        lock_delay: float = 0.0,
        max_recoveries: int = 0,
        force: bool = False,
    ) -> _Acquire:
        # unasync: async-only
        """As :meth:`leasehold.Client.acquire`. Await it for an
        :class:`AsyncLease`, or use it directly with ``async with``."""
        # unasync: end
        # | """Acquires ``key`` for ``ttl`` seconds, queueing (FIFO) up to ``wait``
        # | seconds for a held key, and starts renewing it in the background.
        # |
        # | Use the lease as a context manager (normal exit releases, an exception
        # | suspends) or call ``release()``/``suspend()`` yourself.
        # |
        # | ``lock_delay`` (seconds, at most 60): if this term ends by expiry,
        # | nobody may acquire the key for that long, so writes this holder sent
        # | before it was lost drain first (a release or suspend skips it).
        # | ``max_recoveries``: quarantine the key once that many terms in a row
        # | end by expiry or suspension (0: the server's default). ``force``:
        # | acquire a quarantined key anyway (admin right).
        # |
        # | Raises ``Busy`` (holder, fence, remaining) when the key is still held
        # | after the wait, ``Reserved`` (a ``Busy``) when it is free but in a
        # | lock-delay or kept for another owner's handoff, ``Quarantined`` for a
        # | quarantined key, ``InvalidArgument`` for a malformed key/owner/ttl,
        # | ``Unavailable`` when the server cannot be reached (after a few
        # | attempts, all with the same request id, so a lost reply cannot leave
        # | a second term behind), ``LeaseLost`` when a replayed grant turns out
        # | to be over already.
        # | """
        return _Acquire(
            lambda: self._acquire(
                key,
                ttl=ttl,
                wait=wait,
                owner=owner,
                request_id=request_id,
                renew_every=renew_every,
                safety_margin=safety_margin,
                rpc_timeout=rpc_timeout,
                lock_delay=lock_delay,
                max_recoveries=max_recoveries,
                force=force,
            )
        )

    async def _acquire(
        self,
        key: str,
        *,
        ttl: float,
        wait: float,
        owner: str | None,
        request_id: str | None,
        renew_every: float | None,
        safety_margin: float | None,
        rpc_timeout: float | None,
        lock_delay: float,
        max_recoveries: int,
        force: bool,
    ) -> AsyncLease:
        timing = Timing.resolve(ttl, renew_every, safety_margin, rpc_timeout)
        generated = request_id is None
        request = _core.acquire_request(
            key=key,
            owner=owner or self.owner or _core.default_owner(),
            ttl=ttl,
            wait=wait,
            request_id=request_id or str(uuid.uuid4()),
            lock_delay=lock_delay,
            max_recoveries=max_recoveries,
            force=force,
        )
        timeout = wait + max(timing.rpc_timeout, _core.ACQUIRE_GRACE)
        conn = self._connection()
        first_sent = time.monotonic()
        attempt = 1
        while True:
            try:
                # Safe to resend on another server: the request id makes the
                # server replay a grant whose reply was lost.
                reply = await conn.run(True, lambda node: _grant(node, request, timeout, conn))
                break
            except Unavailable:
                if attempt >= ATTEMPTS:
                    raise
                attempt += 1
                await asyncio.sleep(jittered(timing.retry_pause(attempt)))
        # A fresh grant happened after our first send, so that send time is a
        # safe basis for the local deadline; a replayed one happened at some
        # earlier attempt: ours if we made up the id, of unknown age otherwise.
        basis = first_sent if (not reply.replayed or generated) else None
        lease = AsyncLease(conn, reply, timing, basis)
        await lease._start(basis)
        return lease

    async def check(self, key: str, fence: int, *, timeout: float | None = None) -> int:
        """As :meth:`leasehold.Client.check`."""  # async-only
        # | """Whether ``fence`` is the live term of ``key`` (Chubby's
        # | CheckSequencer), for a process handed a fence rather than a lease.
        # | Returns the fence; raises ``LeaseLost`` (with the reason) when it is
        # | not live, ``Unavailable`` when no answer came in time."""
        request = pb.SessionRequest(check=pb.CheckRequest(key=key, fence=fence))
        wait = timeout or self.timeout
        reply = await self._connection().run(
            True, lambda node: node.mux.call("Check", request, wait)
        )
        return int(reply.lease.fence)

    async def _call(self, name: str, request: Any, timeout: float | None = None) -> Any:
        """A unary call that is safe to resend: a read, or idempotent."""
        conn = self._connection()
        wait = timeout or self.timeout
        return await conn.run(
            True,
            lambda node: unary(getattr(node.rpc, name), request, wait, name, conn.metadata),
        )

    async def server_info(self) -> ServerInfo:
        """As :meth:`leasehold.Client.server_info`."""  # async-only
        # | """Which server this is: its release, the revision of ``leasehold.v1``
        # | it speaks and its backend (``ServerInfo.compatible`` says whether
        # | this client can speak to it). Raises ``Unsupported`` from a server
        # | older than the call itself."""
        reply = await self._call("ServerInfo", pb.ServerInfoRequest())
        return ServerInfo(
            version=reply.version, protocol=int(reply.protocol), backend=reply.backend
        )

    async def get(self, key: str) -> KeyState:
        """As :meth:`leasehold.Client.get`."""  # async-only
        # | """The key's live term (without its lease id), last ended term,
        # | whether it is recoverable or quarantined, and its reservation.
        # | Raises ``NotFound`` for a key the server does not hold."""
        reply = await self._call("Get", pb.GetRequest(key=key))
        return KeyState.from_pb(
            key,
            reply.lease if reply.HasField("lease") else None,
            reply.last_ended if reply.HasField("last_ended") else None,
            reply.recoverable,
            reply.quarantined,
            reply.reservation if reply.HasField("reservation") else None,
        )

    async def list_keys(
        self,
        prefix: str = "",
        *,
        filter: str = "all",
        page_size: int = 0,
        page_token: str = "",
    ) -> KeyPage:
        """As :meth:`leasehold.Client.list_keys`."""  # async-only
        # | """One page of keys in order: ``filter`` is ``"all"``, ``"live"``,
        # | ``"recoverable"`` or ``"quarantined"``; ``page_size`` 0 means 100."""
        request = _core.list_request(prefix, filter, page_size, page_token)
        reply = await self._call("List", request)
        return KeyPage(
            keys=[KeyState.from_key_state(k) for k in reply.keys],
            next_page_token=reply.next_page_token,
        )

    async def history(
        self, key: str, *, page_size: int = 0, before: int | None = None
    ) -> HistoryPage:
        """As :meth:`leasehold.Client.history`."""  # async-only
        # | """One page of ``key``'s ended terms, newest first: ``before`` is None
        # | for the newest, then the previous page's ``next_before``. Raises
        # | ``NotFound`` for a key the server does not hold."""
        request = pb.HistoryRequest(
            key=key, page_size=page_size, page_token="" if before is None else str(before)
        )
        return HistoryPage.from_pb(await self._call("History", request))

    async def unquarantine(self, key: str) -> KeyState:
        """As :meth:`leasehold.Client.unquarantine`."""  # async-only
        # | """Lifts ``key``'s quarantine (admin right) and returns its state."""
        reply = await self._call("Unquarantine", pb.UnquarantineRequest(key=key))
        return KeyState.from_key_state(reply.key)

    def watch(self, *, key: str = "", prefix: str = "", start_revision: int = 0) -> AsyncWatch:
        # unasync: async-only
        """As :meth:`leasehold.Client.watch`: ``async for event in
        client.watch(...)``. Await it first (``w = await client.watch(...)``)
        to be sure the server has accepted the watch before going on (with
        ``start_revision=0`` only what happens after that is reported); a
        watch iterated without being awaited starts at its first step."""
        # unasync: end
        # | """Watches ownership changes of ``key``, or of every key under
        # | ``prefix`` (neither: every key), from ``start_revision`` (0: only what
        # | happens from now on). Returns once the server has accepted the watch,
        # | so nothing that happens after this call is missed.
        # |
        # | Iterate the returned :class:`Watch` for :class:`WatchEvent` values;
        # | after it ends or fails, watch again from its ``next_revision`` to
        # | continue with nothing missed and nothing repeated. Raises
        # | ``Compacted`` when the server no longer holds ``start_revision``,
        # | ``Unsupported`` on a backend without watch."""
        request = _core.watch_request(key, prefix, start_revision)
        return AsyncWatch(self._connection(), request, self.timeout)  # async-only
        # | conn = self._connection()
        # | watch = conn.run(
        # |     True,
        # |     lambda node: Watch(
        # |         node.rpc.Watch(request, metadata=conn.metadata), start_revision, self.timeout
        # |     ),
        # | )
        # | conn.watches.add(watch)
        # | return watch

    async def check_transcript(
        self, messages: str | bytes | list[Any], *, format: str = ""
    ) -> TranscriptReport:
        """As :meth:`leasehold.Client.check_transcript`."""  # async-only
        # | """Checks that every tool call in ``messages`` (a list of message
        # | dicts, or JSON text: an array or JSON lines) is paired the way the
        # | provider requires. ``format`` is ``"openai-chat"``, ``"anthropic"``,
        # | ``"openai-responses"`` or empty to detect it. Raises
        # | ``InvalidArgument`` for unreadable input."""
        request = pb.TranscriptCheckRequest(transcript=transcript_text(messages), format=format)
        conn = self._connection()
        reply = await conn.run(
            True,
            lambda node: unary(
                node.transcripts.Check, request, self.timeout, "Check", conn.metadata
            ),
        )
        return TranscriptReport.from_pb(reply)

    async def repair_transcript(
        self,
        messages: str | bytes | list[Any],
        *,
        format: str = "",
        placeholder_markers: Sequence[str] = (),
    ) -> TranscriptRepair:
        """As :meth:`leasehold.Client.repair_transcript`."""  # async-only
        # | """Repairs tool-call pairing in ``messages`` (moves misplaced results,
        # | drops duplicates and placeholders a real result made redundant,
        # | inserts results for calls that never got one) and says what it did
        # | and what it could not fix."""
        request = pb.TranscriptRepairRequest(
            transcript=transcript_text(messages),
            format=format,
            placeholder_markers=list(placeholder_markers),
        )
        conn = self._connection()
        reply = await conn.run(
            True,
            lambda node: unary(
                node.transcripts.Repair, request, self.timeout, "Repair", conn.metadata
            ),
        )
        return TranscriptRepair.from_pb(reply)


# unasync: async-only
class _Acquire:
    """What ``AsyncClient.acquire`` returns: awaitable, and an async context
    manager that releases on normal exit and suspends on an exception."""

    def __init__(self, start: Callable[[], Awaitable[AsyncLease]]) -> None:
        self._start = start
        self._lease: AsyncLease | None = None

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._start().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._start()
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(exc_type, exc, tb)


# unasync: end
class AsyncLease:
    # unasync: async-only
    """The asyncio twin of :class:`leasehold.Lease`; ``lost`` is an
    ``asyncio.Event`` and ``scope()`` cancels its block when the lease is lost."""

    # unasync: end
    # | """A held term of a key, renewed in the background until released.
    # |
    # | ``fence`` goes with every write to the resource; ``gate()`` before every
    # | model request and terminal write; ``lost`` is set as soon as the lease
    # | cannot be trusted. See the package README for its life.
    # | """

    def __init__(
        self, conn: _Connection, reply: pb.AcquireResponse, timing: Timing, basis: float | None
    ) -> None:
        self._conn = conn
        #: Set while the lease cannot be trusted: the server refused it, it
        #: was released, or the local deadline passed (cleared again if a
        #: later renewal with the same fence succeeds; never after a refusal).
        self.lost = asyncio.Event()
        lost = self.lost

        def notify(valid: bool) -> None:
            # Holds the event, not the lease, so a dropped lease can be collected.
            if valid:
                lost.clear()
            else:
                lost.set()

        self._core = Standing(reply=reply, timing=timing, basis=basis, notify=notify)
        self._finished = False
        self._renewer: Renewer | None = None

    async def _start(self, basis: float | None) -> None:
        core, conn, timing = self._core, self._conn, self._core.timing
        first = time.monotonic() if basis is None else basis + timing.renew_every
        if first <= time.monotonic():
            # The grant is of unknown age (replayed) or a long wait ate into
            # it: renew now so the deadline rests on a send time we know.
            sent = time.monotonic()
            try:
                renewed = await conn.run(
                    True,
                    lambda node: node.mux.call("Renew", core.renew_request(), timing.rpc_timeout),
                )
                core.renewed(sent, renewed.lease)
                first = sent + timing.renew_every
            except Error as err:
                judged = core.judge(err)
                if isinstance(judged, LeaseLost) and judged.final:
                    raise judged from None
        if core.loss() is not None:
            self.lost.set()
        self._renewer = Renewer(core, conn, first)
        # A lease dropped without release: stop renewing and suspend it.
        self._finalizer = weakref.finalize(self, self._renewer.abandon)

    # -- what the grant said ---------------------------------------------
    @property
    def key(self) -> str:
        return self._core.key

    @property
    def fence(self) -> int:
        """The term's fencing token: store it with every write."""
        return self._core.fence

    @property
    def owner(self) -> str:
        return self._core.owner

    @property
    def ttl(self) -> float:
        return self._core.timing.ttl

    @property
    def previous(self) -> EndedTerm | None:
        # | """How the key's previous term ended, if it had one."""
        return self._core.previous

    @property
    def recovered(self) -> bool:
        # | """The previous term ended expired or suspended: work may be unfinished."""
        previous = self._core.previous
        return previous is not None and previous.end in ("suspended", "expired")

    @property
    def replayed(self) -> bool:
        # | """The grant repeated an earlier one for the same request id."""
        return self._core.replayed

    @property
    def unsettled_tool_calls(self) -> int:
        # | """How many of the key's tool calls were left running when this term
        # | was granted (see ``unsettled_tool_calls_list()``)."""
        return self._core.unsettled_at_grant

    @property
    def deadline(self) -> float:
        # | """The local deadline on ``time.monotonic()``'s clock."""
        return self._core.deadline

    @property
    def server_expires_at_ms(self) -> int:
        # | """The expiry the server last reported, on its clock; for display."""
        return self._core.expires_at_ms

    def __repr__(self) -> str:
        # The lease id is a secret capability: leave it out.
        return (
            f"AsyncLease(key={self.key!r}, fence={self.fence}, owner={self.owner!r}, "
            f"valid={self.is_valid()})"
        )

    # -- validity ----------------------------------------------------------
    def is_valid(self) -> bool:
        return self._core.loss() is None  # async-only
        # | """Local check, no round trip: not refused or released, and the local
        # | deadline has not passed (and this is the process that acquired it)."""
        # | return self._conn.pid == os.getpid() and self._core.loss() is None

    def loss(self) -> LeaseLost | None:
        # | """Why the lease is not valid now, or None while it is."""
        return self._core.loss()

    # | def _same_process(self) -> None:
    # |     if self._conn.pid != os.getpid():
    # |         # The renewal thread stayed in the parent; the parent's channel
    # |         # must not be used here (grpc #29586).
    # |         raise self._core.lost_error(
    # |             "forked", "a lease does not cross fork(): acquire in the process that uses it"
    # |         )
    # |
    async def verify(self) -> None:
        # | """A ``Check`` round trip proving the fence is still the key's live
        # | term. Raises ``LeaseLost`` when the lease is lost for good or the
        # | server says the fence is stale (which makes it lost for good),
        # | ``Unavailable`` when the server does not answer in time."""
        # | self._same_process()
        if self._core.final is not None:
            raise copy.copy(self._core.final)
        request, timeout = self._core.check_request(), self._core.timing.rpc_timeout
        try:
            await self._conn.run(True, lambda node: node.mux.call("Check", request, timeout))
        except Error as err:
            raise self._core.judge(err) from None

    async def gate(self, *, storage_fenced: bool = False) -> int:
        # | """The check before each model request and terminal write: local
        # | check, ``verify()``, local check again. Returns the fence. Raises
        # | ``LeaseLost`` (no round trip when already invalid) or ``Unavailable``.
        # |
        # | ``storage_fenced=True`` says that every write this gate guards
        # | carries the fence to a store that refuses a stale one itself (a
        # | fenced SQLite or PostgreSQL transaction, the ledger's Begin): then
        # | a fresh lease (its local deadline ahead, no renewal failed since
        # | the last success) answers locally, with no round trip, because the
        # | server cannot have ended the term before that deadline and the
        # | store would refuse a write that came late anyway."""
        # | self._same_process()
        self._core.ensure_valid()
        if storage_fenced and self._core.fresh():
            return self._core.fence
        await self.verify()
        self._core.ensure_valid()
        return self._core.fence

    # unasync: async-only
    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[AsyncLease]:
        """Runs the block only while the lease is held: raises ``LeaseLost``
        at once if it is not valid, cancels the block as soon as ``lost`` is
        set (the block sees ``CancelledError``; the scope raises ``LeaseLost``
        in its place), and raises ``LeaseLost`` on exit if the lease was lost
        meanwhile. Like ``asyncio.timeout``, it must be used in the task that
        runs the block."""
        self._core.ensure_valid()
        task = asyncio.current_task()
        assert task is not None, "scope() must run inside a task"
        fired = False

        async def watch() -> None:
            nonlocal fired
            await self.lost.wait()
            fired = True
            task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            yield self
        except asyncio.CancelledError:
            if not fired:
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()
            raise self._loss_now() from None
        finally:
            watcher.cancel()
        if fired or self.lost.is_set():
            if fired and sys.version_info >= (3, 11):
                task.uncancel()
            raise self._loss_now()

    def _loss_now(self) -> LeaseLost:
        return self._core.loss() or self._core.lost_error(
            "deadline", "the lease was not valid for a moment"
        )

    # unasync: end
    # -- ending --------------------------------------------------------------
    async def release(self) -> EndedTerm:
        """As :meth:`leasehold.Lease.release`."""  # async-only
        # | """Ends the term as finished (presenting fence and lease id, so it can
        # | never end someone else's term). Raises ``LeaseLost`` when the term was
        # | already lost or the server refuses the release as stale."""
        return await self._finish(False)

    async def suspend(self) -> EndedTerm:
        """As :meth:`leasehold.Lease.suspend`."""  # async-only
        # | """Ends the term as unfinished: the key becomes recoverable and the
        # | next holder sees ``recovered``. Raises as ``release()``."""
        return await self._finish(True)

    async def hand_off(
        self, successor: str, *, within: float = 30.0, suspend: bool = False
    ) -> EndedTerm:
        """As :meth:`leasehold.Lease.hand_off`."""  # async-only
        # | """Ends the term (as unfinished with ``suspend``) and keeps the key
        # | for the owner ``successor`` for ``within`` seconds (at most 600):
        # | only that owner's acquire gets it, ahead of every waiter; others get
        # | ``Reserved``. The successor's lease shows ``previous.handed_off``.
        # | Once ``within`` runs out, anyone may take the key. Raises as
        # | ``release()``."""
        _core.handoff_checked(successor, within)
        return await self._finish(suspend, successor, within)

    async def _finish(self, suspend: bool, successor: str = "", within: float = 0.0) -> EndedTerm:
        # | self._same_process()
        self._finished = True
        if hasattr(self, "_finalizer"):
            self._finalizer.detach()
        core = self._core
        already = core.final
        core.end(core.lost_error("ended", "the lease was released"))
        if self._renewer is not None:
            self._renewer.stop()
        if already is not None:
            raise copy.copy(already)
        # Safe to resend, here and on another server: a retried release
        # returns the term as it first ended.
        request = core.release_request(suspend, successor, within)
        attempt = 1
        while True:
            try:
                reply = await self._conn.run(
                    True,
                    lambda node: node.mux.call("Release", request, core.timing.rpc_timeout),
                )
                return EndedTerm.from_pb(reply.ended)
            except Unavailable:
                if attempt >= ATTEMPTS:
                    raise
                attempt += 1
                await asyncio.sleep(jittered(core.timing.retry_pause(attempt)))
            except LeaseLost as err:
                raise LeaseLost(
                    f"the lease on key {core.key!r} (fence {core.fence}) is lost: {err.message}",
                    key=core.key,
                    fence=core.fence,
                    reason=err.reason,
                    superseded_by=err.superseded_by,
                    at_ms=err.at_ms,
                    details=err.details,
                ) from None

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._finished:
            return
        if exc_type is None:
            await self.release()
            return
        # Unfinished work: suspend so the next holder knows to recover; never
        # mask the block's own exception.
        try:
            await self.suspend()
        except Error:
            pass

    # -- tool calls ----------------------------------------------------------
    async def _ledger(self, name: str, request: Any) -> Any:
        # | self._same_process()
        conn, timeout = self._conn, self._core.timing.rpc_timeout
        # BeginToolCalls is not resent on another server: a registration
        # applied twice looks like another holder of this term. Settling
        # (the first outcome wins) and listing are.
        safe = name != "BeginToolCalls"
        # On the Session stream when the server takes it there: an operation
        # on it costs a fraction of a unary call (docs/benchmarks.md).
        field = _core.LEDGER_STREAM_OPS.get(name)

        async def on(node: _Node) -> Any:
            try:
                if field is not None and await self._ledger_on_stream(node, timeout):
                    reply = await node.mux.call(
                        name, pb.SessionRequest(**{field: request}), timeout
                    )
                    return getattr(reply, field)
                return await unary(getattr(node.rpc, name), request, timeout, name, conn.metadata)
            except Unavailable:
                node.ledger_on_stream = None
                raise

        try:
            return await conn.run(safe, on)
        except Error as err:
            raise self._core.judge(err, ledger=True) from None

    async def _ledger_on_stream(self, node: _Node, timeout: float) -> bool:
        if node.ledger_on_stream is None:
            try:
                info = await unary(
                    node.rpc.ServerInfo,
                    pb.ServerInfoRequest(),
                    timeout,
                    "ServerInfo",
                    self._conn.metadata,
                )
                node.ledger_on_stream = int(info.protocol) >= _core.LEDGER_ON_STREAM
            except Unavailable:
                raise
            except Error:
                # Too old to say (no ServerInfo): it speaks only unary calls.
                node.ledger_on_stream = False
        return node.ledger_on_stream

    async def begin_tool_calls(
        self, calls: Sequence[ToolCallRequest], *, turn: str = "", across_turns: bool = False
    ) -> BeginResult:
        """As :meth:`leasehold.Lease.begin_tool_calls`."""  # async-only
        # | """Registers one turn's calls atomically (all new, or none recorded).
        # |
        # | ``turn`` names the turn (any string up to 256 bytes, e.g. the
        # | provider's turn or message id): a duplicate is then looked for within
        # | that turn only, so an id reused in a new turn is new. Without a turn,
        # | an id is checked against every turn. ``across_turns`` checks every
        # | turn even with a turn named (the calls are still recorded in it)."""
        if not calls:
            return BeginResult(calls=[], duplicate=False, duplicate_call_ids=[])
        reply = await self._ledger(
            "BeginToolCalls", self._core.begin_request(calls, turn, across_turns)
        )
        return BeginResult(
            calls=[ToolCallRecord.from_pb(c) for c in reply.calls],
            duplicate=reply.duplicate,
            duplicate_call_ids=list(reply.duplicate_call_ids),
        )

    async def settle_tool_call(
        self, call_id: str, outcome: str, result: bytes = b"", *, turn: str = ""
    ) -> ToolCallRecord:
        """As :meth:`leasehold.Lease.settle_tool_call`."""  # async-only
        # | """Records a call's outcome (``"succeeded"``, ``"failed"`` or
        # | ``"unknown"``) under this lease's fence; the first terminal outcome
        # | wins and the winning record is returned. ``turn`` names the call's
        # | turn; without it the one call with this id is settled, and an id
        # | begun in several turns raises ``InvalidArgument``. Raises
        # | ``NotFound`` for an id the ledger does not hold (in that turn)."""
        reply = await self._ledger(
            "SettleToolCall", self._core.settle_request(call_id, outcome, result, turn)
        )
        return ToolCallRecord.from_pb(reply.call)

    async def unsettled_tool_calls_list(self) -> list[ToolCallRecord]:
        """As :meth:`leasehold.Lease.unsettled_tool_calls_list`."""  # async-only
        # | """The key's calls still recorded as running: a recoverer settles each
        # | (usually as ``"unknown"``, with its ``turn``) before it continues."""
        reply = await self._ledger("ListToolCalls", self._core.unsettled_request())
        return [ToolCallRecord.from_pb(c) for c in reply.calls]

    async def _register(
        self, calls: list[ToolCallRequest], turn: str, across_turns: bool
    ) -> dict[str, ToolCallRecord]:
        """Registers ``calls`` (unique ids); returns the records the ledger
        already held. The others are now recorded as running."""
        first = await self.begin_tool_calls(calls, turn=turn, across_turns=across_turns)
        if not first.duplicate:
            return {}
        known = {c.call_id: c for c in first.calls}
        fresh = [c for c in calls if c.call_id not in known]
        if fresh:
            again = await self.begin_tool_calls(fresh, turn=turn, across_turns=across_turns)
            if again.duplicate:
                raise _core.concurrent_registration(again.duplicate_call_ids)
        return known

    async def run_tool_calls(
        self,
        calls: Sequence[ToolCallRequest],
        runner: AsyncRunner,
        *,
        concurrency: int | None = None,  # async-only
        turn: str = "",
        across_turns: bool = False,
    ) -> list[ToolResult]:
        # unasync: async-only
        """As :meth:`leasehold.Lease.run_tool_calls` (``turn`` and
        ``across_turns`` included), but the new calls run concurrently (at
        most ``concurrency`` at a time, unlimited if None), each settled as
        soon as it returns, and all are cancelled (their calls left recorded
        as running) if the lease is lost meanwhile."""
        # unasync: end
        # | """Runs one turn's tool calls through the server's ledger.
        # |
        # | All calls are registered before any runs; then each new call runs
        # | (one at a time, in order) and is settled as soon as it returns. A
        # | call id the ledger already knows is not run again: its stored
        # | outcome comes back with ``reused=True``. Results come back in the
        # | provider's order.
        # |
        # | ``turn`` names the turn, for models that reuse call ids in every turn
        # | (``call_0``): an id is then a duplicate only within that turn, unless
        # | ``across_turns`` (an id declared in any turn is reused, not run).
        # | Without a turn, an id from any earlier turn is a duplicate.
        # |
        # | ``runner(invocation)`` returns the result (``bytes``/``str``: succeeded;
        # | a ``ToolOutcome`` to choose); an exception it raises settles the call
        # | as failed with the error text (``LeaseLost`` propagates instead). If
        # | the lease is lost, no further call starts and ``LeaseLost`` is
        # | raised; calls not settled stay recorded as running for the recoverer.
        # | """
        self._core.ensure_valid()
        unique = _core.unique_calls(calls)
        known = await self._register(unique, turn, across_turns)
        ran: dict[str, ToolCallRecord] = {}
        # unasync: async-only
        fresh = [c for c in unique if c.call_id not in known]
        limit = asyncio.Semaphore(concurrency or max(1, len(fresh)))

        async def one(call: ToolCallRequest) -> tuple[str, ToolCallRecord]:
            async with limit:
                return call.call_id, await self._run_one(call, runner, turn)

        if fresh:
            async with self.scope():
                tasks = [asyncio.ensure_future(one(c)) for c in fresh]
                try:
                    for call_id, record in await asyncio.gather(*tasks):
                        ran[call_id] = record
                finally:
                    for t in tasks:
                        t.cancel()
        # unasync: end
        # | for call in unique:
        # |     if call.call_id in known:
        # |         continue
        # |     self._core.ensure_valid()
        # |     ran[call.call_id] = self._run_one(call, runner, turn)
        return _core.assemble(calls, known, ran)

    async def _run_one(
        self, call: ToolCallRequest, runner: AsyncRunner, turn: str
    ) -> ToolCallRecord:
        """Runs one new call and settles it with what it returned or raised."""
        invocation = ToolInvocation(
            call=call,
            fence=self.fence,
            idempotency_key=_core.idempotency_key(self.key, call.call_id, turn),
            turn=turn,
        )
        try:
            outcome = _core.outcome_of(await runner(invocation))
        except LeaseLost:
            raise
        except Exception as err:
            outcome = _core.failure_of(err)
        return await self.settle_tool_call(call.call_id, outcome.outcome, outcome.result, turn=turn)


# |
# |
# | def _idempotency_key(key: str, call_id: str, turn: str = "") -> str:
# |     """As the server computes it (see ``_core.idempotency_key``)."""
# |     return _core.idempotency_key(key, call_id, turn)
