"""The LangChain adapter on real langchain-core tools, and LangGraph nodes re-run by RetryPolicy or from a checkpoint."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any, Callable, Optional, TypedDict, Union

import pytest

from conftest import require  # noqa: E402

require("langgraph", "langchain")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402
from pydantic import Field  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.langchain import protect_tool  # noqa: E402
from refund_table import RefundTable  # noqa: E402


def refund_tool(effects: list[dict[str, Any]]) -> Any:
    @tool
    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        effects.append({"order_id": order_id, "amount": amount})
        return {"refund_id": f"r-{len(effects)}"}

    return refund_order


def test_a_protected_tool_keeps_name_and_schema_and_replays() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []
    raw = refund_tool(effects)
    safe = protect_tool(o, raw, key=lambda args, config: f"refund-{args['order_id']}")
    assert safe.name == raw.name and safe.args == raw.args
    config = {"configurable": {"thread_id": "conv-1"}}
    assert safe.invoke({"order_id": 1, "amount": 5}, config) == {"refund_id": "r-1"}
    assert safe.invoke({"order_id": 1, "amount": 5}, config) == {"refund_id": "r-1"}
    assert asyncio.run(safe.ainvoke({"order_id": 1, "amount": 5}, config)) == {"refund_id": "r-1"}
    assert len(effects) == 1
    view = o.inspect("conv-1", "refund-1")
    assert view is not None and view.replays == 2


class State(TypedDict, total=False):
    order_id: int
    receipt: Any


def test_a_node_rerun_by_its_retry_policy_does_not_refund_twice() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []
    safe = protect_tool(o, refund_tool(effects), key=lambda args, config: f"refund-{args['order_id']}")
    crashes = [RuntimeError("the node failed after the refund")]

    def refund_node(state: State) -> State:
        receipt = safe.invoke({"order_id": state["order_id"], "amount": 200})
        if crashes:
            raise crashes.pop()
        return {"receipt": receipt}

    g = StateGraph(State)
    g.add_node("refund", refund_node, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01,
                                                               retry_on=RuntimeError))
    g.add_edge(START, "refund")
    g.add_edge("refund", END)
    out = g.compile().invoke({"order_id": 1234}, {"configurable": {"thread_id": "conv-2"}})
    assert out["receipt"] == {"refund_id": "r-1"}
    assert effects == [{"order_id": 1234, "amount": 200}]


def test_a_node_replayed_from_a_checkpoint_replays_the_receipt() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []
    safe = protect_tool(o, refund_tool(effects), derive_key_from=["/order_id", "/amount"])

    def plan(state: State) -> State:
        return {"order_id": state["order_id"]}

    def refund_node(state: State) -> State:
        return {"receipt": safe.invoke({"order_id": state["order_id"], "amount": 200})}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("refund", refund_node)
    g.add_edge(START, "plan")
    g.add_edge("plan", "refund")
    g.add_edge("refund", END)
    graph = g.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "conv-3"}}
    graph.invoke({"order_id": 1234}, config)
    # Time-travel to the checkpoint before `refund` ran, and run from there again.
    before = next(s for s in graph.get_state_history(config) if s.next == ("refund",))
    again = graph.invoke(None, before.config)
    assert again["receipt"] == {"refund_id": "r-1"}
    assert len(effects) == 1
    assert len([s for s in graph.get_state_history(config) if s.next == ("refund",)]) >= 1


def test_wrapping_without_a_key_is_refused_and_says_how_to_supply_one() -> None:
    o = Once.memory()
    raw = refund_tool([])
    with pytest.raises(once.InvalidRequest) as info:
        protect_tool(o, raw)
    assert "refund_order" in str(info.value) and "key=lambda args, config" in str(info.value)
    assert "derive_key_from=" in str(info.value)
    with pytest.raises(once.InvalidRequest, match="both key= and derive_key_from="):
        protect_tool(o, raw, key=lambda args, config: "k", derive_key_from=["/order_id"])
    with pytest.raises(once.InvalidRequest, match="effect_fields"):
        protect_tool(o, raw, derive_key_from=["/order_id"], policy=once.Policy(effect_fields=["/amount"]))


def test_a_key_that_returns_none_is_blocked_never_derived() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []
    safe = protect_tool(o, refund_tool(effects), key=lambda args, config: None, raise_unconfirmed=True)
    with pytest.raises(once.Unconfirmed) as info:
        safe.invoke({"order_id": 1, "amount": 5})
    ending = info.value.called.ending
    assert isinstance(ending, once.Blocked) and ending.reason is once.BlockReason.IDENTITY_REQUIRED
    assert effects == []


def test_derived_identity_keeps_the_policy_set_before() -> None:
    o = Once.memory(policies={"refund_order": once.Policy(attempt_budget=1)})
    protect_tool(o, refund_tool([]), derive_key_from=["/order_id"])
    plan = o.plan("refund_order").policy
    assert plan["attempt-budget"] == 1 and plan["identity"] == "derived" and plan["effect-fields"] == ["/order_id"]


def test_an_unknown_outcome_is_onces_text_by_default_and_is_not_resent() -> None:
    o = Once.memory()
    calls: list[int] = []

    @tool
    def refund_order(order_id: int) -> str:
        """Refund an order."""
        calls.append(order_id)
        raise TimeoutError("no answer")

    safe = protect_tool(o, refund_order, key=lambda args, config: "k-1")
    for _ in range(2):
        text = safe.invoke({"order_id": 1})
        assert isinstance(text, str) and text.startswith("refund_order default/k-1: unknown (")
        assert "effect unknown" in text
    # As a tool call (what ToolNode makes): an error ToolMessage carrying once's text.
    message = safe.invoke({"type": "tool_call", "name": "refund_order", "args": {"order_id": 1}, "id": "call-9"})
    assert message.status == "error" and message.content.startswith("refund_order default/k-1: unknown (")
    assert calls == [1]


def test_an_unknown_outcome_raises_unconfirmed_when_asked_and_is_not_resent() -> None:
    o = Once.memory()
    calls: list[int] = []

    @tool
    def refund_order(order_id: int) -> str:
        """Refund an order."""
        calls.append(order_id)
        raise TimeoutError("no answer")

    safe = protect_tool(o, refund_order, key=lambda args, config: "k-1", raise_unconfirmed=True)
    for _ in range(2):
        with pytest.raises(once.Unconfirmed) as info:
            safe.invoke({"order_id": 1})
        assert isinstance(info.value.called.ending, once.Unknown)
    assert calls == [1]


class ScriptedChatModel(BaseChatModel):
    """A chat model that plays `script`: each turn is a function of the messages so far (what the model reads),
    returning the tool calls to make (name, args) or the final text. No network."""

    script: Callable[[list[BaseMessage]], Union[str, list[tuple[str, dict[str, Any]]]]]
    inputs: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """The tools are the script's business: the model is returned as it is."""
        return self

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.inputs.append(list(messages))
        turn = self.script(messages)
        if isinstance(turn, str):
            message = AIMessage(content=turn)
        else:
            # A fresh call id per call, as a model mints them: never an operation key.
            message = AIMessage(content="", tool_calls=[
                {"name": name, "args": args, "id": f"call-{next(_ids)}", "type": "tool_call"} for name, args in turn])
        return ChatResult(generations=[ChatGeneration(message=message)])


