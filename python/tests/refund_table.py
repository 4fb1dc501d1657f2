"""The provider's side of the adapter tests: each refund sent is a row in a real SQLite table."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import once


class RefundTable:
    """A provider whose refunds are rows of `refunds` in the SQLite file `path`; `lose_replies` replies are lost."""

    def __init__(self, path: Path, *, lose_replies: int = 0) -> None:
        self.path = path
        self.lose_replies = lose_replies
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id INTEGER, amount INTEGER, "
                       "request_id TEXT)")

    def refund(self, order_id: int, amount: int, request_id: Optional[str] = None) -> dict[str, object]:
        """Commit one refund; then, while replies are to be lost, raise as a dropped connection would."""
        # A connection per call: the SDK runs a sync tool in a worker thread.
        with sqlite3.connect(self.path) as db:
            row = db.execute("INSERT INTO refunds (order_id, amount, request_id) VALUES (?, ?, ?)",
                             (order_id, amount, request_id)).lastrowid
        if self.lose_replies:
            self.lose_replies -= 1
            raise ConnectionResetError("the refund committed; its reply was lost")
        return {"refund_id": f"r-{row}", "order_id": order_id, "amount": amount}

    def count(self) -> int:
        """How many refunds the provider made."""
        with sqlite3.connect(self.path) as db:
            n: int = db.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
        return n

    def amounts(self) -> list[int]:
        """The amounts refunded, in order."""
        with sqlite3.connect(self.path) as db:
            return [r[0] for r in db.execute("SELECT amount FROM refunds ORDER BY id")]

    @contextmanager
    def held_elsewhere(self, o: once.Once, scope: str, key: str, order_id: int, amount: int) -> Iterator[None]:
        """For the block, another attempt (a thread of this process) holds the operation `key` that refunds
        `amount` of `order_id`; when the block ends it sends that refund, once."""
        entered, release = threading.Event(), threading.Event()

        def held(d: once.Dispatch) -> once.Sent:
            entered.set()
            assert release.wait(30), "the held attempt was never released"
            return once.Sent.success(self.refund(order_id, amount))

        holder = threading.Thread(target=o.call, args=(scope, key, "refund_order",
                                                       {"order_id": order_id, "amount": amount}, held))
        holder.start()
        try:
            assert entered.wait(30), "the holding attempt never started"
            yield
        finally:
            release.set()
            holder.join(30)
