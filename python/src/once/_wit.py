"""Values across the component boundary: Python dataclasses to wasmtime-py records and back.

wasmtime-py lifts a record as `Record` with the WIT field names as
attributes, and a variant (or result) as a tagged `Variant` only when two of
its cases lift to the same Python class; otherwise as the bare payload. The
function types say which, so nothing here guesses from a value alone.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, Optional, Union

from wasmtime.component import Record, ResultType, Variant

from . import errors, model


def record(**fields: Any) -> Record:
    """A WIT record from snake_case keyword arguments."""
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def _classes(ty: Any) -> set[type]:
    out: set[type] = set()
    if ty is None:
        out.add(object)
    else:
        ty.add_classes(out)
    return out


def tagged(case_types: list[Any]) -> bool:
    """Whether wasmtime-py passes a variant with these case types as a tagged `Variant`."""
    seen: set[type] = set()
    for ty in case_types:
        c = _classes(ty)
        if c & seen:
            return True
        seen |= c
    return False


def split_result(ty: ResultType, value: Any) -> tuple[bool, Any]:
    """A lifted result<T, E> as (is_ok, payload)."""
    if tagged([ty.ok, ty.err]):
        assert isinstance(value, Variant) and value.tag in ("ok", "err")
        return value.tag == "ok", value.payload
    ok, err = _classes(ty.ok), _classes(ty.err)
    if object not in err:
        return not isinstance(value, tuple(err)), value
    return isinstance(value, tuple(ok)), value


def lower_case(case_types: list[Any], tag: str, payload: Any) -> Any:
    """A variant argument, tagged or bare as wasmtime-py lowers its type."""
    return Variant(tag, payload) if tagged(case_types) else payload


# ---------------------------------------------------------------- lifting into dataclasses

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls, vars(model))
    return found


def lift(tp: Any, v: Any) -> Any:
    """A lifted WIT value as the Python type `tp` (dataclass, enum, Optional, list, tuple, primitive)."""
    if v is None:
        return None
    origin = typing.get_origin(tp)
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return lift(args[0], v)
        return lift_ending(v)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return [lift(inner, x) for x in v]
    if origin is tuple:
        return tuple(v)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{
            f.name: lift(hints[f.name], getattr(v, f.name.replace("_", "-")))
            for f in dataclasses.fields(tp)
            if hasattr(v, f.name.replace("_", "-"))
        })
    return v


ENDINGS: dict[str, type] = {
    "confirmed": model.Confirmed,
    "rejected": model.Rejected,
    "not-sent": model.NotSent,
    "unknown": model.Unknown,
    "in-flight": model.InFlight,
    "conflict": model.Conflict,
    "blocked": model.Blocked,
    "unrecorded": model.Unrecorded,
}


def lift_ending(v: Variant) -> model.Ending:
    """An `ending` variant as its dataclass."""
    return lift(ENDINGS[v.tag], v.payload)  # type: ignore[no-any-return]


def account(v: Any) -> model.Account:
    """An `account` record."""
    return lift(model.Account, v)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- lowering configuration


def policy_record(p: Optional[model.Policy]) -> Record:
    """A `policy-input` record: every field, unset ones as None (the guest fills them)."""
    p = p or model.Policy()
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, model.Quota):
            value = record(spend_field=value.spend_field, ceiling=value.ceiling, decimals=value.decimals,
                           window_ms=value.window_ms, bucket=value.bucket)
        elif isinstance(value, (list, tuple)):
            value = list(value)
        fields[f.name] = value
    return record(**fields)


def descriptor_record(d: Optional[model.ToolDescriptor]) -> Optional[Record]:
    """A `tool-descriptor` record."""
    if d is None:
        return None
    return record(name=d.name, input_schema=d.input_schema, annotations=d.annotations)


def plain(v: Any) -> Any:
    """A lifted value as neutral Python data (records as dicts by WIT name, variants as {case: payload})."""
    if isinstance(v, Record):
        return {k: plain(x) for k, x in vars(v).items()}
    if isinstance(v, Variant):
        return v.tag if v.payload is None else {v.tag: plain(v.payload)}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


# ---------------------------------------------------------------- errors

_ERRORS: dict[str, type[errors.OnceError]] = {
    "invalid-request": errors.InvalidRequest,
    "invalid-policy": errors.InvalidPolicy,
    "storage": errors.StorageError,
    "invalid-transition": errors.InvalidTransition,
}


def error(v: Any, where: str) -> errors.OnceError:
    """The exception for a WIT `error` (or bare `json-error`) value, naming the export it came from."""
    if isinstance(v, Record):  # a json-error
        return errors.InvalidJson(getattr(v, "kind"), getattr(v, "pointer"), getattr(v, "offset"),
                                  f"{getattr(v, 'message')} ({where})")
    tag, payload = (v.tag, v.payload) if isinstance(v, Variant) else (str(v), None)
    if tag == "invalid-json":
        return error(payload, where)
    if tag == "not-found":
        return errors.NotFound(f"{where}: no record for this scope and key")
    if tag == "fence-mismatch":
        return errors.FenceMismatch(f"{where}: the fence belongs to no attempt of this record")
    if tag == "not-configured":
        return errors.NotConfigured(f"{where}: called before configure")
    cls = _ERRORS.get(tag, errors.OnceError)
    return cls(f"{where}: {payload}")
