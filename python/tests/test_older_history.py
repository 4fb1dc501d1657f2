"""Older history (DESIGN.md "Authority"; docs/design.md "Older history"), through the package as a user runs it: a
SQLite ledger restored from an older backup must not re-send what the newer history had.

The case "older history: restoring an older ledger backup and retrying re-ran a payment": a refund is sent and
confirmed, the ledger file is put back as last night's backup had it (before the refund), and the caller retries
the same refund with the same key. The older ledger holds no record of it; the witness beside it (`<ledger>.witness`,
which the restore did not touch) does. The engine writes the witnessed record back (audit `restored-from-witness`),
lets its attempt's lease run out, and sends nothing before a read of the provider (or an operator) settles it. A
witness restored or lost with the ledger tells nothing: the last test shows that limit.

The provider here honours no idempotency key (every request it receives is a refund), so a second send is a second
payment, and its read finds a refund by the provider key it was sent with.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Optional

import pytest

import once
from once import Confirmation, Confirmed, Effect, Evidence, Once, Policy, ReplayVia, Repeat, Sent, State, Unknown
from once.ledger import MemoryLedger, SqliteLedger

SCOPE, KEY, TOOL = "shop", "refund-order-7", "refund"
ARGS = {"order": 7, "amount": "40.00"}
# A short lease (dispatch timeout 100 ms + the engine's 200 ms margin), so a restored attempt's lease runs out within
# a call's wait; reads every 10 ms once it has.
POLICY = Policy(dispatch_timeout_ms=100, max_in_flight_ms=50, reconcile_interval_ms=10)
# Long enough for the restored attempt's lease to run out and a read to settle it inside the call.
WAIT = 30.0


class Provider:
    """A refund API without idempotency: each request it receives makes one refund."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, int, str]] = []  # (provider key, order, refund id), in the order received

    def send(self, d: once.Dispatch) -> Sent:
        refund_id = f"re_{len(self.refunds) + 1}"
        self.refunds.append((d.provider_key, int(d.arguments()["order"]), refund_id))  # type: ignore[call-overload]
        return Sent.success({"refund_id": refund_id})

    def lookup(self, tool: str, provider_key: str, args: str) -> Evidence:
        """An authoritative read by provider key."""
        for key, _, refund_id in self.refunds:
            if key == provider_key:
                return Evidence.confirmed({"refund_id": refund_id})
        return Evidence.absent(int(time.time() * 1000))

    def of(self, order: int) -> list[str]:
        """The refund ids made for `order`."""
        return [refund_id for _, o, refund_id in self.refunds if o == order]


def _open(path: Path, provider: Provider, *, lookup: bool) -> Once:
    return Once.sqlite(path, policies={TOOL: POLICY}, lookup=provider.lookup if lookup else None)


def _witness(path: Path) -> Path:
    return Path(f"{path}.witness")


def _backup(database: Path, to: Path) -> None:
    """A consistent copy of a SQLite file as it is now, what its WAL holds included (SQLite's online backup, as
    `sqlite3 FILE .backup` makes one), taken while the ledger is open."""
    source, copy = sqlite3.connect(database), sqlite3.connect(to)
    try:
        source.backup(copy)
    finally:
        source.close()
        copy.close()


