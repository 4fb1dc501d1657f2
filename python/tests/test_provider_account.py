"""A record is bound to the provider account it was begun under, through the package as a user runs it: two
handles on one SQLite ledger (two processes' worth), each sending and reading through its own account of one
provider that shows an account only its own refunds. A call through another account is neither replayed nor sent;
a read through a rotated credential never proves an unknown refund absent (DESIGN.md "Authority")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pytest

import once
from once import Blocked, BlockReason, Confirmed, Effect, Evidence, Once, Policy, Repeat, Sent, State


class Provider:
    """A refund API with accounts: each refund is made through one account and visible only through it."""

    def __init__(self) -> None:
        self.refunds: dict[str, dict[str, str]] = {}  # account -> provider key -> refund id

    def account(self, name: str) -> tuple[Callable[[once.Dispatch], Sent], Callable[[str, str, str], Evidence]]:
        """`send` and `lookup` through account `name` (its credential)."""
        mine = self.refunds.setdefault(name, {})

        def send(d: once.Dispatch) -> Sent:
            mine[d.provider_key] = f"{name}-r{len(mine) + 1}"
            return Sent.success({"refund_id": mine[d.provider_key]})

        def lookup(tool: str, provider_key: str, args: str) -> Evidence:
            if provider_key in mine:
                return Evidence.confirmed({"refund_id": mine[provider_key]})
            return Evidence.absent(int(time.time() * 1000))

        return send, lookup

    def count(self) -> int:
        return sum(len(r) for r in self.refunds.values())


def _handle(path: Path, provider: Provider, account: str) -> tuple[Once, Callable[[once.Dispatch], Sent]]:
    send, lookup = provider.account(account)
    policy = Policy(provider_account=account, max_in_flight_ms=50, reconcile_interval_ms=10)
    return Once.sqlite(path, policies={"refund": policy}, lookup=lookup), send


def test_wrong_provider_account_the_same_operation_through_another_account_is_refused(tmp_path: Path) -> None:
    """The case "wrong provider account" (issue "Authority bound to the intent"): the operation, authorised for
    one account, called through another."""
    path, provider = tmp_path / "ledger.db", Provider()
    a, send_a = _handle(path, provider, "acct_live_A")
    b, send_b = _handle(path, provider, "acct_live_B")
    args = {"order": 1, "amount": "40.00"}
    assert isinstance(a.call("s", "refund-1", "refund", args, send_a).ending, Confirmed)

    other = b.call("s", "refund-1", "refund", args, send_b)
    assert isinstance(other.ending, Blocked) and other.ending.reason is BlockReason.OTHER_ACCOUNT
    assert other.effect is Effect.HAPPENED, "the refund happened: never told 'none'"
    assert other.account is not None and other.account.repeat is Repeat.REFUSED
    assert other.ending.receipt is None, "another account is not handed the receipt"
    assert "acct_live_A" in other.ending.detail and "acct_live_B" in other.ending.detail
    assert provider.count() == 1 and provider.refunds["acct_live_B"] == {}

    # Its own account replays it.
    again = a.call("s", "refund-1", "refund", args, send_a)
    assert isinstance(again.ending, Confirmed) and again.ending.replayed and provider.count() == 1


def test_credential_rotation_while_unknown_is_never_read_as_absent(tmp_path: Path) -> None:
    """The case "credential rotation while unknown" (issue "Authority"): the reply is lost, the credential rotated;
    the new one cannot see the old refund. Nothing is sent again through it, and the old account's read still
    settles it."""
    path, provider = tmp_path / "ledger.db", Provider()
    send_old, _ = provider.account("key_2026_11")
    # The reply is lost and the provider's read API is down as well: the refund's outcome stays unknown.
    down = Policy(provider_account="key_2026_11", max_in_flight_ms=50, reconcile_interval_ms=10)
    old = Once.sqlite(path, policies={"refund": down}, lookup=lambda tool, pk, args: Evidence.unknown("read API down"))
    args = {"order": 1, "amount": "40.00"}

    def lost_reply(d: once.Dispatch) -> Sent:
        send_old(d)
        return Sent.ambiguous("connection reset after the request went out")

    first = old.call("s", "refund-1", "refund", args, lost_reply, wait=0)
    assert isinstance(first.ending, once.Unknown) and provider.count() == 1
    before = old.inspect("s", "refund-1")
    assert before is not None
    old.close()

    # The process restarts with the rotated credential: another account as far as once can tell.
    new, send_new = _handle(path, provider, "key_2026_12")
    time.sleep(0.1)  # past max_in_flight: an absence read now would settle it, were it proof
    swept = new.settle(send_new)
    assert (swept.owed, swept.sent, swept.confirmed) == ([], [], 0)
    view = new.inspect("s", "refund-1")
    assert view is not None and view.state is State.UNKNOWN and view.attempts == 1
    since = view.audit[len(before.audit):]
    unread = [e for e in since if e.kind.startswith("reconcile")]
    assert unread and all("not read through provider account key_2026_12" in e.detail for e in unread), since
    retried = new.call("s", "refund-1", "refund", args, send_new, wait=0)
    assert isinstance(retried.ending, Blocked) and retried.ending.reason is BlockReason.OTHER_ACCOUNT
    assert retried.effect is Effect.UNKNOWN
    assert provider.count() == 1 and provider.refunds["key_2026_12"] == {}

    # The old credential's read finds the refund: confirmed, replayed, one refund in all.
    back, send_back = _handle(path, provider, "key_2026_11")
    done = back.call("s", "refund-1", "refund", args, send_back)
    assert isinstance(done.ending, Confirmed) and provider.count() == 1


def test_a_blank_account_is_refused_with_its_field() -> None:
    with pytest.raises(once.InvalidPolicy, match="provider_account"):
        Once.memory(policies={"refund": Policy(provider_account="  ")})
