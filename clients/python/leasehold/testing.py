"""A throwaway leasehold server for your own tests, as ``testing.postgresql``
is for PostgreSQL: a real server process on ``127.0.0.1:0`` with a
temporary SQLite database, stopped (and its database deleted) afterwards::

    from leasehold.testing import leasehold_server   # in conftest.py: a pytest fixture

    def test_my_agent(leasehold_server):
        client = leasehold.Client(leasehold_server.address)
        ...

or, anywhere::

    with leasehold.testing.server() as srv:
        client = leasehold.Client(srv.address)

A test server stops at once when its block ends, even with clients still
connected: it is started with ``--drain-timeout-ms 0`` (the default drain
waits up to 5 s for open connections to close). It still shuts down
cleanly, committing what it acknowledged; pass your own
``--drain-timeout-ms`` to test draining.

The binary is ``$LEASEHOLD_BIN`` when set, else the first ``leasehold`` on
``PATH`` (``pip install leasehold-server`` puts one in the venv); with
neither, :class:`NoServerBinary` says so; a binary older than this client
(one that does not speak the protocol revision it needs) is refused with
:class:`IncompatibleServer`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._errors import Error, Unauthenticated, Unsupported
from ._sync import Client
from ._types import PROTOCOL

__all__ = [
    "IncompatibleServer",
    "NoServerBinary",
    "TestServer",
    "find_binary",
    "leasehold_server",
    "server",
]


class NoServerBinary(Error):
    """No leasehold server binary to start."""


class IncompatibleServer(Error):
    """The binary started, but it does not speak what this client needs."""


def _check_speaks(binary: str, address: str) -> None:
    """Refuses a server older than this client, naming both sides."""
    with Client(address) as client:
        try:
            info = client.server_info()
        except Unauthenticated:
            return  # started with --auth: this helper has no token to ask with
        except Unsupported as e:
            raise IncompatibleServer(
                f"{binary} is older than this client: it does not answer ServerInfo ({e}); "
                "install a leasehold server of at least this client's version"
            ) from None
    if not info.compatible:
        raise IncompatibleServer(
            f"{binary} is leasehold {info.version}, speaking leasehold.v1 revision "
            f"{info.protocol}; this client needs revision {PROTOCOL}: install a leasehold "
            "server of at least this client's version"
        )


def find_binary() -> str:
    """``$LEASEHOLD_BIN``, else ``leasehold`` on ``PATH``; raises
    :class:`NoServerBinary` naming both when neither is there."""
    named = os.environ.get("LEASEHOLD_BIN")
    if named:
        if not os.access(named, os.X_OK):
            raise NoServerBinary(f"LEASEHOLD_BIN={named} is not an executable file")
        return named
    found = shutil.which("leasehold")
    if found is None:
        raise NoServerBinary(
            "no leasehold server binary: set LEASEHOLD_BIN to one, or put `leasehold` on PATH "
            "(build it with `cargo build --release` in the leasehold repository)"
        )
    return found


@dataclass
class TestServer:
    """A running throwaway server."""

    __test__ = False  # not a pytest test class

    #: ``127.0.0.1:<port>``, for ``leasehold.Client(address)``.
    address: str
    #: The temporary database file.
    db: Path
    process: subprocess.Popen[str]

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after 5 s: a server
        started by :func:`server` does not drain, so it exits at once)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


_DRAIN = "--drain-timeout-ms"


@contextlib.contextmanager
def server(*args: str, start_timeout: float = 20.0) -> Iterator[TestServer]:
    """A server for the block; ``args`` are extra ``leasehold serve`` flags."""
    binary = find_binary()
    if not any(a == _DRAIN or a.startswith(_DRAIN + "=") for a in args):
        # A client the test left open would hold the default drain (5 s) on
        # every teardown; nothing is lost without it (acknowledged writes
        # are durable before their reply).
        args = (_DRAIN, "0", *args)
    with tempfile.TemporaryDirectory(prefix="leasehold-test-") as home:
        db = Path(home) / "leasehold.db"
        process = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--db", str(db), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(process.stdout.readline() if process.stdout else ""),
            daemon=True,
        )
        reader.start()
        reader.join(timeout=start_timeout)
        srv = TestServer(address="", db=db, process=process)
        try:
            if not line or not line[0].startswith("listening on "):
                srv.stop()
                err = process.stderr.read() if process.stderr else ""
                raise NoServerBinary(
                    f"{binary} did not start a server: {(line[0] if line else '').strip()!r} "
                    f"{err.strip()[-500:]}"
                )
            srv.address = line[0].split("listening on ", 1)[1].strip()
            _check_speaks(binary, srv.address)
            yield srv
        finally:
            srv.stop()


try:
    import pytest

    @pytest.fixture
    def leasehold_server() -> Iterator[TestServer]:
        """A pytest fixture: a fresh throwaway server per test."""
        with server() as srv:
            yield srv

except ImportError:  # pytest is not installed: the context manager still works
    pass
