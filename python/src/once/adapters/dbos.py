"""DBOS durable workflows: a step whose side effect is a protected call, keyed by the workflow's own identity.

    from dbos import DBOS
    from once.adapters.dbos import protected_step

    @DBOS.step(retries_allowed=True)
    @protected_step(once)
    def refund_order(order_id: int, amount: int) -> dict:
        return provider.refund(order_id, amount)

DBOS runs a step again when the step's completion was never recorded: after a crash (the recovered workflow runs
the step again) and on each of the step's own retries. Neither knows whether the first run's effect happened.
The operation key is therefore DBOS's stable identity of the step, `"<workflow id>/<step id>/<tool>"`: the
workflow id (`DBOS.workflow_id`, the same across recovery), the step's position in the workflow
(`DBOS.step_id`, DBOS's function id, deterministic because the workflow is) and the tool's name (default: the
function's `__qualname__`, as DBOS names a step). It is never taken from the step's arguments or from anything
a model mints, so a re-run of the same step is the same operation and meets its record instead of sending again;
the tool's identity is `required`. The scope defaults to `"dbos"`.

The once ledger is not DBOS's system database: it is the `Once` handle's own ledger (SQLite or PostgreSQL),
written before the provider is called and after it answers, which DBOS's step record cannot be (DBOS records a
step only once it has returned). A step killed after the provider committed and before DBOS recorded it leaves
the once record in flight; the re-run waits for its lease, finds it unknown and reconciles it through the
handle's `lookup` (the provider's authoritative read): confirmed, the stored receipt is returned and nothing is
sent again. Without a lookup the record stays unknown and the step raises `UnconfirmedStep` with once's own
account (never a claim that nothing happened); nothing is sent again until it is resolved.

When the effect did not (yet) happen, the step raises `UnconfirmedStep`, a plain exception DBOS can record and
retry (its retries meet the same record); `unconfirmed_as_text=True` returns once's account as the step's output
instead (for a step that is an agent's tool, whose model should read it; DBOS then records that text as the
step's result and does not run the step again).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Union

from dbos import DBOS

from ..client import Once
from ..errors import InvalidRequest, OnceError, Refused
from ..model import Called, Dispatch, Effect, Policy, Sent
from ..protect import adapter_identity, binder, receipt_or_text

ScopeOf = Union[str, Callable[..., str]]
DEFAULT_DBOS_SCOPE = "dbos"


class UnconfirmedStep(OnceError):
    """A protected step's effect is not confirmed (unknown, in flight, conflict, blocked, rejected, not sent).

    The message is once's account of the call (`called.describe()`). Only plain values are kept when DBOS
    pickles it into its system database; `called` is the full account in the process that raised it.
    """

    def __init__(self, text: str, key: Optional[str] = None, effect: str = Effect.UNKNOWN.value,
                 called: Optional[Called] = None) -> None:
        super().__init__(text)
        self.key = key
        self.effect = effect
        self.called = called

    def __reduce__(self) -> Any:
        # DBOS pickles a step's exception; the account (with its live `raised` exception) stays in this process.
        return (type(self), (str(self), self.key, self.effect))


def step_key(tool: str) -> str:
    """The operation key of the DBOS step running now: `"<workflow id>/<step id>/<tool>"`.

    Raises `once.InvalidRequest` outside a DBOS step: a plain call of the function has no stable identity, and
    none is made up for it.
    """
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    if workflow_id is None or step_id is None:
        raise InvalidRequest(
            f"tool {tool!r}: called outside a DBOS workflow step, so there is no workflow id and step id to key "
            f"it by; decorate it with @DBOS.step() (above @protected_step) and call it from a @DBOS.workflow()"
        )
    return f"{workflow_id}/{step_id}/{tool}"


def protected_step(once: Once, tool: Optional[str] = None, *, scope: ScopeOf = DEFAULT_DBOS_SCOPE,
                   unconfirmed_as_text: bool = False, policy: Optional[Policy] = None,
                   **fields: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a function (sync or async) a protected call keyed by the DBOS step it runs in; put `@DBOS.step()`
    above it.

    `tool`: the tool's name (default: the function's `__qualname__`, DBOS's default step name). `scope`: a string
    or a callable of the function's arguments (default `"dbos"`). `unconfirmed_as_text`: return once's account
    instead of raising `UnconfirmedStep` when the effect did not (yet) happen. `policy` / keyword fields: the
    tool's policy, checked by the guest now (its identity is `required`). The function's bound arguments are the
    call's args and its return value the receipt; raise `once.Refused` for a definite rejection.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = tool or fn.__qualname__
        adapter_identity(once, name, key=step_key, derive_key_from=None, policy=policy, fields=fields,
                         key_hint="(the DBOS step's identity)")
        bind = binder(inspect.signature(fn))

        def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
            arguments = bind(a, kw)
            sc = scope(**arguments) if callable(scope) else scope
            return sc, step_key(name), arguments

        def output(called: Called, key: str) -> Any:
            if called.effect is Effect.HAPPENED or called.direct is not None:
                return receipt_or_text(called)
            if unconfirmed_as_text:
                return called.describe()
            raise UnconfirmedStep(called.describe(), key, called.effect.value, called) from called.raised

        def refused(e: Refused) -> Sent:
            return Sent.rejected(str(e) or type(e).__name__)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def protected_async(*a: Any, **kw: Any) -> Any:
                sc, key, arguments = prepare(a, kw)

                async def send(d: Dispatch) -> Sent:
                    try:
                        return Sent.returned(await fn(**d.arguments()))
                    except Refused as e:
                        return refused(e)

                return output(await once.acall(sc, key, name, arguments, send), key)

            return protected_async

        @functools.wraps(fn)
        def protected(*a: Any, **kw: Any) -> Any:
            sc, key, arguments = prepare(a, kw)

            def send(d: Dispatch) -> Sent:
                try:
                    return Sent.returned(fn(**d.arguments()))
                except Refused as e:
                    return refused(e)

            return output(once.call(sc, key, name, arguments, send), key)

        return protected

    return wrap
