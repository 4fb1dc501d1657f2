"""Values across the component boundary.

The crossings of a protected call (`protocol.start`, `report`, `resume`,
`ledger-json.get`, `ledger-json.commit`: this package configures
`ledger-encoding` json) carry JSON text in the WIT's "JSON form"
(the top comment of `wit/once.wit`: serde's form of the Rust types generated
from it; snake_case field names, UpperCamelCase enum and variant case names,
a case without payload as its name, else `{"Name": payload}`). It is parsed
once with the standard library's C `json` module and turned into this
package's types by the decoders below, one function per type, written out:
nothing reflects on a type per call.

The other exports and imports are typed: wasmtime-py lifts a record as
`Record` with the WIT field names as attributes, and a variant (or result)
as a tagged `Variant` only when two of its cases lift to the same Python
class, otherwise as the bare payload; the function types say which, and
`Export` works that out once per export.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Mapping, NamedTuple, Optional, TypeVar

from wasmtime.component import Record, ResultType, Variant

from . import errors, model
from .ledger._base import Event, Put, Row
from .model import (
    Account, AuditEvent, AwaitsApproval, Blocked, BlockReason, Confirmation, Confirmed, Conflict, Dispatch, Effect, Ending, Escalation,
    InFlight, KeySource, NotSent, Rejected, RecordView, Repeat, ReplayVia, Resolvable, State, Unknown, Unrecorded,
)

E = TypeVar("E", bound=enum.Enum)
# JSON text as the guest reads it (UTF-8 as is); one encoder, not one per call as json.dumps with options makes.
to_json = json.JSONEncoder(ensure_ascii=False).encode
# Every non-ASCII character as a JSON escape: the form of a value whose str holds a lone surrogate.
to_ascii_json = json.JSONEncoder().encode


def record(**fields: Any) -> Record:
    """A WIT record from snake_case keyword arguments."""
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


# ---------------------------------------------------------------- the JSON form: names


def camel(kebab: str) -> str:
    """A WIT case name in the JSON form: `in-flight` -> `InFlight`."""
    return "".join(word[:1].upper() + word[1:] for word in kebab.split("-"))


def cases(cls: type[E]) -> dict[str, E]:
    """An enum's members by their JSON-form names (the WIT names are the members' values)."""
    return {camel(str(m.value)): m for m in cls}


STATE = cases(State)
EFFECT = cases(Effect)
REPEAT = cases(Repeat)
KEY_SOURCE = cases(KeySource)
REPLAY_VIA = cases(ReplayVia)
CONFIRMATION = cases(Confirmation)
BLOCK_REASON = cases(BlockReason)
# Enum values a ledger stores as their WIT names ('in-flight', 'operation').
STATE_NAME = {k: str(v.value) for k, v in STATE.items()}
TABLE_NAME = {camel(t): t for t in ("operation", "tombstone", "quota")}
JSON_ERROR_KIND = {camel(k): k for k in (
    "syntax", "trailing-data", "duplicate-key", "lone-surrogate", "invalid-utf8", "non-finite-number",
    "number-out-of-range", "inexact-number", "too-deep", "too-large",
)}


# ---------------------------------------------------------------- the JSON form: what the host sends


def utf8_text(field: str, text: str) -> str:
    """`text` as given when it has a UTF-8 form; else `InvalidRequest` naming `field` and where.

    A Python `str` may hold a lone surrogate ("\\ud800"), which no UTF-8 text can carry: the guest never
    sees it, and wasmtime's lowering would raise a bare UnicodeEncodeError. Checked before any export is
    entered, so nothing is recorded or sent. `isascii` is O(1) in CPython: ASCII text costs nothing more.
    """
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise errors.InvalidRequest(
                f"{field}: a lone surrogate U+{ord(text[e.start]):04X} at character {e.start} is not Unicode text "
                "(it has no UTF-8 form)") from None
    return text


def call_text(scope: str, key: Optional[str], tool: str, args: str, supersedes: Optional[str],
              acknowledge_confirmed: bool) -> str:
    """The JSON form of a `call`; `args` is checked by the caller, the other strings here (`utf8_text`)."""
    utf8_text("scope", scope)
    if key is not None:
        utf8_text("key", key)
    utf8_text("tool", tool)
    if supersedes is not None:
        utf8_text("supersedes", supersedes)
    return to_json({
        "scope": scope, "keys": [] if key is None else [["application", key]], "tool": tool, "args": args,
        "supersedes": supersedes, "acknowledge_confirmed": acknowledge_confirmed,
    })


_OUTCOME_CASE = {"success": "Success", "rejected": "Rejected", "ambiguous": "Ambiguous"}


def outcome_text(sent: model.Sent) -> str:
    """The JSON form of the `outcome` a dispatcher's answer reports.

    A `Sent` of a kind none of its constructors makes is reported ambiguous: the request may have left.
    """
    if sent.kind == "not-sent":
        return '"NotSent"'
    case = _OUTCOME_CASE.get(sent.kind)
    if case is None:
        return to_json({"Ambiguous": f"the dispatcher answered Sent(kind={sent.kind!r}), none of success, "
                                     "rejected, ambiguous, not-sent"})
    return to_json({case: sent.text})


# ---------------------------------------------------------------- the JSON form: what the guest answers


def confirmed(c: Mapping[str, Any]) -> Confirmed:
    via = c["via"]
    return Confirmed(c["receipt"], c["replayed"], None if via is None else REPLAY_VIA[via],
                     CONFIRMATION[c["confirmed_by"]], c["at"], c["window_until"], c["attempt"],
                     EFFECT[c["earlier_attempts"]], c["possible_duplicate"])


def _rejected(c: Mapping[str, Any]) -> Rejected:
    return Rejected(c["error"], c["attempt"])


def _not_sent(c: Mapping[str, Any]) -> NotSent:
    return NotSent(c["attempts"])


def _unknown(c: Mapping[str, Any]) -> Unknown:
    return Unknown(c["since"], c["deadline"], c["reason"], c["next_read"])


def _in_flight(c: Mapping[str, Any]) -> InFlight:
    return InFlight(c["lease_until"])


def _conflict(c: Mapping[str, Any]) -> Conflict:
    return Conflict(c["key"], c["tool"], c["fingerprint"], c["args"], STATE[c["state"]], c["created_at"])


def _blocked(c: Mapping[str, Any]) -> Blocked:
    return Blocked(BLOCK_REASON[c["reason"]], c["detail"], c["receipt"])


def _unrecorded(c: Mapping[str, Any]) -> Unrecorded:
    return Unrecorded(c["response"])


def _awaits_approval(c: Mapping[str, Any]) -> AwaitsApproval:
    return AwaitsApproval(c["asked_at"], c["reason"], c["valid_ms"], c["wait_until"])


ENDING: dict[str, Any] = {
    "Confirmed": confirmed, "Rejected": _rejected, "NotSent": _not_sent, "Unknown": _unknown,
    "InFlight": _in_flight, "Conflict": _conflict, "Blocked": _blocked, "Unrecorded": _unrecorded,
    "AwaitsApproval": _awaits_approval,
}


def ending(v: Mapping[str, Any]) -> Ending:
    """An `ending`: every case carries a payload, `{"Case": payload}`."""
    ((tag, payload),) = v.items()
    return ENDING[tag](payload)  # type: ignore[no-any-return]


def account(a: Mapping[str, Any]) -> Account:
    """An `account`."""
    source = a["key_source"]
    return Account(a["scope"], a["key"], None if source is None else KEY_SOURCE[source], a["tool"],
                   ending(a["ending"]), EFFECT[a["effect"]], REPEAT[a["repeat"]], a["awaits_operator"])


def dispatch(g: Mapping[str, Any]) -> Dispatch:
    """A `grant` as the `Dispatch` handed to the dispatcher."""
    return Dispatch(g["scope"], g["key"], g["tool"], g["attempt"], g["provider_key"], g["args"], g["send_by"],
                    g["timeout_ms"])


class Step(NamedTuple):
    """A protocol step, decoded: `dispatch` (the grant and its fence), `wait` (resume `scope`/`key` at `next`, or
    stop with the `account` meanwhile), `done` (the `account`) or `direct`."""

    kind: str
    dispatch: Optional[Dispatch] = None
    fence: str = ""
    account: Optional[Account] = None
    scope: str = ""
    key: str = ""
    next: int = 0


DIRECT = Step("direct")


def step(text: str, where: str) -> Step:
    """A protocol export's answer, the JSON form of `result<step, error>`: the step, or its error raised.

    Text that is not that form is the component's failure (like a trap): `ComponentError`.
    """
    try:
        answer = json.loads(text)
        ok = answer.get("Ok", answer)
        if ok is answer:
            raise error_of(answer["Err"], where)
        if ok == "Direct":
            return DIRECT
        ((tag, s),) = ok.items()
        if tag == "Dispatch":
            return Step("dispatch", dispatch(s), s["fence"])
        if tag == "Done":
            return Step("done", account=account(s))
        if tag == "Wait":
            return Step("wait", account=account(s["meanwhile"]), scope=s["scope"], key=s["key"], next=s["next"])
        raise KeyError(tag)
    except errors.OnceError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise errors.ComponentError(
            f"{where}: the component's answer is not the JSON form of a result<step, error> "
            f"({type(e).__name__}: {e}): {text[:200]!r}"
        ) from e


def error_of(v: Any, where: str) -> errors.OnceError:
    """The exception for an `error` in the JSON form, naming the export it came from."""
    if isinstance(v, str):
        return _error_case(_kebab(v), None, where, strict=True)
    ((tag, payload),) = v.items()
    if tag == "InvalidJson":
        return errors.InvalidJson(JSON_ERROR_KIND[payload["kind"]], payload["pointer"], payload["offset"],
                                  f"{payload['message']} ({where})")
    return _error_case(_kebab(tag), payload, where, strict=True)


def _kebab(name: str) -> str:
    """A case's WIT name from its JSON form's UpperCamelCase one: `NotFound` -> `not-found`."""
    return "".join(f"-{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


# A state as a ledger stores it, `None` included (an unknown name is a KeyError: the batch is refused).
_STORED_STATE: dict[Optional[str], Optional[str]] = {None: None}
_STORED_STATE.update(STATE_NAME)


def batch(text: str, bodies: list[str]) -> tuple[list[Put], list[Event], bool]:
    """`ledger-json.commit`'s arguments: the JSON form of a `batch-head` and the written rows' bodies, in put order,
    as the puts, the audit events and whether the batch is deferrable. Anything else is refused whole
    (`ValueError` saying what), so a malformed batch writes nothing."""
    try:
        head = json.loads(text)
        states = _STORED_STATE
        puts = []
        written = 0
        for p in head["puts"]:
            table, scope, key, r = TABLE_NAME[p["table"]], p["scope"], p["key"], p["row"]
            row = None
            if r is not None:
                body = bodies[written] if written < len(bodies) else ""
                row = Row(table, scope, key, r["version"], states[r["state"]], r["due_at"], r["owner"], body)
                written += 1
            puts.append(Put(table, scope, key, p["expected"], row))
        if written != len(bodies):
            raise ValueError(f"ledger-json.commit: the batch writes {written} row(s) but {len(bodies)} bodies came with it")
        events = [Event(e["scope"], e["key"], e["version"], e["at"], e["kind"], states[e["from_state"]],
                        states[e["to_state"]], e["attempt"], e["detail"]) for e in head["events"]]
        deferrable = head["deferrable"]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"ledger-json.commit: the batch is not the JSON form of a batch-head "
                         f"({type(e).__name__}: {e})") from e
    except ValueError as e:
        if str(e).startswith("ledger-json.commit:"):
            raise
        raise ValueError(f"ledger-json.commit: the batch is not the JSON form of a batch-head: {e}") from e
    if deferrable is not True and deferrable is not False:
        raise ValueError(f"ledger-json.commit: the batch's deferrable is {deferrable!r}, not a bool")
    return puts, events, deferrable


# ---------------------------------------------------------------- typed values (the other exports and imports)


class Export:
    """One typed export, and how wasmtime-py lifts its result (worked out once, from its function type)."""

    __slots__ = ("func", "params", "result", "is_result", "tagged_result", "ok_classes", "err_classes")

    def __init__(self, func: Any, params: dict[str, Any], result: Any) -> None:
        self.func, self.params, self.result = func, params, result
        self.is_result = isinstance(result, ResultType)
        self.tagged_result = False
        self.ok_classes: tuple[type, ...] = ()
        self.err_classes: tuple[type, ...] = ()
        if self.is_result:
            self.tagged_result = tagged([result.ok, result.err])
            self.ok_classes = tuple(_classes(result.ok))
            self.err_classes = tuple(_classes(result.err))

    def split(self, value: Any) -> tuple[bool, Any]:
        """A lifted result<T, E> as (is_ok, payload)."""
        if self.tagged_result:
            assert isinstance(value, Variant) and value.tag in ("ok", "err")
            return value.tag == "ok", value.payload
        if object not in self.err_classes:
            return not isinstance(value, self.err_classes), value
        return isinstance(value, self.ok_classes), value

    def case(self, param: str, tag: str, payload: Any) -> Any:
        """A variant argument, tagged or bare as wasmtime-py lowers its type."""
        return Variant(tag, payload) if tagged([t for _, t in self.params[param].cases]) else payload


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


def _opt_state(v: Optional[str]) -> Optional[State]:
    return None if v is None else State(v)


def audit_event(e: Any) -> AuditEvent:
    """An `audit-event` record."""
    return AuditEvent(e.scope, e.key, e.version, e.at, e.kind, _opt_state(getattr(e, "from-state")),
                      _opt_state(getattr(e, "to-state")), e.attempt, e.detail)


def record_view(v: Any) -> RecordView:
    """A `record-view` record."""
    g = v.__dict__
    return RecordView(
        g["scope"], g["key"], KeySource(g["key-source"]), g["tool"], g["fingerprint"], g["args"],
        g["provider-key"], g["owner"], State(g["state"]), g["version"], g["attempts"], g["receipt"], g["error"],
        g["escalated"], g["possible-duplicate"], g["supersedes"], g["superseded-by"], g["replays"], g["conflicts"],
        g["created-at"], g["updated-at"], resolvable(g["resolvable"]), g["body"],
        [audit_event(e) for e in g["audit"]],
    )


def resolvable(r: Any) -> Resolvable:
    """A `resolvable` record."""
    g = r.__dict__
    return Resolvable(g["confirmed"], g["absent"], g["absent-needs-force"], g["approve"])


def escalation(e: Any) -> Escalation:
    """An `escalation` record."""
    return Escalation(e.id, e.scope, e.key, e.tool, State(e.state), e.reason, e.deadline)


# ---------------------------------------------------------------- lowering configuration


def policy_record(p: Optional[model.Policy]) -> Record:
    """A `policy-input` record: every field, unset ones as None (the guest fills them)."""
    p = p or model.Policy()
    fields: dict[str, Any] = {}
    for name in model.POLICY_FIELDS:
        value = getattr(p, name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, model.Quota):
            value = record(spend_field=value.spend_field, ceiling=value.ceiling, decimals=value.decimals,
                           window_ms=value.window_ms, bucket=value.bucket)
        elif name == "approval" and value is not None:
            value = approval_rule(value)
        elif isinstance(value, (list, tuple)):
            value = list(value)
        fields[name] = value
    return record(**fields)


def approval_rule(rule: model.ApprovalRule) -> Variant:
    """An `approval-rule` variant (two of its cases carry nothing: wasmtime-py lowers it tagged)."""
    if isinstance(rule, model.ApprovalAbove):
        return Variant("above", record(field=rule.field, above=rule.above))
    if rule in ("never", "always"):
        return Variant(rule, None)
    raise errors.InvalidPolicy(f"approval must be 'never', 'always' or ApprovalAbove(field, above), not {rule!r}")


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


# ---------------------------------------------------------------- errors of typed exports

# An `error`'s cases that carry nothing: the exception and what it says.
_UNIT_ERRORS: dict[str, tuple[type[errors.OnceError], str]] = {
    "not-found": (errors.NotFound, "no record for this scope and key"),
    "fence-mismatch": (errors.FenceMismatch, "the fence belongs to no attempt of this record"),
    "not-configured": (errors.NotConfigured, "called before configure"),
}

# An `error`'s cases that carry a message (`invalid-json` carries a `json-error`: `error`, `error_of`).
_MESSAGE_ERRORS: dict[str, type[errors.OnceError]] = {
    "invalid-request": errors.InvalidRequest,
    "invalid-policy": errors.InvalidPolicy,
    "storage": errors.StorageError,
    "invalid-transition": errors.InvalidTransition,
}


def _error_case(tag: str, payload: Any, where: str, strict: bool = False) -> errors.OnceError:
    """The exception for the `error` case `tag` (its WIT name); an unknown case is a KeyError when `strict`."""
    if tag in _UNIT_ERRORS:
        cls, says = _UNIT_ERRORS[tag]
        return cls(f"{where}: {says}")
    cls = _MESSAGE_ERRORS[tag] if strict else _MESSAGE_ERRORS.get(tag, errors.OnceError)
    return cls(f"{where}: {payload}")


def error(v: Any, where: str) -> errors.OnceError:
    """The exception for a typed WIT `error` (or bare `json-error`) value, naming the export it came from."""
    if isinstance(v, Record):  # a json-error
        return errors.InvalidJson(getattr(v, "kind"), getattr(v, "pointer"), getattr(v, "offset"),
                                  f"{getattr(v, 'message')} ({where})")
    tag, payload = (v.tag, v.payload) if isinstance(v, Variant) else (str(v), None)
    if tag == "invalid-json":
        return error(payload, where)
    return _error_case(tag, payload, where)
