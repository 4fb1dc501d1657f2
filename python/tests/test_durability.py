"""The SQLite ledger's durability modes: which `PRAGMA synchronous` each commit runs at, and what a process
crash after a deferred commit keeps.

`INTENT_ONLY` (DESIGN.md "Durability budget") commits what the engine marks deferrable (an attempt's own
success, a replay's or a conflict's count) at NORMAL and every other batch (an intent, a rejection, an
unknown, an operator's resolution) at FULL. NORMAL in WAL mode skips the fsync, not the write: the commit is
in the WAL file when `commit` returns, so a process crash (SIGKILL) loses nothing; only a power loss may
lose the last deferred commits (not testable here).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest

import once
from once import Once, Sent
from once.ledger import Event, Put, SqliteLedger

HERE = Path(__file__).resolve().parent
AGENT = HERE / "agent_process.py"
LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class Observed(SqliteLedger):
    """The SQLite ledger, noting for every commit whether the engine marked it deferrable and the
    `PRAGMA synchronous` level of the connection it was committed on (read back from SQLite itself)."""

    def __init__(self, path: Path, synchronous: str) -> None:
        super().__init__(path, synchronous=synchronous)
        self.commits: list[tuple[bool, str, list[str]]] = []

    def _note(self, deferrable: bool, events: Sequence[Event]) -> None:
        level = self._conn().execute("PRAGMA synchronous").fetchone()[0]
        self.commits.append((deferrable, LEVELS[level], [e.kind for e in events]))

    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        applied = super().commit(puts, events)
        self._note(False, events)
        return applied

    def commit_deferred(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        applied = super().commit_deferred(puts, events)
        self._note(True, events)
        return applied


def never(d: once.Dispatch) -> Sent:
    raise AssertionError("sent")


def every_kind_of_commit(ledger: Observed) -> None:
    """A success, its replay, a conflict, a rejection, an ambiguous outcome and an operator's resolution."""
    o = Once(ledger)
    args = {"order_id": 1234, "amount": 200}
    assert isinstance(o.call("s", "k1", "refund", args, lambda d: Sent.success({"id": 1})).ending, once.Confirmed)
    assert o.call("s", "k1", "refund", args, never).confirmed.replayed  # type: ignore[union-attr]
    assert isinstance(o.call("s", "k1", "refund", {"order_id": 1, "amount": 5}, never).ending, once.Conflict)
    assert isinstance(o.call("s", "k2", "refund", args, lambda d: Sent.rejected("no")).ending, once.Rejected)
    assert isinstance(o.call("s", "k3", "refund", args, lambda d: Sent.ambiguous("timeout")).ending, once.Unknown)
    o.resolve("s", "k3", confirmed={"id": 3}, note="seen at the provider")


@pytest.mark.parametrize("mode", ["INTENT_ONLY", "intent-only"])
def test_intent_only_defers_exactly_the_batches_the_engine_marks(tmp_path: Path, mode: str) -> None:
    ledger = Observed(tmp_path / "ledger.db", mode)
    every_kind_of_commit(ledger)
    assert ledger.synchronous == "INTENT_ONLY"
    # The first call: the ledger's provider-key secret (no audit event: no operation's transition) and
    # its intent at FULL before the dispatch, its own success at NORMAL.
    assert ledger.commits[:3] == [(False, "FULL", []), (False, "FULL", ["begin"]), (True, "NORMAL", ["finish-success"])]
    for deferrable, level, what in ledger.commits:
        assert level == ("NORMAL" if deferrable else "FULL"), (deferrable, level, what)
    kinds = {k for _, _, ks in ledger.commits for k in ks}
    deferred = {k for d, _, ks in ledger.commits if d for k in ks}
    # What the engine may defer: an attempt's own success and observations, nothing else.
    assert deferred == {"finish-success", "replay", "conflict"}, ledger.commits
    assert {"begin", "finish-rejected", "finish-ambiguous", "operator-confirmed"} <= kinds - deferred, ledger.commits


@pytest.mark.parametrize("mode,level", [("FULL", "FULL"), ("NORMAL", "NORMAL")])
def test_full_and_normal_commit_every_batch_at_their_level(tmp_path: Path, mode: str, level: str) -> None:
    ledger = Observed(tmp_path / "ledger.db", mode)
    every_kind_of_commit(ledger)
    assert any(d for d, _, _ in ledger.commits) and not all(d for d, _, _ in ledger.commits)
    assert {lv for _, lv, _ in ledger.commits} == {level}, ledger.commits


def test_an_unknown_mode_is_refused_with_the_modes_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FULL, INTENT_ONLY or NORMAL"):
        Once.sqlite(tmp_path / "ledger.db", synchronous="SOMETIMES")


def test_a_process_killed_after_a_deferred_success_loses_nothing(tmp_path: Path) -> None:
    db, effects = tmp_path / "ledger.db", tmp_path / "effects"
    p = subprocess.Popen([sys.executable, str(AGENT), str(db), "refund-1234", str(effects), "hang-after-report",
                          "INTENT_ONLY"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reported = Path(str(effects) + ".reported")
    deadline = time.monotonic() + 60
    while not reported.exists() or not reported.read_text(encoding="utf-8"):
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, "the agent never reported"
        time.sleep(0.01)
    ended = json.loads(reported.read_text(encoding="utf-8"))
    assert ended["ending"] == "Confirmed", ended
    # The deferred commit is in the WAL file (written, not fsynced): what a process crash cannot take away.
    assert Path(str(db) + "-wal").stat().st_size > 0
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL

    o = Once.sqlite(db)
    view = o.inspect("tenant-7", "refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED, view
    assert view.receipt == ended["receipt"] and [e.kind for e in view.audit] == ["begin", "finish-success"]
    again = o.call("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, never)
    assert again.confirmed is not None and again.confirmed.replayed and again.receipt == ended["receipt"]
    assert effects.read_text(encoding="utf-8").split() == [view.provider_key]
