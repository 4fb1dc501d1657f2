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
        signature = inspect.signature(fn)

        def prepare(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, Optional[str], dict[str, Any]]:
            bound = signature.bind(*a, **kw)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
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