def _put_back(backup: Path, database: Path) -> None:
    """Restore `database` from `backup`, as an operator does with the ledger closed: the WAL and shared memory of
    the file it replaces go with it."""
    for suffix in ("-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, database)


def _delete(database: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)


def _refund_then_restore(tmp_path: Path, provider: Provider, *, lookup: bool) -> tuple[Path, Path, str]:
    """Yesterday's refund (order 1), last night's backup, today's refund of order 7 (sent, confirmed), then the
    ledger put back as the backup had it. The ledger's path, the backup's, and order 7's receipt."""
    path, backup = tmp_path / "ledger.db", tmp_path / "ledger-backup.db"
    handle = _open(path, provider, lookup=lookup)
    earlier = handle.call(SCOPE, "refund-order-1", TOOL, {"order": 1, "amount": "5.00"}, provider.send)
    assert isinstance(earlier.ending, Confirmed)
    _backup(path, backup)

    sent = handle.call(SCOPE, KEY, TOOL, ARGS, provider.send)
    assert isinstance(sent.ending, Confirmed) and not sent.ending.replayed
    assert sent.receipt is not None and provider.of(7) == ["re_2"]
    handle.close()

    _put_back(backup, path)
    assert _witness(path).is_file(), "the restore leaves the witness beside the ledger as it was"
    return path, backup, sent.receipt


def test_older_history_a_restored_ledger_finds_the_refund_in_the_witness_and_reads_it_from_the_provider(
    tmp_path: Path,
) -> None:
    """Restoring an older ledger backup and retrying re-ran a payment; with the witness, the retry is written back,
    read from the provider after its attempt's lease, and answered from what the read found: one refund."""
    provider = Provider()
    path, _, receipt = _refund_then_restore(tmp_path, provider, lookup=True)

    restored = _open(path, provider, lookup=True)
    assert restored.inspect(SCOPE, KEY) is None, "the older ledger holds no record of today's refund"
    retried = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send, wait=WAIT)

    assert isinstance(retried.ending, Confirmed), retried.describe()
    assert retried.ending.replayed and retried.ending.via is ReplayVia.PROVIDER
    assert retried.ending.confirmed_by is Confirmation.PROVIDER, "known from the provider's read, never a new send"
    assert retried.ending.attempt == 1, "the attempt the newer history sent"
    assert retried.effect is Effect.HAPPENED
    assert retried.receipt == receipt
    assert provider.of(7) == ["re_2"], "the refund was not sent again"
    view = restored.inspect(SCOPE, KEY)
    assert view is not None and view.state is State.CONFIRMED
    kinds = [e.kind for e in view.audit]
    assert kinds[0] == "restored-from-witness", kinds  # its life in this ledger begins with the witness

    # Every later call replays it.
    again = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send)
    assert isinstance(again.ending, Confirmed) and again.ending.replayed and again.receipt == receipt
    assert provider.of(7) == ["re_2"] and provider.of(1) == ["re_1"]
    restored.close()


def test_older_history_without_a_lookup_the_restored_refund_is_never_sent_again_and_waits_for_an_operator(
    tmp_path: Path,
) -> None:
    """The same restore with no read of the provider: the witnessed refund's outcome is unknown to the older ledger,
    so nothing is sent; it waits for an operator, whose resolution the next call replays."""
    provider = Provider()
    path, _, receipt = _refund_then_restore(tmp_path, provider, lookup=False)

    restored = _open(path, provider, lookup=False)
    retried = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send, wait=WAIT)

    assert isinstance(retried.ending, Unknown), retried.describe()
    assert retried.ending.next_read is None, "no read of the provider is scheduled: there is none"
    assert retried.account is not None and retried.account.awaits_operator
    assert retried.account.repeat is Repeat.WAITS
    assert retried.effect is Effect.UNKNOWN
    assert provider.of(7) == ["re_2"], "the refund was not sent again"
    view = restored.inspect(SCOPE, KEY)
    assert view is not None and view.state is State.UNKNOWN
    kinds = [e.kind for e in view.audit]
    assert kinds[0] == "restored-from-witness", kinds

    # Asked again, it still sends nothing.
    again = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send, wait=0)
    assert isinstance(again.ending, Unknown) and provider.of(7) == ["re_2"]

    # An operator who checked the provider settles it; the call then replays the receipt.
    restored.resolve(SCOPE, KEY, confirmed=receipt, note="ops: re_2 found in the provider's dashboard")
    settled = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send)
    assert isinstance(settled.ending, Confirmed) and settled.ending.replayed and settled.receipt == receipt
    assert provider.of(7) == ["re_2"]
    restored.close()


