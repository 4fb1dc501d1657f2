"""One process of the LangGraph durable-execution tests: a checkpointed graph (a scripted model, a `ToolNode`
with a refund tool) run until the tool hangs after the provider committed, or resumed after that process died.

    python langgraph_process.py CHECKPOINTS LEDGER PROVIDER DURABILITY PROTECT PHASE

CHECKPOINTS: the saver's SQLite file, or a postgres:// URL whose search_path is the test's schema. LEDGER: once's
SQLite file, or `postgres` (the same database and schema as the checkpoints). PROVIDER: the refund table's SQLite
file (refund_table.py). DURABILITY: LangGraph's `sync` | `async` | `exit`. PROTECT: `once` (the tool wrapped by
`protect_tool`, keyed by `step_key`) or `plain` (the tool as it is). PHASE `crash`: run the request; the tool
commits the refund, writes PROVIDER.committed and hangs until SIGKILLed. PHASE `resume`: resume the thread from
its checkpoint, or run the request again when the thread has none to resume from; print the run's messages as
JSON (`resumed_from`, `messages`).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from once import Evidence, Once, Policy
from once.adapters.langchain import protect_tool, step_key
from refund_table import RefundTable

THREAD = {"configurable": {"thread_id": "conv-42"}}
REQUEST = {"messages": [("user", "refund order 1234")]}
# Every process of a test shares this host's clock (no skew allowance), and leases stay short so the resuming
# process finds the dead holder's lease ended within a second.
SETTINGS = {"clock_skew_ms": 0}
POLICY = Policy(dispatch_timeout_ms=300, max_in_flight_ms=500, reconcile_interval_ms=100, lookup=True)


class ScriptedModel(BaseChatModel):
    """Asks for one refund, then answers with the tool's output. Each tool call gets a fresh id, as a model's do."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: Optional[list[str]] = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        outputs = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        if outputs:
            message = AIMessage(content="done: " + outputs[-1])
        else:
            message = AIMessage(content="", tool_calls=[{"name": "refund_order", "args": {"order_id": 1234, "amount": 200},
                                                         "id": f"call-{uuid.uuid4().hex[:8]}", "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


class Provider(RefundTable):
    """The test's refund table, already created by the test."""

    def __init__(self, path: Path) -> None:
        self.path, self.lose_replies = path, 0
        self.once: Optional[Once] = None

    def lookup(self, tool: str, provider_key: str, args: str) -> Evidence:
        """The provider's authoritative read: the refund of this order, if it committed."""
        import sqlite3

        assert self.once is not None
        # The read sees every refund committed before it started: its position is taken first.
        position = self.once.now()
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT id, order_id, amount FROM refunds WHERE order_id = ?",
                             (json.loads(args)["order_id"],)).fetchone()
        if row is None:
            return Evidence.absent(position)
        return Evidence.confirmed({"refund_id": f"r-{row[0]}", "order_id": row[1], "amount": row[2]})


def refund_tool(provider: Provider, hang: bool) -> BaseTool:
    @tool
    def refund_order(order_id: int, amount: int) -> dict[str, object]:
        """Refund an order."""
        receipt = provider.refund(order_id, amount)
        if hang:
            # The refund committed; the process dies before the tool's result is written to any checkpoint.
            Path(str(provider.path) + ".committed").write_text("1")
            time.sleep(3600)
        return receipt

    return refund_order


def saver(stack: ExitStack, checkpoints: str) -> Any:
    if checkpoints.startswith("postgres"):
        from langgraph.checkpoint.postgres import PostgresSaver

        s = stack.enter_context(PostgresSaver.from_conn_string(checkpoints))
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver

        s = stack.enter_context(SqliteSaver.from_conn_string(checkpoints))
    s.setup()
    return s


def ledger(spec: str, checkpoints: str, provider: Provider) -> Once:
    options: dict[str, Any] = dict(settings=SETTINGS, policies={"refund_order": POLICY}, lookup=provider.lookup,
                                   wait=30)
    if spec == "postgres":
        url = urlparse(checkpoints)
        schema = parse_qs(url.query)["options"][0].split("=", 1)[1]
        o = Once.postgres(url._replace(query="").geturl(), schema=schema, **options)
    else:
        o = Once.sqlite(spec, **options)
    provider.once = o
    return o


def main() -> int:
    checkpoints, ledger_spec, provider_path, durability, protect, phase = sys.argv[1:7]
    provider = Provider(Path(provider_path))
    refund = refund_tool(provider, hang=phase == "crash")
    if protect == "once":
        o = ledger(ledger_spec, checkpoints, provider)
        refund = protect_tool(o, refund, key=lambda args, config: step_key(config, "refund"))
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [ScriptedModel().invoke(state["messages"])]})
    g.add_node("tools", ToolNode([refund]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    with ExitStack() as stack:
        graph = g.compile(checkpointer=saver(stack, checkpoints))
        if phase == "crash":
            graph.invoke(REQUEST, THREAD, durability=durability)  # type: ignore[arg-type]
            return 1  # unreachable: the tool hangs until the test kills this process
        # What an application does after a crash: resume the thread if a checkpoint says what is next, else run
        # the request again (nothing of the dead run was saved).
        pending = graph.get_state(THREAD).next
        out = graph.invoke(None if pending else REQUEST, THREAD, durability=durability)  # type: ignore[arg-type]
        print(json.dumps({
            "resumed_from": "checkpoint" if pending else "request",
            "messages": [{"type": m.type, "content": m.content, "status": getattr(m, "status", None)}
                         for m in out["messages"]],
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
