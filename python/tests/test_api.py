"""The Python API over the real component: replay, typed outcomes, policies checked by the guest, async."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

import once
from once import Blocked, BlockReason, Confirmed, Effect, Once, Policy, Rejected, Repeat, Sent


def test_a_retry_with_the_same_key_replays_the_receipt_without_sending() -> None:
    o = Once.memory()
    sent: list[once.Dispatch] = []

    def send(d: once.Dispatch) -> Sent:
        sent.append(d)
        return Sent.success({"refund_id": "r-1"})

    first = o.call("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, send)
    again = o.call("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, send)
    assert len(sent) == 1
    assert sent[0].arguments() == {"order_id": 1234, "amount": 200}
    assert isinstance(first.ending, Confirmed) and not first.ending.replayed
    assert isinstance(again.ending, Confirmed) and again.ending.replayed
    assert again.ending.value() == {"refund_id": "r-1"}
    assert again.effect is Effect.HAPPENED and again.account and again.account.repeat is Repeat.REPLAYS


def test_a_changed_payload_under_the_same_key_is_a_conflict_and_nothing_is_sent() -> None:
    o = Once.memory()
    o.call("s", "k", "refund_order", {"amount": 1}, lambda d: Sent.success({}))
    sent: list[object] = []
    c = o.call("s", "k", "refund_order", {"amount": 2}, lambda d: sent.append(d))
    assert sent == []
    assert isinstance(c.ending, once.Conflict) and json.loads(c.ending.args) == {"amount": 1}


def test_a_rejection_is_recorded_and_retried_within_the_budget() -> None:
    o = Once.memory(policies={"charge": Policy(attempt_budget=2)})
    answers = [Sent.rejected("card declined"), Sent.success({"ok": 1})]
    c1 = o.call("s", "k", "charge", {"n": 1}, lambda d: answers.pop(0))
    assert isinstance(c1.ending, Rejected) and c1.ending.error == "card declined"
    assert c1.effect is Effect.NONE and c1.account and c1.account.repeat is Repeat.RETRIES
    c2 = o.call("s", "k", "charge", {"n": 1}, lambda d: answers.pop(0))
    assert isinstance(c2.ending, Confirmed) and c2.ending.attempt == 2


def test_policy_as_keywords_or_dataclass_is_filled_and_checked_by_the_guest() -> None:
    o = Once.memory()
    plan = o.policy("refund", identity=once.IdentityMode.REQUIRED, dispatch_timeout_ms=1000)
    assert plan.policy["identity"] == "required" and plan.policy["lease-ms"] > 1000
    blocked = o.call("s", None, "refund", {"a": 1}, lambda d: pytest.fail("sent without a key"))
    assert isinstance(blocked.ending, Blocked) and blocked.ending.reason is BlockReason.IDENTITY_REQUIRED
    with pytest.raises(once.InvalidPolicy, match="lease"):
        o.policy("refund", Policy(dispatch_timeout_ms=10_000, lease_ms=10))
    # The refused policy left the previous one in force.
    assert o.plan("refund").policy["dispatch-timeout-ms"] == 1000


def test_a_block_route_is_never_sent_and_a_direct_route_is_sent_unrecorded() -> None:
    o = Once.memory(policies={"wipe": Policy(route=once.Route.BLOCK), "read": Policy(route=once.Route.DIRECT)})
    c = o.call("s", "k", "wipe", {}, lambda d: pytest.fail("a blocked tool was sent"))
    assert isinstance(c.ending, Blocked) and c.ending.reason is BlockReason.ROUTE_BLOCKED
    d = o.call("s", "k2", "read", {"q": 1}, lambda d: Sent.success({"v": 2}))
    assert d.direct == Sent.success({"v": 2}) and o.inspect("s", "k2") is None


def test_a_direct_dispatch_says_so_and_carries_the_calls_scope() -> None:
    o = Once.memory(policies={"read": Policy(route=once.Route.DIRECT)})
    seen: list[once.Dispatch] = []

    def send(d: once.Dispatch) -> Sent:
        seen.append(d)
        return Sent.success({"v": 1})

    o.call("tenant-7", "k", "read", {"q": 1}, send)
    o.call("tenant-7", "k", "refund", {"q": 1}, send)
    direct, granted = seen
    assert direct.direct and direct.scope == "tenant-7" and direct.tool == "read"
    assert direct.arguments() == {"q": 1}
    assert not granted.direct and granted.scope == "tenant-7" and granted.attempt == 1 and granted.key == "k"


def test_an_async_direct_dispatch_carries_the_calls_scope() -> None:
    o = Once.memory(policies={"read": Policy(route=once.Route.DIRECT)})
    seen: list[once.Dispatch] = []

    async def send(d: once.Dispatch) -> Sent:
        seen.append(d)
        return Sent.success({"v": 1})

    asyncio.run(o.acall("tenant-8", None, "read", {"q": 1}, send))
    assert [(d.direct, d.scope) for d in seen] == [(True, "tenant-8")]


def test_an_unknown_no_read_can_settle_awaits_an_operator_who_is_offered_what_resolve_accepts() -> None:
    o = Once.memory(policies={"blind": Policy(lookup=False)})
    c = o.call("s", "k", "blind", {"n": 1}, lambda d: Sent.ambiguous("timeout"))
    assert isinstance(c.ending, once.Unknown) and c.ending.next_read is None
    assert c.account is not None and c.account.awaits_operator
    view = o.inspect("s", "k")
    assert view is not None and view.resolvable == once.Resolvable(confirmed=True, absent=True, absent_needs_force=True)
    with pytest.raises(once.InvalidTransition):
        o.resolve("s", "k", absent=True, note="too early")
    ok = o.call("s", "k2", "refund", {"n": 1}, lambda d: Sent.success({"ok": 1}))
    assert ok.account is not None and not ok.account.awaits_operator
    done = o.inspect("s", "k2")
    assert done is not None and done.resolvable == once.Resolvable(False, False, False)


def test_protect_sync_replays_and_takes_the_key_from_the_application() -> None:
    o = Once.memory()
    calls: list[tuple[int, int]] = []

    @o.protect(key=lambda order_id, amount: f"refund-{order_id}", scope="tenant-7")
    def refund_order(order_id: int, amount: int) -> dict[str, object]:
        calls.append((order_id, amount))
        return {"refund_id": f"r-{order_id}", "amount": amount}

    assert refund_order(1234, 200) == {"refund_id": "r-1234", "amount": 200}
    assert refund_order(1234, amount=200) == {"refund_id": "r-1234", "amount": 200}
    assert calls == [(1234, 200)]
    view = o.inspect("tenant-7", "refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED and view.replays == 1


def test_protect_raises_unconfirmed_with_the_account_when_the_effect_is_unknown() -> None:
    o = Once.memory()

    @o.protect(key="k-1")
    def flaky() -> None:
        raise ConnectionResetError("reply lost")

    with pytest.raises(once.Unconfirmed) as info:
        flaky()
    called = info.value.called
    assert isinstance(called.ending, once.Unknown) and called.effect is Effect.UNKNOWN
    assert isinstance(info.value.__cause__, ConnectionResetError)
    # The same operation again is never sent blind.
    with pytest.raises(once.Unconfirmed):
        flaky()
    view = o.inspect("default", "k-1")
    assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1


def test_protect_refused_is_a_definite_rejection() -> None:
    o = Once.memory()

    @o.protect(key="k-2")
    def charge(amount: int) -> None:
        raise once.Refused("insufficient funds")

    with pytest.raises(once.Unconfirmed) as info:
        charge(5)
    assert isinstance(info.value.called.ending, Rejected)
    assert info.value.called.ending.error == "insufficient funds"


def test_protect_async_and_acall() -> None:
    o = Once.memory()
    calls: list[int] = []

    @o.protect()
    async def refund(order_id: int) -> dict[str, int]:
        await asyncio.sleep(0)
        calls.append(order_id)
        return {"order": order_id}

    async def main() -> None:
        with once.operation("refund-op-9", scope="t"):
            assert await refund(9) == {"order": 9}
            assert await refund(9) == {"order": 9}
        async def send(d: once.Dispatch) -> Sent:
            return Sent.success({"x": 1})
        c = await o.acall("t", "other", "refund", {"order_id": 1}, send)
        assert isinstance(c.ending, Confirmed)

    asyncio.run(main())
    assert calls == [9]


def test_an_async_dispatcher_given_to_a_blocking_call_is_refused_and_never_confirmed() -> None:
    """A coroutine that never ran is not a provider's answer: before, `call` recorded it as a success."""
    o = Once.memory()
    ran: list[int] = []

    async def send(d: once.Dispatch) -> Sent:
        ran.append(1)
        return Sent.success({"refund_id": "r-1"})

    # An async function is refused before anything is recorded.
    with pytest.raises(once.InvalidRequest, match="acall"):
        o.call("t", "async-fn", "refund", {"order_id": 1}, send)
    assert o.inspect("t", "async-fn") is None
    with pytest.raises(once.InvalidRequest, match="acall"):
        o.settle(send)
    # A plain callable that hands back a coroutine is caught when it does: that attempt is reported not sent.
    with pytest.raises(once.InvalidRequest, match="awaitable"):
        o.call("t", "lambda", "refund", {"order_id": 2}, lambda d: send(d))
    view = o.inspect("t", "lambda")
    assert view is not None and view.state != once.State.CONFIRMED, view
    assert [a["outcome"] for a in json.loads(view.body)["attempts"]] == ["not-sent"], view.body
    assert ran == []
    # The same key through acall is sent (after the back-off of the attempt that was not sent).
    c = asyncio.run(o.acall("t", "lambda", "refund", {"order_id": 2}, send, wait=10.0))
    assert isinstance(c.ending, Confirmed), c
    assert ran == [1]


