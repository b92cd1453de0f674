"""Shared fixtures: a real leasehold server per test, on a free loopback
port with a temporary database, found through $LEASEHOLD_BIN."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    binary = os.environ.get("LEASEHOLD_BIN")
    if not binary:
        raise pytest.UsageError(
            "LEASEHOLD_BIN is not set: point it at the leasehold server binary "
            "(e.g. target/debug/leasehold) to run the Python client's tests"
        )
    if not os.access(binary, os.X_OK):
        raise pytest.UsageError(f"LEASEHOLD_BIN={binary} is not an executable file")


class Server:
    """One leasehold server process: started on 127.0.0.1 port 0, stopped,
    paused (SIGSTOP) and resumed (SIGCONT) by the test."""

    def __init__(
        self,
        db: Path,
        listen: str = "127.0.0.1:0",
        extra: tuple[str, ...] = (),
        store: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        self.db = db
        self.process = subprocess.Popen(
            [
                binary or os.environ["LEASEHOLD_BIN"],
                "serve",
                "--listen",
                listen,
                # ``store`` replaces the SQLite file (e.g. --store postgres://...).
                *(store or ("--db", str(db))),
                "--drain-timeout-ms",
                "200",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.paused = False
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(
                self.process.stdout.readline() if self.process.stdout else ""
            ),
            daemon=True,
        )
        reader.start()
        reader.join(timeout=20)
        if not line or not line[0].startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the server did not say where it listens: {line!r}")
        #: host:port the server listens on.
        self.address = line[0].split("listening on ", 1)[1].strip()
        assert self.address.startswith("127.0.0.1:"), self.address

    def restart(self) -> None:
        """Stops the server and starts it again on the same address and database."""
        self.stop()
        again = Server(self.db, listen=self.address)
        self.process, self.paused = again.process, False

    def pause(self) -> None:
        """Freezes the server process, as a hung or partitioned server."""
        os.kill(self.process.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        if self.paused:
            self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A fresh server with an empty database, for one test."""
    srv = Server(tmp_path / "leasehold.db")
    try:
        yield srv
    finally:
        srv.stop()


def wait_until(predicate: object, timeout: float, step: float = 0.01) -> bool:
    """Polls ``predicate()`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(step)
    return bool(predicate())  # type: ignore[operator]


#: PostgreSQL for the storage-fence and framework tests (set by .ci/run).
PG_URL = os.environ.get("LEASEHOLD_TEST_PG_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="LEASEHOLD_TEST_PG_URL is not set")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A schema of its own on $LEASEHOLD_TEST_PG_URL, dropped after the test."""
    import psycopg

    assert PG_URL is not None
    schema = f"leasehold_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


# -- worker processes (lg_worker.py, fw_worker.py) ----------------------------

TESTS = Path(__file__).parent


def wait_for_marker(proc: subprocess.Popen[str], marker: str, timeout: float = 60) -> None:
    """Waits until worker ``proc`` writes ``marker`` (its tool is running);
    fails at once, with what the worker said, if it ends first."""
    path = Path(marker)
    if not wait_until(lambda: path.exists() or proc.poll() is not None, timeout):
        pytest.fail(f"the worker did not reach its tool within {timeout} s")
    if not path.exists():
        out = proc.communicate(timeout=10)[0]
        pytest.fail(f"the worker ended (status {proc.returncode}) before its tool: {out!r}")


def spawn_worker(script: str, spec: dict[str, object]) -> subprocess.Popen[str]:
    """Starts ``tests/<script>`` with ``spec`` (JSON); its one stdout line is
    how it ended."""
    return subprocess.Popen(
        [sys.executable, str(TESTS / script), json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


def finish_worker(process: subprocess.Popen[str]) -> dict[str, Any]:
    """Waits for a worker and returns what it printed."""
    out, _ = process.communicate(timeout=60)
    result: dict[str, Any] = json.loads(out)
    return result


def kill_worker(process: subprocess.Popen[str]) -> None:
    """Kills a worker still running (resumed first if it was stopped)."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


def worker_effects(path: str) -> list[tuple[str, str, str]]:
    """The tool runs the workers recorded: (worker, tool, argument)."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS effects (worker TEXT, tool TEXT, cmd TEXT)")
        return [(r[0], r[1], r[2]) for r in conn.execute("SELECT worker, tool, cmd FROM effects")]


def metrics_address() -> str:
    """A loopback address free at the time of asking, for ``--metrics-listen``."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def answered(metrics_at: str, *rpcs: str) -> int:
    """How many requests of exactly the named RPCs (e.g. ``"Check"``,
    ``"Session.Check"``) the server at ``metrics_at`` answered."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics_at}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found = re.findall(r'^leasehold_request_seconds_count\{rpc="([^"]+)"\} (\d+)', text, re.M)
    return sum(int(n) for name, n in found if name in rpcs)


def checks_answered(metrics_at: str) -> int:
    """How many Check requests (unary or on a Session stream) the server answered."""
    return answered(metrics_at, "Check", "Session.Check")
