"""The asyncio client's own machinery, behind the names ``_async.py`` uses.

``_async.py`` is the one source of both clients (``scripts/unasync.py``
writes ``_sync.py`` from it); what cannot be written once for both lives
here and in ``_sync_rt.py``, by the same names: the pipelined ``Session``
stream (``Mux``: a reader and a writer task here, a reader thread there),
unary calls (``unary``), a lease's keep-alive (``Renewer``: a task here, a
thread there) and the watch (``AsyncWatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from . import _core
from ._core import Metadata, Standing, jittered, millis
from ._errors import Error, LeaseLost, StreamRefused, Unavailable, from_aio_error, from_refusal
from ._proto import leasehold_pb2 as pb
from ._types import WatchEvent

T = TypeVar("T")

#: grpc.aio's end-of-stream marker (missing from the type stubs).
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]


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
                why = StreamRefused(f"the Session stream failed: {why}", why)
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


class Mux:
    """The client's shared Session stream to one server, opened on first use
    and again after it breaks."""

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


async def unary(
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


class _Node(Protocol):
    """What the keep-alive and the watch use of one server (``_async._Node``,
    named by its shape so this module imports nothing of the client's)."""

    @property
    def mux(self) -> Mux: ...

    @property
    def rpc(self) -> Any: ...


class _Connection(Protocol):
    """What the keep-alive and the watch use of a connection
    (``_async._Connection``)."""

    @property
    def closed(self) -> bool: ...

    @property
    def metadata(self) -> Metadata: ...

    def track(self, task: asyncio.Task[None]) -> None: ...

    async def run(self, safe: bool, op: Callable[[_Node], Awaitable[T]]) -> T: ...


class Renewer:
    """A lease's keep-alive task, tracked by the connection so close()
    cancels and awaits it."""

    def __init__(self, core: Standing, conn: _Connection, first: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(_keep_alive(core, conn, first))
        conn.track(self._task)

    def stop(self) -> None:
        """The lease was released: stop renewing."""
        self._task.cancel()

    def abandon(self) -> None:
        """The lease was collected without release: stop renewing and
        suspend it, from the loop (a finalizer may run on any thread)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._task.cancel)


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
                core.renewal_failing = True
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
