"""LangChain tools (and so LangGraph nodes and the prebuilt agent): a `BaseTool` / `@tool` whose every call is a
protected call.

    from once.adapters.langchain import protect_tool

    safe_refund = protect_tool(once, refund_order,  # refund_order: a @tool or any BaseTool
                               key=lambda args, config: f"refund-{args['order_id']}")

The operation key is the application's: `key(args, config)`, the same on every retry and never a tool-call id.
Wrapping a tool without one raises `once.InvalidRequest`; a key derived from the arguments is an explicit opt-in
that names the effect-bearing fields, `derive_key_from=["/order_id", "/amount"]` (JSON pointers: the tool's
policy gets `identity=derived` and those `effect_fields`, so an argument outside them, such as a fresh
`request_id` the model mints per call, can never make a second operation). With `key`, the tool's identity is
`required`: a `key` that returns None is `blocked(identity-required)`.

The scope defaults to the run's `thread_id` (`config["configurable"]`). A LangGraph node re-run by its
`RetryPolicy` or replayed from a checkpoint calls the tool again with the same thread and arguments, so it
replays the stored receipt instead of sending twice. The tool's output is the stored receipt (projected to JSON
as for `@once.protect`). When the effect did not (yet) happen (unknown, in flight, conflict, blocked, rejected,
not sent) the tool raises a `ToolException` whose text is once's account of the call (`called.describe()`), and
the tool handles it (`handle_tool_error=True`): the output is that text, in a `ToolMessage` with
`status="error"` under `ToolNode` / `create_react_agent`, so the model reads it and the run goes on.
`raise_unconfirmed=True` raises `once.Unconfirmed` instead (a graph node that wants to stop or branch).

Durable execution (a graph compiled with a checkpointer, resumed after a crash): `step_key(config, "refund")` is
a key from the engine's own identities, the node's name and its superstep number (and, for a `Send`, its index),
within the thread (the scope). After a crash LangGraph re-runs the interrupted task with the same step and node,
whether it resumes from the checkpoint (`durability="sync"` / `"async"`) or the request is run again because
nothing was saved (`durability="exit"`); the task id is not used because it changes in the latter case.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from ..client import Once
from ..errors import Refused, Unconfirmed
from ..model import Called, Dispatch, Effect, Policy, Sent
from ..protect import DEFAULT_SCOPE, adapter_identity, receipt_or_text, result_of

KeyOf = Callable[[dict[str, Any], RunnableConfig], Optional[str]]
ScopeOf = Union[str, Callable[[RunnableConfig], str], None]


def thread_scope(config: RunnableConfig) -> str:
    """The run's LangGraph thread id, else the default scope."""
    configurable = config.get("configurable") or {}
    return str(configurable.get("thread_id") or DEFAULT_SCOPE)


def step_key(config: RunnableConfig, *parts: object) -> Optional[str]:
    """The operation key of the LangGraph task running this call, for `protect_tool(key=lambda args, config: ...)`.

    `"<node>@<step>"` (the task's node and superstep; a `Send`'s or a functional `@task`'s path is appended),
    then `parts` joined with `/`: name the operation (`step_key(config, "refund")`) and add a part of yours when one
    task makes more than one call of the tool. The thread is the scope (`protect_tool`'s default), so the key is
    unique per thread, superstep and task. These values are what LangGraph recomputes for the same task after a
    crash, from the last checkpoint or from the same input run again; the task id is not part of the key because
    without a saved checkpoint (`durability="exit"`) the re-run gets a new one, and a model's tool-call id never is,
    because a re-run model mints another.

    None (so the protected call is `blocked(identity-required)`, nothing sent) outside a LangGraph task, in a graph
    compiled without a checkpointer, or inside a subgraph. Without a checkpointer every invocation starts again at
    step 1, so a second invocation on the thread would get the first one's key and its receipt instead of its own
    effect. A subgraph's steps restart at each invocation and its namespace is told apart only by the parent's task
    id, so no key of its own is stable across a crash and a second invocation at once. Give such a call a key from
    your own identities.
    """
    metadata = config.get("metadata") or {}
    node, step, path = metadata.get("langgraph_node"), metadata.get("langgraph_step"), metadata.get("langgraph_path")
    namespace = str(metadata.get("langgraph_checkpoint_ns") or "")
    # LangGraph's CONFIG_KEY_CHECKPOINTER (a private constant): the step numbers go on from the thread's last
    # checkpoint only when there is one.
    checkpointer = (config.get("configurable") or {}).get("__pregel_checkpointer")
    if node is None or not isinstance(step, int) or "|" in namespace or checkpointer is None:
        return None
    key = f"{node}@{step}"
    if isinstance(path, (tuple, list)) and path and path[0] != "__pregel_pull":
        key += ":" + _path_text(path[1:])
    return "/".join([key, *(str(p) for p in parts)])


