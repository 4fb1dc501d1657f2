"""The LangChain adapter on real langchain-core tools, and LangGraph nodes re-run by RetryPolicy or from a checkpoint."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

from conftest import require  # noqa: E402

require("langgraph", "langchain")

from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.langchain import protect_tool  # noqa: E402


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
    safe = protect_tool(o, refund_tool(effects))
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
    safe = protect_tool(o, refund_tool(effects))

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


def test_an_unknown_outcome_raises_unconfirmed_and_is_not_resent() -> None:
    o = Once.memory()
    calls: list[int] = []

    @tool
    def refund_order(order_id: int) -> str:
        """Refund an order."""
        calls.append(order_id)
        raise TimeoutError("no answer")

    safe = protect_tool(o, refund_order, key=lambda args, config: "k-1")
    for _ in range(2):
        with pytest.raises(once.Unconfirmed) as info:
            safe.invoke({"order_id": 1})
        assert isinstance(info.value.called.ending, once.Unknown)
    assert calls == [1]
