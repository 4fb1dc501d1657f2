"""The OpenAI Agents SDK: a `function_tool` whose every invocation is a protected call.

    from once.adapters.openai_agents import protected_function_tool

    refund = protected_function_tool(once, refund_order, key=lambda ctx, args: ctx.context.key_for(args))

The operation key is the application's, through the run context (`key(ctx, args)`): never the model's
`tool_call_id`, which changes on every retry of the model. Wrapping a function without one raises
`once.InvalidRequest`; a key derived from the arguments is an explicit opt-in that names the effect-bearing
fields, `derive_key_from=["/order_id", "/amount"]` (JSON pointers: the tool's policy gets `identity=derived` and
those `effect_fields`, so an argument outside them can never make a second operation). With `key`, the tool's
identity is `required`: a `key` that returns None is `blocked(identity-required)`.

The model's arguments are parsed and validated with the SDK's own schema of the function (`function_schema`, the
pydantic model `function_tool` validates with) before anything is begun: arguments the SDK rejects (malformed
JSON, `"amount": "300 EUR"` for an `int`) record nothing, and the model gets the SDK's usual tool-error text
(`default_tool_error_function`), so it can call again, as with a plain `function_tool`. What is recorded and
dispatched are the validated arguments, in their JSON form (pydantic's `model_dump(mode="json")`): `"300"` and
`300` for an `int` are one operation. The SDK's own invocation of the function is the dispatch; its errors are
not turned into text (that would look like a success): a raise is an ambiguous outcome, `once.Refused` a
rejection. The model is shown the receipt when the effect happened, else once's own account of the call
(`called.describe()`: unknown, in flight, conflict, blocked, ...), and the run goes on.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence, Union

from agents import FunctionTool, ModelBehaviorError, RunContextWrapper, default_tool_error_function, function_tool
from agents.function_schema import function_schema
from pydantic import ValidationError

from ..client import Once
from ..errors import InvalidRequest, Refused
from ..model import Dispatch, Policy, Sent
from ..protect import DEFAULT_SCOPE, adapter_identity, receipt_or_text

KeyOf = Callable[[RunContextWrapper[Any], dict[str, Any]], Optional[str]]
ScopeOf = Union[str, Callable[[RunContextWrapper[Any]], str], None]


def protected_function_tool(once: Once, fn: Callable[..., Any], *, key: Optional[KeyOf] = None,
                            derive_key_from: Optional[Sequence[str]] = None, scope: ScopeOf = None,
                            name: Optional[str] = None, policy: Optional[Policy] = None,
                            **fields: Any) -> FunctionTool:
    """`function_tool(fn)` with each invocation protected by `once`.

    `key(ctx, args)` returns the application's operation key; or `derive_key_from` names the effect fields a
    derived key covers (one of the two is required: `once.InvalidRequest` otherwise). `scope`: a string or a
    callable of the run context (default: "default"). `policy` / keyword fields: the tool's policy, checked by the
    guest now.
    """
    tool = function_tool(fn, name_override=name, failure_error_function=None)
    # The same schema function_tool built its validation from; checked equal, so what passes here passes there.
    schema = function_schema(fn, name_override=name)
    if schema.params_json_schema != tool.params_json_schema:
        raise InvalidRequest(f"tool {tool.name!r}: function_schema and function_tool disagree on the parameters")
    adapter_identity(once, tool.name, key=key, derive_key_from=derive_key_from, policy=policy, fields=fields,
                     key_hint="lambda ctx, args: ...")
    invoke = tool.on_invoke_tool

    def validated(input_json: str) -> dict[str, Any]:
        """The arguments as the function will receive them, in JSON form; `ModelBehaviorError` as the SDK raises."""
        message = f"Invalid JSON input for tool {tool.name}"
        try:
            raw = json.loads(input_json) if input_json else {}
        except ValueError as e:
            raise ModelBehaviorError(f"{message}: {input_json}") from e
        if not isinstance(raw, dict):
            raise ModelBehaviorError(f"{message}: expected a JSON object")
        try:
            parsed = schema.params_pydantic_model(**raw)
        except ValidationError as e:
            raise ModelBehaviorError(f"{message}: {e}") from e
        args: dict[str, Any] = parsed.model_dump(mode="json")
        return args

    async def protected(ctx: Any, input_json: str) -> Any:
        try:
            args = validated(input_json)
        except ModelBehaviorError as e:
            # The function never ran and nothing was begun: the model gets the SDK's usual text and may call again.
            return default_tool_error_function(ctx, e)
        k = key(ctx, args) if key is not None else None
        sc = scope(ctx) if callable(scope) else (scope or DEFAULT_SCOPE)

        async def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(await invoke(ctx, d.args))
            except Refused as e:
                return Sent.rejected(str(e) or type(e).__name__)

        return receipt_or_text(await once.acall(sc, k, tool.name, args, send))

    tool.on_invoke_tool = protected
    return tool
