"""An owner paused (SIGSTOP) inside its fenced write, in a real process:
the next owner gets the library's FenceTimeout within the bound, not a hang
or the driver's error, and the paused owner's write, once it is continued,
is not committed (PostgreSQL ends its idle transaction; SQLite's helper
rolls back a transaction open past its bound)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import PG_URL, needs_pg

from leasehold.fence import FenceTimeout
from leasehold.fence import postgres as pg_fence
from leasehold.fence import sqlite as sqlite_fence

WORKER = Path(__file__).parent / "fence_worker.py"


@contextmanager
def _paused_writer(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Starts the worker, waits until it is inside its write, stops it;
    yields it and its ``inside`` line; kills it at the end whatever happened."""
    child = subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("inside "), line
        os.kill(child.pid, signal.SIGSTOP)
        yield child, line
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(timeout=10)


def _resume(child: subprocess.Popen[str]) -> str:
    """Continues the worker and lets its write go on: its last line."""
    os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate("go\n", timeout=20)
    return out.strip().splitlines()[-1]


def test_sqlite_a_paused_owner_blocks_with_fence_timeout_and_its_commit_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        sqlite_fence.install(setup)
        setup.execute("CREATE TABLE items (session TEXT, body TEXT)")
    nxt = sqlite3.connect(path, timeout=0.3)
    try:
        with _paused_writer("sqlite", str(path), "s", "1", "old", "0.2") as (child, _):
            # The paused owner holds the write lock: the busy timeout runs
            # out, as the library's error.
            with pytest.raises(FenceTimeout) as caught:
                with sqlite_fence.write(nxt, "s", 2):
                    nxt.execute("INSERT INTO items VALUES ('s', 'new')")
            assert caught.value.reason == "busy"
            assert not nxt.in_transaction
            # Continued, long past its bound: rolled back, not committed.
            assert _resume(child).startswith("error FenceTimeout open")
        with sqlite_fence.write(nxt, "s", 2):
            nxt.execute("INSERT INTO items VALUES ('s', 'new')")
        assert [r[0] for r in nxt.execute("SELECT body FROM items ORDER BY rowid")] == ["new"]
        assert sqlite_fence.highest(nxt, "s") == 2
    finally:
        nxt.close()


@needs_pg
def test_postgres_a_paused_owner_times_out_the_next_and_the_server_ends_its_write(
    pg_schema: str,
) -> None:
    import psycopg

    assert PG_URL is not None
    # statement_timeout: without the helper's bound the advance would wait
    # for ever; fail instead.
    options = f"-c search_path={pg_schema} -c statement_timeout=20000"
    with psycopg.connect(PG_URL, options=options, autocommit=True) as nxt:
        pg_fence.install(nxt)
        nxt.execute("CREATE TABLE items (session TEXT, body TEXT)")
        with _paused_writer("pg", PG_URL, pg_schema, "s", "1", "old", "4") as (child, line):
            pid = int(line.split()[1])
            # The next owner's advance waits for the paused transaction's
            # row: bounded, as the library's error.
            with pytest.raises(FenceTimeout) as caught:
                with pg_fence.write(nxt, "s", 2, lock_timeout=0.3):
                    nxt.execute("INSERT INTO items VALUES ('s', 'new')")
            assert caught.value.reason == "busy"
            # Idle past its bound, the paused transaction's session is ended
            # by the server (bounded wait).
            for _ in range(150):
                gone = nxt.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
                if gone.fetchone() is None:
                    break
                time.sleep(0.1)
            with pg_fence.write(nxt, "s", 2):
                nxt.execute("INSERT INTO items VALUES ('s', 'new')")
            assert _resume(child).startswith("error FenceTimeout idle")
        rows = nxt.execute("SELECT body FROM items").fetchall()
        assert [r[0] for r in rows] == ["new"], "nothing of the paused owner's write landed"
        assert pg_fence.highest(nxt, "s") == 2
