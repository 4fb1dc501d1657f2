"""The Pydantic AI adapter, through a real `Agent` and its tool-calling path, with `FunctionModel` as the scripted
model (no network). Every refund is a row in the provider's SQLite table; each crash or retry scenario is also run
with the plain (unprotected) tool, which must make two refunds where the protected one makes one."""

from __future__ import annotations

import json
import runpy
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Union

import pytest

from conftest import docs_example, kill_when, require  # noqa: E402

if sys.version_info < (3, 11):
    # Pydantic AI 2 needs Python 3.11+, so the extra (and its test pins) are marked python_version >= "3.11" and are
    # not installed here; on 3.11+ a missing extra is still a failure under CI (require, below).
    pytest.skip("skipped: Pydantic AI 2 requires Python 3.11 or newer; this is Python "
                f"{sys.version_info.major}.{sys.version_info.minor}", allow_module_level=True)

require("pydantic_ai", "pydantic-ai")

from pydantic import Field  # noqa: E402
from pydantic_ai import Agent, ModelRetry, RunContext, Tool  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

import once  # noqa: E402
from once import Evidence, Once  # noqa: E402
from once.adapters.pydantic_ai import protected_tool  # noqa: E402
from refund_table import RefundTable  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass
class Conversation:
    """The application's deps: it mints the operation key of each refund it asks for (never the model)."""

    id: str
    keys: dict[int, str] = field(default_factory=dict)

    def key_for(self, order_id: int) -> str:
        return self.keys.setdefault(order_id, f"{self.id}/refund-{order_id}")


def by_conversation(args: dict[str, Any], ctx: RunContext[Conversation]) -> str:
    """The key function the tests use: the conversation's key for the order."""
    return ctx.deps.key_for(args["order_id"])


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """The tool results the model has read so far (results, failures and retry prompts alike)."""
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


class Script:
    """A `FunctionModel` function: one `refund_order` call per turn with the given arguments (a dict, or the raw
    arguments text as a model may send it), then an answer listing the tool results it read. A fresh
    `tool_call_id` per call, as a model mints them. Keeps every message list it was given."""

    def __init__(self, *calls: Union[dict[str, Any], str], on_turn: Optional[Callable[[int], None]] = None) -> None:
        self.calls, self.on_turn = calls, on_turn
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        returns = tool_returns(messages)
        if self.on_turn is not None:
            self.on_turn(len(returns))
        if len(returns) < len(self.calls):
            return ModelResponse(parts=[ToolCallPart("refund_order", self.calls[len(returns)])])
        return ModelResponse(parts=[TextPart(" | ".join(f"{p.outcome}: {p.content}" for p in returns))])

    def read(self) -> list[ToolReturnPart]:
        """The tool results the model read by its last turn."""
        return tool_returns(self.seen[-1])


def run(tool: Any, script: Script, deps: Optional[Conversation] = None) -> str:
    agent = Agent(FunctionModel(script), deps_type=Conversation, tools=[tool])
    output: str = agent.run_sync("refund order 1234", deps=deps or Conversation("conv-1")).output
    return output


