"""A fake Responses model for the OpenAI Agents SDK tests: it refuses an
input whose function call has no output, with the provider's words, asks
for one tool call per user message and then answers in text."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


class ProviderError(Exception):
    """What the provider answers a transcript it rejects (HTTP 400)."""


def check_pairing(items: list[Any]) -> None:
    outputs = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
    for item in items:
        if item.get("type") == "function_call" and item.get("call_id") not in outputs:
            raise ProviderError(f"No tool output found for function call {item['call_id']}.")


class FakeModel(Model):
    def __init__(
        self, tool: str = "shell", ids: Iterator[str] | None = None, fail: bool = False
    ) -> None:
        self.tool = tool
        self.fail = fail
        self.ids = ids if ids is not None else (f"call_{n}" for n in itertools.count(1))
        self.requests: list[list[Any]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.requests.append(items)
        check_pairing(items)
        if self.fail:
            raise ProviderError("The server had an error while processing your request.")
        last = items[-1]
        if last.get("type") == "function_call_output":
            text = f"done: {last['output']}"
            out: Any = ResponseOutputMessage(
                id=f"msg_{len(self.requests)}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        else:
            content = last.get("content")
            cmd = content if isinstance(content, str) else str(content)
            out = ResponseFunctionToolCall(
                type="function_call",
                call_id=next(self.ids),
                name=self.tool,
                arguments=f'{{"cmd": "{cmd}"}}',
                id=f"fc_{len(self.requests)}",
                status="completed",
            )
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError
