"""LangChain tools (and so LangGraph nodes): a `BaseTool` / `@tool` whose every call is a protected call.

    from once.adapters.langchain import protect_tool

    safe_refund = protect_tool(once, refund_order)  # refund_order: a @tool or any BaseTool

The scope defaults to the run's `thread_id` (`config["configurable"]`), and
the key to `key(args, config)`, else one derived from the arguments: never a
tool-call id. A LangGraph node re-run by its `RetryPolicy` or replayed from
a checkpoint calls the tool again with the same thread and arguments, so it
replays the stored receipt instead of sending twice. When the effect did not
(yet) happen the tool raises `once.Unconfirmed` with the guest's account.
The tool's outputs must be JSON-serializable (they are the stored receipt).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from ..client import Once
from ..errors import Refused
from ..model import Dispatch, Policy, Sent
from ..protect import DEFAULT_SCOPE, result_of

KeyOf = Callable[[dict[str, Any], RunnableConfig], Optional[str]]
ScopeOf = Union[str, Callable[[RunnableConfig], str], None]


def thread_scope(config: RunnableConfig) -> str:
    """The run's LangGraph thread id, else the default scope."""
    configurable = config.get("configurable") or {}
    return str(configurable.get("thread_id") or DEFAULT_SCOPE)


def protect_tool(once: Once, tool: BaseTool, *, key: Optional[KeyOf] = None, scope: ScopeOf = None,
                 policy: Optional[Policy] = None, **fields: Any) -> StructuredTool:
    """A tool with `tool`'s name, description and schema whose calls are protected by `once`."""
    if policy is not None or fields:
        once.policy(tool.name, policy, **fields)

    def arguments_and_identity(kwargs: dict[str, Any], config: RunnableConfig) -> tuple[str, Optional[str]]:
        k = key(kwargs, config) if key is not None else None
        sc = scope(config) if callable(scope) else (scope or thread_scope(config))
        return sc, k

    def refused(e: Refused) -> Sent:
        return Sent.rejected(str(e) or type(e).__name__)

    def run(config: RunnableConfig, **kwargs: Any) -> Any:
        sc, k = arguments_and_identity(kwargs, config)

        def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(tool.invoke(d.arguments()))
            except Refused as e:
                return refused(e)

        return result_of(once.call(sc, k, tool.name, kwargs, send))

    async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
        sc, k = arguments_and_identity(kwargs, config)

        async def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(await tool.ainvoke(d.arguments()))
            except Refused as e:
                return refused(e)

        return result_of(await once.acall(sc, k, tool.name, kwargs, send))

    return StructuredTool.from_function(
        func=run, coroutine=arun, name=tool.name, description=tool.description, args_schema=tool.args_schema,
        infer_schema=False,
    )
