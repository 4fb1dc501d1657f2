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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from . import errors
from .model import Called, Dispatch, Policy, Sent

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
