"""Real processes on one ledger (an SQLite file, a PostgreSQL schema): racing one key, and a holder SIGKILLed
between dispatch and report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import kill_when

import once
from once import Dispatch, Evidence, Once, Sent

HERE = Path(__file__).resolve().parent
AGENT = HERE / "agent_process.py"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The shared ledger every process of a test opens."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return f"{request.getfixturevalue('pg_url')}?schema={request.getfixturevalue('pg_schema')}"


def open_ledger(db: str, **options: object) -> Once:
    return (Once.postgres if db.startswith("postgres") else Once.sqlite)(db, **options)  # type: ignore[arg-type]


def agent(db: str, key: str, effects: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(AGENT), str(db), key, str(effects), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def effects_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def test_processes_racing_one_key_dispatch_once(tmp_path: Path, db: str) -> None:
    effects = tmp_path / "effects"
    procs = [agent(db, "refund-1234", effects, "race") for _ in range(6)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert len(effects_of(effects)) == 1, effects_of(effects)
    # Every process ends with the one effect's receipt: the holder's own, the others' waited for or replayed.
    receipts = {r["receipt"] for r in results}
    assert [r["effect"] for r in results] == ["happened"] * 6 and len(receipts) == 1, results


class Provider:
    """The provider's authoritative read: its effect ledger (the file the agents append to)."""

    def __init__(self, effects: Path, o: list[Once]) -> None:
        self.effects, self.once = effects, o

    def __call__(self, tool: str, provider_key: str, args: str) -> Evidence:
        if provider_key in effects_of(self.effects):
            return Evidence.confirmed({"refund_id": "found-by-lookup"})
        return Evidence.absent(self.once[0].now())


def kill_after_dispatch(tmp_path: Path, db: str, mode: str) -> Path:
    effects = tmp_path / "effects"
    p = agent(db, "refund-1234", effects, mode)
    marker = Path(str(effects) + ".dispatched")
    kill_when(p, marker.exists, "the agent never dispatched")
    return effects


def recovering_handle(db: str, effects: Path) -> Once:
    handles: list[Once] = []
    o = open_ledger(db, lookup=Provider(effects, handles), settings={"clock_skew_ms": 0},
                    policies={"refund_order": once.Policy(dispatch_timeout_ms=300, max_in_flight_ms=500,
                                                          reconcile_interval_ms=100, lookup=True)})
    handles.append(o)
    return o


@pytest.mark.parametrize("mode", ["hang-after-effect", "hang-before-effect"])
def test_a_holder_killed_between_dispatch_and_report_is_reconciled_never_sent_twice(
    tmp_path: Path, db: str, mode: str
) -> None:
    effects = kill_after_dispatch(tmp_path, db, mode)
    o = recovering_handle(db, effects)
    view = o.inspect("tenant-7", "refund-1234")
    assert view is not None and view.state is once.State.IN_FLIGHT
    resent: list[Dispatch] = []

    def send(d: Dispatch) -> Sent:
        resent.append(d)
        with open(effects, "a", encoding="utf-8") as f:
            f.write(d.provider_key + "\n")
        return Sent.success({"refund_id": "owed-dispatch"})

    called = o.call("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, send, wait=30)
    assert called.effect is once.Effect.HAPPENED
    assert len(effects_of(effects)) == 1, "a second effect"
    view = o.inspect("tenant-7", "refund-1234")
    assert view is not None and view.state is once.State.CONFIRMED
    kinds = [e.kind for e in view.audit]
    assert "lease-expired" in kinds, kinds
    if mode == "hang-after-effect":
        assert resent == [] and called.receipt == '{"refund_id":"found-by-lookup"}'
    else:
        # Proven absent: the owed dispatch went out once, with the same provider key.
        assert len(resent) == 1 and resent[0].provider_key == view.provider_key and resent[0].attempt == 2
