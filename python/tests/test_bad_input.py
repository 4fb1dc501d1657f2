"""Bad input: a typed exception that says what and where, or the documented ambiguous outcome; nothing half-written."""

from __future__ import annotations

import re
from typing import Sequence

import pytest

import once
from once import Once, Sent
from once.ledger import Event, LedgerFailure, MemoryLedger, Put


def nothing_written(o: Once) -> None:
    rows, events = o.ledger.counts()
    assert rows == {"operation": 0, "tombstone": 0, "quota": 0} and events == 0


def never(d: once.Dispatch) -> Sent:
    raise AssertionError("dispatched")


def test_args_that_are_not_json_are_invalid_json_with_where() -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidJson) as info:
        o.call("s", "k", "t", '{"amount": 1,}', never)
    assert info.value.kind == "syntax" and info.value.offset > 0
    assert "start" in str(info.value)
    nothing_written(o)


@pytest.mark.parametrize(
    "args, kind",
    [
        ('{"a": NaN}', "non-finite-number"),
        ('{"a": 1, "a": 2}', "duplicate-key"),
        ('{"amount": 9007199254740993}', "inexact-number"),
        ('{"a": "\\ud800"}', "lone-surrogate"),
    ],
)
def test_i_json_violations_are_refused_not_fixed(args: str, kind: str) -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidJson) as info:
        o.call("s", "k", "t", args, never)
    assert info.value.kind == kind
    nothing_written(o)


def test_a_python_nan_reaches_the_guest_and_is_refused() -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidJson) as info:
        o.call("s", "k", "t", {"a": float("nan")}, never)
    assert info.value.pointer == "/a"
    nothing_written(o)


@pytest.mark.parametrize(
    "field, call, where",
    [
        ("scope", ("s\ud800", "k", "t", {}), "scope: a lone surrogate U+D800 at character 1"),
        ("key", ("s", "\udfff", "t", {}), "key: a lone surrogate U+DFFF at character 0"),
        ("tool", ("s", "k", "t\ud800", {}), "tool: a lone surrogate U+D800 at character 1"),
        ("args text", ("s", "k", "t", '{"a": "\ud800"}'), "args: a lone surrogate U+D800 at character 7"),
    ],
)
def test_a_lone_surrogate_in_a_str_is_an_invalid_request_naming_the_field(
        field: str, call: tuple[str, str, str, object], where: str) -> None:
    # A Python str can hold a surrogate no UTF-8 text can carry: a once error, not wasmtime's UnicodeEncodeError.
    o = Once.memory()
    with pytest.raises(once.InvalidRequest, match=re.escape(where)):
        o.call(*call, never)  # type: ignore[arg-type]
    nothing_written(o)


def test_a_lone_surrogate_in_an_args_value_is_the_guests_lone_surrogate_with_its_pointer() -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidJson) as info:
        o.call("s", "k", "t", {"a": ["x", "\ud800"]}, never)
    assert info.value.kind == "lone-surrogate" and info.value.pointer == "/a/1"
    nothing_written(o)


def test_a_lone_surrogate_reaches_no_export_raw() -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidRequest, match="inspect: key: a lone surrogate"):
        o.inspect("s", "\ud800")
    with pytest.raises(once.InvalidRequest, match="fingerprint: tool: a lone surrogate"):
        o.fingerprint("\ud800", {})

    @o.protect("refund", key=lambda order: order)
    def refund(order: str) -> str:
        raise AssertionError("ran")

    with pytest.raises(once.InvalidRequest, match="key: a lone surrogate"):
        refund("o-\ud800")
    nothing_written(o)


@pytest.mark.parametrize("scope, key, tool, what", [
    ("s", " ", "t", "operation key from application"), ("\u3000", "k", "t", "scope"), ("s", "k", "\u2003", "tool"),
])
def test_a_blank_name_is_an_invalid_request_naming_the_field(scope: str, key: str, tool: str, what: str) -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidRequest, match=f"{what} is only whitespace"):
        o.call(scope, key, tool, {}, never)
    nothing_written(o)


def test_args_python_cannot_serialize_are_an_invalid_request() -> None:
    o = Once.memory()
    with pytest.raises(once.InvalidRequest, match="not JSON-serializable"):
        o.call("s", "k", "t", {"when": object()}, never)
    nothing_written(o)


