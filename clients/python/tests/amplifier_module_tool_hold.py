"""Amplifier module ``tool-hold``: a ``shell`` tool that marks that it is
running (``marker``), stays running until ``hold`` exists (at most 30 s),
then records its effect (worker, command) in ``effects``."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any, ClassVar

from amplifier_core import ModuleCoordinator, ToolResult

__amplifier_module_type__ = "tool"


async def mount(coordinator: ModuleCoordinator, config: dict[str, Any] | None = None) -> None:
    await coordinator.mount("tools", HoldTool(config or {}), name="shell")


class HoldTool:
    name = "shell"
    description = "Runs a shell command."
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
    }

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        cfg = self.config
        Path(cfg["marker"]).write_text("in shell")
        hold = cfg.get("hold")
        deadline = time.monotonic() + 30
        while hold and not Path(hold).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        conn = sqlite3.connect(cfg["effects"], timeout=30, isolation_level=None)
        conn.execute("CREATE TABLE IF NOT EXISTS effects (worker TEXT, tool TEXT, cmd TEXT)")
        conn.execute("INSERT INTO effects VALUES (?, 'shell', ?)", (cfg["name"], input["cmd"]))
        conn.close()
        return ToolResult(success=True, output=f"{cfg['name']} ran {input['cmd']}")
