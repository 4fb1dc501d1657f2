"""The OpenAI Agents SDK adapter, through the SDK's real Runner and tool-calling path (a scripted model)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


from conftest import require  # noqa: E402

require("agents", "openai-agents")

from agents import Agent, Runner  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.openai_agents import protected_function_tool  # noqa: E402
from scripted_model import ScriptedModel, Turn  # noqa: E402


@dataclass
class Conversation:
    """The application's run context: it mints the operation key for each refund it asks for."""

    tenant: str
    keys: dict[int, str] = field(default_factory=dict)

    def key_for(self, order_id: int) -> str:
        return self.keys.setdefault(order_id, f"refund-order-{order_id}")


def make(o: Once, effects: list[dict[str, Any]]) -> Any:
    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        effects.append({"order_id": order_id, "amount": amount})
        return {"refund_id": f"r-{len(effects)}", "order_id": order_id}

    return protected_function_tool(
        o, refund_order,
        key=lambda ctx, args: ctx.context.key_for(args["order_id"]),
        scope=lambda ctx: ctx.context.tenant,
    )


def twice(outputs: list[str]) -> Turn:
    """A model that asks for the same refund twice (a retry with a new tool_call_id), then answers."""
    if len(outputs) < 2:
        return [("refund_order", {"order_id": 1234, "amount": 200})]
    return f"done: {outputs}"


def test_a_model_retry_with_a_new_call_id_replays_and_the_key_is_the_applications() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []
    agent = Agent(name="refunds", instructions="refund", tools=[make(o, effects)], model=ScriptedModel(twice))
    ctx = Conversation("tenant-7")
    result = asyncio.run(Runner.run(agent, "refund order 1234", context=ctx))
    assert effects == [{"order_id": 1234, "amount": 200}]
    assert "r-1" in result.final_output and result.final_output.count("r-1") == 2
    view = o.inspect("tenant-7", "refund-order-1234")
    assert view is not None and view.key_source is once.KeySource.APPLICATION and view.replays == 1
    # A new run of the conversation (a restarted agent) replays too.
    asyncio.run(Runner.run(agent, "refund order 1234 again", context=ctx))
    assert len(effects) == 1


def test_without_an_application_key_it_is_derived_from_the_args_never_the_call_id() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        effects.append({"order_id": order_id})
        return {"ok": True}

    tool = protected_function_tool(o, refund_order, scope="t")
    agent = Agent(name="refunds", tools=[tool], model=ScriptedModel(twice))
    asyncio.run(Runner.run(agent, "go"))
    assert len(effects) == 1
    view = None
    for r in o.ledger.scan("operation", [], 1 << 62, None, 10):
        view = o.inspect(r.scope, r.key)
    assert view is not None and view.key_source is once.KeySource.DERIVED and not view.key.startswith("call-")


def test_a_tool_that_raises_is_unknown_and_the_model_is_told_so() -> None:
    o = Once.memory()
    calls: list[int] = []

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        calls.append(order_id)
        raise ConnectionResetError("the provider's reply was lost")

    tool = protected_function_tool(o, refund_order, key=lambda ctx, args: f"k-{args['order_id']}")
    agent = Agent(name="refunds", tools=[tool], model=ScriptedModel(twice))
    result = asyncio.run(Runner.run(agent, "go"))
    assert calls == [1234], "sent again while the outcome was unknown"
    assert "not done" in result.final_output and "effect unknown" in result.final_output
