"""The conformance scenarios (tests/conformance/scenarios) with this package's own ledgers as the store.

The scenario runner is the repository's Python runner (tests/conformance/python/run.py): it scripts the
clock, the provider's evidence and the store's failures, and checks every expectation. Here its stores
are replaced by adapters over `once.ledger.MemoryLedger`, `SqliteLedger` and `PostgresLedger`, so every
scenario's reads, compare-and-swaps and audit trails go through the ledgers users get.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest

from conftest import CI, REPO, load_module
from once import _runtime
from once.ledger import Event, Ledger, MemoryLedger, Put, Row, SqliteLedger

RUNNER = REPO / "tests" / "conformance" / "python" / "run.py"
SCENARIOS = REPO / "tests" / "conformance" / "scenarios"
VECTORS = Path(os.environ.get("ONCE_VECTORS") or REPO.parent / "shared" / "vectors" / "jcs")


def runner() -> ModuleType:
    return load_module(RUNNER, "once_conformance_runner")


def as_dict(r: Optional[Row]) -> Optional[dict[str, Any]]:
    if r is None:
        return None
    return {"table": r.table, "scope": r.scope, "key": r.key, "version": r.version, "state": r.state,
            "due-at": r.due_at, "owner": r.owner, "body": r.body}


class Adapter:
    """The runner's store interface over one of the package's ledgers."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def get(self, table: str, scope: str, key: str) -> Optional[dict[str, Any]]:
        return as_dict(self.ledger.get(table, scope, key))

    def commit(self, puts: list[dict[str, Any]], events: list[dict[str, Any]]) -> Optional[str]:
        rows = [
            Put(p["table"], p["scope"], p["key"], p["expected"],
                None if p["row"] is None else Row(
                    p["row"]["table"], p["row"]["scope"], p["row"]["key"], p["row"]["version"], p["row"]["state"],
                    p["row"]["due-at"], p["row"]["owner"], p["row"]["body"]))
            for p in puts
        ]
        evs = [Event(e["scope"], e["key"], e["version"], e["at"], e["kind"], e["from-state"], e["to-state"],
                     e["attempt"], e["detail"]) for e in events]
        return None if self.ledger.commit(rows, evs) else "conflict"

    def scan(self, table: str, states: list[str], due_before: int, owner: Optional[str],
             limit: int) -> list[dict[str, Any]]:
        return [as_dict(r) for r in self.ledger.scan(table, states, due_before, owner, limit)]  # type: ignore[misc]

    def audit(self, scope: str, key: str) -> list[dict[str, Any]]:
        names = ("scope", "key", "version", "at", "kind", "from-state", "to-state", "attempt", "detail")
        return [dict(zip(names, e)) for e in self.ledger.audit(scope, key)]

    def counts(self) -> tuple[dict[str, int], int]:
        return self.ledger.counts()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_every_scenario_passes_on_the_packages_ledgers(kind: str, request: pytest.FixtureRequest) -> None:
    if not VECTORS.is_dir():
        if CI:
            pytest.fail(f"the JCS vectors are missing at {VECTORS} (CI is set)")
        pytest.skip(f"skipped: the JCS vectors are missing at {VECTORS}")
    run = runner()
    schemas: list[str] = []
    if kind == "memory":
        run.MemoryStore = lambda path=None: Adapter(MemoryLedger())
    elif kind == "sqlite":
        # The semantics are under test here, not power loss: NORMAL keeps a fresh file per scenario quick.
        run.SqliteStore = lambda path: Adapter(SqliteLedger(path, synchronous="NORMAL"))
    else:
        # The runner's "memory" slot, filled with a fresh PostgreSQL schema per ledger (a wipe is a new one).
        url = request.getfixturevalue("pg_url")
        from once.ledger.postgres import PostgresLedger

        def postgres(path: object = None) -> Adapter:
            schemas.append(f"conf_{uuid.uuid4().hex[:12]}")
            return Adapter(PostgresLedger(url, schema=schemas[-1]))

        run.MemoryStore = postgres
    runtime = run.Runtime(str(_runtime.component_path()))
    scenarios = run.load_scenarios(str(SCENARIOS), "")
    assert len(scenarios) >= 40
    try:
        results = run.run_all(runtime, run.Vectors(str(VECTORS)), scenarios, "sqlite" if kind == "sqlite" else "memory",
                              None)
    finally:
        if schemas:
            import psycopg

            with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
                for s in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
    failures = [line for _, _, f in results for line in f]
    assert not failures, "\n".join(failures[:40])
    assert len(results) == len(scenarios)