def refund_tool(provider: RefundTable) -> Callable[..., dict[str, Any]]:
    """The refund tool as its author writes it for Pydantic AI: a dropped connection asks the model to try again
    (`ModelRetry`), so the run survives a network error. Protected or not, it is the same function."""

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund `amount` on an order."""
        try:
            return provider.refund(order_id, amount)
        except ConnectionError as e:
            raise ModelRetry(f"the refund service did not answer ({e}); try again") from e

    return refund_order


class Lookup:
    """The provider's authoritative read for an unknown outcome: its table, by order. While `available` is False
    the read answers unknown (the provider cannot be read yet)."""

    def __init__(self, provider: RefundTable) -> None:
        self.provider, self.reads, self.available = provider, 0, True
        self.handle: Optional[Once] = None

    def __call__(self, tool: str, provider_key: str, args: str) -> Evidence:
        self.reads += 1
        if not self.available:
            return Evidence.unknown("the refund service's read timed out")
        order_id = json.loads(args)["order_id"]
        with sqlite3.connect(self.provider.path) as db:
            row = db.execute("SELECT id, amount FROM refunds WHERE order_id = ?", (order_id,)).fetchone()
        if row is None:
            assert self.handle is not None
            return Evidence.absent(self.handle.now())
        return Evidence.confirmed({"refund_id": f"r-{row[0]}", "order_id": order_id, "amount": row[1]})


def with_lookup(path: Path, provider: RefundTable, **options: Any) -> tuple[Once, Lookup]:
    lookup = Lookup(provider)
    o = Once.sqlite(str(path), lookup=lookup, **options)
    lookup.handle = o
    return o, lookup


# ---------------------------------------------------------------- the tool as Pydantic AI sees it


def test_a_protected_tool_keeps_the_tools_name_schema_and_settings() -> None:
    o = Once.memory()

    def refund_order(ctx: RunContext[Conversation], order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order.

        Args:
            order_id: The order to refund.
            amount: The amount, in cents.
        """
        return {}

    raw = Tool(refund_order, max_retries=4, description="Refund an order (cents).", strict=True)
    safe = protected_tool(o, raw, key=by_conversation)
    assert safe.tool_def == raw.tool_def
    assert safe.tool_def.parameters_json_schema["properties"]["amount"]["description"] == "The amount, in cents."
    assert (safe.name, safe.max_retries, safe.description) == ("refund_order", 4, "Refund an order (cents).")
    # The Tool given is not changed: registered unprotected elsewhere, it still calls the plain function.
    assert raw.function is refund_order and raw.function_schema.function is refund_order
    assert safe.function_schema.validator is raw.function_schema.validator
    plain = protected_tool(o, refund_order, key=by_conversation)
    assert plain.tool_def == Tool(refund_order).tool_def


def test_wrapping_without_a_key_is_refused_and_says_how_to_supply_one() -> None:
    o = Once.memory()

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        return {}

    with pytest.raises(once.InvalidRequest) as info:
        protected_tool(o, refund_order)
    assert "refund_order" in str(info.value) and "key=lambda args, ctx" in str(info.value)
    assert "derive_key_from=" in str(info.value)
    with pytest.raises(once.InvalidRequest, match="both key= and derive_key_from="):
        protected_tool(o, refund_order, key=by_conversation, derive_key_from=["/order_id"])
    with pytest.raises(once.InvalidPolicy):
        protected_tool(o, refund_order, derive_key_from=["order_id"])  # not a JSON pointer


# ---------------------------------------------------------------- retry


def refund_function(provider: RefundTable, kind: str) -> Callable[..., Any]:
    """The refund tool's function: `refund_tool`'s, or an async one that takes the run context."""
    if kind == "sync":
        return refund_tool(provider)

    async def refund_order(ctx: RunContext[Conversation], order_id: int, amount: int) -> dict[str, Any]:
        """Refund `amount` on an order."""
        return provider.refund(order_id, amount)

    return refund_order


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_model_retry_with_a_new_call_id_replays_the_receipt(tmp_path: Path, kind: str) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))
    twice = {"order_id": 1234, "amount": 200}
    script = Script(twice, twice)
    run(protected_tool(o, refund_function(provider, kind), key=by_conversation, scope="tenant-7"), script)
    with_once = provider.count()
    first, second = script.read()
    assert first.tool_call_id != second.tool_call_id
    assert first.outcome == second.outcome == "success"
    assert first.content == second.content == {"refund_id": "r-1", "order_id": 1234, "amount": 200}
    view = o.inspect("tenant-7", "conv-1/refund-1234")
    assert view is not None and view.key_source is once.KeySource.APPLICATION and view.replays == 1

    # The same model, the same function, not protected.
    plain = RefundTable(tmp_path / "plain.db")
    run(refund_function(plain, kind), Script(twice, twice))
    assert (with_once, plain.count()) == (1, 2)


def test_arguments_are_recorded_as_validated_so_a_coerced_retry_replays(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))
    script = Script({"order_id": "1234", "amount": "300"}, '{"order_id": 1234, "amount": 300}')
    run(protected_tool(o, refund_tool(provider), key=by_conversation), script)
    assert provider.amounts() == [300]
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.replays == 1 and view.conflicts == 0
    assert json.loads(view.args) == {"order_id": 1234, "amount": 300}


