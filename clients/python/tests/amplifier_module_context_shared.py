"""Amplifier module ``context-shared``: a context manager over one SQLite
file that several processes share (the source of truth, read on every
call, as context-persistent reads its file). When the session is owned
(the ``leasehold.session`` capability), every write first advances the
session's fence in the write's own transaction (``leasehold.fence.sqlite``),
so the database itself refuses a lost owner's late write."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from amplifier_core import ModuleCoordinator

from leasehold.fence import sqlite as fence

__amplifier_module_type__ = "context"

SCHEMA = "CREATE TABLE IF NOT EXISTS messages (session TEXT, seq INTEGER PRIMARY KEY, body TEXT)"


async def mount(coordinator: ModuleCoordinator, config: dict[str, Any] | None = None) -> None:
    config = config or {}
    await coordinator.mount(
        "context", SharedContext(config["db"], coordinator.session_id, coordinator)
    )


def read(db: str, session: str) -> list[dict[str, Any]]:
    """The stored messages of ``session``."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        conn.execute(SCHEMA)
        rows = conn.execute("SELECT body FROM messages WHERE session = ? ORDER BY seq", (session,))
        return [json.loads(r[0]) for r in rows]
    finally:
        conn.close()


class SharedContext:
    #: Writes compare the fence in their own transaction (see the module doc).
    leasehold_fenced_writes = True

    def __init__(self, db: str, session: str, coordinator: Any) -> None:
        self.db = db
        self.session = session
        self.coordinator = coordinator

    def _write(self, replace: bool, messages: list[dict[str, Any]]) -> None:
        conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            conn.execute(SCHEMA)
            fence.install(conn)
            owner = self.coordinator.get_capability("leasehold.session")
            if owner is not None:
                txn = fence.write(conn, owner.key, owner.fence)
            else:
                conn.execute("BEGIN IMMEDIATE")
                txn = fence.FencedWrite(conn, True)
            with txn:
                if replace:
                    conn.execute("DELETE FROM messages WHERE session = ?", (self.session,))
                conn.executemany(
                    "INSERT INTO messages (session, body) VALUES (?, ?)",
                    [(self.session, json.dumps(m)) for m in messages],
                )
        finally:
            conn.close()

    async def add_message(self, message: dict[str, Any]) -> None:
        self._write(False, [message])

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        self._write(True, messages)

    async def clear(self) -> None:
        self._write(True, [])

    async def get_messages(self) -> list[dict[str, Any]]:
        return read(self.db, self.session)

    async def get_messages_for_request(
        self, token_budget: int | None = None, provider: Any | None = None
    ) -> list[dict[str, Any]]:
        return read(self.db, self.session)
