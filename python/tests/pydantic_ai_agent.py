"""One Pydantic AI agent process for the restart test: a scripted model asks for one refund of order 1234.

    python pydantic_ai_agent.py LEDGER PROVIDER MODE PHASE

LEDGER: the once SQLite ledger file; PROVIDER: the provider's SQLite file (its `refunds` table, made by the test);
MODE `once`: the refund tool protected by once (key from the conversation in the agent's deps), `plain`: the same
tool unprotected. PHASE `crash`: the refund commits, the process writes PROVIDER.committed and hangs until it is
SIGKILLed (before its reply reaches the agent); `rerun`: the agent runs to its end and the process prints, as JSON,
the tool results the model read (`outcome`, `content`) and the run's output.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from once import Evidence, Once, Policy
from once.adapters.pydantic_ai import protected_tool
from refund_table import RefundTable

# The test's processes share this host's clock (no skew allowance), and a short lease, so the rerun's wait for the
# killed holder's lease is a fraction of a second.
SETTINGS = {"clock_skew_ms": 0}
POLICY = Policy(dispatch_timeout_ms=300, max_in_flight_ms=500, reconcile_interval_ms=100, lookup=True)


class Provider(RefundTable):
    """The test's provider table, opened (the test made it); its reads are the provider's authoritative lookup."""

    def __init__(self, path: Path) -> None:
        self.path, self.lose_replies = path, 0

    def find(self, order_id: int) -> Any:
        """The refund of `order_id` as the provider's own read reports it, or None."""
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT id, amount FROM refunds WHERE order_id = ?", (order_id,)).fetchone()
        return None if row is None else {"refund_id": f"r-{row[0]}", "order_id": order_id, "amount": row[1]}


@dataclass
class Conversation:
    """The application's deps: the conversation the agent serves (stable across a restart)."""

    id: str


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """The tool results the model has read so far."""
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the refund until it has a tool result, then answers with what it read."""
    returns = tool_returns(messages)
    if not returns:
        return ModelResponse(parts=[ToolCallPart("refund_order", {"order_id": 1234, "amount": 200})])
    return ModelResponse(parts=[TextPart(json.dumps([{"outcome": p.outcome, "content": p.content} for p in returns]))])


def main() -> int:
    ledger, provider_path, mode, phase = sys.argv[1:5]
    provider = Provider(Path(provider_path))

    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        """Refund `amount` on an order."""
        receipt = provider.refund(order_id, amount)
        if phase == "crash":
            Path(provider_path + ".committed").write_text(json.dumps(receipt), encoding="utf-8")
            time.sleep(3600)
        return receipt

    tool: Any = refund_order
    if mode == "once":
        handles: list[Once] = []

        def lookup(tool: str, provider_key: str, args: str) -> Evidence:
            found = provider.find(json.loads(args)["order_id"])
            return Evidence.confirmed(found) if found else Evidence.absent(handles[0].now())

        o = Once.sqlite(ledger, lookup=lookup, settings=SETTINGS, policies={"refund_order": POLICY})
        handles.append(o)
        tool = protected_tool(o, refund_order, key=lambda args, ctx: f"{ctx.deps.id}/refund-{args['order_id']}",
                              scope="tenant-7")
    agent = Agent(FunctionModel(model), deps_type=Conversation, tools=[tool])
    result = agent.run_sync("refund order 1234", deps=Conversation("conv-42"))
    print(json.dumps({"output": result.output}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
