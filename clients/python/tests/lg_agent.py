"""A small LangGraph agent for the adapter's tests: a model that answers the
way a provider does (refusing an unmatched tool call with the provider's
words), a slow tool and a fast one, on a real checkpointer."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition


class ProviderError(Exception):
    """What the provider answers a transcript it rejects (HTTP 400)."""


def check_pairing(messages: Sequence[BaseMessage]) -> None:
    """OpenAI's rule: every function call is answered by exactly one
    function_call_output before the next model turn."""
    for i, msg in enumerate(messages):
        if not isinstance(msg, AIMessage) or not msg.tool_calls:
            continue
        answered: dict[str, int] = {}
        for later in messages[i + 1 :]:
            if not isinstance(later, ToolMessage):
                break
            answered[later.tool_call_id] = answered.get(later.tool_call_id, 0) + 1
        for call in msg.tool_calls:
            if answered.get(call["id"], 0) == 0:
                raise ProviderError(f"No tool output found for function call {call['id']}.")
            if answered[call["id"]] > 1:
                raise ProviderError(f"Duplicate tool output for function call {call['id']}.")


class ProviderModel(BaseChatModel):
    """Asks for one tool call per user message, then answers in text.

    ``tool`` names the tool to call, ``ids`` the call ids to use in turn
    (a model that reuses ids is one script away)."""

    tool: str = "shell"
    #: Tool calls per user message before the answer (one at a time).
    rounds: int = 1
    ids: Any = None
    requests: Any = None

    def model_post_init(self, context: Any) -> None:
        if self.ids is None:
            counter = itertools.count(1)
            self.ids = (f"call_{n}" for n in counter)
        else:
            self.ids = iter(self.ids)
        self.requests = []

    @property
    def _llm_type(self) -> str:
        return "fake-provider"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ProviderModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: Any = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests.append(list(messages))
        check_pairing(messages)
        last = messages[-1]
        since_user = 0
        for msg in reversed(messages):
            if isinstance(msg, HumanMessage):
                break
            since_user += isinstance(msg, ToolMessage)
        if isinstance(last, HumanMessage) or since_user < self.rounds:
            cmd = next(str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage))
            call = {"id": next(self.ids), "name": self.tool, "args": {"cmd": cmd}}
            reply = AIMessage("", tool_calls=[call])
        else:
            reply = AIMessage(f"done: {last.content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


class Tools:
    """The agent's tools; ``effects`` records every real run of a tool body
    (the side effect a duplicate call would repeat)."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str]] = []
        self.in_shell = threading.Event()
        self.release_shell = threading.Event()
        self.release_shell.set()
        self.lock = threading.Lock()

        @tool
        def shell(cmd: str) -> str:
            """Runs a shell command (slowly)."""
            self.in_shell.set()
            self.release_shell.wait(30)
            with self.lock:
                self.effects.append(("shell", cmd))
            return f"ran {cmd}"

        @tool
        def read(cmd: str) -> str:
            """Reads a file."""
            with self.lock:
                self.effects.append(("read", cmd))
            return f"read {cmd}"

        self.all = [shell, read]


def build(model: BaseChatModel, tool_node: Any) -> StateGraph:
    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tool_node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder
