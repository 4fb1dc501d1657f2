"""A protected function's return value that is not JSON: the effect happened, so the record ends confirmed and
the stated JSON projection (model.receipt_text) is what is stored, returned and replayed."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import json
import uuid

import once
from once import Confirmed, Once, Sent

TICKET = uuid.UUID("12345678-1234-5678-1234-567812345678")


class Status(enum.Enum):
    DONE = "done"


@dataclasses.dataclass
class Refund:
    refund_id: str
    amount: decimal.Decimal
    at: datetime.datetime
    status: Status
    ticket: uuid.UUID


class Handle:
    """A value with no JSON form at all."""

    def __repr__(self) -> str:
        return "Handle(fd=3)"


# What a Refund is stored and replayed as: fields by name, each field projected.
PROJECTED = {"refund_id": "r-7", "amount": "19.90", "at": "2026-12-04T22:00:00+00:00", "status": "done",
             "ticket": "12345678-1234-5678-1234-567812345678"}


def _confirmed(o: Once, scope: str, key: str, replays: int) -> object:
    view = o.inspect(scope, key)
    assert view is not None and view.state is once.State.CONFIRMED, view
    assert view.attempts == 1 and view.replays == replays
    assert view.receipt is not None
    return json.loads(view.receipt)


def test_protect_a_dataclass_of_datetime_decimal_enum_uuid_is_confirmed_and_its_projection_replayed() -> None:
    o = Once.memory()
    calls: list[int] = []

    @o.protect(key=lambda order_id: f"refund-{order_id}")
    def refund_order(order_id: int) -> Refund:
        calls.append(order_id)
        return Refund(f"r-{order_id}", decimal.Decimal("19.90"),
                      datetime.datetime(2026, 12, 4, 22, 0, tzinfo=datetime.timezone.utc), Status.DONE, TICKET)

    # The first call returns what is stored, as a replay does: a retry cannot tell the two apart.
    assert refund_order(7) == PROJECTED
    assert _confirmed(o, "default", "refund-7", replays=0) == PROJECTED
    assert refund_order(7) == PROJECTED
    assert calls == [7]
    assert _confirmed(o, "default", "refund-7", replays=1) == PROJECTED


def test_protect_each_non_json_value_has_its_stated_projection() -> None:
    o = Once.memory()
    cases: list[tuple[object, object]] = [
        (datetime.date(2026, 12, 4), "2026-12-04"),
        (datetime.time(22, 5, 1), "22:05:01"),
        (decimal.Decimal("1E+2"), "1E+2"),
        ({"tags": {"vip"}, "pair": (1, 2)}, {"tags": ["vip"], "pair": [1, 2]}),
        # No projection: a stand-in naming the type, with its repr; nested ones stay where they were.
        ({"refund_id": "r-1", "handle": Handle()},
         {"refund_id": "r-1", "handle": {"once_unserializable": {"type": "Handle", "repr": "Handle(fd=3)"}}}),
        # A value json cannot walk at all (a key that is not a string): the whole value is the stand-in.
        ({(1, 2): "x"}, {"once_unserializable": {"type": "dict", "repr": "{(1, 2): 'x'}"}}),
    ]
    for i, (value, projected) in enumerate(cases):
        calls: list[int] = []

        @o.protect(tool="returns", key=f"k-{i}")
        def returns() -> object:
            calls.append(i)
            return value

        assert returns() == projected, value
        assert returns() == projected, value
        assert calls == [i], value
        assert _confirmed(o, "default", f"k-{i}", replays=1) == projected


def test_protect_async_returning_a_datetime_is_confirmed() -> None:
    o = Once.memory()
    calls: list[int] = []

    @o.protect(key="op-1", scope="t")
    async def stamp() -> datetime.datetime:
        await asyncio.sleep(0)
        calls.append(1)
        return datetime.datetime(2026, 12, 4, 22, 0, 5)

    async def main() -> None:
        assert await stamp() == "2026-12-04T22:00:05"
        assert await stamp() == "2026-12-04T22:00:05"

    asyncio.run(main())
    assert calls == [1]
    assert _confirmed(o, "t", "op-1", replays=1) == "2026-12-04T22:00:05"


def test_a_dispatcher_answering_a_non_json_success_is_confirmed() -> None:
    o = Once.memory()
    sent: list[once.Dispatch] = []

    def send(d: once.Dispatch) -> object:
        sent.append(d)
        return {"at": datetime.date(2026, 1, 2)}  # any value but a Sent is the success response

    first = o.call("s", "k", "refund_order", {"order_id": 1}, send)
    again = o.call("s", "k", "refund_order", {"order_id": 1}, send)
    assert isinstance(first.ending, Confirmed) and not first.ending.replayed
    assert isinstance(again.ending, Confirmed) and again.ending.replayed
    assert again.ending.value() == {"at": "2026-01-02"} and len(sent) == 1
    assert Sent.success(decimal.Decimal("0.1")) == Sent("success", '"0.1"')
