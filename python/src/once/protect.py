"""`@once.protect`: a function (sync or async) as a protected tool.

The call's arguments (bound to the signature, defaults applied) are the
tool's JSON args; the function runs only with the args of a grant, at most
once per grant. Its return value is the provider's receipt; raising
`Refused` is a definite rejection; any other exception is ambiguous (the
effect may exist), and the call ends as the guest decides.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from . import errors
from .model import Called, Dispatch, Effect, IdentityMode, Policy, Sent

if TYPE_CHECKING:
    from .client import Once

_KEY: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("once_operation_key", default=None)
_SCOPE: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("once_scope", default=None)
DEFAULT_SCOPE = "default"


@contextlib.contextmanager
def operation(key: Optional[str] = None, *, scope: Optional[str] = None) -> Iterator[None]:
    """Within this block, protected functions use this application-minted operation key (and scope)."""
    tokens = (_KEY.set(key), _SCOPE.set(scope) if scope is not None else None)
    try:
        yield
    finally:
        _KEY.reset(tokens[0])
        if tokens[1] is not None:
            _SCOPE.reset(tokens[1])


def current_key() -> Optional[str]:
    """The operation key set by the innermost `operation(...)`, if any."""
    return _KEY.get()


def result_of(called: Called) -> Any:
    """What a protected function returns: the receipt's value when the effect happened, else `Unconfirmed`."""
    receipt = called.receipt if called.effect.value == "happened" or called.direct is not None else None
    if receipt is None:
        raise errors.Unconfirmed(called) from called.raised
    return json.loads(receipt)


def receipt_or_text(called: Called) -> Any:
    """What an agent framework's model is shown: the receipt's value when the effect happened, else once's own
    account of the call (`called.describe()`: the ending, the effect, what the same call again would do).

    Never a claim beyond the ledger's: an unknown outcome is reported unknown, not "not done", because the effect
    may well exist.
    """
    receipt = called.receipt if called.effect is Effect.HAPPENED or called.direct is not None else None
    if receipt is None:
        return called.describe()
    return json.loads(receipt)


def adapter_identity(once: Once, tool: str, *, key: Any, derive_key_from: Optional[Sequence[str]],
                     policy: Optional[Policy], fields: dict[str, Any], key_hint: str) -> None:
    """Check a framework adapter's choice of operation identity when a tool is wrapped, and set the tool's policy.

    An adapter needs `key` (the application's key for the operation) or `derive_key_from` (the effect fields the
    key is derived from); never neither, because a key derived from every argument makes a model's retry that
    varies a non-effect field (a fresh `request_id`, a reworded `reason`) a second operation and a second effect.
    With `key`, the tool's identity is `required` unless the policy says otherwise, so a key function that returns
    None is refused by the engine (`blocked(identity-required)`), not silently derived. With `derive_key_from`, the
    tool's identity is `derived` and its `effect_fields` are exactly those pointers: the fingerprint, and so the
    derived key, cover nothing else. The policy set so far for the tool (`Once(policies=...)`, `once.policy`) is
    the base, then `policy`, then the keyword `fields`.
    """
    if key is None and derive_key_from is None:
        raise errors.InvalidRequest(
            f"tool {tool!r}: no operation key. Pass key={key_hint} returning the application's key for this "
            f"operation (the same on every retry; never the model's call id), or opt in to a key derived from the "
            f"effect-bearing arguments with derive_key_from=['/order_id', '/amount'] (JSON pointers)"
        )
    if key is not None and derive_key_from is not None:
        raise errors.InvalidRequest(
            f"tool {tool!r}: both key= and derive_key_from= given; the operation key comes from one of them"
        )
    base = policy if policy is not None else (once.configured(tool) or Policy())
    base = replace(base, **fields)
    if derive_key_from is None:
        if base.identity is None:
            base = replace(base, identity=IdentityMode.REQUIRED)
        once.policy(tool, base, descriptor=once._descriptor(tool))
        return
    if isinstance(derive_key_from, (str, bytes)) or not all(isinstance(p, str) for p in derive_key_from):
        raise errors.InvalidRequest(
            f"tool {tool!r}: derive_key_from must be a list of JSON pointers such as ['/order_id'], "
            f"not {derive_key_from!r}"
        )
    pointers = list(derive_key_from)
    if base.identity is IdentityMode.REQUIRED:
        raise errors.InvalidRequest(
            f"tool {tool!r}: derive_key_from= asks for a derived key, but the tool's policy has identity=required"
        )
    if base.effect_fields is not None and list(base.effect_fields) != pointers:
        raise errors.InvalidRequest(
            f"tool {tool!r}: derive_key_from={pointers!r} differs from the policy's "
            f"effect_fields={list(base.effect_fields)!r}; the derived key covers exactly the effect fields"
        )
    # The guest checks the pointers (syntax, not empty, not the key argument) and names the bad one.
    once.policy(tool, replace(base, identity=IdentityMode.DERIVED, effect_fields=pointers),
                descriptor=once._descriptor(tool))


