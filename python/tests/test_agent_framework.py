"""The Microsoft Agent Framework adapter on the real `agent-framework-core`, with a scripted chat client: a workflow
restored from its file checkpoint after a SIGKILL re-runs the agent's turn, and the refund happens once with once
and twice without it (microsoft/agent-framework#3938)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from conftest import docs_example, kill_when, require, run_script  # noqa: E402

require("agent_framework", "agent-framework")

from agent_framework import Agent, Message, tool  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.agent_framework import protect_tool  # noqa: E402
from agent_framework_process import ScriptedChatClient, Turn, refund_once_then_answer, tool_results  # noqa: E402
from refund_table import RefundTable  # noqa: E402

PROCESS = Path(__file__).with_name("agent_framework_process.py")


def phase(directory: Path, with_once: str, name: str, ledger: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROCESS), str(directory), with_once, name, ledger],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROCESS.parent)


def kill_after_commit(directory: Path, with_once: str, ledger: str) -> list[str]:
    """Run the first phase until the refund is committed, then SIGKILL it; the agent sessions its key was formed in."""
    p = phase(directory, with_once, "first", ledger)
    marker = directory / "committed"
    kill_when(p, lambda: marker.exists() and bool(marker.read_text(encoding="utf-8")), "the refund never committed")
    sessions: list[str] = json.loads(marker.read_text(encoding="utf-8"))["sessions"]
    return sessions


@pytest.mark.parametrize("with_once,ledger,refunds", [("once", "sqlite", 1), ("once", "postgres", 1),
                                                      ("once-without-lookup", "sqlite", 1), ("plain", "none", 2)])
def test_a_workflow_restored_from_its_checkpoint_after_a_sigkill_refunds_once_with_once_twice_without(
        request: pytest.FixtureRequest, tmp_path: Path, with_once: str, ledger: str, refunds: int) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    at = str(tmp_path / "once.db")
    if ledger == "postgres":
        at = f"{request.getfixturevalue('pg_url')}?schema={request.getfixturevalue('pg_schema')}"
    first_sessions = kill_after_commit(tmp_path, with_once, at)
    assert provider.count() == 1, "the first process committed its refund before it was killed"

    p = phase(tmp_path, with_once, "resume", at)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    resumed = json.loads(out)
    # The restore started from the checkpoint after `intake`: the agent's whole turn ran again.
    assert resumed["restored_iteration"] == 1
    assert provider.count() == refunds, f"{with_once}: {provider.count()} refund(s)"
    if with_once == "plain":
        assert resumed["outputs"] == ['refunded: {"refund_id": "r-2", "order_id": 1234, "amount": 200}']
        return
    if with_once == "once-without-lookup":
        # Nothing can read the provider: the outcome stays unknown, the model reads once's text, nothing is resent.
        [output] = resumed["outputs"]
        assert output.startswith("refunded: refund_order default/case-42/refund-1234: unknown (")
        assert "effect unknown" in output and "failed" not in output
        return
    # The run's output carries the receipt of the one refund, found by the provider's read (lookup).
    assert resumed["outputs"] == ['refunded: {"refund_id": "r-1", "order_id": 1234, "amount": 200}']
    # The agent's session id (session_scope), which the AgentExecutor checkpointed, is the same in both processes.
    assert resumed["sessions"] == first_sessions and len(first_sessions) == 1
    # The resumed process's key came from the case id it never passed: the checkpoint carried the run's kwargs.
    view = (Once.postgres if ledger == "postgres" else Once.sqlite)(at).inspect("default", "case-42/refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED
    kinds = [e.kind for e in view.audit]
    assert "lease-expired" in kinds, kinds


def refund_tool(provider: RefundTable) -> Any:
    @tool
    def refund_order(order_id: int, amount: int) -> dict[str, object]:
        """Refund an order."""
        return provider.refund(order_id, amount)

    return refund_order


def test_the_protected_tool_keeps_the_tools_schema_and_a_new_call_id_replays(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    raw = refund_tool(provider)
    o = Once.memory()
    safe = protect_tool(o, raw, key=lambda args, ctx: f"{ctx.kwargs['case_id']}/refund-{args['order_id']}")
    assert (safe.name, safe.description, safe.parameters(), safe.approval_mode) == (
        raw.name, raw.description, raw.parameters(), raw.approval_mode)
    client = ScriptedChatClient(refund_once_then_answer)
    agent = Agent(client=client, name="refunder", tools=[safe])
    session = agent.create_session()

    async def twice() -> list[str]:
        # The same operation asked twice (a retried run): the model mints a new call id each time.
        return [(await agent.run("refund order 1234", session=session,
                                 function_invocation_kwargs={"case_id": "case-7"})).text for _ in range(2)]

    first, second = asyncio.run(twice())
    assert provider.count() == 1
    receipt = '{"refund_id": "r-1", "order_id": 1234, "amount": 200}'
    assert first == second == f"refunded: {receipt}"
    view = o.inspect("default", "case-7/refund-1234")
    assert view is not None and view.replays == 1


def test_wrapping_without_a_key_is_refused_and_says_how_to_supply_one(tmp_path: Path) -> None:
    o = Once.memory()
    raw = refund_tool(RefundTable(tmp_path / "provider.db"))
    with pytest.raises(once.InvalidRequest) as info:
        protect_tool(o, raw)
    assert "refund_order" in str(info.value) and "key=lambda args, ctx" in str(info.value)
    with pytest.raises(once.InvalidRequest, match="both key= and derive_key_from="):
        protect_tool(o, raw, key=lambda args, ctx: "k", derive_key_from=["/order_id"])


def script_of(turns: list[Turn]) -> Any:
    def script(messages: Sequence[Message]) -> Turn:
        return turns[len(tool_results(messages))]

    return script


def test_an_unknown_outcome_is_onces_text_for_the_model_and_is_never_resent(tmp_path: Path) -> None:
    """A lost reply (the refund committed, the tool raised): the model reads once's account, never "failed"; its
    next call, with a fresh call id and a fresh request id, sends nothing (derive_key_from covers only the effect)."""
    provider = RefundTable(tmp_path / "provider.db", lose_replies=1)

    @tool
    def refund_order(order_id: int, amount: int, request_id: str) -> dict[str, object]:
        """Refund an order (request_id: the caller's, not part of the effect)."""
        return provider.refund(order_id, amount, request_id)

    o = Once.sqlite(str(tmp_path / "once.db"))
    safe = protect_tool(o, refund_order, derive_key_from=["/order_id", "/amount"], scope="tenant-7")
    call = [("refund_order", {"order_id": 1234, "amount": 300, "request_id": "req-1"})]
    again = [("refund_order", {"order_id": 1234, "amount": 300, "request_id": "req-2"})]
    client = ScriptedChatClient(script_of([call, again, "done"]))
    agent = Agent(client=client, name="refunder", tools=[safe])
    asyncio.run(agent.run("refund order 1234"))
    assert provider.count() == 1
    first, second = tool_results(client.inputs[-1])
    for text in (first, second):
        assert text.startswith("refund_order tenant-7/") and ": unknown (" in text and "effect unknown" in text


def test_arguments_the_framework_rejects_begin_nothing(tmp_path: Path) -> None:
    provider = RefundTable(tmp_path / "provider.db")
    o = Once.memory()
    safe = protect_tool(o, refund_tool(provider), key=lambda args, ctx: f"refund-{args['order_id']}")
    bad = [("refund_order", {"order_id": 1234, "amount": "300 EUR"})]
    good = [("refund_order", {"order_id": 1234, "amount": 300})]
    client = ScriptedChatClient(script_of([bad, good, "done"]))
    asyncio.run(Agent(client=client, name="refunder", tools=[safe]).run("refund order 1234"))
    assert provider.amounts() == [300]
    rejected, done = tool_results(client.inputs[-1])
    assert "refund_id" not in rejected and json.loads(done)["amount"] == 300
    assert o.inspect("default", "refund-1234") is not None


def test_the_docs_example_runs_as_printed_and_refunds_twice_without_once(tmp_path: Path) -> None:
    code = docs_example("docs/frameworks/agent-framework.md")
    # The same script with the plain tool (which then gets no provider key): the restore refunds again.
    plain = code.replace("tools=[safe_refund]", "tools=[refund_order]").replace(
        "ctx.kwargs[PROVIDER_KEY]", "ctx.kwargs.get(PROVIDER_KEY)")
    assert plain.count("refund_order]") == 1 and "kwargs.get(" in plain
    for name, script, refunds in (("with-once", code, 1), ("without-once", plain, 2)):
        run = run_script(tmp_path / name, script, timeout=60)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert lines[0] == lines[1] == 'done: {"refunded": 1234, "amount": 200}', run.stdout
        assert lines[-1] == f"refunds in the provider's table: {refunds}", (name, run.stdout)
