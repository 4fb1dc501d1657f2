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


def _raw(db: str) -> Callable[[], object]:
    """A plain connection to the ledger `db` names (an SQLite path, or a PostgreSQL URL with `?schema=`)."""
    if db.startswith("postgres"):
        import psycopg

        url, schema = db.split("?schema=")
        return lambda: psycopg.connect(url, autocommit=True, options=f"-c search_path={schema}")
    import sqlite3

    return lambda: sqlite3.connect(db, isolation_level=None)


def body_format(db: str) -> str | None:
    conn = _raw(db)()
    try:
        r = conn.execute("SELECT value FROM meta WHERE key = 'body_format'").fetchone()  # type: ignore[attr-defined]
        return None if r is None else str(r[0])
    finally:
        conn.close()  # type: ignore[attr-defined]


def set_body_format(db: str, value: str | None) -> None:
    """Leave the ledger's recorded body format as another build (or one from before the key) left it."""
    conn = _raw(db)()
    try:
        conn.execute("DELETE FROM meta WHERE key = 'body_format'")  # type: ignore[attr-defined]
        if value is not None:
            mark = "%s" if db.startswith("postgres") else "?"
            conn.execute(f"INSERT INTO meta (key, value) VALUES ('body_format', {mark})", (value,))  # type: ignore[attr-defined]
    finally:
        conn.close()  # type: ignore[attr-defined]


def ledger_name(db: str) -> str:
    """How a refusal names the ledger: the file, or the schema and its server (as the Rust host does)."""
    if not db.startswith("postgres"):
        return db
    url, schema = db.split("?schema=")
    return f"schema {schema} on {url.split('@', 1)[-1].split('?')[0]}"


def test_a_ledger_records_the_guests_body_format_and_one_of_a_later_format_is_refused(
    ledger: tuple[Callable[[], Once], str]
) -> None:
    open_once, db = ledger
    o = open_once()
    fmt = int(getattr(o._configured, "body-format"))
    assert body_format(db) == str(fmt), "a new ledger records the guest's format"
    o.call(SCOPE, KEY, TOOL, ARGS, lambda d: Sent.success({"refund_id": "py-1"}))
    o.close()

    # A ledger from before the key holds format 1; an earlier format is raised: this guest reads both.
    for left in (None, "0"):
        set_body_format(db, left)
        o = open_once()
        assert body_format(db) == str(fmt), f"left as {left!r}"
        again = o.call(SCOPE, KEY, TOOL, ARGS, never)
        assert isinstance(again.ending, once.Confirmed) and again.ending.value() == {"refund_id": "py-1"}
        o.close()

    set_body_format(db, str(fmt + 1))
    with pytest.raises(once.StorageError) as refused:
        open_once()
    assert str(refused.value) == (
        f"ledger {ledger_name(db)} holds record bodies of format {fmt + 1}; this build of once reads format {fmt}: "
        f"upgrade once (any build reading format {fmt + 1})"
    )
    assert body_format(db) == str(fmt + 1), "the refusal wrote nothing"
