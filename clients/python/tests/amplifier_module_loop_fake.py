"""Amplifier module ``loop-fake``: a small orchestrator for the tests, with
the event protocol of Microsoft's ``loop-basic`` (prompt:submit before the
prompt is written, provider:request before each model request, tool:pre and
tool:post around each tool, orchestrator:complete at the end; a denied
prompt:submit or provider:request ends the turn with "Operation denied:
<reason>") and its message layout in the context (assistant ``tool_calls``
of ``{id, tool, arguments}``, then one ``role: tool`` message per call).
Tools run one after another."""

from __future__ import annotations

from typing import Any

from amplifier_core import ModuleCoordinator
from amplifier_core.events import (
    ORCHESTRATOR_COMPLETE,
    PROMPT_SUBMIT,
    PROVIDER_ERROR,
    PROVIDER_REQUEST,
    PROVIDER_RESPONSE,
    TOOL_POST,
    TOOL_PRE,
)
from amplifier_core.message_models import ChatRequest, Message, ToolSpec

__amplifier_module_type__ = "orchestrator"


async def mount(coordinator: ModuleCoordinator, config: dict[str, Any] | None = None) -> None:
    await coordinator.mount("orchestrator", FakeLoop(config or {}))


class FakeLoop:
    def __init__(self, config: dict[str, Any]) -> None:
        self.max_iterations = int(config.get("max_iterations", 8))

    async def execute(
        self,
        prompt: str,
        context: Any,
        providers: dict[str, Any],
        tools: dict[str, Any],
        hooks: Any,
        coordinator: Any = None,
        **kwargs: Any,
    ) -> str:
        result = await hooks.emit(PROMPT_SUBMIT, {"prompt": prompt})
        result = await coordinator.process_hook_result(result, PROMPT_SUBMIT, "orchestrator")
        if result.action == "deny":
            return f"Operation denied: {result.reason}"
        await context.add_message({"role": "user", "content": prompt})
        name, provider = next(iter(providers.items()))
        for iteration in range(self.max_iterations):
            result = await hooks.emit(PROVIDER_REQUEST, {"provider": name, "iteration": iteration})
            result = await coordinator.process_hook_result(result, PROVIDER_REQUEST, "orchestrator")
            if result.action == "deny":
                return f"Operation denied: {result.reason}"
            dicts = await context.get_messages_for_request(provider=provider)
            request = ChatRequest(
                messages=[Message(**m) for m in dicts],
                tools=[
                    ToolSpec(name=t.name, description=t.description, parameters=t.input_schema)
                    for t in tools.values()
                ],
            )
            try:
                response = await provider.complete(request)
            except Exception as err:
                await hooks.emit(
                    PROVIDER_ERROR,
                    {"provider": name, "error": {"type": type(err).__name__, "msg": str(err)}},
                )
                raise
            await hooks.emit(
                PROVIDER_RESPONSE, {"provider": name, "tool_calls": bool(response.tool_calls)}
            )
            if response.tool_calls:
                calls = [
                    {"id": tc.id, "tool": tc.name, "arguments": tc.arguments}
                    for tc in response.tool_calls
                ]
                await context.add_message({"role": "assistant", "content": "", "tool_calls": calls})
                for tc in response.tool_calls:
                    pre = await hooks.emit(
                        TOOL_PRE, {"tool_name": tc.name, "tool_input": tc.arguments}
                    )
                    pre = await coordinator.process_hook_result(pre, TOOL_PRE, tc.name)
                    if pre.action == "deny":
                        content = f"Denied by hook: {pre.reason}"
                    else:
                        out = await tools[tc.name].execute(tc.arguments)
                        await hooks.emit(
                            TOOL_POST,
                            {
                                "tool_name": tc.name,
                                "tool_input": tc.arguments,
                                "result": out.model_dump(),
                            },
                        )
                        content = out.get_serialized_output()
                    await context.add_message(
                        {"role": "tool", "tool_call_id": tc.id, "content": content}
                    )
                continue
            text = "".join(b.text for b in response.content if b.type == "text")
            await context.add_message({"role": "assistant", "content": text})
            await hooks.emit(
                ORCHESTRATOR_COMPLETE,
                {"orchestrator": "loop-fake", "turn_count": iteration, "status": "success"},
            )
            return text
        return ""
