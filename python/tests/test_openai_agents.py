"""The OpenAI Agents SDK adapter, through the SDK's real Runner and tool-calling path (a scripted model)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest


from conftest import require  # noqa: E402

require("agents", "openai-agents")

from agents import Agent, Runner, default_tool_error_function  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.openai_agents import protected_function_tool  # noqa: E402
from refund_table import RefundTable  # noqa: E402
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


def test_wrapping_without_a_key_is_refused_and_says_how_to_supply_one() -> None:
    o = Once.memory()

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        return {}

    with pytest.raises(once.InvalidRequest) as info:
        protected_function_tool(o, refund_order, scope="t")
    assert "refund_order" in str(info.value) and "key=lambda ctx, args" in str(info.value)
    assert "derive_key_from=" in str(info.value)
    with pytest.raises(once.InvalidRequest, match="both key= and derive_key_from="):
        protected_function_tool(o, refund_order, key=lambda ctx, args: "k", derive_key_from=["/order_id"])
    with pytest.raises(once.InvalidRequest, match="list of JSON pointers"):
        protected_function_tool(o, refund_order, derive_key_from="/order_id")
    with pytest.raises(once.InvalidPolicy):
        protected_function_tool(o, refund_order, derive_key_from=["order_id"])  # not a JSON pointer


def test_derived_identity_is_an_opt_in_over_the_named_effect_fields_never_the_call_id() -> None:
    o = Once.memory()
    effects: list[dict[str, Any]] = []

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        effects.append({"order_id": order_id})
        return {"ok": True}

    tool = protected_function_tool(o, refund_order, scope="t", derive_key_from=["/order_id", "/amount"])
    plan = o.plan("refund_order")
    assert plan.policy["identity"] == "derived" and plan.policy["effect-fields"] == ["/order_id", "/amount"]
    agent = Agent(name="refunds", tools=[tool], model=ScriptedModel(twice))
    asyncio.run(Runner.run(agent, "go"))
    assert len(effects) == 1
    views = [o.inspect(r.scope, r.key) for r in o.ledger.scan("operation", [], 1 << 62, None, 10)]
    assert len(views) == 1
    view = views[0]
    assert view is not None and view.key_source is once.KeySource.DERIVED and view.key.startswith("derived:")


def fresh_request_id_after_unknown(outputs: list[str]) -> Turn:
    """The peer vector model_generated_fresh_id_after_unknown: after an unknown outcome the model calls again with
    the same effect (order, amount) and a request id it mints afresh."""
    if len(outputs) < 2:
        return [("refund_order", {"order_id": 1234, "amount": 300, "request_id": f"req-{len(outputs) + 1}"})]
    return "outputs: " + " | ".join(outputs)


@pytest.mark.parametrize("identity", ["application key", "derived from effect fields"])
def test_a_fresh_request_id_after_an_unknown_outcome_sends_nothing(tmp_path: Path, identity: str) -> None:
    provider = RefundTable(tmp_path / "provider.db", lose_replies=1)
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int, request_id: str) -> dict[str, Any]:
        """Refund an order (request_id: the caller's request id, not part of the effect)."""
        return provider.refund(order_id, amount, request_id)

    if identity == "application key":
        tool = protected_function_tool(o, refund_order, key=lambda ctx, args: f"refund-{args['order_id']}")
    else:
        tool = protected_function_tool(o, refund_order, derive_key_from=["/order_id", "/amount"])
    seen: list[list[str]] = []

    def script(outputs: list[str]) -> Turn:
        seen.append(list(outputs))
        return fresh_request_id_after_unknown(outputs)

    result = asyncio.run(Runner.run(Agent(name="refunds", tools=[tool], model=ScriptedModel(script)), "refund"))
    assert provider.count() == 1, "the model's fresh request id made a second refund"
    first, second = seen[-1]
    # The model reads once's own account, and the run went on to the model's answer.
    assert first.startswith("refund_order default/") and ": unknown (" in first and "effect unknown" in first
    assert "not done" not in first
    if identity == "application key":
        assert ": conflict;" in second  # same key, another payload: denied, nothing sent
    else:
        assert ": unknown (" in second  # same derived key: still unknown, nothing sent
    assert result.final_output == f"outputs: {first} | {second}"


def amount_then(corrected: Any, first: Any) -> Callable[[list[str]], Turn]:
    """A model whose first call the SDK rejects (`first`), then the corrected call, then its answer."""

    def script(outputs: list[str]) -> Turn:
        if not outputs:
            return [("refund_order", first)]
        if len(outputs) == 1:
            return [("refund_order", corrected)]
        return "outputs: " + " | ".join(outputs)

    return script


@pytest.mark.parametrize("first", [
    {"order_id": 1234, "amount": "300 EUR"},  # schema-invalid
    '{"order_id": 1234, "amount": ',  # malformed JSON
    '[1234, 300]',  # JSON, not an object
], ids=["schema-invalid", "malformed-json", "not-an-object"])
def test_arguments_the_sdk_rejects_begin_nothing_and_the_model_may_call_again(tmp_path: Path, first: Any) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        return provider.refund(order_id, amount)

    tool = protected_function_tool(o, refund_order, key=lambda ctx, args: f"refund-{args['order_id']}")
    script = amount_then({"order_id": 1234, "amount": 300}, first)
    result = asyncio.run(Runner.run(Agent(name="refunds", tools=[tool], model=ScriptedModel(script)), "refund"))
    assert provider.amounts() == [300]
    view = o.inspect("default", "refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    assert [e.kind for e in view.audit].count("unknown") == 0
    # The SDK's usual text for arguments it rejects, exactly as a plain function_tool gives it.
    assert result.final_output.startswith(f"outputs: {default_tool_error_function(None, Exception())} | ")  # type: ignore[arg-type]


def test_arguments_are_recorded_as_validated_so_a_coerced_retry_replays(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        return provider.refund(order_id, amount)

    tool = protected_function_tool(o, refund_order, key=lambda ctx, args: f"refund-{args['order_id']}")
    script = amount_then({"order_id": 1234, "amount": 300}, {"order_id": "1234", "amount": "300"})
    result = asyncio.run(Runner.run(Agent(name="refunds", tools=[tool], model=ScriptedModel(script)), "refund"))
    assert provider.amounts() == [300]
    view = o.inspect("default", "refund-1234")
    assert view is not None and view.replays == 1 and view.conflicts == 0
    assert result.final_output.count("r-1") == 2


def test_a_tool_that_raises_is_unknown_and_the_model_is_told_onces_account() -> None:
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
    assert "not done" not in result.final_output
    assert "refund_order default/k-1234: unknown (" in result.final_output
    assert "effect unknown; the same call again" in result.final_output


def test_a_blocked_call_is_reported_as_once_says_and_the_run_goes_on(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        return provider.refund(order_id, amount)

    # The application has no key for this order: the tool's identity is required, so the engine refuses.
    tool = protected_function_tool(o, refund_order, key=lambda ctx, args: None)
    result = asyncio.run(Runner.run(Agent(name="refunds", tools=[tool], model=ScriptedModel(twice)), "go"))
    assert provider.count() == 0
    assert result.final_output.count("refund_order default/-: blocked (identity-required: ") == 2
    assert "effect none" in result.final_output


def test_a_call_in_flight_elsewhere_is_reported_as_once_says_and_the_run_goes_on(tmp_path: Path) -> None:
    # Another attempt (here a thread of this process) holds the operation while the model calls the tool: the model
    # is shown once's in-flight account, not "not done" nor the SDK's error text, nothing is sent twice, and the run
    # goes on to the model's answer.
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"), wait=0)
    with provider.held_elsewhere(o, "default", "refund-1234", 1234, 300):

        def refund_order(order_id: int, amount: int) -> dict[str, Any]:
            """Refund an order."""
            return provider.refund(order_id, amount)

        tool = protected_function_tool(o, refund_order, key=lambda ctx, args: f"refund-{args['order_id']}")
        calls: list[Turn] = [[("refund_order", {"order_id": 1234, "amount": 300})]]
        model = ScriptedModel(lambda outputs: calls.pop() if calls else "outputs: " + " | ".join(outputs))
        result = asyncio.run(Runner.run(Agent(name="refunds", tools=[tool], model=model), "refund"))
        assert provider.count() == 0, "sent while another attempt held the operation"
    assert provider.count() == 1
    assert result.final_output == (
        "outputs: refund_order default/refund-1234: inflight; effect unknown; the same call again waits")
