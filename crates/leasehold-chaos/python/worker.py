"""A chaos worker on the Python client (``clients/python``).

Run by the harness (``leasehold-chaos``), never by hand: it holds hot keys
through ``leasehold.Client.acquire`` (renewal in the background, ``gate()``
before every write), and writes one JSON line per operation on stdout, in
the harness's ``Line`` format, timed with ``time.monotonic_ns()`` (Linux
``CLOCK_MONOTONIC``, the harness's clock) less the harness's origin. Store
writes go to the harness the same way.

    python worker.py URL WORKER_ID ORIGIN_NS SECONDS TTL_MS KEYS SEED
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from typing import Any

import leasehold

CODES = {
    "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
SERVER_REASONS = {"expired", "released", "suspended", "superseded", "unknown"}


def main() -> None:
    url, worker, origin, seconds, ttl_ms, keys, seed = sys.argv[1:8]
    worker_id, origin_ns = int(worker), int(origin)
    ttl = int(ttl_ms) / 1000.0
    key_names = [f"chaos:{k}" for k in range(int(keys))]
    rng = random.Random(int(seed) * 1000 + worker_id)
    until = time.monotonic() + float(seconds)
    client = leasehold.Client(url.removeprefix("http://"), timeout=1.5)

    def now() -> int:
        return max(0, time.monotonic_ns() - origin_ns)

    def emit(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    def op(key: str, call: Any, invoked: int, outcome: Any) -> None:
        emit({"Op": {"worker": worker_id, "key": key, "call": call, "invoked": invoked,
                     "completed": now(), "outcome": outcome}})

    def failure(err: BaseException) -> Any:
        # Statuses the server sent, as statuses; the client's own verdicts
        # (a lost lease it decided on locally, a timeout) as unknown.
        if isinstance(err, leasehold.Busy):
            return {"Err": {"code": 10, "reason": None, "fence": err.fence, "message": err.message}}
        if isinstance(err, leasehold.LeaseLost) or not isinstance(err, leasehold.Error):
            return {"Unknown": f"{type(err).__name__}: {err}"}
        code = CODES.get(err.code)
        if code is None:
            return {"Unknown": f"{type(err).__name__}: {err}"}
        return {"Err": {"code": code, "reason": None, "fence": None, "message": err.message}}

    while time.monotonic() < until:
        key = rng.choice(key_names)
        wait_ms = rng.choice([0, int(ttl_ms) // 2, int(ttl_ms) * 2])
        request_id = str(uuid.uuid4())
        call = {"Acquire": {"owner": f"py-{worker_id}", "request_id": request_id,
                            "ttl_ms": int(ttl_ms), "wait_ms": wait_ms}}
        invoked = now()
        try:
            lease = client.acquire(key, ttl=ttl, wait=wait_ms / 1000.0, owner=f"py-{worker_id}",
                                   request_id=request_id, safety_margin=ttl / 5)
        except Exception as err:  # noqa: BLE001 - every outcome is recorded
            op(key, call, invoked, failure(err))
            time.sleep(rng.uniform(0.01, 0.1))
            continue
        fence = lease.fence
        op(key, call, invoked, {"Ok": {"Granted": {"fence": fence, "ttl_ms": int(lease.ttl * 1000),
                                                   "replayed": lease.replayed}}})
        end = time.monotonic() + rng.uniform(ttl * 0.2, ttl * 2)
        while time.monotonic() < end:
            invoked = now()
            try:
                lease.gate()
            except Exception as err:  # noqa: BLE001
                op(key, {"Check": {"fence": fence}}, invoked, {"Unknown": f"gate: {err}"})
                if isinstance(err, leasehold.LeaseLost) and err.final:
                    break
            else:
                op(key, {"Check": {"fence": fence}}, invoked, {"Ok": "Live"})
                emit({"Write": {"worker": worker_id, "key": key, "fence": fence}})
            time.sleep(ttl / 6)
        # Always released explicitly: a release the checker cannot see
        # must not end a term.
        suspend = rng.random() < 0.1
        invoked = now()
        call = {"Release": {"fence": fence, "suspend": suspend}}
        try:
            lease.suspend() if suspend else lease.release()
        except Exception as err:  # noqa: BLE001
            op(key, call, invoked, failure(err))
        else:
            op(key, call, invoked, {"Ok": "Released"})
    client.close()


if __name__ == "__main__":
    main()
