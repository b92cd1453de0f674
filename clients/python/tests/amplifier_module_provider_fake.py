"""Amplifier module ``provider-fake``: a scripted model that checks the
history it is sent the way the OpenAI Responses API does, and refuses an
unmatched call with that API's own message (HTTP 400). A user prompt gets
a ``shell`` call (the next id of ``ids``); a tool result gets an answer.
Every request is logged (worker, verdict) in the ``requests`` table of
``log``."""

from __future__ import annotations

import sqlite3
from typing import Any

from amplifier_core import ModuleCoordinator
from amplifier_core.llm_errors import InvalidRequestError
from amplifier_core.message_models import ChatRequest, ChatResponse, TextBlock, ToolCall

__amplifier_module_type__ = "provider"


async def mount(coordinator: ModuleCoordinator, config: dict[str, Any] | None = None) -> None:
    await coordinator.mount("providers", FakeProvider(config or {}), name="fake")


def pairing_error(messages: list[dict[str, Any]]) -> str | None:
    """The provider's refusal for this history, or None."""
    waiting: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            if m.get("tool_call_id") not in waiting:
                call_id = m.get("tool_call_id")
                return f"No tool call found for function call output with call_id {call_id}."
            waiting.remove(m["tool_call_id"])
            continue
        if waiting:
            return f"No tool output found for function call {waiting[0]}."
        waiting = [c["id"] for c in m.get("tool_calls") or []]
    if waiting:
        return f"No tool output found for function call {waiting[0]}."
    return None


def requests(log: str) -> list[tuple[str, str]]:
    """The logged requests: (worker, "ok" or the refusal)."""
    conn = sqlite3.connect(log, timeout=30)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS requests (worker TEXT, verdict TEXT)")
        return [(r[0], r[1]) for r in conn.execute("SELECT worker, verdict FROM requests")]
    finally:
        conn.close()


class FakeProvider:
    name = "fake"

    def __init__(self, config: dict[str, Any]) -> None:
        self.worker = config.get("worker", "")
        self.ids = list(config.get("ids") or ["call_1"])
        self.log = config.get("log")

    def _record(self, verdict: str) -> None:
        if self.log:
            conn = sqlite3.connect(self.log, timeout=30, isolation_level=None)
            conn.execute("CREATE TABLE IF NOT EXISTS requests (worker TEXT, verdict TEXT)")
            conn.execute("INSERT INTO requests VALUES (?, ?)", (self.worker, verdict))
            conn.close()

    async def complete(self, request: ChatRequest, **kwargs: Any) -> ChatResponse:
        messages = [m.model_dump() for m in request.messages]
        error = pairing_error(messages)
        self._record(error or "ok")
        if error:
            raise InvalidRequestError(error, provider="fake", status_code=400)
        last = messages[-1]
        if last["role"] == "tool":
            return ChatResponse(content=[TextBlock(text=f"done: {last['content']}")])
        call = ToolCall(id=self.ids.pop(0), name="shell", arguments={"cmd": last["content"]})
        return ChatResponse(content=[TextBlock(text="")], tool_calls=[call])

    def parse_tool_calls(self, response: ChatResponse) -> list[ToolCall]:
        return response.tool_calls or []
