"""What the Amplifier module hooks-leasehold adds to a session's turns,
against the same turns without it, in one process and one run of this
script (never pass/fail):

    LEASEHOLD_BIN=target/release/leasehold clients/python/.venv/bin/python bench/amplifier.py [runs]

Each run is a new ``AmplifierSession`` (amplifier-core's kernel) with the
test modules of clients/python/tests (loop-fake, provider-fake, tool-hold
not holding) and one of two contexts: ``context-shared`` (a SQLite file;
it fences its writes in its own transaction, so the module checks them
locally) and ``context-memory`` (a list in memory; the module gates each
write with a round trip). A turn is a tool call and an answer: two model
requests and four context writes. Sessions of 1 and of 5 turns give what a
session costs once (acquire, release) and what each further turn adds (the
slope). Alternates plain and owned sessions so that drift on a busy machine
hits both alike.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients" / "python" / "tests"))

from amplifier_core import AmplifierSession
from conftest import Server


class MemoryContext:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def add_message(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    async def set_messages(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)

    async def clear(self) -> None:
        self.messages = []

    async def get_messages(self) -> list[dict[str, Any]]:
        return list(self.messages)

    async def get_messages_for_request(
        self, token_budget: Any = None, provider: Any = None
    ) -> Any:
        return list(self.messages)


async def _mount_memory(coordinator: Any, config: dict[str, Any] | None = None) -> None:
    await coordinator.mount("context", MemoryContext())


# The kernel's loader imports amplifier_module_<id>: this one lives here.
_memory = types.ModuleType("amplifier_module_context_memory")
_memory.mount = _mount_memory  # type: ignore[attr-defined]
sys.modules[_memory.__name__] = _memory


def plan(tmp: Path, context: str, address: str | None, turns: int) -> dict[str, Any]:
    ctx: dict[str, Any] = {"module": context, "config": {"db": str(tmp / "context.db")}}
    p: dict[str, Any] = {
        "session": {"orchestrator": "loop-fake", "context": ctx},
        "providers": [
            {
                "module": "provider-fake",
                "config": {"ids": [f"call_{i}" for i in range(turns)]},
            }
        ],
        "tools": [
            {
                "module": "tool-hold",
                "config": {
                    "name": "b",
                    "marker": str(tmp / "m"),
                    "effects": str(tmp / "e.db"),
                },
            }
        ],
        "hooks": [],
    }
    if address:
        p["hooks"].append({"module": "hooks-leasehold", "config": {"address": address}})
    return p


async def session(p: dict[str, Any], sid: str, turns: int) -> None:
    async with AmplifierSession(p, session_id=sid) as s:
        for i in range(turns):
            out = await s.execute(f"cmd {i}")
            assert out.startswith("done"), out


async def bench(address: str, tmp: Path, runs: int) -> None:
    for context in ("context-shared", "context-memory"):
        p50: dict[tuple[str, int], float] = {}
        for turns in (1, 5):
            times: dict[str, list[float]] = {"plain": [], "owned": []}
            plans = {
                "plain": plan(tmp, context, None, turns),
                "owned": plan(tmp, context, address, turns),
            }
            for i in range(runs + 10):
                for name, p in plans.items():
                    start = time.perf_counter()
                    await session(p, f"{context}-{name}-{turns}-{i}", turns)
                    if i >= 10:  # warm-up
                        times[name].append(time.perf_counter() - start)
            for name, samples in times.items():
                p50[(name, turns)] = statistics.median(samples)
        print(f"{context}, p50 per session:")
        for (name, turns), v in p50.items():
            print(f"  {name:5} {turns} turn(s): {v * 1e3:7.2f} ms")
        once = p50[("owned", 1)] - p50[("plain", 1)]
        slope = {n: (p50[(n, 5)] - p50[(n, 1)]) / 4 for n in ("plain", "owned")}
        print(
            f"  added: per session (1 turn) {once * 1e3:.2f} ms; "
            f"per further turn {(slope['owned'] - slope['plain']) * 1e3:.2f} ms "
            f"(plain turn {slope['plain'] * 1e3:.2f} ms)"
        )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    # The test modules' own files (context, tool effects) in memory where
    # there is a tmpfs, so that their fsyncs do not drown what the module
    # adds; the server's database stays on disk (its fsyncs are the cost).
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory() as d,
        tempfile.TemporaryDirectory(dir=shm) as files,
    ):
        sync = os.environ.get("LEASEHOLD_BENCH_SYNC", "full")
        server = Server(Path(d) / "leasehold.db", extra=("--sync", sync))
        try:
            asyncio.run(bench(server.address, Path(files), runs))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