def test_a_key_over_the_limit_is_an_invalid_request() -> None:
    o = Once.memory()
    limit = o._settings["max-key-bytes"]
    with pytest.raises(once.InvalidRequest, match="key"):
        o.call("s", "k" * (limit + 1), "t", {}, never)
    with pytest.raises(once.InvalidRequest):
        o.call("", "k", "t", {}, never)
    nothing_written(o)


def test_an_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(once.InvalidRequest, match="max_keys"):
        Once.memory(settings={"max_keys": 1})


def test_a_dispatcher_that_raises_leaves_an_unknown_record_never_resent() -> None:
    o = Once.memory()

    def boom(d: once.Dispatch) -> Sent:
        raise TimeoutError("no answer")

    c = o.call("s", "k", "t", {"a": 1}, boom)
    assert isinstance(c.ending, once.Unknown) and "TimeoutError" in c.ending.reason
    assert isinstance(c.raised, TimeoutError)
    again = o.call("s", "k", "t", {"a": 1}, never)
    assert isinstance(again.ending, once.Unknown)
    view = o.inspect("s", "k")
    assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1
    assert view.audit[-1].version == view.version


class FailingCommits(MemoryLedger):
    """A ledger whose writes fail (a full disk, a lost connection)."""

    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        raise LedgerFailure("injected: disk full")


def test_no_durable_intent_means_no_dispatch() -> None:
    o = Once(FailingCommits())
    c = o.call("s", "k", "t", {"a": 1}, never)
    assert isinstance(c.ending, once.Blocked) and c.ending.reason is once.BlockReason.STORAGE
    assert "disk full" in c.ending.detail
    nothing_written(o)


def test_a_call_over_the_fuel_budget_is_a_guest_limit_and_writes_nothing() -> None:
    o = Once.memory(fuel=30_000_000)
    with pytest.raises(once.GuestLimit, match="fuel"):
        o.call("s", "k", "t", {"n": list(range(100_000))}, never)
    nothing_written(o)
    # The handle goes on with a fresh instance.
    assert isinstance(o.call("s", "k2", "t", {}, lambda d: Sent.success({})).ending, once.Confirmed)


def test_an_answer_that_is_not_the_json_form_is_a_component_error_naming_the_export() -> None:
    from once import _wit

    for text in ("", "[]", '{"Ok": {"Dispatch": {"scope": "s"}}}', '{"Ok": {"Teleport": {}}}', '{"Err": "Nope"}',
                 '{"Ok": {"Done": {"scope": "s", "key": null, "key_source": null, "tool": "t", "ending": '
                 '{"Confirmed": {}}, "effect": "Happened", "repeat": "Replays"}}}'):
        with pytest.raises(once.ComponentError, match="report: the component's answer is not the JSON form"):
            _wit.step(text, "report")
    with pytest.raises(once.FenceMismatch, match="report"):
        _wit.step('{"Err": "FenceMismatch"}', "report")
    with pytest.raises(once.InvalidJson) as info:
        _wit.step('{"Err": {"InvalidJson": {"kind": "DuplicateKey", "pointer": "/a", "offset": 7, "message": "m"}}}',
                  "start")
    assert (info.value.kind, info.value.pointer, info.value.offset) == ("duplicate-key", "/a", 7)


def test_a_batch_that_is_not_the_json_form_is_refused_whole_saying_what() -> None:
    from once import _wit

    put = ('{"table": "Operation", "scope": "s", "key": "k", "expected": null, '
           '"row": {"version": 1, "state": "InFlight", "due_at": 5, "owner": "o"}}')
    puts, events, deferrable = _wit.batch(f'{{"puts": [{put}], "events": [], "deferrable": true}}', ["{}"])
    assert puts[0].row is not None and (puts[0].row.state, puts[0].row.table, puts[0].row.body) == (
        "in-flight", "operation", "{}")
    assert deferrable and events == []
    with pytest.raises(ValueError, match="writes 1 row\\(s\\) but 0 bodies"):
        _wit.batch(f'{{"puts": [{put}], "events": [], "deferrable": false}}', [])
    with pytest.raises(ValueError, match="not the JSON form of a batch-head"):
        _wit.batch('{"puts": [{"table": "Elsewhere"}], "events": [], "deferrable": false}', [])
    with pytest.raises(ValueError, match="not a bool"):
        _wit.batch('{"puts": [], "events": [], "deferrable": 1}', [])
