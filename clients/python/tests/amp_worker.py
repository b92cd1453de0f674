"""One Amplifier process for test_amplifier.py: an ``AmplifierSession``
(amplifier-core's kernel) mounting loop-fake, context-shared, provider-fake
and tool-hold, with or without hooks-leasehold, runs one turn of session
``s1`` and prints how it ended as one JSON line.

    python amp_worker.py '{"name": ..., "db": ..., "effects": ..., "marker": ..., ...}'
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from amplifier_core import AmplifierSession


def mount_plan(spec: dict[str, Any]) -> dict[str, Any]:
    name = spec["name"]
    plan: dict[str, Any] = {
        "session": {
            "orchestrator": "loop-fake",
            "context": {"module": "context-shared", "config": {"db": spec["db"]}},
        },
        "providers": [
            {
                "module": "provider-fake",
                "config": {
                    "worker": name,
                    "ids": spec.get("ids") or [f"call_{name}"],
                    "log": spec["effects"],
                },
            }
        ],
        "tools": [
            {
                "module": "tool-hold",
                "config": {
                    "name": name,
                    "marker": spec["marker"],
                    "hold": spec.get("hold"),
                    "effects": spec["effects"],
                },
            }
        ],
        "hooks": [],
    }
    if spec.get("addr"):
        # The one line a user adds (here with the test's server and timings).
        plan["hooks"].append(
            {
                "module": "hooks-leasehold",
                "config": {
                    "address": spec["addr"],
                    "ttl": spec.get("ttl", 30.0),
                    "wait": spec.get("wait", 0.0),
                    "owner": name,
                },
            }
        )
    return plan


async def turn(spec: dict[str, Any]) -> dict[str, Any]:
    session = AmplifierSession(mount_plan(spec), session_id="s1", is_resumed=True)
    async with session:
        out = await session.execute(spec["message"])
        owner = session.coordinator.get_capability("leasehold.session")
        repaired = [] if owner is None or owner.repair is None else owner.repair.actions
    status = "denied" if out.startswith("Operation denied") else "ok"
    return {"status": status, "detail": out, "repaired": repaired}


def main(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        result = asyncio.run(turn(spec))
    except Exception as err:
        result = {"status": type(err).__name__, "detail": str(err)[:300], "repaired": []}
    return {"name": spec["name"], **result}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1])), default=str), flush=True)