def test_without_a_key_the_operation_is_derived_from_the_args() -> None:
    o = Once.memory()
    sent: list[object] = []
    o.call("s", None, "t", {"a": 1}, lambda d: sent.append(d) or Sent.success({}))
    c2 = o.call("s", None, "t", {"a": 1}, lambda d: sent.append(d) or Sent.success({}))
    assert len(sent) == 1
    assert c2.account and c2.account.key_source is once.KeySource.DERIVED
    assert isinstance(c2.ending, Confirmed) and c2.ending.via is once.ReplayVia.DERIVED_ARGS


def test_the_compiled_component_is_cached_on_disk(tmp_path: object) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, ONCE_CACHE_DIR=str(tmp_path))
    script = "from once import Once, _runtime; Once.memory(); print(_runtime.Runtime.shared().from_cache)"
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert (first.stdout.strip(), second.stdout.strip()) == ("False", "True")
    assert any(p.name.endswith(".cwasm") for p in tmp_path.iterdir())  # type: ignore[attr-defined]


def test_threads_sharing_a_handle_race_one_key_and_dispatch_once(tmp_path: object) -> None:
    import threading
    import time

    o = Once.sqlite(str(tmp_path) + "/ledger.db", settings={"clock_skew_ms": 0})  # type: ignore[operator]
    sent: list[int] = []
    results: list[once.Called] = []

    def send(d: once.Dispatch) -> Sent:
        sent.append(d.attempt)
        time.sleep(0.1)
        return Sent.success({"refund_id": "r-1"})

    def worker() -> None:
        results.append(o.call("t", "refund-1", "refund_order", {"order_id": 1}, send, wait=10))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sent == [1]
    assert [r.receipt for r in results] == ['{"refund_id":"r-1"}'] * 8


