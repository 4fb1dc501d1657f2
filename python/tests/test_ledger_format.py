"""The Rust host's ledger format, both ways: the `once` CLI reads and resolves ledgers written from Python,
and records written by Rust are continued and replayed from Python (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

import once
from conftest import run
from once import Once, Sent

SCOPE, KEY, TOOL = "tenant-7", "refund-order-1234", "refund_order"
ARGS = '{"order_id":1234,"amount":200}'


def never(d: once.Dispatch) -> Sent:
    raise AssertionError("dispatched again")


def lost_reply(d: once.Dispatch) -> Sent:
    raise ConnectionResetError("the reply was lost")


def cli(once_bin: Path, db: str, *args: str) -> str:
    done = run([str(once_bin), "ledger", *args, "--db", db])
    assert done.returncode == 0, f"once ledger {' '.join(args)}: {done.stderr}"
    return done.stdout


def sqlite_ledger(tmp_path: Path) -> tuple[Callable[[], Once], str]:
    path = str(tmp_path / "ledger.db")
    return (lambda: Once.sqlite(path)), path


def postgres_ledger(url: str, schema: str) -> tuple[Callable[[], Once], str]:
    db = f"{url}?schema={schema}"
    return (lambda: Once.postgres(db)), db


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Callable[[], Once], str]:
    """(open a Python handle, the --db the CLI takes) for one fresh ledger."""
    if request.param == "sqlite":
        return sqlite_ledger(tmp_path)
    url = request.getfixturevalue("pg_url")
    return postgres_ledger(url, request.getfixturevalue("pg_schema"))


def test_the_cli_lists_and_shows_a_ledger_written_from_python(
    once_bin: Path, ledger: tuple[Callable[[], Once], str]
) -> None:
    open_once, db = ledger
    o = open_once()
    o.call(SCOPE, KEY, TOOL, ARGS, lambda d: Sent.success({"refund_id": "py-1"}))
    o.call(SCOPE, "refund-order-99", TOOL, '{"order_id":99,"amount":5}', lost_reply)
    o.close()
    listed = [line.split() for line in cli(once_bin, db, "list").splitlines()[1:]]
    assert sorted(listed) == [
        [SCOPE, KEY, "confirmed", "2"],
        [SCOPE, "refund-order-99", "unknown", "2"],
    ]
    shown = cli(once_bin, db, "show", KEY, "--scope", SCOPE)
    assert 'receipt      {"refund_id":"py-1"}' in shown
    assert "args         " + json.dumps(json.loads(ARGS), sort_keys=True, separators=(",", ":")) in shown
    assert "finish-success" in shown


def test_a_resolution_written_by_rust_is_replayed_from_python(
    once_bin: Path, ledger: tuple[Callable[[], Once], str]
) -> None:
    open_once, db = ledger
    o = open_once()
    first = o.call(SCOPE, KEY, TOOL, ARGS, lost_reply)
    assert isinstance(first.ending, once.Unknown)
    o.close()
    out = cli(once_bin, db, "resolve", KEY, "--scope", SCOPE, "--confirmed", '{"refund_id":"ops-7"}',
              "--note", "seen in the provider's dashboard")
    assert out.strip() == f"{KEY}: confirmed"
    o = open_once()
    again = o.call(SCOPE, KEY, TOOL, ARGS, never)
    assert isinstance(again.ending, once.Confirmed)
    assert again.ending.receipt == '{"refund_id":"ops-7"}' and again.ending.confirmed_by is once.Confirmation.OPERATOR
    view = o.inspect(SCOPE, KEY)
    assert view is not None and [e.kind for e in view.audit][-2:] == ["operator-confirmed", "replay"]
    o.close()
    # And the Rust side sees the replay Python recorded.
    assert "replays      1" in cli(once_bin, db, "show", KEY, "--scope", SCOPE)


def test_the_rust_embedding_replays_a_refund_python_confirmed(embed_bin: Path, tmp_path: Path) -> None:
    # host/once/examples/embed.rs protects the same refund over ./once.db; its own dispatcher never sends.
    o = Once.sqlite(str(tmp_path / "once.db"))
    o.call(SCOPE, KEY, TOOL, ARGS, lambda d: Sent.success({"refund_id": "from-python"}))
    o.close()
    done = run([str(embed_bin)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'refunded: {"refund_id":"from-python"}'
    view = Once.sqlite(str(tmp_path / "once.db")).inspect(SCOPE, KEY)
    assert view is not None and view.replays == 1 and view.audit[-1].kind == "replay"


def test_python_answers_a_record_the_rust_embedding_wrote(embed_bin: Path, tmp_path: Path) -> None:
    # The Rust example's dispatcher answers not-sent: it spends every attempt of its budget.
    done = run([str(embed_bin)], cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("not refunded"), done.stdout + done.stderr
    o = Once.sqlite(str(tmp_path / "once.db"))
    c = o.call(SCOPE, KEY, TOOL, ARGS, never)
    # The account of the Rust record: nothing was ever sent, no attempt is left.
    assert isinstance(c.ending, once.NotSent) and c.ending.attempts == 3
    assert c.account is not None and c.account.repeat is once.Repeat.REFUSED and c.effect is once.Effect.NONE
    view = o.inspect(SCOPE, KEY)
    assert view is not None and view.state is once.State.FAILED and view.attempts == 3
    assert [e.kind for e in view.audit][:2] == ["begin", "finish-not-sent"]
