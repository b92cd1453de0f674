"""One agent server process for the LangGraph tests: runs one turn of the
test agent on a thread of a shared SqliteSaver file, owned through
leasehold or not, and prints how it ended as one JSON line.

    python lg_worker.py '{"cp": ..., "effects": ..., "thread": ..., ...}'
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import lg_agent
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt import ToolNode as PlainToolNode

import leasehold
from leasehold.langgraph import ToolNode, own


def effects_db(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (worker TEXT, tool TEXT, cmd TEXT)")
    return conn


def main(spec: dict[str, Any]) -> dict[str, Any]:
    name, marker = spec["name"], Path(spec["marker"])

    @tool
    def shell(cmd: str) -> str:
        """Runs a shell command (slowly)."""
        # LangGraph's default durability saves the last step in the
        # background: let it commit before the test may freeze this process.
        time.sleep(0.3)
        marker.write_text("in shell")
        time.sleep(spec.get("shell_seconds", 1.0))
        # "hold": the test lets the call finish by creating this file.
        hold = spec.get("hold")
        deadline = time.monotonic() + 30
        while hold and not Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        effects_db(spec["effects"]).execute(
            "INSERT INTO effects VALUES (?, 'shell', ?)", (name, cmd)
        )
        return f"{name} ran {cmd}"

    model = lg_agent.ProviderModel(ids=spec.get("ids"))
    saver: Any
    if spec.get("pg_schema"):
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        pg = psycopg.connect(
            spec["pg_url"],
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={spec['pg_schema']}",
        )
        saver = PostgresSaver(pg)
        saver.setup()
    else:
        conn = sqlite3.connect(spec["cp"], check_same_thread=False, timeout=30)
        saver = SqliteSaver(conn)
    owned = spec.get("addr") is not None
    node = ToolNode([shell]) if owned else PlainToolNode([shell])
    graph: Any = lg_agent.build(model, node).compile(checkpointer=saver)
    if owned:
        client = leasehold.Client(spec["addr"], owner=name)
        graph = own(graph, client, ttl=spec.get("ttl", 30.0), wait=spec.get("wait", 0.0))
    config = {"configurable": {"thread_id": spec["thread"]}}
    message = spec.get("message")
    try:
        out = graph.invoke(None if message is None else {"messages": [("user", message)]}, config)
    except leasehold.Error as err:
        return {"name": name, "status": type(err).__name__, "detail": str(err)}
    except lg_agent.ProviderError as err:
        return {"name": name, "status": "ProviderError", "detail": str(err)}
    return {"name": name, "status": "ok", "detail": [str(m.content) for m in out["messages"]]}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
