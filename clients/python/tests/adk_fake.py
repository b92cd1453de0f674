"""A fake model for the Google ADK tests: refuses a request whose function
call has no response (the provider's rule), asks for one tool call per user
message, then answers in text."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types


class ProviderError(Exception):
    """What the provider answers a transcript it rejects (HTTP 400)."""


def check_pairing(contents: list[types.Content]) -> None:
    answered = {
        p.function_response.id
        for c in contents
        for p in c.parts or []
        if p.function_response is not None
    }
    for c in contents:
        for p in c.parts or []:
            if p.function_call is not None and p.function_call.id not in answered:
                raise ProviderError(f"No tool output found for function call {p.function_call.id}.")


class FakeLlm(BaseLlm):
    model: str = "fake-provider"
    ids: Any = None
    requests: Any = None

    def model_post_init(self, context: Any) -> None:
        self.ids = (
            iter(self.ids) if self.ids is not None else (f"call_{n}" for n in itertools.count(1))
        )
        self.requests = []

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = list(llm_request.contents)
        self.requests.append(contents)
        check_pairing(contents)
        last = contents[-1].parts[-1] if contents and contents[-1].parts else None
        if last is not None and last.function_response is not None:
            text = f"done: {last.function_response.response}"
            part = types.Part(text=text)
        else:
            cmd = last.text if last is not None else ""
            part = types.Part(
                function_call=types.FunctionCall(id=next(self.ids), name="shell", args={"cmd": cmd})
            )
        yield LlmResponse(content=types.Content(role="model", parts=[part]))
