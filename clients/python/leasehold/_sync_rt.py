"""The synchronous client's own machinery, behind the names ``_sync.py`` uses.

``_sync.py`` is written from ``_async.py`` by ``scripts/unasync.py``; what
cannot be written once for both lives here and in ``_async_rt.py``, by the
same names: the pipelined ``Session`` stream (``Mux``: fed from a queue and
read by one daemon thread that hands each response to the caller waiting
for its id), unary calls (``unary``), a lease's keep-alive (``Renewer``: a
daemon thread), the watch (``Watch``) and what a ``fork()`` needs done
first (``clients``, ``inherited``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from . import _core
from ._core import Metadata, Standing, jittered, millis
from ._errors import Error, LeaseLost, StreamRefused, Unavailable, from_refusal, from_rpc_error
from ._proto import leasehold_pb2 as pb
from ._types import WatchEvent

T = TypeVar("T")


class _Stream:
    """One open Session stream: its request queue, its waiters, its reader."""

    def __init__(self, stub: Any, metadata: Metadata) -> None:
        self._requests: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting: dict[int, concurrent.futures.Future[pb.SessionResponse]] = {}
        self.broken: Error | None = None
        self._call = stub.Session(self._outgoing(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="leasehold-session", daemon=True)
        self._reader.start()

    def _outgoing(self) -> Iterator[pb.SessionRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self) -> None:
        why: Error
        try:
            for response in self._call:
                with self._lock:
                    waiter = self._waiting.pop(response.id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(response)
            why = Unavailable("the Session stream ended")
        except grpc.RpcError as err:
            why = from_rpc_error(err)
            if not isinstance(why, Unavailable):
                why = StreamRefused(f"the Session stream failed: {why}", why)
        except Exception as err:  # pragma: no cover - grpc internals
            why = Unavailable(f"the Session stream failed: {err!r}")
        self._break(why)

    def _break(self, why: Error) -> None:
        with self._lock:
            self.broken = why
            waiting, self._waiting = self._waiting, {}
        self._requests.put(None)  # frees gRPC's thread reading our requests
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(why)

    def submit(
        self, request: pb.SessionRequest
    ) -> concurrent.futures.Future[pb.SessionResponse] | None:
        """Sends ``request``; None when the stream has broken."""
        waiter: concurrent.futures.Future[pb.SessionResponse] = concurrent.futures.Future()
        with self._lock:
            if self.broken is not None:
                return None
            self._waiting[request.id] = waiter
        self._requests.put(request)
        return waiter

    def forget(self, op_id: int) -> None:
        with self._lock:
            self._waiting.pop(op_id, None)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()

    def join(self, timeout: float) -> None:
        """Waits (bounded) until the reader has left gRPC."""
        self._reader.join(timeout)


class Mux:
    """The client's shared Session stream, opened on first use and again
    after it breaks; operations in flight when it breaks fail as Unavailable."""

    def __init__(self, stub: Any, metadata: Metadata) -> None:
        self._stub = stub
        self._metadata = metadata
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._ids = itertools.count(1)

    def submit(
        self, request: pb.SessionRequest
    ) -> tuple[_Stream, concurrent.futures.Future[pb.SessionResponse]]:
        request.id = next(self._ids)
        for _ in range(2):
            with self._lock:
                if self._stream is None or self._stream.broken is not None:
                    try:
                        self._stream = _Stream(self._stub, self._metadata)
                    except ValueError:
                        # grpc's "Cannot invoke RPC: Channel closed!": the
                        # client was closed while a lease's thread still ran.
                        raise Unavailable("the client is closed") from None
                stream = self._stream
            waiter = stream.submit(request)
            if waiter is not None:
                return stream, waiter
        raise Unavailable("the Session stream keeps breaking")

    def call(self, name: str, request: pb.SessionRequest, timeout: float) -> pb.SessionResponse:
        """Sends one operation and waits up to ``timeout`` for its answer; a
        refusal raises the same error the unary RPC would."""
        stream, waiter = self.submit(request)
        return self.result(name, stream, request.id, waiter, timeout)

    @staticmethod
    def result(
        name: str,
        stream: _Stream,
        op_id: int,
        waiter: concurrent.futures.Future[pb.SessionResponse],
        timeout: float,
    ) -> pb.SessionResponse:
        try:
            response = waiter.result(timeout)
        except concurrent.futures.TimeoutError:
            stream.forget(op_id)
            raise Unavailable(f"{name} got no reply within {millis(timeout)} ms") from None
        if response.code != 0:
            raise from_refusal(response.code, response.message, dict(response.details))
        return response

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def quiesce(self, timeout: float) -> None:
        """Ends the open stream and waits for its reader to leave gRPC, so a
        fork() finds no thread inside a gRPC call (gRPC's fork support skips
        its handlers otherwise, and the child can crash). Operations in
        flight fail as Unavailable and are retried like any broken stream;
        the next operation opens a new stream."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
            stream.join(timeout)


