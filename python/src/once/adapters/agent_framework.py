"""Microsoft Agent Framework (`agent-framework-core`): a `FunctionTool` whose every invocation is a protected call.

    from once.adapters.agent_framework import protect_tool

    safe_refund = protect_tool(once, refund_order,  # refund_order: a @tool (FunctionTool) or a plain function
                               key=lambda args, ctx: f"{ctx.kwargs['case_id']}/refund-{args['order_id']}")

Why: a workflow restored from a checkpoint re-runs the whole superstep that was under way, so an `AgentExecutor`
whose turn crashed after a tool's effect runs the agent's turn again, and the model calls the tool again with a new
call id (microsoft/agent-framework#3938). The operation key must therefore come from what survives the restore,
never from the model's `call_id`:

- the application's key: `key(args, ctx)`, where `ctx` is the framework's `FunctionInvocationContext`. Its
  `ctx.kwargs` are the run's `function_invocation_kwargs` (`workflow.run(..., function_invocation_kwargs=...)`),
  which the workflow keeps in its state and so in every checkpoint: a restored run sees the same values. Wrapping
  a tool without `key` raises `once.InvalidRequest`; `derive_key_from=["/order_id", "/amount"]` (JSON pointers)
  is the explicit opt-in to a key derived from the effect-bearing arguments only.
- the scope: `scope=`, a string or a function of `ctx`, else "default"; the key itself carries the run's identity.
  `scope=session_scope` scopes keys by the agent's session id (`ctx.session.session_id`): an `AgentExecutor` saves
  its session in each checkpoint and restores it, so the id survives a restore; but a new run of the workflow (not
  a restore) has a new session, so only use it when each run is an operation of its own.

The tool keeps the wrapped tool's name, description, input schema and approval mode. The arguments are validated
by the framework with that schema before the protected call begins; what is recorded and dispatched is their JSON
form (the input model's `model_dump(mode="json")`, defaults included), and the dispatch is the wrapped tool's own
`invoke` with those arguments. A wrapped tool that takes a `FunctionInvocationContext` finds the dispatch's
provider key in `ctx.kwargs[PROVIDER_KEY]`: send it as the provider's idempotency key and read the effect back by it
in your `lookup`. The model is shown the stored receipt when the effect happened (also on every replay), else
once's own account of the call (`called.describe()`: unknown, in flight, conflict, blocked, rejected, not sent) as
the tool's result, so the run goes on and nothing claims more than the ledger knows. A raise from the wrapped tool
is an ambiguous outcome (the effect may exist); `once.Refused` is a rejection.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from agent_framework import FunctionInvocationContext, FunctionTool
from agent_framework import tool as as_tool

from ..client import Once
from ..errors import InvalidRequest, Refused
from ..model import Dispatch, Policy, Sent
from ..protect import DEFAULT_SCOPE, adapter_identity, receipt_or_text

PROVIDER_KEY = "once_provider_key"
"""The runtime kwarg (`ctx.kwargs[PROVIDER_KEY]`) that hands the wrapped tool its dispatch's provider key, the same
on every attempt of the operation: send it as the provider's idempotency key, and look the effect up by it."""

KeyOf = Callable[[dict[str, Any], FunctionInvocationContext], Optional[str]]
ScopeOf = Union[str, Callable[[FunctionInvocationContext], str], None]


def session_scope(ctx: FunctionInvocationContext) -> str:
    """The invoking agent's session id (checkpointed and restored by its `AgentExecutor`), else the default scope.

    For `protect_tool(..., scope=session_scope)`: the same before and after a checkpoint restore, a new one for a
    new run of the workflow.
    """
    session = ctx.session
    session_id = getattr(session, "session_id", None) if session is not None else None
    return str(session_id) if session_id else DEFAULT_SCOPE


def protect_tool(once: Once, tool: Union[FunctionTool, Callable[..., Any]], *, key: Optional[KeyOf] = None,
                 derive_key_from: Optional[Sequence[str]] = None, scope: ScopeOf = None,
                 policy: Optional[Policy] = None, **fields: Any) -> FunctionTool:
    """A `FunctionTool` with `tool`'s name, description and schema whose invocations are protected by `once`.

    `tool`: a `FunctionTool` (`@tool`) or a plain function (made one with the framework's `tool`). `key(args, ctx)`
    returns the application's operation key from the validated arguments and the `FunctionInvocationContext`
    (`ctx.kwargs`: the run's checkpointed `function_invocation_kwargs`); or `derive_key_from` names the effect
    fields a derived key covers (one of the two is required: `once.InvalidRequest` otherwise). `scope`: a string
    or a function of `ctx` (default: "default"; `session_scope` for the agent's session). `policy` / keyword
    fields: the tool's policy, checked by the guest now.
    """
    inner = tool if isinstance(tool, FunctionTool) else as_tool(tool)
    if inner.declaration_only:
        raise InvalidRequest(f"tool {inner.name!r}: a declaration-only tool has no effect to protect")
    adapter_identity(once, inner.name, key=key, derive_key_from=derive_key_from, policy=policy, fields=fields,
                     key_hint="lambda args, ctx: ...")
    model = inner.input_model

    def as_json(arguments: dict[str, Any]) -> dict[str, Any]:
        """The validated arguments in JSON form, defaults included, so equal calls are one fingerprint."""
        if model is None:  # a JSON-schema tool: the framework hands over the parsed JSON values as they are
            return dict(arguments)
        dumped: dict[str, Any] = model.model_validate(arguments).model_dump(mode="json")
        return dumped

    async def protected(ctx: FunctionInvocationContext, **arguments: Any) -> Any:
        args = as_json(arguments)
        k = key(args, ctx) if key is not None else None
        sc = scope(ctx) if callable(scope) else (scope or DEFAULT_SCOPE)

        async def send(d: Dispatch) -> Sent:
            try:
                # The wrapped tool's own invocation (its validation, its context parameter), raw value back. A
                # context of its own, so the framework's (its prepared arguments, its approval marks) is untouched.
                own = FunctionInvocationContext(function=inner, arguments=d.arguments(), session=ctx.session,
                                                kwargs={**ctx.kwargs, PROVIDER_KEY: d.provider_key}, tools=ctx.tools,
                                                parent_service_session_state_keys=ctx.parent_service_session_state_keys)
                return Sent.returned(await inner.invoke(arguments=d.arguments(), context=own, skip_parsing=True))
            except Refused as e:
                return Sent.rejected(str(e) or type(e).__name__)

        return receipt_or_text(await once.acall(sc, k, inner.name, args, send))

    schema: Any = model if model is not None else inner.parameters()
    wrapped = FunctionTool(name=inner.name, description=inner.description, approval_mode=inner.approval_mode,
                           kind=inner.kind, additional_properties=dict(inner.additional_properties or {}),
                           func=protected, input_model=schema)
    if wrapped.parameters() != inner.parameters():
        raise InvalidRequest(f"tool {inner.name!r}: the protected tool's schema differs from the wrapped tool's")
    return wrapped
