"""What a ledger is: a compare-and-swap table of rows, an append-only audit trail and a clock.

A ledger never interprets a row: the guest decides every transition and hands
over one batch per transition, which applies entirely or not at all.
"""

from __future__ import annotations

import abc
import threading
import time
from typing import NamedTuple, Optional, Sequence


class Row(NamedTuple):
    """One row: the indexed fields and the engine's opaque JSON body."""

    table: str
    scope: str
    key: str
    version: int
    state: Optional[str]
    due_at: Optional[int]
    owner: Optional[str]
    body: str


class Put(NamedTuple):
    """One conditional write: `expected` None means the row must not exist; `row` None deletes it."""

    table: str
    scope: str
    key: str
    expected: Optional[int]
    row: Optional[Row]


class Event(NamedTuple):
    """The audit event of one transition, keyed by (scope, key, version)."""

    scope: str
    key: str
    version: int
    at: int
    kind: str
    from_state: Optional[str]
    to_state: Optional[str]
    attempt: Optional[int]
    detail: str


class LedgerFailure(Exception):
    """The store failed: nothing was applied, or (for a commit) the outcome is unknown."""


# The `meta` key under which a ledger records the format of its row bodies (the guest's `body-format`).
BODY_FORMAT_KEY = "body_format"
# The format of a ledger that records none: it predates the key, when every body was format 1.
UNRECORDED_BODY_FORMAT = 1


class NewerBodyFormat(LedgerFailure):
    """The ledger holds row bodies of a later format than this build's guest reads: refused before any row is
    read, because this build could misread them."""

    def __init__(self, ledger: str, holds: int, reads: int) -> None:
        super().__init__(
            f"ledger {ledger} holds record bodies of format {holds}; this build of once reads format {reads}: "
            f"upgrade once (any build reading format {holds})"
        )
        self.ledger, self.holds, self.reads = ledger, holds, reads


def next_body_format(ledger: str, stored: Optional[str], fmt: int) -> Optional[int]:
    """What a ledger's recorded body format must become before a guest that writes `fmt` (and reads every
    earlier one) uses it: the value to write (none recorded yet: the ledger holds format 1; or an earlier one),
    or None when it already says `fmt`. A later format raises `NewerBodyFormat`. Stores call this inside the
    write transaction that reads the value and writes the answer (as the Rust host's storage does)."""
    if stored is None:
        holds = UNRECORDED_BODY_FORMAT
    elif str(stored).isdigit():
        holds = int(stored)
    else:
        raise LedgerFailure(f"ledger {ledger}: unreadable {BODY_FORMAT_KEY} {stored!r} in its meta table (expected a number)")
    if holds > fmt:
        raise NewerBodyFormat(ledger, holds, fmt)
    return fmt if stored is None or holds < fmt else None


# Integers are signed 64-bit in both SQL stores (as in the Rust host's codec).
I64_MAX = (1 << 63) - 1


def checked_int(what: str, value: int) -> int:
    """A u64 as a signed 64-bit column, refusing what it cannot hold."""
    if value > I64_MAX:
        raise LedgerFailure(f"{what} {value} exceeds i64::MAX")
    return value


def _due(row: Row) -> Optional[int]:
    return None if row.due_at is None else checked_int("due_at", row.due_at)


def insert_values(p: Put, row: Row) -> tuple[object, ...]:
    """The parameters of `INSERT INTO rows (tbl, scope, key, version, state, due_at, body, owner)`."""
    return (p.table, p.scope, p.key, checked_int("version", row.version), row.state, _due(row), row.body, row.owner)


def update_values(p: Put, row: Row) -> tuple[object, ...]:
    """The parameters of `UPDATE rows SET version, state, due_at, body, owner WHERE tbl, scope, key, version`."""
    return (checked_int("version", row.version), row.state, _due(row), row.body, row.owner,
            p.table, p.scope, p.key, p.expected)


def event_values(e: Event) -> tuple[object, ...]:
    """The parameters of `INSERT INTO audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)`."""
    return (e.scope, e.key, checked_int("audit version", e.version), checked_int("audit at", e.at), e.kind,
            e.from_state, e.to_state, e.attempt, e.detail)


class SystemClock:
    """Milliseconds since the epoch from this host's clock; never runs backwards."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        wall = time.time_ns() // 1_000_000
        with self._lock:
            self._last = max(self._last, wall)
            return self._last


class Ledger(abc.ABC):
    """A record store and the clock its leases are measured in.

    Beside it, a ledger may keep a witness (the component's `witness` import, wit/once.wit): a copy, kept where a
    restore of the ledger does not reach, of the record of every attempt the engine hands out, so that a ledger
    restored from an older backup never re-sends what the newer history had. The engine decides everything; a
    ledger only stores the text. A ledger with nowhere to keep one keeps nothing (the default here), and the
    engine then cannot tell an older ledger from the newest (docs/design.md "Older history").
    """

    @abc.abstractmethod
    def get(self, table: str, scope: str, key: str) -> Optional[Row]:
        """One row, or None."""

    @abc.abstractmethod
    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        """Apply every put and event atomically: True; a version or event conflict: False, nothing applied.

        A put whose `row` and `expected` are both None writes nothing: it only fails the batch (False) if the
        row exists (the engine claims a new key with an insert that asserts its tombstone is absent).
        """

    def commit_deferred(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        """`commit` a batch the engine marked deferrable (an attempt's own success, a replay or conflict count):
        a store in an intent-only mode may return before it is on disk (DESIGN.md "Durability budget"); a later
        durable commit makes it durable too. By default the same as `commit`."""
        return self.commit(puts, events)

    @abc.abstractmethod
    def scan(
        self, table: str, states: Sequence[str], due_before: int, owner: Optional[str], limit: int
    ) -> list[Row]:
        """Rows of `table` in `states` (empty: any) due at or before `due_before`, oldest due first."""

    @abc.abstractmethod
    def audit(self, scope: str, key: str) -> list[Event]:
        """The audit trail of one operation, oldest first."""

    @abc.abstractmethod
    def now(self) -> int:
        """Now, in the ledger's clock domain (ms); never runs backwards."""

    @abc.abstractmethod
    def claim_body_format(self, fmt: int) -> None:
        """Settle the ledger's body format with a guest that writes `fmt` (and reads every earlier one), before
        it reads or writes a row: record it if none or an earlier one is recorded; raise `NewerBodyFormat`,
        writing nothing, if a later one is. Atomic: read and written in one transaction."""

    @abc.abstractmethod
    def counts(self) -> tuple[dict[str, int], int]:
        """Rows per table and the number of audit events (for operators and tests)."""

    def witness_seen(self, scope: str, key: str) -> Optional[str]:
        """The record body the witness last kept for (scope, key), or None (nothing kept: never granted where this
        witness saw it, or forgotten). Raises `LedgerFailure` when the witness cannot be read: the engine then grants
        nothing on it. By default a ledger keeps no witness: None."""
        return None

    def witness_keep(self, scope: str, key: str, body: str, at: int) -> None:
        """Keep `body` for (scope, key) in place of what is kept, unless what is kept was granted later (its `at` is
        greater); durably before returning. `at` (ms, the ledger clock) is when the attempt was granted. Raises
        `LedgerFailure` when it is not kept: the engine then does not send the attempt. By default nothing is
        kept."""

    def witness_forget(self, scope: str, key: str, before: int) -> None:
        """Forget what the witness kept for (scope, key) if it was kept as of before `before` (ms): the engine's
        prune, as the ledger forgets the key. Raises `LedgerFailure` when it could not. By default there is nothing
        to forget."""

    def close(self) -> None:
        """Release connections."""