def test_the_escalation_callable_gets_an_unknown_past_its_deadline() -> None:
    import time

    escalations: list[once.Escalation] = []
    o = Once.memory(
        lookup=lambda tool, provider_key, args: once.Evidence.unknown("the provider cannot tell"),
        escalate=lambda e: escalations.append(e) is None,
        settings={"clock_skew_ms": 0},
        policies={"t": Policy(dispatch_timeout_ms=50, reconcile_interval_ms=20, resolve_deadline_ms=300)},
    )
    c = o.call("s", "k", "t", {}, lambda d: Sent.ambiguous("connection reset"), wait=0)
    assert isinstance(c.ending, once.Unknown)
    time.sleep(0.4)
    swept = o.sweep()
    assert swept.escalated == 1
    assert [(e.scope, e.key, e.tool, e.state) for e in escalations] == [("s", "k", "t", once.State.UNKNOWN)]
    view = o.inspect("s", "k")
    assert view is not None and view.escalated


def test_protect_binds_arguments_as_signature_bind_does() -> None:
    """The wrapper's own binding of plain signatures: the same dict, in the same order, and the same errors."""
    import inspect

    from once.protect import binder

    def plain(a: int, b: int = 2, *, c: int, d: int = 4) -> None: ...

    def star(x: int, *args: int, **kw: int) -> None: ...

    def positional_only(p: int, /, q: int) -> None: ...

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((1,), {"c": 3}), ((1, 5), {"c": 3, "d": 9}), ((), {"a": 1, "c": 3}), ((1,), {}), ((1, 2, 3), {"c": 1}),
        ((1,), {"c": 1, "zz": 2}), ((1,), {"a": 1, "c": 1}), ((), {"q": 1, "p": 2}), ((1, 2), {}),
    ]
    for fn in (plain, star, positional_only):
        signature = inspect.signature(fn)
        bind = binder(signature)
        for a, kw in calls:
            want: Any
            try:
                bound = signature.bind(*a, **kw)
                bound.apply_defaults()
                want = list(bound.arguments.items())
            except TypeError as e:
                want = ("TypeError", str(e))
            got: Any
            try:
                got = list(bind(a, kw).items())
            except TypeError as e:
                got = ("TypeError", str(e))
            assert got == want, (fn.__name__, a, kw)


