"""The in-memory ledger: one process, gone when it exits (tests, demos)."""

from __future__ import annotations

import threading
from typing import Optional, Sequence

from ._base import Event, Ledger, Put, Row, SystemClock, next_body_format

TABLES = ("operation", "tombstone", "quota")


class MemoryLedger(Ledger):
    """Rows and audit events in dicts behind one lock; a batch applies entirely or not at all."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str, str], Row] = {}
        self._events: dict[tuple[str, str, int], Event] = {}
        self._lock = threading.Lock()
        self._clock = SystemClock()
        # Recorded by the first guest: engines sharing one ledger object must agree, as on a file.
        self._body_format: Optional[str] = None
        # The witness: (scope, key) -> (granted at, body). Exact rather than out of a restore's reach: a memory
        # ledger is never restored from a backup, and its witness goes when it does.
        self._witness: dict[tuple[str, str], tuple[int, str]] = {}

    def claim_body_format(self, fmt: int) -> None:
        with self._lock:
            new = next_body_format("(in memory)", self._body_format, fmt)
            if new is not None:
                self._body_format = str(new)

    def get(self, table: str, scope: str, key: str) -> Optional[Row]:
        with self._lock:
            return self._rows.get((table, scope, key))

    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        with self._lock:
            staged: dict[tuple[str, str, str], Optional[Row]] = {}
            for put in puts:
                k = (put.table, put.scope, put.key)
                current = staged[k] if k in staged else self._rows.get(k)
                if (current.version if current else None) != put.expected:
                    return False
                staged[k] = put.row
            new_events: dict[tuple[str, str, int], Event] = {}
            for e in events:
                ek = (e.scope, e.key, e.version)
                if ek in self._events or ek in new_events:
                    return False
                new_events[ek] = e
            for k, row in staged.items():
                if row is None:
                    self._rows.pop(k, None)
                else:
                    self._rows[k] = row
            self._events.update(new_events)
            return True

    def scan(
        self, table: str, states: Sequence[str], due_before: int, owner: Optional[str], limit: int
    ) -> list[Row]:
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r.table == table
                and r.due_at is not None
                and r.due_at <= due_before
                and (not states or r.state in states)
                and (owner is None or r.owner == owner)
            ]
        rows.sort(key=lambda r: (r.due_at or 0, r.scope.encode(), r.key.encode()))
        return rows[:limit]

    def audit(self, scope: str, key: str) -> list[Event]:
        with self._lock:
            found = [e for (s, k, _), e in self._events.items() if s == scope and k == key]
        return sorted(found, key=lambda e: e.version)

    def now(self) -> int:
        return self._clock.now()

    def counts(self) -> tuple[dict[str, int], int]:
        with self._lock:
            n = {t: 0 for t in TABLES}
            for t, _, _ in self._rows:
                n[t] += 1
            return n, len(self._events)

    def witness_seen(self, scope: str, key: str) -> Optional[str]:
        with self._lock:
            kept = self._witness.get((scope, key))
        return None if kept is None else kept[1]

    def witness_keep(self, scope: str, key: str, body: str, at: int) -> None:
        with self._lock:
            kept = self._witness.get((scope, key))
            # As the SQL witness's upsert: never replaced by an earlier grant (a slow keep overtaken).
            if kept is None or at >= kept[0]:
                self._witness[(scope, key)] = (at, body)

    def witness_forget(self, scope: str, key: str, before: int) -> None:
        with self._lock:
            kept = self._witness.get((scope, key))
            if kept is not None and kept[0] < before:
                del self._witness[(scope, key)]
