"""A person approves high-value calls, through the package as a user runs it: the tool's `approval` rule holds a
call above the threshold for a person, an approval covers exactly the recorded payload, one attempt and a
limited time; a changed amount never runs on it; a denial ends the operation (DESIGN.md "Authority")."""

from __future__ import annotations

import pytest

import once
from once import ApprovalAbove, AwaitsApproval, Blocked, BlockReason, Confirmed, Effect, Once, Policy, Repeat, Sent
from once import State

REFUND = Policy(approval=ApprovalAbove(field="/amount", above="100.00"))


def _recorder(sent: list[once.Dispatch]) -> object:
    def send(d: once.Dispatch) -> Sent:
        sent.append(d)
        return Sent.success({"refund_id": f"r-{len(sent)}"})

    return send


def test_above_the_threshold_nothing_is_sent_until_a_person_approves_then_exactly_once() -> None:
    o = Once.memory(policies={"refund": REFUND})
    sent: list[once.Dispatch] = []
    send = _recorder(sent)
    asked = o.call("s", "k", "refund", {"order": 1, "amount": 250}, send)
    assert sent == []
    assert isinstance(asked.ending, AwaitsApproval)
    assert asked.ending.reason == "/amount is 250, above 100.00"
    assert asked.effect is Effect.NONE and asked.account is not None
    assert asked.account.repeat is Repeat.WAITS and asked.account.awaits_operator
    assert "a person must approve this exact call first" in asked.describe()
    view = o.inspect("s", "k")
    assert view is not None and view.state is State.AWAITING_APPROVAL and view.resolvable.approve

    with pytest.raises(once.InvalidRequest):
        o.approve("s", "k", note="  ")
    assert o.approve("s", "k", note="ops@example: checked with the customer") is State.ABSENT
    done = o.call("s", "k", "refund", {"order": 1, "amount": 250}, send)
    assert isinstance(done.ending, Confirmed) and len(sent) == 1
    again = o.call("s", "k", "refund", {"order": 1, "amount": 250}, send)
    assert isinstance(again.ending, Confirmed) and again.ending.replayed and len(sent) == 1
    trail = o.inspect("s", "k")
    assert trail is not None
    approved = [e for e in trail.audit if e.kind == "approved"]
    assert len(approved) == 1 and "ops@example: checked with the customer" in approved[0].detail
    assert trail.fingerprint in approved[0].detail


def test_approval_scope_changed_a_larger_amount_needs_a_new_approval() -> None:
    """The vector "approval scope changed": approved for one payload, retried with a larger amount."""
    o = Once.memory(policies={"refund": REFUND})
    sent: list[once.Dispatch] = []
    send = _recorder(sent)
    o.call("s", "k", "refund", {"order": 1, "amount": 150}, send)
    o.approve("s", "k", note="ops: 150 is fine")
    # The same key with a larger amount: another payload, refused, nothing sent on the approval.
    larger = o.call("s", "k", "refund", {"order": 1, "amount": 900}, send)
    assert isinstance(larger.ending, once.Conflict) and sent == []
    # A new key with the larger amount is a new operation that asks a person again.
    fresh = o.call("s", "k2", "refund", {"order": 1, "amount": 900}, send)
    assert isinstance(fresh.ending, AwaitsApproval) and sent == []
    # A keyless call's derived key follows the amount too.
    derived = o.call("s", None, "refund", {"order": 1, "amount": 901}, send)
    assert isinstance(derived.ending, AwaitsApproval) and sent == []
    # The approved payload goes out, once.
    assert isinstance(o.call("s", "k", "refund", {"order": 1, "amount": 150}, send).ending, Confirmed)
    assert [d.arguments() for d in sent] == [{"order": 1, "amount": 150}]


def test_at_or_below_the_threshold_the_call_is_sent_at_once() -> None:
    o = Once.memory(policies={"refund": REFUND})
    sent: list[once.Dispatch] = []
    assert isinstance(o.call("s", "k", "refund", {"amount": "100.00"}, _recorder(sent)).ending, Confirmed)
    assert len(sent) == 1


def test_a_denial_ends_the_operation_and_the_same_call_is_refused() -> None:
    o = Once.memory(policies={"refund": REFUND})
    sent: list[once.Dispatch] = []
    o.call("s", "k", "refund", {"amount": 500}, _recorder(sent))
    assert o.deny("s", "k", note="ops@example: not this customer") is State.DENIED
    refused = o.call("s", "k", "refund", {"amount": 500}, _recorder(sent))
    assert isinstance(refused.ending, Blocked) and refused.ending.reason is BlockReason.APPROVAL_DENIED
    assert refused.effect is Effect.NONE and sent == []
    with pytest.raises(once.InvalidTransition):
        o.approve("s", "k", note="ops: changed my mind")


def test_a_protected_function_raises_unconfirmed_while_it_awaits_approval() -> None:
    o = Once.memory(policies={"refund_order": Policy(approval="always")})
    calls: list[int] = []

    @o.protect(key=lambda order_id: f"refund-{order_id}")
    def refund_order(order_id: int) -> dict[str, object]:
        calls.append(order_id)
        return {"refund_id": "r-1"}

    with pytest.raises(once.Unconfirmed) as raised:
        refund_order(7)
    assert isinstance(raised.value.called.ending, AwaitsApproval) and calls == []
    o.approve("default", "refund-7", note="ops: yes")
    assert refund_order(7) == {"refund_id": "r-1"} and calls == [7]


def test_a_bad_rule_is_refused_with_its_field() -> None:
    with pytest.raises(once.InvalidPolicy, match="approval field"):
        Once.memory(policies={"refund": Policy(approval=ApprovalAbove(field="/amount", above="1"),
                                               effect_fields=["/order"])})
    with pytest.raises(once.InvalidPolicy, match="approval"):
        Once.memory(policies={"refund": Policy(approval="sometimes")})  # type: ignore[arg-type]
