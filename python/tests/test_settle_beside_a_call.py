"""A `settle` running beside a live call in the same process (a background thread or task on one `Once`), through
the package over a SQLite ledger file.

A call whose reply was lost waits for its provider read to come due; the sweep of a `settle` meanwhile reads the
same due unknown, proves it absent and lists it owed. Sending it there would race the call for its own operation,
and when `settle` won, the caller, who made one call, was told its operation had already run (a replay): a
duplicate it did not make, as far as it could tell. So `settle` leaves an operation a call of the same handle is
driving to that call, which sends attempt 2 itself and answers that it did. A call that goes away leaves it to the
next `settle`, as before.

Nothing here depends on timing: the ledger's clock is this test's (it moves only when the test moves it), and the
call is held between its steps at its first reading of that clock after the lost reply, before its wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

import once
from once import Confirmed, Evidence, Once, Policy, Sent
from once.ledger import SqliteLedger

SCOPE, KEY, TOOL = "t1", "refund-1", "refund"
ARGS = {"order_id": 1}
# A lost reply is read at once, and again once max-in-flight has passed since it (a read before proves nothing: the
# request may still land), so the call waits a minute of the ledger's clock for its read to come due.
POLICY = Policy(lookup=True, max_in_flight_ms=60_000)
# Past the read's due time, well before the unknown's escalation deadline (15 minutes).
LATER = 120_000


class Clocked(SqliteLedger):
    """A SQLite ledger whose clock is the test's: the wall clock when opened, moved on only by `advance`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._at = super().now()

    def now(self) -> int:
        return self._at

    def advance(self, ms: int) -> None:
        self._at += ms


class Provider:
    """A refund API: counts what it receives by whom; no refund is ever found by its read."""

    def __init__(self, ledger: Clocked) -> None:
        self.ledger = ledger
        self.sends: list[tuple[str, int]] = []  # (who sent, attempt)

    def lookup(self, tool: str, provider_key: str, args: str) -> Evidence:
        return Evidence.absent(self.ledger.now())

    def sender(self, who: str, *, lost: Optional[threading.Event] = None) -> Callable[[once.Dispatch], Sent]:
        """`who`'s dispatcher: with `lost`, its first attempt's reply is lost (and `lost` set); others succeed."""

        def send(d: once.Dispatch) -> Sent:
            self.sends.append((who, d.attempt))
            if lost is not None and not lost.is_set():
                lost.set()
                return Sent.ambiguous("the connection dropped before the reply")
            return Sent.success({"refund_id": f"re_{len(self.sends)}"})

        return send


def _open(path: Path) -> tuple[Once, Clocked, Provider]:
    ledger = Clocked(path)
    provider = Provider(ledger)
    return Once(ledger, policies={TOOL: POLICY}, lookup=provider.lookup), ledger, provider


def _the_next_settle_sends_attempt_2(o: Once, ledger: Clocked, provider: Provider) -> None:
    """Once the read is due, `settle` proves the absence and sends attempt 2, once: the call's was the only other."""
    ledger.advance(LATER)
    swept = o.settle(provider.sender("settle"))
    assert swept.owed == [(SCOPE, KEY)] and len(swept.sent) == 1, swept
    ending = swept.sent[0].ending
    assert isinstance(ending, Confirmed) and (ending.replayed, ending.attempt) == (False, 2), ending
    assert provider.sends == [("call", 1), ("settle", 2)]


def test_a_settle_beside_a_call_leaves_it_its_own_lost_reply(tmp_path: Path) -> None:
    """The call's first send is lost; while it waits for its read, `settle` (another thread, the same handle) reads
    the due unknown, proves it absent and lists it owed, and sends nothing; the call then sends attempt 2 itself and
    answers executed, attempt 2, not a replay: two sends in all, the lost one and the call's second."""
    o, ledger, provider = _open(tmp_path / "once.db")
    lost, waiting, go = threading.Event(), threading.Event(), threading.Event()
    ledger_now = o.now

    def held_after_the_lost_reply() -> int:
        # The call reads the ledger clock as it starts each wait: its first wait after the lost reply holds here.
        if threading.current_thread() is caller and lost.is_set() and not waiting.is_set():
            waiting.set()
            assert go.wait(30), "the test never let the call go on"
        return ledger_now()

    o.now = held_after_the_lost_reply  # type: ignore[method-assign]
    answer: list[once.Called] = []
    caller = threading.Thread(
        target=lambda: answer.append(o.call(SCOPE, KEY, TOOL, ARGS, provider.sender("call", lost=lost), wait=600.0)))
    caller.start()
    try:
        assert waiting.wait(30), "the call never reached its wait"
        view = o.inspect(SCOPE, KEY)
        assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1, view
        ledger.advance(LATER)  # the call's read is due: the sweep reads it
        swept = o.settle(provider.sender("settle"))
    finally:
        go.set()
        caller.join(30)
    assert not caller.is_alive()
    assert swept.owed == [(SCOPE, KEY)], "the sweep proved the absence and listed it owed"
    assert swept.sent == [] and ("settle", 2) not in provider.sends, f"settle sent the call's operation: {swept}"
    (called,) = answer
    assert isinstance(called.ending, Confirmed), called.describe()
    assert (called.ending.replayed, called.ending.attempt) == (False, 2), called.ending
    assert provider.sends == [("call", 1), ("call", 2)]
    # Once the call is over, settle takes what is due again: nothing is.
    after = o.settle(provider.sender("settle"))
    assert after.owed == [] and after.sent == [] and len(provider.sends) == 2, after