_ids = itertools.count(1)


def tool_texts(messages: list[BaseMessage]) -> list[str]:
    """The tool outputs the model has read so far."""
    return [str(m.content) for m in messages if isinstance(m, ToolMessage)]


def fresh_request_id_after_unknown(messages: list[BaseMessage]) -> Union[str, list[tuple[str, dict[str, Any]]]]:
    """The peer vector model_generated_fresh_id_after_unknown: after an unknown outcome the model calls again with
    the same effect (order, amount) and a request id it mints afresh."""
    outputs = tool_texts(messages)
    if len(outputs) < 2:
        return [("refund_order", {"order_id": 1234, "amount": 300, "request_id": f"req-{len(outputs) + 1}"})]
    return "outputs: " + " | ".join(outputs)


# The prebuilt agent of langgraph (create_agent's home, the langchain package, is not a dependency of the extra).
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize("identity", ["application key", "derived from effect fields"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_prebuilt_agent_a_fresh_request_id_after_unknown_sends_nothing_and_the_run_goes_on(
        tmp_path: Path, identity: str, mode: str) -> None:
    provider = RefundTable(tmp_path / "provider.db", lose_replies=1)
    o = Once.sqlite(str(tmp_path / "once.db"))

    @tool
    def refund_order(order_id: int, amount: int, request_id: str) -> dict[str, Any]:
        """Refund an order (request_id: the caller's request id, not part of the effect)."""
        return provider.refund(order_id, amount, request_id)

    if identity == "application key":
        safe = protect_tool(o, refund_order, key=lambda args, config: f"refund-{args['order_id']}")
    else:
        safe = protect_tool(o, refund_order, derive_key_from=["/order_id", "/amount"])
    model = ScriptedChatModel(script=fresh_request_id_after_unknown)
    agent = create_react_agent(model, [safe])
    request = {"messages": [("user", "refund order 1234")]}
    config = {"configurable": {"thread_id": "conv-9"}}
    out = agent.invoke(request, config) if mode == "sync" else asyncio.run(agent.ainvoke(request, config))
    assert provider.count() == 1, "the model's fresh request id made a second refund"
    # The model read once's own account after the unknown outcome, and the run went on to its answer.
    first, second = tool_texts(model.inputs[1])[0], tool_texts(model.inputs[2])[1]
    assert first.startswith("refund_order conv-9/") and ": unknown (" in first and "effect unknown" in first
    if identity == "application key":
        assert ": conflict;" in second  # same key, another payload: denied, nothing sent
    else:
        assert ": unknown (" in second  # same derived key: still unknown, nothing sent
    assert out["messages"][-1].content == f"outputs: {first} | {second}"


def test_wrapping_keeps_the_tools_descriptor() -> None:
    o = Once.memory()
    descriptor = once.ToolDescriptor("refund_order", '{"type":"object"}')
    o.policy("refund_order", once.Policy(attempt_budget=2), descriptor=descriptor)
    pinned = o.plan("refund_order")
    protect_tool(o, refund_tool([]), key=lambda args, config: "k")
    assert o._descriptor("refund_order") == descriptor
    assert o.plan("refund_order").policy["attempt-budget"] == 2 and pinned.blocked == o.plan("refund_order").blocked


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_prebuilt_agent_a_call_in_flight_elsewhere_is_onces_text_and_the_run_goes_on(tmp_path: Path, mode: str) -> None:
    # Another attempt (a thread of this process) holds the operation while the model calls the tool: the model reads
    # once's in-flight account (before, the run aborted with Unconfirmed), nothing is sent twice, the run goes on.
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"), wait=0)
    with provider.held_elsewhere(o, "conv-9", "refund-1234", 1234, 300):

        @tool
        def refund_order(order_id: int, amount: int) -> dict[str, Any]:
            """Refund an order."""
            return provider.refund(order_id, amount)

        safe = protect_tool(o, refund_order, key=lambda args, config: f"refund-{args['order_id']}")

        def script(messages: list[BaseMessage]) -> Union[str, list[tuple[str, dict[str, Any]]]]:
            outputs = tool_texts(messages)
            if outputs:
                return "outputs: " + " | ".join(outputs)
            return [("refund_order", {"order_id": 1234, "amount": 300})]

        agent = create_react_agent(ScriptedChatModel(script=script), [safe])
        request = {"messages": [("user", "refund order 1234")]}
        config = {"configurable": {"thread_id": "conv-9"}}
        out = agent.invoke(request, config) if mode == "sync" else asyncio.run(agent.ainvoke(request, config))
        assert provider.count() == 0, "sent while another attempt held the operation"
    assert provider.count() == 1
    assert out["messages"][-1].content == (
        "outputs: refund_order conv-9/refund-1234: inflight; effect unknown; the same call again waits")
