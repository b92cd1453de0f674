"""An earlier owner for the paused-writer tests (test_fence_paused.py): it
opens a fenced write, inserts its row, prints ``inside <pg backend pid>``,
then blocks until a line arrives on stdin (the test stops it with SIGSTOP
meanwhile), ends the write and prints ``ok`` or ``error <class> <reason>``.

    python fence_worker.py pg <url> <schema> <key> <fence> <body> <idle_timeout>
    python fence_worker.py sqlite <path> <key> <fence> <body> <timeout>
"""

from __future__ import annotations

import sqlite3
import sys

from leasehold.fence import postgres as pg_fence
from leasehold.fence import sqlite as sqlite_fence


def main(kind: str, *args: str) -> None:
    try:
        if kind == "pg":
            import psycopg

            url, schema, key, fence, body, idle = args
            with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
                with pg_fence.write(conn, key, int(fence), idle_timeout=float(idle)):
                    conn.execute("INSERT INTO items VALUES (%s, %s)", (key, body))
                    pid = conn.execute("SELECT pg_backend_pid()").fetchone()
                    print(f"inside {pid[0] if pid else 0}", flush=True)
                    sys.stdin.readline()
        else:
            path, key, fence, body, timeout = args
            db = sqlite3.connect(path)
            with sqlite_fence.write(db, key, int(fence), timeout=float(timeout)):
                db.execute("INSERT INTO items VALUES (?, ?)", (key, body))
                print("inside 0", flush=True)
                sys.stdin.readline()
            db.close()
        print("ok", flush=True)
    except Exception as err:
        print(f"error {type(err).__name__} {getattr(err, 'reason', '')} {err}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
