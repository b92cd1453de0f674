"""The asyncio client: ``AsyncClient`` and its ``AsyncLease`` (grpc.aio).

The same protocol as the sync twin: one pipelined ``Session`` stream per
client carries every lease's renewals, checks and releases, read by one
task; each lease renews in its own task. A grpc.aio channel belongs to one
event loop and one process, so the client opens one lazily per (process,
loop) pair. With several servers, one channel and stream per server, and
calls fail over as in the sync twin (``_Connection.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import os
import sys
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from . import _core, _tls
from ._core import ATTEMPTS, Metadata, Standing, Timing, jittered, millis
from ._errors import Error, LeaseLost, Unavailable, from_aio_error, from_refusal
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
    WatchEvent,
    transcript_text,
)

#: grpc.aio's end-of-stream marker (missing from the type stubs).
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]

AsyncRunner = Callable[[ToolInvocation], Awaitable["bytes | str | ToolOutcome | None"]]
T = TypeVar("T")


class _Stream:
    """One open Session stream, its waiters and its reader task."""

    def __init__(self, stub: Any, metadata: Metadata) -> None:
        self._call: Any = stub.Session(metadata=metadata)
        self._waiting: dict[int, asyncio.Future[pb.SessionResponse]] = {}
        #: Requests go out through one writer task, so a caller cancelled
        #: mid-write (a timeout, a released lease) never cancels the shared
        #: stream under the others, and writes never overlap.
        self._outbox: asyncio.Queue[pb.SessionRequest] = asyncio.Queue()
        self.broken: Error | None = None
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read())
        self._writer = loop.create_task(self._write())

    async def _write(self) -> None:
        try:
            while True:
                request = await self._outbox.get()
                await self._call.write(request)
        except asyncio.CancelledError:
            return
        except Exception as err:
            self._break(Unavailable(f"the Session stream failed: {err!r}"))
            self._call.cancel()

    async def _read(self) -> None:
        why: Error
        try:
            while True:
                response = await self._call.read()
                if response is _EOF:
                    why = Unavailable("the Session stream ended")
                    break
                waiter = self._waiting.pop(response.id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(response)
        except grpc.aio.AioRpcError as err:
            why = from_aio_error(err)
            if not isinstance(why, Unavailable):
                why = Unavailable(f"the Session stream failed: {why}")
        except asyncio.CancelledError:
            why = Unavailable("the Session stream was closed")
        except Exception as err:  # pragma: no cover - grpc internals
            why = Unavailable(f"the Session stream failed: {err!r}")
        self._break(why)

    def _break(self, why: Error) -> None:
        if self.broken is None:
            self.broken = why
        self._writer.cancel()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(why)

    async def call(
        self, name: str, request: pb.SessionRequest, timeout: float
    ) -> pb.SessionResponse:
        if self.broken is not None:
            raise copy.copy(self.broken)
        waiter: asyncio.Future[pb.SessionResponse] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = waiter
        self._outbox.put_nowait(request)
        try:
            response = await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            raise Unavailable(f"{name} got no reply within {millis(timeout)} ms") from None
        finally:
            self._waiting.pop(request.id, None)
        if response.code != 0:
            raise from_refusal(response.code, response.message, dict(response.details))
        return response

    def close(self) -> None:
        self._writer.cancel()
        self._call.cancel()


class _Mux:
    def __init__(self, stub: Any, metadata: Metadata) -> None:
        self._metadata = metadata
        self._stub = stub
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)

    async def call(
        self, name: str, request: pb.SessionRequest, timeout: float
    ) -> pb.SessionResponse:
        request.id = next(self._ids)
        if self._stream is None or self._stream.broken is not None:
            try:
                self._stream = _Stream(self._stub, self._metadata)
            except grpc.aio.UsageError:
                # The channel was closed under a caller still running.
                raise Unavailable("the client is closed") from None
        return await self._stream.call(name, request, timeout)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class _Node:
    """One server: its grpc.aio channel, stubs and Session stream."""

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
        self.mux = _Mux(self.rpc, metadata)

    async def close(self) -> None:
        self.mux.close()
        await self.channel.close(None)


class _Connection:
    """The grpc.aio channels to a client's servers, for one process and one
    event loop."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, _tls.Endpoint]],
        options: Sequence[tuple[str, Any]],
        metadata: Metadata,
    ) -> None:
        self.pid = os.getpid()
        #: Sent with every call (the bearer token, when there is one).
        self.metadata = metadata
        self.loop = asyncio.get_running_loop()
        #: One per server, in the order given; channels connect on first use.
        self.nodes = [_Node(t, e, options, metadata) for t, e in endpoints]
        #: Which server calls go to first.
        self.rotation = _core.Rotation(len(self.nodes))
        #: The leases' keep-alive tasks, cancelled and awaited by close() so
        #: no task outlives the channels it calls through.
        self.tasks: set[asyncio.Task[None]] = set()
        #: Set by close(): a keep-alive task stopped by it leaves its term
        #: to expire at its TTL (as documented) instead of suspending it.
        self.closed = False

    @property
    def current(self) -> _Node:
        return self.nodes[self.rotation.current]

    async def run(self, safe: bool, op: Callable[[_Node], Awaitable[T]]) -> T:
        """As the sync twin's: the current server, then (on ``Unavailable``,
        when ``safe``) the next ones, each at most once."""
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
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return self.pid == os.getpid() and self.loop is loop and not loop.is_closed()

    def track(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        self.closed = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        # Awaited, so their exceptions (if any) are retrieved here and never
        # reported as "Task exception was never retrieved".
        await asyncio.gather(*tasks, return_exceptions=True)
        for node in self.nodes:
            await node.close()


async def _unary(
    call: Callable[..., Any], request: Any, timeout: float, name: str, metadata: Metadata
) -> Any:
    try:
        return await call(request, timeout=timeout, metadata=metadata)
    except grpc.aio.UsageError:
        raise Unavailable(f"{name}: the client is closed") from None
    except grpc.aio.AioRpcError as err:
        failure = from_aio_error(err)
        if failure.code == "DEADLINE_EXCEEDED":
            failure = Unavailable(f"{name} got no reply within {millis(timeout)} ms")
        raise failure from None


class AsyncClient:
    """The asyncio twin of :class:`leasehold.Client`; the same arguments
    (``https://`` targets and the ``tls_*`` options included), the same
    methods, awaited.

    The channel is opened lazily per process and per event loop. Use it from
    the event loop's thread.
    """

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
        self.owner = owner
        self.timeout = timeout
        self._options = list(options)
        self._conn: _Connection | None = None
        #: Connections of other processes or loops, kept so they are never
        #: closed or collected from the wrong one.
        self._inherited: list[_Connection] = []

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        if conn is not None:
            self._inherited.append(conn)
        self._conn = _Connection(self._endpoints, self._options, self._metadata)
        return self._conn

    @property
    def current_target(self) -> str:
        """As :attr:`leasehold.Client.current_target` (for this loop)."""
        conn = self._conn
        if conn is None or not conn.usable():
            return self.targets[0]
        return conn.current.target

    async def close(self) -> None:
        """Closes this loop's channel; leases still held expire at their TTL."""
        conn, self._conn = self._conn, None
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
        """As :meth:`leasehold.Client.acquire`. Await it for an
        :class:`AsyncLease`, or use it directly with ``async with``."""
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
                reply: pb.AcquireResponse = await conn.run(
                    True,
                    lambda node: _unary(
                        node.rpc.Acquire, request, timeout, "Acquire", conn.metadata
                    ),
                )
                break
            except Unavailable:
                if attempt >= ATTEMPTS:
                    raise
                attempt += 1
                await asyncio.sleep(jittered(timing.retry_pause(attempt)))
        basis = first_sent if (not reply.replayed or generated) else None
        lease = AsyncLease(conn, reply, timing, basis)
        await lease._start(basis)
        return lease

    async def check(self, key: str, fence: int, *, timeout: float | None = None) -> int:
        """As :meth:`leasehold.Client.check`."""
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
            lambda node: _unary(getattr(node.rpc, name), request, wait, name, conn.metadata),
        )

    async def server_info(self) -> ServerInfo:
        """As :meth:`leasehold.Client.server_info`."""
        reply = await self._call("ServerInfo", pb.ServerInfoRequest())
        return ServerInfo(
            version=reply.version, protocol=int(reply.protocol), backend=reply.backend
        )

    async def get(self, key: str) -> KeyState:
        """As :meth:`leasehold.Client.get`."""
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
        """As :meth:`leasehold.Client.list_keys`."""
        request = _core.list_request(prefix, filter, page_size, page_token)
        reply = await self._call("List", request)
        return KeyPage(
            keys=[KeyState.from_key_state(k) for k in reply.keys],
            next_page_token=reply.next_page_token,
        )

    async def history(
        self, key: str, *, page_size: int = 0, before: int | None = None
    ) -> HistoryPage:
        """As :meth:`leasehold.Client.history`."""
        request = pb.HistoryRequest(
            key=key, page_size=page_size, page_token="" if before is None else str(before)
        )
        return HistoryPage.from_pb(await self._call("History", request))

    async def unquarantine(self, key: str) -> KeyState:
        """As :meth:`leasehold.Client.unquarantine`."""
        reply = await self._call("Unquarantine", pb.UnquarantineRequest(key=key))
        return KeyState.from_key_state(reply.key)

    def watch(self, *, key: str = "", prefix: str = "", start_revision: int = 0) -> AsyncWatch:
        """As :meth:`leasehold.Client.watch`: ``async for event in
        client.watch(...)``. Await it first (``w = await client.watch(...)``)
        to be sure the server has accepted the watch before going on (with
        ``start_revision=0`` only what happens after that is reported); a
        watch iterated without being awaited starts at its first step."""
        request = _core.watch_request(key, prefix, start_revision)
        return AsyncWatch(self._connection(), request, self.timeout)

    async def check_transcript(
        self, messages: str | bytes | list[Any], *, format: str = ""
    ) -> TranscriptReport:
        """As :meth:`leasehold.Client.check_transcript`."""
        request = pb.TranscriptCheckRequest(transcript=transcript_text(messages), format=format)
        conn = self._connection()
        reply = await conn.run(
            True,
            lambda node: _unary(
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
        """As :meth:`leasehold.Client.repair_transcript`."""
        request = pb.TranscriptRepairRequest(
            transcript=transcript_text(messages),
            format=format,
            placeholder_markers=list(placeholder_markers),
        )
        conn = self._connection()
        reply = await conn.run(
            True,
            lambda node: _unary(
                node.transcripts.Repair, request, self.timeout, "Repair", conn.metadata
            ),
        )
        return TranscriptRepair.from_pb(reply)


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


class AsyncLease:
    """The asyncio twin of :class:`leasehold.Lease`; ``lost`` is an
    ``asyncio.Event`` and ``scope()`` cancels its block when the lease is lost."""

    def __init__(
        self, conn: _Connection, reply: pb.AcquireResponse, timing: Timing, basis: float | None
    ) -> None:
        self._conn = conn
        #: Set while the lease cannot be trusted (see ``Lease.lost``).
        self.lost = asyncio.Event()
        lost = self.lost

        def notify(valid: bool) -> None:
            if valid:
                lost.clear()
            else:
                lost.set()

        self._core = Standing(reply=reply, timing=timing, basis=basis, notify=notify)
        self._finished = False
        self._task: asyncio.Task[None] | None = None

    async def _start(self, basis: float | None) -> None:
        core, conn, timing = self._core, self._conn, self._core.timing
        first = time.monotonic() if basis is None else basis + timing.renew_every
        if first <= time.monotonic():
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
        loop = asyncio.get_running_loop()
        task = loop.create_task(_keep_alive(core, conn, first))
        conn.track(task)
        self._task = task

        def abandon() -> None:
            # The lease was collected without release: stop renewing and
            # suspend it, from the loop (a finalizer may run on any thread).
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)

        self._finalizer = weakref.finalize(self, abandon)

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
        return self._core.previous

    @property
    def recovered(self) -> bool:
        previous = self._core.previous
        return previous is not None and previous.end in ("suspended", "expired")

    @property
    def replayed(self) -> bool:
        return self._core.replayed

    @property
    def unsettled_tool_calls(self) -> int:
        return self._core.unsettled_at_grant

    @property
    def deadline(self) -> float:
        return self._core.deadline

    @property
    def server_expires_at_ms(self) -> int:
        return self._core.expires_at_ms

    def __repr__(self) -> str:
        return (
            f"AsyncLease(key={self.key!r}, fence={self.fence}, owner={self.owner!r}, "
            f"valid={self.is_valid()})"
        )

    # -- validity ----------------------------------------------------------
    def is_valid(self) -> bool:
        return self._core.loss() is None

    def loss(self) -> LeaseLost | None:
        return self._core.loss()

    async def verify(self) -> None:
        if self._core.final is not None:
            raise copy.copy(self._core.final)
        request, timeout = self._core.check_request(), self._core.timing.rpc_timeout
        try:
            await self._conn.run(True, lambda node: node.mux.call("Check", request, timeout))
        except Error as err:
            raise self._core.judge(err) from None

    async def gate(self) -> int:
        self._core.ensure_valid()
        await self.verify()
        self._core.ensure_valid()
        return self._core.fence

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

    # -- ending --------------------------------------------------------------
    async def release(self) -> EndedTerm:
        """As :meth:`leasehold.Lease.release`."""
        return await self._finish(False)

    async def suspend(self) -> EndedTerm:
        """As :meth:`leasehold.Lease.suspend`."""
        return await self._finish(True)

    async def hand_off(
        self, successor: str, *, within: float = 30.0, suspend: bool = False
    ) -> EndedTerm:
        """As :meth:`leasehold.Lease.hand_off`."""
        _core.handoff_checked(successor, within)
        return await self._finish(suspend, successor, within)

    async def _finish(self, suspend: bool, successor: str = "", within: float = 0.0) -> EndedTerm:
        self._finished = True
        if hasattr(self, "_finalizer"):
            self._finalizer.detach()
        core = self._core
        already = core.final
        core.end(core.lost_error("ended", "the lease was released"))
        if self._task is not None:
            self._task.cancel()
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
        try:
            await self.suspend()
        except Error:
            pass

    # -- tool calls ----------------------------------------------------------
    async def _ledger(self, name: str, request: Any) -> Any:
        conn, timeout = self._conn, self._core.timing.rpc_timeout
        # As the sync twin: BeginToolCalls is never resent on another server.
        safe = name != "BeginToolCalls"
        try:
            return await conn.run(
                safe,
                lambda node: _unary(getattr(node.rpc, name), request, timeout, name, conn.metadata),
            )
        except Error as err:
            raise self._core.judge(err, ledger=True) from None

    async def begin_tool_calls(
        self, calls: Sequence[ToolCallRequest], *, turn: str = "", across_turns: bool = False
    ) -> BeginResult:
        """As :meth:`leasehold.Lease.begin_tool_calls`."""
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
        """As :meth:`leasehold.Lease.settle_tool_call`."""
        reply = await self._ledger(
            "SettleToolCall", self._core.settle_request(call_id, outcome, result, turn)
        )
        return ToolCallRecord.from_pb(reply.call)

    async def unsettled_tool_calls_list(self) -> list[ToolCallRecord]:
        """As :meth:`leasehold.Lease.unsettled_tool_calls_list`."""
        reply = await self._ledger("ListToolCalls", self._core.unsettled_request())
        return [ToolCallRecord.from_pb(c) for c in reply.calls]

    async def run_tool_calls(
        self,
        calls: Sequence[ToolCallRequest],
        runner: AsyncRunner,
        *,
        concurrency: int | None = None,
        turn: str = "",
        across_turns: bool = False,
    ) -> list[ToolResult]:
        """As :meth:`leasehold.Lease.run_tool_calls` (``turn`` and
        ``across_turns`` included), but the new calls run concurrently (at
        most ``concurrency`` at a time, unlimited if None), each settled as
        soon as it returns, and all are cancelled (their calls left recorded
        as running) if the lease is lost meanwhile."""
        self._core.ensure_valid()
        unique = _core.unique_calls(calls)
        known = await self._register(unique, turn, across_turns)
        fresh = [c for c in unique if c.call_id not in known]
        limit = asyncio.Semaphore(concurrency or max(1, len(fresh)))

        async def one(call: ToolCallRequest) -> tuple[str, ToolCallRecord]:
            async with limit:
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
                record = await self.settle_tool_call(
                    call.call_id, outcome.outcome, outcome.result, turn=turn
                )
                return call.call_id, record

        ran: dict[str, ToolCallRecord] = {}
        if fresh:
            async with self.scope():
                tasks = [asyncio.ensure_future(one(c)) for c in fresh]
                try:
                    for call_id, record in await asyncio.gather(*tasks):
                        ran[call_id] = record
                finally:
                    for t in tasks:
                        t.cancel()
        return _core.assemble(calls, known, ran)

    async def _register(
        self, calls: list[ToolCallRequest], turn: str, across_turns: bool
    ) -> dict[str, ToolCallRecord]:
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


class AsyncWatch:
    """A running watch (asyncio): ``async for event in watch``, revisions
    rising, with ``next_revision`` to resume from. Await it to start it
    eagerly; ``await watch.aclose()`` (or ``async with``) cancels it."""

    def __init__(self, conn: _Connection, request: pb.WatchRequest, timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout
        self._request = request
        self._cursor = _core.WatchCursor(request.start_revision)
        self._call: Any = None
        self._done = False

    @property
    def next_revision(self) -> int:
        """As :attr:`leasehold.Watch.next_revision`."""
        return self._cursor.next_revision

    async def _start(self) -> None:
        if self._call is not None:
            return
        first = await self._conn.run(True, self._start_on)
        self._cursor.first(first)

    async def _start_on(self, node: _Node) -> pb.WatchResponse:
        self._done = False
        self._call = node.rpc.Watch(self._request, metadata=self._conn.metadata)
        try:
            # A server that does not answer in time must not hang the caller.
            first = await asyncio.wait_for(self._receive(), self._timeout)
        except asyncio.TimeoutError:
            self._done = True
            self._call.cancel()
            raise Unavailable(
                f"Watch got no first reply within {millis(self._timeout)} ms"
            ) from None
        if first is None:
            raise Unavailable("the Watch stream ended before it started")
        return first

    async def _receive(self) -> pb.WatchResponse | None:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as err:
            if self._done:
                return None
            self._done = True
            raise from_aio_error(err) from None
        except asyncio.CancelledError:
            if self._done:  # aclose() cancelled the call under us
                return None
            raise
        if response is _EOF:
            self._done = True
            return None
        result: pb.WatchResponse = response
        return result

    def __await__(self) -> Generator[Any, None, AsyncWatch]:
        return self._started().__await__()

    async def _started(self) -> AsyncWatch:
        await self._start()
        return self

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        await self._start()
        while True:
            event = self._cursor.pop()
            if event is not None:
                return event
            if self._done:
                raise StopAsyncIteration
            response = await self._receive()
            if response is None:
                raise StopAsyncIteration
            self._cursor.take(response)

    async def aclose(self) -> None:
        """Cancels the watch; iteration then ends."""
        self._done = True
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> AsyncWatch:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _keep_alive(core: Standing, conn: _Connection, first: float) -> None:
    """Renews the term until it is lost for good or released; if the task is
    cancelled while the term is still live (the lease was collected without
    release), suspends it once, best effort."""
    timing = core.timing
    next_renewal = first
    failures = 0
    try:
        while core.final is None:
            until = core.seconds_to_deadline()
            wait = max(0.0, next_renewal - time.monotonic())
            if until is not None:
                wait = min(wait, until)
            await asyncio.sleep(wait)
            core.refresh()
            if time.monotonic() < next_renewal:
                continue
            # The deadline rests on this send time, before any failover:
            # the server that acknowledges the renewal extended the term
            # after it. Safe to resend: a renewal applied twice extends the
            # same term.
            sent = time.monotonic()
            renewal = asyncio.ensure_future(
                conn.run(
                    True,
                    lambda node: node.mux.call("Renew", core.renew_request(), timing.rpc_timeout),
                )
            )
            try:
                # Wake at the deadline while the renewal is out, to flag it.
                while not renewal.done():
                    core.refresh()
                    await asyncio.wait({renewal}, timeout=core.seconds_to_deadline())
                core.refresh()
                reply = renewal.result()
            except Error as err:
                judged = core.judge(err)
                if isinstance(judged, LeaseLost) and judged.final:
                    return
                failures += 1
                next_renewal = time.monotonic() + jittered(timing.retry_pause(failures))
                continue
            finally:
                if renewal.done():
                    # Retrieved even when this task is being cancelled, so a
                    # renewal that failed as the loop ended is never reported.
                    if not renewal.cancelled():
                        renewal.exception()
                else:
                    renewal.cancel()
            failures = 0
            core.renewed(sent, reply.lease)
            next_renewal = sent + timing.renew_every
    except asyncio.CancelledError:
        if core.final is None and not conn.closed:
            core.end(core.lost_error("ended", "the lease was dropped without release"))
            request = core.release_request(True)
            # Best effort: the loop may be ending and the channel closing.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await conn.run(
                    True, lambda node: node.mux.call("Release", request, timing.rpc_timeout)
                )
        raise