def test_the_function_gets_the_provider_key_in_its_key_argument_not_the_models(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int, idempotency_key: str) -> dict[str, Any]:
        """Refund an order; the refund service dedupes on `idempotency_key`."""
        return provider.refund(order_id, amount, idempotency_key)

    # A model mints a fresh idempotency key per call: it is left out of the fingerprint and replaced by once's.
    script = Script(*({"order_id": 1234, "amount": 200, "idempotency_key": f"model-{i}"} for i in (1, 2)))
    run(protected_tool(o, refund_order, key=by_conversation), script)
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.replays == 1
    with sqlite3.connect(provider.path) as db:
        assert db.execute("SELECT request_id FROM refunds").fetchall() == [(view.provider_key,)]
    assert [p.outcome for p in script.read()] == ["success", "success"]


def test_dispatched_arguments_the_schema_rejects_are_not_sent(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"), wait=0)  # no waiting out the back-off of a not-sent attempt

    def refund_order(order_id: int, idempotency_key: Annotated[str, Field(pattern="^model-")]) -> dict[str, Any]:
        """A key argument whose schema once's provider key does not pass."""
        return provider.refund(order_id, 1, idempotency_key)

    script = Script({"order_id": 1234, "idempotency_key": "model-1"})
    run(protected_tool(o, refund_order, key=by_conversation), script)
    # The function was never called, and the record says nothing was sent (not an unknown outcome).
    assert provider.count() == 0
    [result] = script.read()
    assert result.outcome == "failed" and ": notsent" in result.content and "effect none" in result.content
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.state is once.State.FAILED and view.attempts == 1


# ---------------------------------------------------------------- lost reply


RECEIPT = {"refund_id": "r-1", "order_id": 1234, "amount": 200}
UNKNOWN = "refund_order default/conv-1/refund-1234: unknown ("


@pytest.mark.parametrize("read", ["lookup", "lookup unavailable at first", "no lookup"])
def test_a_lost_reply_is_unknown_and_the_models_retry_sends_nothing(tmp_path: Path, read: str) -> None:
    provider = RefundTable(tmp_path / "provider.db", lose_replies=1)
    lookup: Optional[Lookup] = None
    fields: dict[str, Any] = {}
    if read == "no lookup":
        o = Once.sqlite(str(tmp_path / "once.db"))
    else:
        # A call waits for a due read at most half a second: the first call gives up on a read that stays unknown.
        o, lookup = with_lookup(tmp_path / "once.db", provider, wait=0.5)
        fields = {"reconcile_interval_ms": 100}
        lookup.available = read == "lookup"

    def on_turn(results: int) -> None:
        if lookup is not None and results == 1:
            lookup.available = True  # the provider can be read again by the model's retry

    call = {"order_id": 1234, "amount": 200}
    script = Script(call, call, on_turn=on_turn)
    run(protected_tool(o, refund_tool(provider), key=by_conversation, **fields), script)
    with_once = provider.count()
    first, second = script.read()
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.attempts == 1
    kinds = [e.kind for e in view.audit]
    assert "finish-ambiguous" in kinds and ("reconciled-confirmed" in kinds) == (lookup is not None), kinds
    if read == "lookup":
        # The lost reply was reconciled within the call by the provider's read: the model read the receipt, and its
        # retry replays it.
        assert (first.outcome, first.content) == (second.outcome, second.content) == ("success", RECEIPT)
    else:
        # The model read once's own account: a failed tool result (no "fix the errors and try again", no retry
        # budget spent), never "failed" as in "nothing happened".
        assert first.outcome == "failed" and first.content.startswith(UNKNOWN)
        assert "effect unknown" in first.content and "effect none" not in first.content
    if read == "lookup unavailable at first":
        # The model's retry (same key) was reconciled by the provider's read: the receipt, nothing sent again.
        assert (second.outcome, second.content) == ("success", RECEIPT)
    if read == "no lookup":
        # Nobody can read the provider: the retry is answered once's text, and nothing is sent.
        assert second.outcome == "failed" and second.content.startswith(UNKNOWN)

    # The same scenario, the same function unprotected: its ModelRetry makes the model send the refund again.
    plain = RefundTable(tmp_path / "plain.db", lose_replies=1)
    script = Script(call, call)
    run(refund_tool(plain), script)
    assert [p.outcome for p in script.read()] == ["retried", "success"]
    assert (with_once, plain.count()) == (1, 2)


@pytest.mark.parametrize("identity", ["application key", "derived from effect fields"])
def test_a_fresh_request_id_after_an_unknown_outcome_sends_nothing(tmp_path: Path, identity: str) -> None:
    """The peer vector model_generated_fresh_id_after_unknown: after an unknown outcome the model calls again with
    the same effect (order, amount) and a request id it mints afresh."""
    provider = RefundTable(tmp_path / "provider.db", lose_replies=1)
    o = Once.sqlite(str(tmp_path / "once.db"))

    def refund_order(order_id: int, amount: int, request_id: str) -> dict[str, Any]:
        """Refund an order (request_id: the caller's request id, not part of the effect)."""
        return provider.refund(order_id, amount, request_id)

    if identity == "application key":
        tool = protected_tool(o, refund_order, key=by_conversation)
    else:
        tool = protected_tool(o, refund_order, derive_key_from=["/order_id", "/amount"])
    script = Script(*({"order_id": 1234, "amount": 300, "request_id": f"req-{i}"} for i in (1, 2)))
    run(tool, script)
    assert provider.count() == 1, "the model's fresh request id made a second refund"
    first, second = script.read()
    assert first.outcome == second.outcome == "failed"
    assert ": unknown (" in first.content and "effect unknown" in first.content
    if identity == "application key":
        assert ": conflict;" in second.content  # same key, another payload: denied, nothing sent
    else:
        assert ": unknown (" in second.content  # same derived key: still unknown, nothing sent


# ---------------------------------------------------------------- arguments Pydantic AI rejects


@pytest.mark.parametrize("first", [
    {"order_id": 1234, "amount": "300 EUR"},  # schema-invalid
    '{"order_id": 1234, "amount": ',  # malformed JSON
    {"order_id": 1234},  # a required argument missing
], ids=["schema-invalid", "malformed-json", "missing-argument"])
def test_arguments_pydantic_ai_rejects_record_nothing_and_get_its_retry_prompt(tmp_path: Path, first: Any) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))
    recorded_before_the_retry: list[Any] = []

    def on_turn(results: int) -> None:
        if results == 1:  # the model has read the retry prompt: nothing may be recorded yet
            recorded_before_the_retry.append(o.inspect("default", "conv-1/refund-1234"))

    corrected = {"order_id": 1234, "amount": 300}
    script = Script(first, corrected, on_turn=on_turn)
    run(protected_tool(o, refund_tool(provider), key=by_conversation), script)
    assert recorded_before_the_retry == [None]
    assert provider.amounts() == [300]
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    rejected, done = script.read()
    assert rejected.outcome == "retried" and done.outcome == "success"

    # Exactly Pydantic AI's own retry prompt for the plain tool.
    plain = RefundTable(tmp_path / "plain.db")
    plain_script = Script(first, corrected)
    run(refund_tool(plain), plain_script)
    assert plain_script.read()[0].content == rejected.content
    assert plain_script.read()[0].outcome == "retried"