def test_acall_cancels_a_dispatcher_past_its_deadline_and_the_attempt_is_unknown() -> None:
    """The deadline the guest gives an answer stops an async dispatcher (as the Rust and Node hosts stop theirs):
    cancelled and waited for, so nothing of it runs on after the report; the attempt is ambiguous, never failed."""
    o = Once.memory(policies={"refund": Policy(dispatch_timeout_ms=100)})
    stopped: list[int] = []

    async def hangs(d: once.Dispatch) -> Sent:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # tidying up after the cancellation: the call waits for it
            stopped.append(d.attempt)
            raise
        return Sent.success({"late": True})

    async def main() -> once.Called:
        # A loop that did not stop it would wait an hour: a minute is far past its deadline.
        return await asyncio.wait_for(o.acall("t", "k-1", "refund", {"order_id": 1}, hangs, wait=0.0), 60)

    c = asyncio.run(main())
    assert stopped == [1]
    assert isinstance(c.ending, once.Unknown), c
    assert "the dispatcher was cancelled" in c.ending.reason, c.ending
    assert c.effect is Effect.UNKNOWN and c.account and c.account.repeat is Repeat.WAITS

    # A dispatcher that answers anyway when it is cancelled: its answer is the outcome.
    async def answers_anyway(d: once.Dispatch) -> Sent:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        return Sent.success({"refund_id": "r-7"})

    done = asyncio.run(o.acall("t", "k-2", "refund", {"order_id": 2}, answers_anyway, wait=0.0))
    assert isinstance(done.ending, Confirmed) and done.ending.value() == {"refund_id": "r-7"}, done


def test_a_ledger_clock_that_stalls_past_send_by_sends_nothing() -> None:
    """Send-by is checked on this host's monotonic clock too, just before the send, by call and acall: a ledger clock
    read that stalls past send-by (a slow database query; the default lease leaves 200 ms between the grant and
    send-by, the read takes 300 ms) leaves the attempt not sent, never sent late (as the Rust host does). Under acall
    the ledger clock is read in the worker thread that runs the guest, never on the event loop."""
    o = Once.memory(policies={"refund": Policy(dispatch_timeout_ms=1000)})
    assert o.plan("refund").policy["lease-ms"] == 1200
    ledger_now = o.now

    read_on: list[int] = []

    def stalls() -> int:
        read_on.append(threading.get_ident())
        read = ledger_now()
        time.sleep(0.3)
        return read

    o.now = stalls  # type: ignore[method-assign]
    sends: list[str] = []

    def send(d: once.Dispatch) -> Sent:
        sends.append(d.key)
        return Sent.success({"refund_id": "r-1"})

    async def asend(d: once.Dispatch) -> Sent:
        return send(d)

    by_call = o.call("t", "k-sync", "refund", {"order_id": 1}, send, wait=0.0)
    assert read_on and set(read_on) == {threading.get_ident()}
    read_on.clear()
    by_acall = asyncio.run(o.acall("t", "k-async", "refund", {"order_id": 2}, asend, wait=0.0))
    assert read_on and threading.get_ident() not in read_on, "the event loop's thread read the ledger clock"
    for called in (by_call, by_acall):
        assert isinstance(called.ending, once.NotSent) and called.ending.attempts == 1, called
    assert sends == []


def test_a_cancelled_acall_cancels_its_dispatcher_and_waits_for_it() -> None:
    """The caller goes away mid-send: its dispatcher is cancelled with it, and has ended by the time the caller's
    cancellation arrives (nothing of it runs on unseen); the attempt is left to reconciliation, never re-sent blind."""
    o = Once.memory()
    events: list[str] = []

    async def slow(d: once.Dispatch) -> Sent:
        events.append("sent")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)
            events.append("ended")
            raise
        return Sent.success({})

    async def main() -> None:
        call = asyncio.ensure_future(o.acall("t", "k-3", "refund", {"order_id": 3}, slow))
        while "sent" not in events:
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert events == ["sent", "ended"], events

    asyncio.run(main())
    view = o.inspect("t", "k-3")
    assert view is not None and view.state is once.State.UNKNOWN, view
