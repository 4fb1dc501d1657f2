"""A Microsoft Agent Framework workflow with file checkpoints, for the crash tests (and the scripted chat client
the in-process tests share).

    python agent_framework_process.py DIR WITH PHASE [LEDGER]

WITH: `once`, `once-without-lookup` or `plain`; PHASE: `first` or `resume`; LEDGER: an SQLite file or a
postgres:// URL (default DIR/once.db).

The workflow is `intake` (a function executor) -> `refunder` (an `AgentExecutor` around an `Agent` whose chat
client is scripted: no network), checkpointed in DIR/checkpoints after each superstep, like the two-executor
workflow of microsoft/agent-framework#3938. The agent's refund tool commits a row in the provider's SQLite table
DIR/provider.db (the effect, counted there); WITH=once wraps it with `once.adapters.agent_framework.protect_tool`
over the ledger LEDGER, with the provider's read as its lookup (`once-without-lookup`: none), WITH=plain leaves it
as the framework's plain `@tool`.

PHASE `first`: starts the run (the application's case id travels in `function_invocation_kwargs`, which the
workflow keeps in its checkpoints); the refund commits, then the tool writes DIR/committed (the agent sessions the
key was formed in) and hangs until the test SIGKILLs the process: after the provider's commit, before the superstep's
checkpoint. PHASE `resume`: a new process rebuilds the workflow, restores the latest checkpoint (the one after
`intake`) and runs on: the agent's turn is run again, and the scripted model calls the tool again with a new call
id. Prints the run's output texts, the agent sessions and the restored checkpoint's iteration as JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from agent_framework import (Agent, AgentExecutor, AgentExecutorRequest, BaseChatClient, ChatResponse, Content,
                             FileCheckpointStorage, FunctionInvocationContext, FunctionInvocationLayer, Message,
                             Workflow, WorkflowBuilder, WorkflowContext, executor, tool)

from refund_table import RefundTable

Turn = Union[str, list[tuple[str, dict[str, Any]]]]
_calls = itertools.count(1)


def tool_results(messages: Sequence[Message]) -> list[str]:
    """The tool results the model has read so far, in order."""
    return [str(c.result) for m in messages for c in m.contents if c.type == "function_result"]


class ScriptedChatClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """A chat client that plays `script` (a function of the messages so far, i.e. of what the model reads: the tool
    calls to make, as (name, args), or the final text). Scripted, no network. Like a real model it mints a fresh
    call id for every call, including the same call made again after a restore."""

    def __init__(self, script: Callable[[Sequence[Message]], Turn]) -> None:
        super().__init__()
        self.script = script
        self.inputs: list[list[Message]] = []

    async def _reply(self, messages: Sequence[Message]) -> ChatResponse:
        self.inputs.append(list(messages))
        turn = self.script(messages)
        if isinstance(turn, str):
            return ChatResponse(messages=[Message(role="assistant", contents=[turn])])
        calls = [Content.from_function_call(call_id=f"call-{time.monotonic_ns()}-{next(_calls)}", name=name,
                                            arguments=args) for name, args in turn]
        return ChatResponse(messages=[Message(role="assistant", contents=calls)])

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: Any,
                            **kwargs: Any) -> Any:
        if stream:
            raise NotImplementedError("the scripted client answers whole responses only")
        return self._reply(messages)


def refund_once_then_answer(messages: Sequence[Message]) -> Turn:
    """Call refund_order(1234, 200) until a tool result is read in this turn (since the user's last message), then
    answer with the results read."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    results = tool_results(messages[users[-1] + 1:] if users else messages)
    if not results:
        return [("refund_order", {"order_id": 1234, "amount": 200})]
    return "refunded: " + " | ".join(results)


class Provider(RefundTable):
    """The provider's table, opened (not created) by each process."""

    def __init__(self, path: Path, hang_after_commit: Optional[Path] = None) -> None:
        self.path, self.lose_replies, self.hang_after_commit = path, 0, hang_after_commit

    def find(self, request_id: str) -> Optional[dict[str, object]]:
        """The provider's authoritative read: the refund made under this idempotency key, if any."""
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT id, order_id, amount FROM refunds WHERE request_id = ?", (request_id,)).fetchone()
        return None if row is None else {"refund_id": f"r-{row[0]}", "order_id": row[1], "amount": row[2]}


def refund_tool(provider: Provider, sessions: list[str]) -> Any:
    """The agent's refund tool over `provider`: the framework's plain `@tool`."""

    @tool
    def refund_order(order_id: int, amount: int, ctx: FunctionInvocationContext) -> dict[str, object]:
        """Refund an order."""
        from once.adapters.agent_framework import PROVIDER_KEY

        # Under once, the dispatch's provider key is the provider's idempotency key; a plain call has none.
        receipt = provider.refund(order_id, amount, ctx.kwargs.get(PROVIDER_KEY))
        if provider.hang_after_commit is not None:
            provider.hang_after_commit.write_text(json.dumps({"sessions": sessions}), encoding="utf-8")
            time.sleep(3600)  # the test SIGKILLs the process here: committed, not yet checkpointed
        return receipt

    return refund_order


@executor(id="intake")
async def intake(text: str, ctx: WorkflowContext[AgentExecutorRequest]) -> None:
    """The first superstep: hands the request to the agent (its checkpoint is what a restore starts from)."""
    await ctx.send_message(AgentExecutorRequest(messages=[Message(role="user", contents=[text])]))


def workflow(directory: Path, ledger_at: Optional[str], hang: bool,
             with_lookup: bool = True) -> tuple[Workflow, FileCheckpointStorage, list[str]]:
    """The checkpointed workflow, its storage, and the agent sessions the protected tool's keys were formed in."""
    provider = Provider(directory / "provider.db", directory / "committed" if hang else None)
    sessions: list[str] = []
    refund: Any = refund_tool(provider, sessions)
    if ledger_at is not None:
        import once
        from once.adapters.agent_framework import session_scope, protect_tool

        def lookup(tool_name: str, provider_key: str, args: str) -> once.Evidence:
            found = provider.find(provider_key)
            return once.Evidence.confirmed(found) if found else once.Evidence.absent(ledger.now())

        opened = once.Once.postgres if ledger_at.startswith("postgres") else once.Once.sqlite
        # Without a lookup the call waits its whole `wait` for a read that cannot come: kept short.
        ledger = opened(ledger_at, lookup=lookup if with_lookup else None, wait=20 if with_lookup else 1,
                        settings={"clock_skew_ms": 0},
                        policies={"refund_order": once.Policy(dispatch_timeout_ms=300, max_in_flight_ms=500,
                                                              reconcile_interval_ms=100, lookup=with_lookup)})

        def key(args: dict[str, Any], ctx: FunctionInvocationContext) -> str:
            sessions.append(session_scope(ctx))
            return f"{ctx.kwargs['case_id']}/refund-{args['order_id']}"

        refund = protect_tool(ledger, refund, key=key)
    agent = Agent(client=ScriptedChatClient(refund_once_then_answer), name="refunder", tools=[refund])
    storage = FileCheckpointStorage(str(directory / "checkpoints"))
    built = (WorkflowBuilder(name="refunds", start_executor=intake, checkpoint_storage=storage)
             .add_edge(intake, AgentExecutor(agent, id="refunder")).build())
    return built, storage, sessions


async def main() -> int:
    directory, with_once, phase = Path(sys.argv[1]), sys.argv[2].startswith("once"), sys.argv[3]
    ledger_at = (sys.argv[4] if len(sys.argv) > 4 else str(directory / "once.db")) if with_once else None
    built, storage, sessions = workflow(directory, ledger_at, hang=phase == "first",
                                        with_lookup=sys.argv[2] != "once-without-lookup")
    if phase == "first":
        await built.run("refund order 1234", function_invocation_kwargs={"case_id": "case-42"})
        return 1  # unreachable: the tool hangs until killed
    latest = await storage.get_latest(workflow_name="refunds")
    assert latest is not None, "no checkpoint to resume from"
    result = await built.run(checkpoint_id=latest.checkpoint_id)
    texts = [o.text for o in result.get_outputs()]
    print(json.dumps({"outputs": texts, "sessions": sessions, "restored_iteration": latest.iteration_count}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