class _Forking(Protocol):
    """What a fork() needs of a client (``_sync.Client``, named by its shape
    so this module imports nothing of the client's)."""

    def _quiesce_for_fork(self, timeout: float) -> None:
        """Ends this process's Session streams and watches, waiting up to
        ``timeout`` for each."""

    def _forget_after_fork(self) -> None:
        """In the child: drops the parent's connection (kept in ``inherited``)
        and the locks its threads may have held."""


clients: weakref.WeakSet[_Forking] = weakref.WeakSet()
#: Connections inherited across fork are kept, never closed or collected, in
#: the child: gRPC must not touch a parent's channel there (grpc #29586).
inherited: list[object] = []


#: How long a fork() waits for open Session streams to close first.
_FORK_QUIESCE_SECONDS = 1.0


def _before_fork() -> None:
    # gRPC Python supports fork() with open channels but no call in progress;
    # the Session stream is always in progress while leases are held, so it
    # is ended first (in this process) and reopened on next use.
    for client in list(clients):
        client._quiesce_for_fork(_FORK_QUIESCE_SECONDS)


def _after_fork_in_child() -> None:
    for client in list(clients):
        client._forget_after_fork()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def unary(
    call: Callable[..., Any], request: Any, timeout: float, name: str, metadata: Metadata
) -> Any:
    try:
        return call(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as err:
        failure = from_rpc_error(err)
        if failure.code == "DEADLINE_EXCEEDED":
            failure = Unavailable(f"{name} got no reply within {millis(timeout)} ms")
        raise failure from None


class _Node(Protocol):
    """What the keep-alive uses of one server (``_sync._Node``)."""

    @property
    def mux(self) -> Mux: ...


class _Connection(Protocol):
    """What the keep-alive and a fork use of a connection (``_sync._Connection``)."""

    @property
    def pid(self) -> int: ...

    @property
    def nodes(self) -> Sequence[_Node]: ...

    @property
    def watches(self) -> Iterable[Watch]: ...

    def run(self, safe: bool, op: Callable[[_Node], T]) -> T: ...


class Renewer:
    """A lease's keep-alive thread."""

    def __init__(self, core: Standing, conn: _Connection, first: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_keep_alive,
            args=(core, conn, self._stop, first),
            name=f"leasehold-renew-{core.key}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """The lease was released: stop renewing."""
        self._stop.set()

    def abandon(self) -> None:
        """The lease was dropped without release: stop renewing and suspend
        it (from its thread)."""
        self._stop.set()


class _Stopped(Exception):
    """The lease was released or dropped while its renewal was out."""


def _keep_alive(core: Standing, conn: _Connection, stop: threading.Event, first: float) -> None:
    """Renews the term until it is lost for good, released, or abandoned."""
    timing = core.timing
    next_renewal = first
    failures = 0

    def renew_on(node: _Node) -> pb.SessionResponse:
        request = core.renew_request()
        stream, waiter = node.mux.submit(request)
        attempt_sent = time.monotonic()
        # Wake at the deadline while the renewal is out, to flag it.
        while not waiter.done():
            until = core.seconds_to_deadline()
            left = timing.rpc_timeout - (time.monotonic() - attempt_sent)
            if left <= 0:
                break
            concurrent.futures.wait([waiter], timeout=min(left, until or left, 0.25))
            core.refresh()
            if stop.is_set():
                raise _Stopped
        if not waiter.done():
            stream.forget(request.id)
            raise Unavailable(f"Renew got no reply within {millis(timing.rpc_timeout)} ms")
        return Mux.result("Renew", stream, request.id, waiter, 0.0)

    while core.final is None:
        until = core.seconds_to_deadline()
        wait = max(0.0, next_renewal - time.monotonic())
        if until is not None:
            wait = min(wait, until)
        if stop.wait(wait):
            return _abandoned(core, conn)
        core.refresh()
        if time.monotonic() < next_renewal:
            continue
        # The deadline rests on this send time, before any failover: the
        # server that acknowledges the renewal extended the term after it.
        sent = time.monotonic()
        try:
            # Safe to resend on another server: a renewal applied twice
            # extends the same term.
            reply = conn.run(True, renew_on)
        except _Stopped:
            return _abandoned(core, conn)
        except Error as err:
            judged = core.judge(err)
            if isinstance(judged, LeaseLost) and judged.final:
                return None
            failures += 1
            core.renewal_failing = True
            next_renewal = time.monotonic() + jittered(timing.retry_pause(failures))
            continue
        failures = 0
        core.renewed(sent, reply.lease)
        next_renewal = sent + timing.renew_every
    return None


def _abandoned(core: Standing, conn: _Connection) -> None:
    """The lease was released (nothing to do) or dropped without release:
    one best-effort suspension, so the next holder recovers at once."""
    if core.final is not None:
        return
    core.end(core.lost_error("ended", "the lease was dropped without release"))
    request = core.release_request(True)
    try:
        conn.run(True, lambda node: node.mux.call("Release", request, core.timing.rpc_timeout))
    except Error:
        pass  # it expires at its TTL


class Watch:
    """A running watch: iterate it for :class:`WatchEvent` values, revisions
    rising. Iteration blocks until the next event; it ends (or raises
    ``Unavailable``, ``ResourceExhausted`` for a watcher too slow, ...) when
    the stream does. ``close()`` (or leaving a ``with`` block) cancels it.
    A ``fork()`` ends it in the parent (gRPC forks safely only with no call
    in progress): iteration then raises ``Unavailable``; watch again from
    ``next_revision``.
    """

    def __init__(self, call: Any, start_revision: int, timeout: float) -> None:
        self._call = call
        self._cursor = _core.WatchCursor(start_revision)
        self._done = False
        self._forked = False
        # The first response says where the watch starts: read it now, so a
        # refusal (Compacted, Unsupported, ...) is raised by watch() itself
        # and nothing after the call can be missed. A server that does not
        # answer in time (frozen, partitioned) must not hang the caller.
        timer = threading.Timer(timeout, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            first = self._receive()
        except Unavailable:
            if not timer.is_alive():
                raise Unavailable(f"Watch got no first reply within {millis(timeout)} ms") from None
            raise
        finally:
            timer.cancel()
        if first is None:
            raise Unavailable("the Watch stream ended before it started")
        self._cursor.first(first)

    @property
    def next_revision(self) -> int:
        """The ``start_revision`` that continues exactly after the last event
        this watch yielded (or after where it started, if none)."""
        return self._cursor.next_revision

    def _receive(self) -> pb.WatchResponse | None:
        try:
            response: pb.WatchResponse = next(self._call)
            return response
        except StopIteration:
            self._done = True
            return None
        except grpc.RpcError as err:
            if self._forked:
                self._done = True
                raise Unavailable(
                    "the watch was ended before fork(): watch again from next_revision"
                ) from None
            if self._done:  # closed by close(), perhaps from another thread
                return None
            self._done = True
            raise from_rpc_error(err) from None

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        while True:
            event = self._cursor.pop()
            if event is not None:
                return event
            if self._done:
                raise StopIteration
            response = self._receive()
            if response is None:
                raise StopIteration
            self._cursor.take(response)

    def close(self) -> None:
        """Cancels the watch; iteration then ends."""
        self._done = True
        self._call.cancel()

    def _end_for_fork(self, timeout: float) -> None:
        if self._done:
            return
        self._forked = True
        self._call.cancel()
        # gRPC may still be finishing the call on its own threads; a fork in
        # the middle leaves the child's new channel broken ("Wrong file
        # descriptor generation"), so wait (bounded) until it has.
        deadline = time.monotonic() + timeout
        while not self._call.done() and time.monotonic() < deadline:
            time.sleep(0.005)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
