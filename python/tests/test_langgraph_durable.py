"""LangGraph durable execution: a checkpointed graph (SQLite and PostgreSQL savers) whose tool node is SIGKILLed
after the provider committed a refund and before the node's write reached a checkpoint, then resumed by a new
process. With once (`protect_tool` keyed by `step_key`) the provider's table holds one refund and the resumed run
carries its receipt; the same scenario with the plain tool holds two."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, TypedDict

import pytest

from conftest import docs_example, kill_when, require, run_script

require("langgraph.checkpoint.sqlite", "langgraph")
require("langgraph.checkpoint.postgres", "langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Send  # noqa: E402

import once  # noqa: E402
from once import Once  # noqa: E402
from once.adapters.langchain import protect_tool, step_key  # noqa: E402
from refund_table import RefundTable  # noqa: E402

HERE = Path(__file__).resolve().parent
PROCESS = HERE / "langgraph_process.py"
THREAD: RunnableConfig = {"configurable": {"thread_id": "conv-42"}}
# The model's step is 1 (the input is step -1, START's step 0), so the tool node runs at step 2.
KEY = "tools@2/refund"


@pytest.fixture(params=[("sqlite", "sync"), ("sqlite", "async"), ("sqlite", "exit"), ("postgres", "async")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(checkpoints, ledger, durability): the saver's store, once's ledger and the durability mode under test.
    PostgreSQL: a fresh schema holding both the checkpoints and the ledger (`async` is LangGraph's default)."""
    saver, durability = request.param
    if saver == "sqlite":
        yield str(tmp_path / "checkpoints.db"), str(tmp_path / "once.db"), durability
        return
    import psycopg

    url, schema = request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield f"{url}?options=-csearch_path%3D{schema}", "postgres", durability


def process(checkpoints: str, ledger: str, provider: Path, durability: str, protect: str,
            phase: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROCESS), checkpoints, ledger, str(provider), durability, protect,
                             phase], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])})


def saved_step(checkpoints: str) -> Optional[int]:
    """The step of the thread's last checkpoint, None when none was saved: read by the test, not the graph."""
    if checkpoints.startswith("postgres"):
        from langgraph.checkpoint.postgres import PostgresSaver as Saver
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver as Saver  # type: ignore[assignment]
    with Saver.from_conn_string(checkpoints) as saver:
        saver.setup()
        saved = saver.get_tuple(THREAD)
    return None if saved is None else int(saved.metadata["step"])


def crash_then_resume(tmp_path: Path, setup: tuple[str, str, str], protect: str) -> tuple[RefundTable, dict[str, Any]]:
    checkpoints, ledger, durability = setup
    provider = RefundTable(tmp_path / f"provider-{protect}.db")
    p = process(checkpoints, ledger, provider.path, durability, protect, "crash")
    committed = Path(str(provider.path) + ".committed")
    # Killed once the tool committed and (but under "exit") the model's step is checkpointed: under "async" that
    # write runs beside the tool node.
    kill_when(p, lambda: committed.exists() and (durability == "exit" or saved_step(checkpoints) == 1),
              "the tool never ran, or the model's step was never checkpointed")
    assert provider.count() == 1, "the refund committed before the kill"
    # What the dead run left: under "exit" nothing at all, otherwise the model's step and not the tool node's.
    assert saved_step(checkpoints) == (None if durability == "exit" else 1)
    r = process(checkpoints, ledger, provider.path, durability, protect, "resume")
    out, err = r.communicate(timeout=120)
    assert r.returncode == 0, err
    resumed = json.loads(out)
    assert resumed["resumed_from"] == ("request" if durability == "exit" else "checkpoint")
    return provider, resumed


def tool_message(resumed: dict[str, Any]) -> dict[str, Any]:
    (message,) = [m for m in resumed["messages"] if m["type"] == "tool"]
    return message  # type: ignore[no-any-return]


def open_ledger(ledger: str, checkpoints: str) -> Once:
    if ledger == "postgres":
        url, _, options = checkpoints.partition("?")
        return Once.postgres(url, schema=options.split("%3D", 1)[1])
    return Once.sqlite(ledger)


def test_a_tool_node_killed_after_the_refund_and_resumed_refunds_once(tmp_path: Path,
                                                                      setup: tuple[str, str, str]) -> None:
    provider, resumed = crash_then_resume(tmp_path, setup, "once")
    assert provider.count() == 1, "the resumed run refunded again"
    # The resumed run's tool message is the refund's receipt, read back from the provider by the lookup.
    message = tool_message(resumed)
    receipt = {"refund_id": "r-1", "order_id": 1234, "amount": 200}
    assert message["status"] == "success" and json.loads(message["content"]) == receipt, message
    assert resumed["messages"][-1] == {"type": "ai", "content": "done: " + message["content"], "status": None}
    checkpoints, ledger, _ = setup
    view = open_ledger(ledger, checkpoints).inspect("conv-42", KEY)
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    # The dead holder's lease ended, the outcome was unknown, and the provider's read confirmed it: nothing resent.
    kinds = [e.kind for e in view.audit]
    assert kinds[0] == "begin" and "lease-expired" in kinds and kinds[-1] == "reconciled-confirmed", kinds
    assert view.key_source is once.KeySource.APPLICATION