def _path_text(path: object) -> str:
    # A push task's path: the Send's index, or for a functional @task the caller's path and the call's index.
    if isinstance(path, (tuple, list)):
        return "(" + ",".join(_path_text(p) for p in path) + ")"
    return str(path)


def protect_tool(once: Once, tool: BaseTool, *, key: Optional[KeyOf] = None,
                 derive_key_from: Optional[Sequence[str]] = None, scope: ScopeOf = None,
                 raise_unconfirmed: bool = False, policy: Optional[Policy] = None, **fields: Any) -> StructuredTool:
    """A tool with `tool`'s name, description and schema whose calls are protected by `once`.

    `key(args, config)` returns the application's operation key; or `derive_key_from` names the effect fields a
    derived key covers (one of the two is required: `once.InvalidRequest` otherwise). `scope`: a string or a
    callable of the config (default: the run's `thread_id`). `raise_unconfirmed`: raise `once.Unconfirmed` when
    the effect did not (yet) happen, instead of handing once's text to the model. `policy` / keyword fields: the
    tool's policy, checked by the guest now.
    """
    adapter_identity(once, tool.name, key=key, derive_key_from=derive_key_from, policy=policy, fields=fields,
                     key_hint="lambda args, config: ...")

    def identity(kwargs: dict[str, Any], config: RunnableConfig) -> tuple[str, Optional[str]]:
        k = key(kwargs, config) if key is not None else None
        sc = scope(config) if callable(scope) else (scope or thread_scope(config))
        return sc, k

    def refused(e: Refused) -> Sent:
        return Sent.rejected(str(e) or type(e).__name__)

    def output(called: Called) -> Any:
        if raise_unconfirmed:
            return result_of(called)
        if called.effect is Effect.HAPPENED or called.direct is not None:
            return receipt_or_text(called)
        # Handled by the tool itself (handle_tool_error below): the model reads once's account, the run goes on,
        # and ToolNode marks the message an error, so no framework takes it for the tool's result.
        error = ToolException(called.describe())
        error.__cause__ = Unconfirmed(called)
        raise error

    def run(config: RunnableConfig, **kwargs: Any) -> Any:
        sc, k = identity(kwargs, config)

        def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(tool.invoke(d.arguments()))
            except Refused as e:
                return refused(e)

        return output(once.call(sc, k, tool.name, kwargs, send))

    async def arun(config: RunnableConfig, **kwargs: Any) -> Any:
        sc, k = identity(kwargs, config)

        async def send(d: Dispatch) -> Sent:
            try:
                return Sent.returned(await tool.ainvoke(d.arguments()))
            except Refused as e:
                return refused(e)

        return output(await once.acall(sc, k, tool.name, kwargs, send))

    return StructuredTool.from_function(
        func=run, coroutine=arun, name=tool.name, description=tool.description, args_schema=tool.args_schema,
        infer_schema=False, handle_tool_error=True,
    )