@pytest.mark.parametrize("witness", ["lost", "restored"])
def test_a_witness_restored_or_lost_with_the_ledger_cannot_tell(tmp_path: Path, witness: str) -> None:
    """What the witness cannot detect, written down as a test: restored from the same backup as the ledger, or
    deleted with it, it holds nothing the older ledger lacks, and the retry pays the refund a second time."""
    provider = Provider()
    path, backup = tmp_path / "ledger.db", tmp_path / "ledger-backup.db"
    witness_backup = tmp_path / "ledger-backup.db.witness"
    handle = _open(path, provider, lookup=True)
    earlier = handle.call(SCOPE, "refund-order-1", TOOL, {"order": 1, "amount": "5.00"}, provider.send)
    assert isinstance(earlier.ending, Confirmed)
    _backup(path, backup)
    _backup(_witness(path), witness_backup)  # the witness backed up with the ledger: the mistake
    sent = handle.call(SCOPE, KEY, TOOL, ARGS, provider.send)
    assert isinstance(sent.ending, Confirmed) and provider.of(7) == ["re_2"]
    handle.close()

    _put_back(backup, path)
    if witness == "lost":
        _delete(_witness(path))
    else:
        _put_back(witness_backup, _witness(path))

    restored = _open(path, provider, lookup=True)
    retried = restored.call(SCOPE, KEY, TOOL, ARGS, provider.send, wait=WAIT)
    assert isinstance(retried.ending, Confirmed) and not retried.ending.replayed
    assert provider.of(7) == ["re_2", "re_3"], "the limit: the refund was paid twice"
    view = restored.inspect(SCOPE, KEY)
    assert view is not None and "restored-from-witness" not in [e.kind for e in view.audit]
    restored.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_the_witness_keeps_the_latest_grant_and_forgets_older_ones(tmp_path: Path, kind: str) -> None:
    """The ledger's side of the `witness` import: what is kept is replaced by a grant as late or later, never by an
    earlier one (a slow keep of an earlier attempt), and `forget` drops one key's, if it was kept before its time."""
    ledger = SqliteLedger(tmp_path / "ledger.db") if kind == "sqlite" else MemoryLedger()
    try:
        assert ledger.witness_seen("s", "k") is None
        ledger.witness_keep("s", "k", '{"attempt":1}', 1_000)
        ledger.witness_keep("s", "k", '{"attempt":2}', 2_000)
        ledger.witness_keep("s", "k", '{"attempt":1,"late":true}', 1_500)
        assert ledger.witness_seen("s", "k") == '{"attempt":2}'
        ledger.witness_keep("s", "k", '{"attempt":2,"again":true}', 2_000)
        assert ledger.witness_seen("s", "k") == '{"attempt":2,"again":true}'
        ledger.witness_keep("s", "other", "{}", 3_000)
        ledger.witness_forget("s", "k", 2_000)  # kept at 2 000, not before: a later operation's, which stays
        assert ledger.witness_seen("s", "k") == '{"attempt":2,"again":true}'
        ledger.witness_forget("s", "k", 2_001)
        assert (ledger.witness_seen("s", "k"), ledger.witness_seen("s", "other")) == (None, "{}")
        ledger.witness_forget("s", "other", 2 ** 64 - 1)  # the largest timestamp: all it kept was before it
        assert ledger.witness_seen("s", "other") is None
    finally:
        ledger.close()


def test_the_sqlite_witness_is_its_own_file_in_the_format_every_host_shares(tmp_path: Path) -> None:
    """`<ledger>.witness`, one table `witness (scope, key, at, body)` keyed by (scope, key), in WAL mode: the Rust
    and Node hosts open the same file. The ledger file holds no witness (a restore of it must not reach one)."""
    path = tmp_path / "ledger.db"
    provider = Provider()
    handle = _open(path, provider, lookup=True)
    sent = handle.call(SCOPE, KEY, TOOL, ARGS, provider.send)
    assert isinstance(sent.ending, Confirmed)
    handle.close()

    db = sqlite3.connect(_witness(path))
    try:
        columns = [(name, kind, notnull, pk) for _, name, kind, notnull, _, pk in db.execute("PRAGMA table_info(witness)")]
        assert columns == [("scope", "TEXT", 1, 1), ("key", "TEXT", 1, 2), ("at", "INTEGER", 1, 0),
                           ("body", "TEXT", 1, 0)]
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        kept: Optional[tuple[str, str, int, str]] = db.execute("SELECT scope, key, at, body FROM witness").fetchone()
    finally:
        db.close()
    assert kept is not None and kept[:2] == (SCOPE, KEY) and isinstance(kept[2], int)
    record = json.loads(kept[3])  # the record as the engine granted it
    assert (record["scope"], record["key"], record["tool"], len(record["attempts"])) == (SCOPE, KEY, TOOL, 1)
    ledger = sqlite3.connect(path)
    try:
        tables = {name for (name,) in ledger.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        ledger.close()
    assert "witness" not in tables, tables
