"""A record that went unknown while no lookup was configured is read once one is (issue 32, item 4).

Two processes' worth of handles on one SQLite file: the first has no lookup, the second adds one.
Before, the second's `sweep()` reported `reconciled=0` and the key waited for an operator for ever.
"""

from __future__ import annotations

from pathlib import Path

import once
from once import Once, Sent


def _unknown_without_lookup(path: Path) -> None:
    first = Once.sqlite(path)
    c = first.call("s", "refund-1", "refund_order", {"order_id": 1, "amount": "10.00"},
                   lambda d: Sent.ambiguous("connection reset after the request went out"), wait=0)
    assert isinstance(c.ending, once.Unknown)
    assert c.ending.next_read is None, "no lookup: nothing will read it"
    assert first.sweep().reconciled == 0


def test_the_sweep_of_a_handle_with_a_lookup_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _unknown_without_lookup(path)
    reads: list[str] = []

    def lookup(tool: str, provider_key: str, args: str) -> once.Evidence:
        reads.append(tool)
        return once.Evidence.confirmed({"refund_id": "r-1"})

    second = Once.sqlite(path, lookup=lookup)
    swept = second.sweep()
    assert (swept.reconciled, swept.confirmed) == (1, 1)
    assert reads == ["refund_order"]
    view = second.inspect("s", "refund-1")
    assert view is not None and view.state == once.State.CONFIRMED
    # The caller's retry replays the provider's receipt; nothing is sent.
    again = second.call("s", "refund-1", "refund_order", {"order_id": 1, "amount": "10.00"},
                        lambda d: (_ for _ in ()).throw(AssertionError("sent again")))
    assert isinstance(again.ending, once.Confirmed)
    assert again.receipt == '{"refund_id":"r-1"}'


def test_a_retry_through_a_handle_with_a_lookup_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _unknown_without_lookup(path)
    second = Once.sqlite(path, lookup=lambda tool, pk, args: once.Evidence.confirmed({"refund_id": "r-1"}))
    again = second.call("s", "refund-1", "refund_order", {"order_id": 1, "amount": "10.00"},
                        lambda d: (_ for _ in ()).throw(AssertionError("sent again")))
    assert isinstance(again.ending, once.Confirmed)
    assert again.receipt == '{"refund_id":"r-1"}'