def test_a_model_retry_from_the_args_validator_records_nothing(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))

    def at_most_1000(ctx: RunContext[Conversation], order_id: int, amount: int) -> None:
        if amount > 1000:
            raise ModelRetry("refunds above 1000 need a person; ask for at most 1000")

    raw = Tool(refund_tool(provider), args_validator=at_most_1000)
    script = Script({"order_id": 1234, "amount": 5000}, {"order_id": 1234, "amount": 1000})
    run(protected_tool(o, raw, key=by_conversation), script)
    rejected, done = script.read()
    assert rejected.outcome == "retried" and "at most 1000" in str(rejected.content)
    assert done.outcome == "success" and provider.amounts() == [1000]
    view = o.inspect("default", "conv-1/refund-1234")
    assert view is not None and view.attempts == 1 and json.loads(view.args)["amount"] == 1000


# ---------------------------------------------------------------- once's text to the model


def test_a_blocked_call_is_reported_as_once_says_and_the_run_goes_on(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.sqlite(str(tmp_path / "once.db"))
    # The application has no key for this call: the tool's identity is required, so the engine refuses.
    script = Script({"order_id": 1, "amount": 5}, {"order_id": 1, "amount": 5})
    output = run(protected_tool(o, refund_tool(provider), key=lambda args, ctx: None), script)
    assert provider.count() == 0
    assert [p.outcome for p in script.read()] == ["failed", "failed"]
    assert all(p.content.startswith("refund_order default/-: blocked (identity-required: ") and
               "effect none" in p.content for p in script.read())
    assert output.count("blocked (identity-required") == 2


def test_a_refused_call_is_a_rejection_and_a_later_call_may_send(tmp_path: Path) -> None:
    o = Once.sqlite(str(tmp_path / "once.db"))
    sent: list[int] = []

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund an order."""
        sent.append(amount)
        if len(sent) == 1:
            raise once.Refused("insufficient balance")
        return {"refunded": amount}

    call = {"order_id": 1, "amount": 5}
    script = Script(call, call)
    run(protected_tool(o, refund_order, key=by_conversation), script)
    first, second = script.read()
    assert first.outcome == "failed" and ": rejected (insufficient balance); effect none" in first.content
    assert second.outcome == "success" and second.content == {"refunded": 5}
    assert sent == [5, 5]


# ---------------------------------------------------------------- restart: a real process killed after the commit


def agent(ledger: Path, provider: Path, mode: str, phase: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "pydantic_ai_agent.py"), str(ledger), str(provider), mode,
                             phase], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def crash_then_rerun(tmp_path: Path, mode: str) -> tuple[RefundTable, list[dict[str, Any]]]:
    """Run the agent until its refund committed, SIGKILL it, and run it again in a new process on the same files."""
    ledger, provider = tmp_path / f"{mode}-once.db", RefundTable(tmp_path / f"{mode}-provider.db")
    first = agent(ledger, provider.path, mode, "crash")
    kill_when(first, Path(str(provider.path) + ".committed").exists, "the agent never refunded")
    assert provider.count() == 1
    second = agent(ledger, provider.path, mode, "rerun")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    return provider, json.loads(json.loads(out)["output"])


def test_a_process_killed_after_the_refund_committed_is_recovered_by_a_new_one_without_a_second_refund(
        tmp_path: Path) -> None:
    provider, read = crash_then_rerun(tmp_path, "once")
    with_once = provider.count()
    # The new process's model read the refund the killed one made: found by the provider's read, not sent again.
    assert read == [{"outcome": "success", "content": {"refund_id": "r-1", "order_id": 1234, "amount": 200}}]
    view = Once.sqlite(str(tmp_path / "once-once.db")).inspect("tenant-7", "conv-42/refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    assert "lease-expired" in [e.kind for e in view.audit]

    plain, read = crash_then_rerun(tmp_path, "plain")
    assert read == [{"outcome": "success", "content": {"refund_id": "r-2", "order_id": 1234, "amount": 200}}]
    assert (with_once, plain.count()) == (1, 2)


# ---------------------------------------------------------------- the documentation's example


def test_the_docs_example_runs_as_printed_and_refunds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    example = tmp_path / "example.py"
    example.write_text(docs_example("docs/frameworks/pydantic-ai.md"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for run_number in (1, 2):  # the second run: new handles on the same files, as a restarted process has
        runpy.run_path(str(example), run_name="__main__")
        printed = capsys.readouterr().out
        assert "refunds in the shop: 1" in printed, (run_number, printed)
        assert printed.count("'refunded': 1234") == 2, printed
    with sqlite3.connect(tmp_path / "shop.db") as db:
        assert db.execute("SELECT COUNT(*) FROM refunds").fetchone()[0] == 1
