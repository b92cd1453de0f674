"""A small agent runner for the two-graph regression: a session store in
SQLite, a fake model provider that refuses an unmatched tool call the way
the OpenAI Responses API does, and one turn of a graph (user message, a
tool call, its output, a final answer), guarded by leasehold or not.

Worker processes run :func:`run_graph`; the test reads the store.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import leasehold
from leasehold.fence import StaleFence
from leasehold.fence import sqlite as fence_sqlite

SESSION = "session:42"


class ProviderRejected(Exception):
    """The fake provider refused the request, with the provider's words."""


def open_store(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=20)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS items ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT, graph TEXT, fence INTEGER, body TEXT)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS provider_log (graph TEXT, error TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (graph TEXT, call_id TEXT)")
    fence_sqlite.install(conn)
    conn.commit()
    return conn


def history(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    return [json.loads(row[0]) for row in conn.execute("SELECT body FROM items ORDER BY seq")]


def append(conn: sqlite3.Connection, graph: str, item: dict[str, Any], fence: int | None) -> None:
    """Appends to the session; fenced when the graph holds a lease."""
    row = (graph, fence, json.dumps(item))
    if fence is None:
        conn.execute("INSERT INTO items (graph, fence, body) VALUES (?, ?, ?)", row)
        conn.commit()
        return
    with fence_sqlite.write(conn, SESSION, fence):
        conn.execute("INSERT INTO items (graph, fence, body) VALUES (?, ?, ?)", row)


def provider(conn: sqlite3.Connection, graph: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The fake model: refuses history holding a function_call without its
    output; otherwise calls a tool after a user message and answers after a
    tool output. Every request is logged with its refusal, if any."""
    answered = {i["call_id"] for i in items if i["type"] == "function_call_output"}
    for item in items:
        if item["type"] == "function_call" and item["call_id"] not in answered:
            error = f"No tool output found for function call {item['call_id']}."
            conn.execute("INSERT INTO provider_log VALUES (?, ?)", (graph, error))
            conn.commit()
            raise ProviderRejected(error)
    conn.execute("INSERT INTO provider_log VALUES (?, '')", (graph,))
    conn.commit()
    if items and items[-1]["type"] == "message" and items[-1]["role"] == "user":
        return {
            "type": "function_call",
            "call_id": f"call_{graph}",
            "name": "shell",
            "arguments": "{}",
        }
    return {"type": "message", "role": "assistant", "content": f"{graph}: done"}


def _turn(spec: dict[str, Any], in_tool: Event, gated: Event | None) -> dict[str, Any]:
    graph: str = spec["graph"]
    conn = open_store(spec["db"])
    lease: leasehold.Lease | None = None
    if spec.get("address"):
        client = leasehold.Client(spec["address"])
        lease = client.acquire(SESSION, ttl=spec["ttl"], wait=spec.get("wait", 0.0), owner=graph)
    fence = lease.fence if lease else None
    report: dict[str, Any] = {"fence": fence}

    def tool(invocation: leasehold.ToolInvocation) -> str:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (graph, invocation.call.call_id))
        conn.commit()
        time.sleep(spec["tool_seconds"])
        return f"output of {invocation.call.call_id}"

    if lease is not None:
        report["recovered"] = lease.recovered
        report["previous_end"] = lease.previous.end if lease.previous else None
        # A recoverer answers the calls its predecessor left open, from the
        # ledger where the call already ran (never running a tool twice).
        items = history(conn)
        answered = {i["call_id"] for i in items if i["type"] == "function_call_output"}
        open_calls = [
            leasehold.ToolCallRequest(i["call_id"], i["name"])
            for i in items
            if i["type"] == "function_call" and i["call_id"] not in answered
        ]
        if open_calls:
            results = lease.run_tool_calls(open_calls, tool)
            report["recovered_calls"] = [(r.call_id, r.state, r.reused) for r in results]
            for r in results:
                output = r.result.decode() if r.state in ("succeeded", "failed") else "interrupted"
                lease.gate()
                append(
                    conn,
                    graph,
                    {"type": "function_call_output", "call_id": r.call_id, "output": output},
                    fence,
                )

    append(conn, graph, {"type": "message", "role": "user", "content": f"{graph}: please"}, fence)
    if lease is not None:
        lease.gate()
    call = provider(conn, graph, history(conn))
    append(conn, graph, call, fence)
    in_tool.set()
    request = leasehold.ToolCallRequest(call["call_id"], call["name"])
    if lease is not None:
        result = lease.run_tool_calls([request], tool)[0].result.decode()
    else:
        result = tool(leasehold.ToolInvocation(request, 0, ""))
    if lease is not None:
        lease.gate()
        if gated is not None:
            # Stall between the gate and the terminal write, as in a GC
            # pause; the test resumes us after the lease has moved on.
            gated.set()
            os.kill(os.getpid(), signal.SIGSTOP)
    append(
        conn,
        graph,
        {"type": "function_call_output", "call_id": call["call_id"], "output": result},
        fence,
    )
    if lease is not None:
        lease.gate()
    answer = provider(conn, graph, history(conn))
    append(conn, graph, answer, fence)
    if lease is not None:
        lease.release()
    return report


def run_graph(
    spec: dict[str, Any], in_tool: Event, gated: Event | None, results: Queue[Any]
) -> None:
    """One graph's turn in its own process; reports how it ended on ``results``."""
    graph = spec["graph"]
    try:
        results.put((graph, "ok", _turn(spec, in_tool, gated)))
    except ProviderRejected as err:
        results.put((graph, "rejected", str(err)))
    except StaleFence as err:
        results.put((graph, "stale", {"fence": err.fence, "highest": err.highest}))
    except leasehold.Error as err:
        results.put((graph, type(err).__name__, str(err)))
    except Exception as err:
        results.put((graph, "crashed", repr(err)))
