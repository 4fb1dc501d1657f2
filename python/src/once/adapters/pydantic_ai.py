"""Pydantic AI: a `Tool` whose every call, once Pydantic AI has validated its arguments, is a protected call.

    from once.adapters.pydantic_ai import protected_tool

    refund = protected_tool(once, refund_order,  # a function (plain or taking RunContext) or a `Tool`
                            key=lambda args, ctx: ctx.deps.key_for(args["order_id"]))
    agent = Agent(model, deps_type=Conversation, tools=[refund])

The operation key is the application's: `key(args, ctx)`, from the validated arguments and the `RunContext`
(typically `ctx.deps`, where the application keeps its conversation or order), the same on every retry and never
the model's `tool_call_id`, which is fresh on every call. Wrapping a tool without one raises
`once.InvalidRequest`; a key derived from the arguments is an explicit opt-in that names the effect-bearing
fields, `derive_key_from=["/order_id", "/amount"]` (JSON pointers: the tool's policy gets `identity=derived` and
those `effect_fields`, so an argument outside them can never make a second operation). With `key`, the tool's
identity is `required`: a `key` that returns None is `blocked(identity-required)`.

The tool keeps its name, description, schema and settings. Pydantic AI validates the model's arguments (and runs
the tool's `args_validator`) before the protected call begins, so arguments it rejects record nothing and the
model gets Pydantic AI's usual retry prompt. What is recorded is the validated arguments in their JSON form;
what is dispatched is the recorded arguments validated again by the tool's own schema (as Pydantic AI's durable
engines do after a JSON boundary), so a dispatch after a restart, or one whose key argument once replaced,
calls the function exactly as an in-process call would.

When the effect happened the model gets the stored receipt (projected to JSON as for `@once.protect`). Otherwise
(unknown, in flight, conflict, blocked, rejected, not sent) the tool raises Pydantic AI's `ToolFailed` with
once's own account of the call (`called.describe()`): a failed tool result, not a `ModelRetry` one (which asks
for the call again with corrected arguments and spends the tool's retry budget), because what the model should do
next is what once's text says (the same call again waits, or is reconciled), never a call with other arguments.
Once dispatched, the function's exceptions (`ModelRetry` and `ToolFailed` included) are not taken as "nothing
happened": a raise is an ambiguous outcome, `once.Refused` a definite rejection; a check that should send the model
back to correct its arguments belongs in the tool's `args_validator`, which runs before the call begins. Recorded
arguments that the tool's schema rejects at dispatch (a key argument whose type the provider key does not fit) are
not sent.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

from pydantic import ValidationError
from pydantic_ai import RunContext, Tool
from pydantic_ai.exceptions import ToolFailed
from pydantic_core import to_jsonable_python

from ..client import Once
from ..errors import Refused
from ..model import Called, Dispatch, Effect, Policy, Sent
from ..protect import DEFAULT_SCOPE, adapter_identity, receipt_or_text

KeyOf = Callable[[dict[str, Any], RunContext[Any]], Optional[str]]
ScopeOf = Union[str, Callable[[RunContext[Any]], str], None]


def protected_tool(once: Once, tool: Union[Tool[Any], Callable[..., Any]], *, key: Optional[KeyOf] = None,
                   derive_key_from: Optional[Sequence[str]] = None, scope: ScopeOf = None,
                   policy: Optional[Policy] = None, **fields: Any) -> Tool[Any]:
    """A Pydantic AI `Tool` with `tool`'s name, description, schema and settings whose calls are protected by `once`.

    `tool`: a function as `Agent(tools=[...])` takes it (plain, or taking `RunContext` first), or a `Tool` (its
    settings are kept; the given `Tool` is not changed). `key(args, ctx)` returns the application's operation key
    from the validated arguments (JSON form) and the run context; or `derive_key_from` names the effect fields a
    derived key covers (one of the two is required: `once.InvalidRequest` otherwise). `scope`: a string or a
    callable of the run context (default: "default"). `policy` / keyword fields: the tool's policy, checked by the
    guest now.
    """
    base: Tool[Any] = tool if isinstance(tool, Tool) else Tool(tool)
    name = base.name
    adapter_identity(once, name, key=key, derive_key_from=derive_key_from, policy=policy, fields=fields,
                     key_hint="lambda args, ctx: ...")
    schema = base.function_schema

    def arguments(positional: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The validated arguments by name, as Pydantic AI had them before it split out the positional ones."""
        args = dict(zip(schema.positional_fields, positional))
        if schema.var_positional_field is not None:
            args[schema.var_positional_field] = list(positional[len(schema.positional_fields):])
        args.update(kwargs)
        return args

    async def run(ctx: RunContext[Any], *positional: Any, **kwargs: Any) -> Any:
        validated = arguments(positional, kwargs)
        # The JSON form is what is recorded and fingerprinted, and what the key function reads: a `Json` argument
        # as its text again, so validating it once more (at dispatch) gives the same value.
        args: dict[str, Any] = to_jsonable_python(
            schema.dump_json_parameters(validated, by_alias=None, round_trip=False))
        k = key(args, ctx) if key is not None else None
        sc = scope(ctx) if callable(scope) else (scope or DEFAULT_SCOPE)

        async def send(d: Dispatch) -> Sent:
            # The grant's args (the key argument, if any, already carries the provider key), validated by the
            # tool's own schema as after any JSON boundary; then the function, called as Pydantic AI calls it.
            try:
                again = schema.revalidate(d.arguments(), context=ctx.validation_context)
            except ValidationError:
                # The function was never called: nothing left, and the record says so (not an unknown outcome).
                return Sent.not_sent()
            try:
                return Sent.returned(await schema.call(again, ctx))
            except Refused as e:
                return Sent.rejected(str(e) or type(e).__name__)

        return output(await once.acall(sc, k, name, args, send))

    protected = copy.copy(base)
    protected.function = run
    protected.takes_ctx = True
    # The same validator (so the durable engines still recognise the tool's arguments) and JSON schema; only the
    # function it calls is once's.
    protected.function_schema = dataclasses.replace(schema, function=run, takes_ctx=True, is_async=True)
    return protected


def output(called: Called) -> Any:
    """The tool's result for the model: the receipt when the effect happened, else `ToolFailed` with once's text."""
    if called.effect is Effect.HAPPENED or called.direct is not None:
        return receipt_or_text(called)
    # A failed tool result rather than ModelRetry: ModelRetry asks for the call again with corrected arguments,
    # which after an unknown outcome is the blind retry with other arguments that once exists to prevent.
    raise ToolFailed(called.describe())