def test_the_same_crash_without_once_refunds_twice(tmp_path: Path, setup: tuple[str, str, str]) -> None:
    provider, resumed = crash_then_resume(tmp_path, setup, "plain")
    assert provider.count() == 2
    assert json.loads(tool_message(resumed)["content"])["refund_id"] == "r-2"


class State(TypedDict, total=False):
    orders: list[int]
    order_id: int
    keys: list[Optional[str]]


def key_probe() -> tuple[Any, list[Optional[str]]]:
    keys: list[Optional[str]] = []

    @tool
    def probe(order_id: int, config: RunnableConfig) -> str:
        """Record the step key this call sees."""
        keys.append(step_key(config, "refund", order_id))
        return "ok"

    return probe, keys


def test_step_key_names_the_node_and_step_and_each_send() -> None:
    probe, keys = key_probe()

    def fan_out(state: State) -> list[Send]:
        return [Send("refund", {"order_id": o}) for o in state["orders"]]

    def refund(state: State) -> State:
        probe.invoke({"order_id": state["order_id"]})
        return {}

    g = StateGraph(State)
    g.add_node("plan", lambda state: {})
    g.add_node("refund", refund)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan_out, ["refund"])
    g.add_edge("refund", END)
    graph = g.compile(checkpointer=InMemorySaver())
    graph.invoke({"orders": [7, 8]}, THREAD)
    assert sorted(k or "" for k in keys) == ["refund@2:(0,False)/refund/7", "refund@2:(1,False)/refund/8"]
    # A second turn on the thread runs at later steps: new keys, a new operation.
    keys.clear()
    graph.invoke({"orders": [7]}, THREAD)
    assert keys == ["refund@6:(0,False)/refund/7"]


def identity_required(called: once.Called) -> bool:
    return isinstance(called.ending, once.Blocked) and called.ending.reason is once.BlockReason.IDENTITY_REQUIRED


def step_keyed_tool() -> tuple[Any, list[int]]:
    """A refund tool keyed by `step_key` (raising `Unconfirmed` when not confirmed) and the refunds it made."""
    effects: list[int] = []

    @tool
    def refund_order(order_id: int) -> str:
        """Refund an order."""
        effects.append(order_id)
        return "r"

    return protect_tool(Once.memory(), refund_order, key=lambda args, config: step_key(config, "refund"),
                        raise_unconfirmed=True), effects


def test_step_key_is_none_outside_a_graph_and_in_a_subgraph_so_nothing_is_sent() -> None:
    safe, effects = step_keyed_tool()
    with pytest.raises(once.Unconfirmed) as info:
        safe.invoke({"order_id": 1})
    assert identity_required(info.value.called)

    inner = StateGraph(State)
    inner.add_node("refund", lambda state: {"keys": [safe.invoke({"order_id": 1})]})
    inner.add_edge(START, "refund")
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    with pytest.raises(once.Unconfirmed) as info:
        outer.compile(checkpointer=InMemorySaver()).invoke({}, THREAD)
    assert identity_required(info.value.called)
    assert effects == []


def test_step_key_is_none_in_a_graph_without_a_checkpointer_so_a_second_invocation_is_not_taken_for_the_first(
) -> None:
    # Without a checkpointer each invocation on the thread starts at step 1 again: "refund@1/refund" both times, so
    # the second (a refund of its own) would replay the first's receipt. No key, nothing sent, both times.
    safe, effects = step_keyed_tool()
    g = StateGraph(State)
    g.add_node("refund", lambda state: {"keys": [safe.invoke({"order_id": 1})]})
    g.add_edge(START, "refund")
    graph = g.compile()
    for _ in range(2):
        with pytest.raises(once.Unconfirmed) as info:
            graph.invoke({}, THREAD)
        assert identity_required(info.value.called)
    assert effects == []


def test_the_docs_example_runs_as_printed(tmp_path: Path) -> None:
    done = run_script(tmp_path, docs_example("docs/frameworks/langgraph.md"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "{'refund_id': 'r-1'}\n"
    # The example's provider table, in its working directory: one refund.
    with sqlite3.connect(tmp_path / "provider.db") as db:
        assert db.execute("SELECT COUNT(*) FROM refunds").fetchone()[0] == 1
    view = Once.sqlite(tmp_path / "once.db").inspect("order-1234", "refund@1/refund")
    assert view is not None and view.state is once.State.CONFIRMED
