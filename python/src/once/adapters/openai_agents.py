"""The OpenAI Agents SDK: a `function_tool` whose every invocation is a protected call.

    from once.adapters.openai_agents import protected_function_tool

    refund = protected_function_tool(once, refund_order, key=lambda ctx, args: ctx.context.key_for(args))

The operation key comes from the application, through the run context
(`key(ctx, args)`), or is derived from the arguments (`key=None`): never
from the model's `tool_call_id`, which changes on every retry of the model.
The SDK's own invocation (argument parsing, the function) is the dispatch;
its errors are not turned into text for the model (that would look like a
success): a raise is an ambiguous outcome, `once.Refused` a rejection.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Union

from agents import FunctionTool, RunContextWrapper, function_tool

from ..client import Once
from ..errors import Refused
from ..model import Dispatch, Policy, Sent
from ..protect import DEFAULT_SCOPE

KeyOf = Callable[[RunContextWrapper[Any], dict[str, Any]], Optional[str]]
ScopeOf = Union[str, Callable[[RunContextWrapper[Any]], str], None]


def protected_function_tool(once: Once, fn: Callable[..., Any], *, key: Optional[KeyOf] = None,
                            scope: ScopeOf = None, name: Optional[str] = None, policy: Optional[Policy] = None,
                            **fields: Any) -> FunctionTool:
    """`function_tool(fn)` with each invocation protected by `once` (policy as a `Policy` or keywords)."""
    tool = function_tool(fn, name_override=name, failure_error_function=None)
    if policy is not None or fields:
        once.policy(tool.name, policy, **fields)
    invoke = tool.on_invoke_tool

    async def protected(ctx: Any, input_json: str) -> Any:
        args = json.loads(input_json) if input_json.strip() else {}
        k = key(ctx, args) if key is not None else None
        sc = scope(ctx) if callable(scope) else (scope or DEFAULT_SCOPE)

        async def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(await invoke(ctx, d.args))
            except Refused as e:
                return Sent.rejected(str(e) or type(e).__name__)

        called = await once.acall(sc, k, tool.name, args, send)
        receipt = called.receipt
        if receipt is not None and called.effect.value == "happened":
            return json.loads(receipt)
        # What the model is told is the guest's account, not a guess.
        return f"not done: {called.describe()}"

    tool.on_invoke_tool = protected
    return tool
