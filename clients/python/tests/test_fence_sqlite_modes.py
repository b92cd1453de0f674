"""``leasehold.fence.sqlite.write()`` in every transaction-control mode of
Python's sqlite3: the legacy ``isolation_level`` modes (every Python) and
3.12's ``autocommit=True`` / ``autocommit=False``. In each, a fenced write
commits for real, a stale or failed one rolls back for real, and neither
keeps the write lock. ``clients/python/test.sh`` runs this file under 3.11
and again under 3.12 or later, so every mode runs in CI."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from leasehold.fence import StaleFence
from leasehold.fence import sqlite as fence

Open = Callable[[Path], sqlite3.Connection]

MODES: dict[str, Open] = {
    "legacy-deferred": lambda p: sqlite3.connect(p),
    "legacy-none": lambda p: sqlite3.connect(p, isolation_level=None),
    "legacy-immediate": lambda p: sqlite3.connect(p, isolation_level="IMMEDIATE"),
}
if sys.version_info >= (3, 12):
    MODES["autocommit-true"] = lambda p: sqlite3.connect(p, autocommit=True)
    MODES["autocommit-false"] = lambda p: sqlite3.connect(p, autocommit=False)

MODERN = ("autocommit-true", "autocommit-false")


def _params() -> list[object]:
    params: list[object] = list(MODES)
    if sys.version_info < (3, 12):
        params += [
            pytest.param(m, marks=pytest.mark.skip(reason="needs Python 3.12 (test.sh runs it)"))
            for m in MODERN
        ]
    return params


@pytest.fixture(params=_params())
def conn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = tmp_path / "app.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE items (session TEXT, body TEXT)")
    setup.close()
    c = MODES[request.param](path)
    fence.install(c)
    yield c
    c.close()


def _other(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A second connection to the same file, that never waits for a lock."""
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    return sqlite3.connect(path, isolation_level=None, timeout=0)


def _bodies(conn: sqlite3.Connection) -> list[str]:
    other = _other(conn)
    try:
        return [r[0] for r in other.execute("SELECT body FROM items ORDER BY rowid")]
    finally:
        other.close()


def _lock_is_free(conn: sqlite3.Connection) -> bool:
    other = _other(conn)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        other.close()


def test_a_fenced_write_commits_and_frees_the_lock(conn: sqlite3.Connection) -> None:
    """The block's write is visible to another connection afterwards, and the
    write lock is free (not held until the connection closes)."""
    with fence.write(conn, "session:1", 3):
        conn.execute("INSERT INTO items VALUES ('session:1', 'one')")
    assert _bodies(conn) == ["one"]
    assert _lock_is_free(conn)
    with fence.write(conn, "session:1", 3):  # an equal fence writes again
        conn.execute("INSERT INTO items VALUES ('session:1', 'two')")
    assert _bodies(conn) == ["one", "two"]
    assert fence.highest(_other(conn), "session:1") == 3


def test_a_stale_fence_rolls_back_and_frees_the_lock(conn: sqlite3.Connection) -> None:
    """A lower fence than one that wrote raises StaleFence; nothing of its
    transaction lands and the newer holder can still write."""
    with fence.write(conn, "session:1", 5):
        conn.execute("INSERT INTO items VALUES ('session:1', 'new')")
    with pytest.raises(StaleFence):
        with fence.write(conn, "session:1", 4):
            conn.execute("INSERT INTO items VALUES ('session:1', 'late')")
    assert _bodies(conn) == ["new"]
    assert _lock_is_free(conn)
    newer = _other(conn)
    with fence.write(newer, "session:1", 6):
        newer.execute("INSERT INTO items VALUES ('session:1', 'newer')")
    newer.close()
    assert _bodies(conn) == ["new", "newer"]


def test_an_error_in_the_block_rolls_back_and_frees_the_lock(conn: sqlite3.Connection) -> None:
    """An exception inside the block undoes its writes and the fence."""
    with pytest.raises(RuntimeError):
        with fence.write(conn, "session:1", 7):
            conn.execute("INSERT INTO items VALUES ('session:1', 'half')")
            raise RuntimeError("the handler failed")
    assert _bodies(conn) == []
    assert fence.highest(_other(conn), "session:1") is None
    assert _lock_is_free(conn)