class GoneAway(BaseException):
    """The caller goes away mid-send (as a KeyboardInterrupt or a thread's exit would): not an `Exception`."""


def test_a_call_that_raises_out_of_its_send_leaves_its_operation_to_the_next_settle(tmp_path: Path) -> None:
    """A dispatcher that raises a BaseException ends the call once the attempt is reported ambiguous: the call no
    longer drives it, and the next `settle` proves it absent and sends attempt 2."""
    o, ledger, provider = _open(tmp_path / "once.db")

    def goes_away(d: once.Dispatch) -> Sent:
        provider.sends.append(("call", d.attempt))
        raise GoneAway()

    with pytest.raises(GoneAway):
        o.call(SCOPE, KEY, TOOL, ARGS, goes_away, wait=600.0)
    _the_next_settle_sends_attempt_2(o, ledger, provider)


def test_a_cancelled_acall_leaves_its_operation_to_the_next_settle(tmp_path: Path) -> None:
    """An acall cancelled while it waits for its read (its reply lost) no longer drives the operation: the next
    `settle` proves it absent and sends attempt 2."""
    o, ledger, provider = _open(tmp_path / "once.db")
    lost = threading.Event()
    ledger_now = o.now

    async def scenario() -> None:
        waiting = asyncio.Event()
        loop = asyncio.get_running_loop()

        def noted_after_the_lost_reply() -> int:
            # Read in a worker thread as the call starts each wait (and before each send).
            if lost.is_set():
                loop.call_soon_threadsafe(waiting.set)
            return ledger_now()

        o.now = noted_after_the_lost_reply  # type: ignore[method-assign]
        send = provider.sender("call", lost=lost)

        async def asend(d: once.Dispatch) -> Sent:
            return send(d)

        call = asyncio.ensure_future(o.acall(SCOPE, KEY, TOOL, ARGS, asend, wait=600.0))
        await asyncio.wait_for(waiting.wait(), 30)
        # Waiting a minute of the ledger's clock for its read (whether it is still reading the clock or already
        # asleep, the cancellation ends its loop).
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        asyncio.run(scenario())
    finally:
        o.now = ledger_now  # type: ignore[method-assign]
    view = o.inspect(SCOPE, KEY)
    assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1, view
    _the_next_settle_sends_attempt_2(o, ledger, provider)


def test_a_send_that_hangs_past_its_deadline_leaves_its_operation_to_settle(tmp_path: Path) -> None:
    """A call holds its operation against `settle` while it drives it, but a send is the caller's code and may never
    return: past the deadline the guest gave its answer, the hung send no longer holds it, and once the lease is over
    `settle` proves the absence and sends attempt 2, as it would without the call."""
    ledger = Clocked(tmp_path / "once.db")
    provider = Provider(ledger)
    o = Once(ledger, policies={TOOL: Policy(lookup=True, dispatch_timeout_ms=50, lease_ms=2_000, max_in_flight_ms=1)},
             lookup=provider.lookup)
    in_send, hangs = threading.Event(), threading.Event()

    def hung(d: once.Dispatch) -> Sent:
        provider.sends.append(("call", d.attempt))
        in_send.set()
        assert hangs.wait(30), "the test never let the send return"
        return Sent.not_sent()

    caller = threading.Thread(target=lambda: o.call(SCOPE, KEY, TOOL, ARGS, hung, wait=0.0))
    caller.start()
    try:
        assert in_send.wait(30), "the call never sent"
        ledger.advance(LATER)  # its lease is over and the request can no longer commit
        swept = o.settle(provider.sender("settle"))
        # Until the send's deadline (this host's clock: send-by ~1.95 s after the grant, however slow the machine, and
        # the 50 ms timeout) has passed.
        for _ in range(500):
            if swept.sent:
                break
            time.sleep(0.02)
            swept = o.settle(provider.sender("settle"))
    finally:
        hangs.set()
        caller.join(30)
    assert len(swept.sent) == 1, swept
    ending = swept.sent[0].ending
    assert isinstance(ending, Confirmed) and (ending.replayed, ending.attempt) == (False, 2), ending
    assert provider.sends == [("call", 1), ("settle", 2)]