_PLAIN = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def binder(signature: inspect.Signature) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """`signature.bind(*a, **kw)` with the defaults applied, as a dict in the signature's order.

    For a signature of plain parameters (no positional-only, no `*args` or `**kwargs`) the binding is done
    here, without building a `BoundArguments` per call; any call it cannot bind plainly (a missing or unknown
    argument, too many positional ones), and every other signature, goes through `Signature.bind`, which
    raises its usual `TypeError`.
    """

    def general(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
        bound = signature.bind(*a, **kw)
        bound.apply_defaults()
        return dict(bound.arguments)

    params = list(signature.parameters.values())
    if not all(p.kind in _PLAIN for p in params):
        return general
    names = tuple(p.name for p in params)
    positional = sum(1 for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    missing = object()

    def plain(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
        if len(a) > positional:
            return general(a, kw)
        given = dict(zip(names, a))
        for k, v in kw.items():
            if k in given or k not in names:
                return general(a, kw)
            given[k] = v
        out = {}
        for n in names:
            v = given.get(n, missing)
            if v is missing:
                v = defaults.get(n, missing)
                if v is missing:
                    return general(a, kw)
            out[n] = v
        return out

    return plain


def protect(once: Once, tool: Optional[str] = None, *, key: Any = None, scope: Any = None,
            policy: Optional[Policy] = None, **fields: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make `fn` a protected tool named `tool` (default: its name).

    `key`: an operation key, or a callable of the function's arguments returning one; None: the key of the
    enclosing `operation(...)`, else none (the tool's identity policy decides: derived by default).
    `scope`: a string or a callable of the arguments; None: the enclosing `operation(scope=...)`, else "default".
    `policy` / keyword fields: the tool's policy, checked by the guest now.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = tool or fn.__name__
        if policy is not None or fields:
            once.policy(name, policy, **fields)
        bind = binder(inspect.signature(fn))

        def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, Optional[str], dict[str, Any]]:
            arguments = bind(a, kw)
            k = key(**arguments) if callable(key) else key
            if k is None:
                k = _KEY.get()
            sc = scope(**arguments) if callable(scope) else scope
            return (sc or _SCOPE.get() or DEFAULT_SCOPE), k, arguments

        def refused(e: errors.Refused) -> Sent:
            return Sent.rejected(str(e) or type(e).__name__)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def protected_async(*a: Any, **kw: Any) -> Any:
                sc, k, arguments = prepare(a, kw)

                async def send(d: Dispatch) -> Sent:
                    try:
                        return Sent.returned(await fn(**d.arguments()))
                    except errors.Refused as e:
                        return refused(e)

                return result_of(await once.acall(sc, k, name, arguments, send))

            return protected_async

        @functools.wraps(fn)
        def protected(*a: Any, **kw: Any) -> Any:
            sc, k, arguments = prepare(a, kw)

            def send(d: Dispatch) -> Sent:
                try:
                    return Sent.returned(fn(**d.arguments()))
                except errors.Refused as e:
                    return refused(e)

            return result_of(once.call(sc, k, name, arguments, send))

        return protected

    return wrap
