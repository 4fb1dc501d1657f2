"""The SQLite ledger: one file, the Rust host's schema, safe with several threads and processes.

WAL mode; `synchronous=FULL` by default (a committed batch survives power
loss); `INTENT_ONLY` commits the batches the engine marks deferrable (an
attempt's own success, a replay or conflict count) at `NORMAL` and every
other one at `FULL` (DESIGN.md "Durability budget"); a busy timeout for the
write lock. A batch is one `BEGIN IMMEDIATE` transaction: SQLite's file lock
makes the compare-and-swap atomic across processes. The tables are the Rust host's (schema version 2), created
and upgraded by the same files (the repository's schema/sqlite, shipped as once/schema/sqlite), so
`once ledger list/show/resolve --db FILE` reads a ledger written here; `meta` also records the guest's
`body_format` once a client is built over the file, and a file holding a later one is refused.

Beside the ledger file, `<path>.witness` is the ledger's witness (the component's `witness` import): a copy of the
record of every attempt the engine hands out, in a file of its own so that copying an older backup of the ledger
back over it leaves the witness as it is, and the engine sees what the older ledger lacks. Its one table is the
Rust and Node hosts' too (any of them may open the same file); it is written at `synchronous=FULL` whatever the
ledger's mode, since a kept record must be on disk before the attempt is sent.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Optional, Sequence

from ._base import (
    BODY_FORMAT_KEY, I64_MAX, Event, Ledger, LedgerFailure, Put, Row, SystemClock, checked_int, event_values,
    insert_values, next_body_format, update_values,
)
from ._schema import migrations, statements, witness_table

# The schema version this package writes and understands: the highest step of its schema/sqlite files.
SCHEMA_VERSION = 2
ROW_COLUMNS = "tbl, scope, key, version, state, due_at, body, owner"
EVENT_COLUMNS = "scope, key, version, at, kind, from_state, to_state, attempt, detail"
# Per mode: the `PRAGMA synchronous` of an ordinary commit, and of one the engine marked deferrable.
SYNCHRONOUS = {"FULL": ("FULL", "FULL"), "INTENT_ONLY": ("FULL", "NORMAL"), "NORMAL": ("NORMAL", "NORMAL")}
# The witness's file is the ledger's path plus this suffix, and these are its statements (its table is
# schema/witness/sqlite.sql): the Rust and Node hosts open the same file, so they are theirs word for word. A kept
# record is replaced only by one granted as late or later, so a slow keep of an earlier attempt never overwrites a
# later one.
WITNESS_SUFFIX = ".witness"
WITNESS_KEEP = ("INSERT INTO witness (scope, key, at, body) VALUES (?, ?, ?, ?) ON CONFLICT (scope, key) DO UPDATE "
                "SET at = excluded.at, body = excluded.body WHERE excluded.at >= witness.at")
WITNESS_SEEN = "SELECT body FROM witness WHERE scope = ? AND key = ?"
WITNESS_FORGET = "DELETE FROM witness WHERE scope = ? AND key = ? AND at < ?"


def _row(r: tuple[object, ...]) -> Row:
    tbl, scope, key, version, state, due_at, body, owner = r
    return Row(tbl, scope, key, version, state, due_at, owner, body)  # type: ignore[arg-type]


class SqliteLedger(Ledger):
    """A ledger in one SQLite database file (WAL), one connection per thread."""

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "FULL", busy_timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        mode = str(synchronous).upper().replace("-", "_")
        if mode not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be FULL, INTENT_ONLY or NORMAL, not {synchronous!r}")
        if os.path.isdir(self.path):
            raise LedgerFailure(f"sqlite: {self.path}: is a directory")
        self.synchronous = mode
        # The `PRAGMA synchronous` level of an ordinary commit and of a deferrable one.
        self._levels = SYNCHRONOUS[mode]
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._clock = SystemClock()
        # The witness's file, with a connection per thread as the ledger's. (There is no in-memory case: this
        # ledger refuses `:memory:`, which cannot be in WAL mode.)
        self.witness_path = self.path + WITNESS_SUFFIX
        self._init_schema(self._conn())
        # Opened (and its table made) with the ledger, as the Node host does: a ledger whose witness cannot be kept
        # is refused here, naming the file, before any call relies on it.
        try:
            self._witness_conn()
        except LedgerFailure:
            self.close()
            raise

    def _conn(self) -> sqlite3.Connection:
        conn: Optional[sqlite3.Connection] = getattr(self._local, "conn", None)
        # A connection is never shared by a forked child: it opens its own.
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self._levels[0]}")
            self._enable_wal(conn)
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: open {self.path}: {e}") from e
        self._local.conn, self._local.pid, self._local.level = conn, os.getpid(), self._levels[0]
        return conn

    def _witness_conn(self) -> sqlite3.Connection:
        """This thread's connection to the witness file (opened, and its table made, on first use)."""
        conn: Optional[sqlite3.Connection] = getattr(self._local, "witness", None)
        # As the ledger's: never shared by a forked child.
        if conn is not None and getattr(self._local, "witness_pid", None) == os.getpid():
            return conn
        path = self.witness_path
        try:
            conn = sqlite3.connect(path, isolation_level=None, timeout=self.busy_timeout, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                # `keep` answers only once the record is on disk, whatever the ledger's own mode: a grant whose
                # record a power loss could take from the witness is a grant an older ledger could send again.
                conn.execute("PRAGMA synchronous = FULL")
                self._enable_wal(conn, path)
                conn.executescript(witness_table())
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: open the witness {path}: {e}") from e
        self._local.witness, self._local.witness_pid = conn, os.getpid()
        return conn

    def _enable_wal(self, conn: sqlite3.Connection, path: Optional[str] = None) -> None:
        # Changing the journal mode does not wait on the busy handler: retried here.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise LedgerFailure(f"sqlite: {path or self.path}: WAL journal mode unavailable (got {mode!r})")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                files = migrations("sqlite")
                for statement in statements(files.bootstrap or ""):
                    conn.execute(statement)
                has_meta = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta')"
                ).fetchone()[0]
                found = None
                if has_meta:
                    r = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                    found = r[0] if r else None
                if found is not None and (not str(found).isdigit() or int(found) > SCHEMA_VERSION):
                    raise LedgerFailure(
                        f"sqlite: {self.path}: schema version {found!r} is newer than this package understands "
                        f"({SCHEMA_VERSION}); upgrade once"
                    )
                # The package's schema/sqlite files: a new file's whole layout, or the steps above its version.
                for step in files.plan(int(found) if found is not None else 0):
                    for statement in statements(step.sql):
                        conn.execute(statement)
                if found != str(SCHEMA_VERSION):
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (str(SCHEMA_VERSION),),
                    )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: {self.path}: create schema: {e}") from e

    def claim_body_format(self, fmt: int) -> None:
        conn = self._conn()
        read = "SELECT value FROM meta WHERE key = ?"
        try:
            r = conn.execute(read, (BODY_FORMAT_KEY,)).fetchone()
            if next_body_format(self.path, r[0] if r else None, fmt) is None:
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Read again under the write lock: another process may have raised it meanwhile.
                r = conn.execute(read, (BODY_FORMAT_KEY,)).fetchone()
                new = next_body_format(self.path, r[0] if r else None, fmt)
                if new is not None:
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (BODY_FORMAT_KEY, str(new)),
                    )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: {self.path}: record body format: {e}") from e

    def get(self, table: str, scope: str, key: str) -> Optional[Row]:
        try:
            r = self._conn().execute(
                f"SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ? AND scope = ? AND key = ?", (table, scope, key)
            ).fetchone()
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: get ({table}, {scope!r}, {key!r}): {e}") from e
        return _row(r) if r else None

    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        return self._commit(puts, events, self._levels[0])

    def commit_deferred(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        return self._commit(puts, events, self._levels[1])

    def _commit(self, puts: Sequence[Put], events: Sequence[Event], level: str) -> bool:
        conn = self._conn()
        if self._local.level != level:
            # Outside any transaction, so it governs the COMMIT below.
            try:
                conn.execute(f"PRAGMA synchronous = {level}")
            except sqlite3.Error as e:
                raise LedgerFailure(f"sqlite: set synchronous = {level}: {e}") from e
            self._local.level = level
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: begin: {e}") from e
        try:
            applied = self._apply(conn, puts, events)
            conn.execute("COMMIT" if applied else "ROLLBACK")
            return applied
        except sqlite3.Error as e:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise LedgerFailure(f"sqlite: commit: {e} (nothing applied, or the outcome is unknown)") from e
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @staticmethod
    def _apply(conn: sqlite3.Connection, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        for p in puts:
            row = p.row
            if p.expected is None and row is not None:
                n = conn.execute(
                    f"INSERT INTO rows ({ROW_COLUMNS}) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    insert_values(p, row),
                ).rowcount
            elif row is not None:
                n = conn.execute(
                    "UPDATE rows SET version = ?, state = ?, due_at = ?, body = ?, owner = ? "
                    "WHERE tbl = ? AND scope = ? AND key = ? AND version = ?",
                    update_values(p, row),
                ).rowcount
            elif p.expected is not None:
                n = conn.execute(
                    "DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?",
                    (p.table, p.scope, p.key, p.expected),
                ).rowcount
            else:
                exists = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM rows WHERE tbl = ? AND scope = ? AND key = ?)",
                    (p.table, p.scope, p.key),
                ).fetchone()[0]
                n = 0 if exists else 1
            if n != 1:
                return False
        for e in events:
            n = conn.execute(
                f"INSERT INTO audit ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                event_values(e),
            ).rowcount
            if n != 1:
                return False
        return True

    def scan(
        self, table: str, states: Sequence[str], due_before: int, owner: Optional[str], limit: int
    ) -> list[Row]:
        q = f"SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ? AND due_at IS NOT NULL AND due_at <= ?"
        args: list[object] = [table, min(due_before, I64_MAX)]
        if states:
            q += " AND state IN (%s)" % ",".join("?" * len(states))
            args += list(states)
        if owner is not None:
            q += " AND owner = ?"
            args.append(owner)
        q += " ORDER BY due_at, scope, key LIMIT ?"
        args.append(limit)
        try:
            return [_row(r) for r in self._conn().execute(q, args)]
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: scan: {e}") from e

    def audit(self, scope: str, key: str) -> list[Event]:
        try:
            cur = self._conn().execute(
                f"SELECT {EVENT_COLUMNS} FROM audit WHERE scope = ? AND key = ? ORDER BY version", (scope, key)
            )
            return [Event(*r) for r in cur]
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: audit: {e}") from e

    def now(self) -> int:
        return self._clock.now()

    def counts(self) -> tuple[dict[str, int], int]:
        conn = self._conn()
        n = {t: 0 for t in ("operation", "tombstone", "quota")}
        for t, c in conn.execute("SELECT tbl, count(*) FROM rows GROUP BY tbl"):
            n[t] = c
        return n, conn.execute("SELECT count(*) FROM audit").fetchone()[0]

    def witness_seen(self, scope: str, key: str) -> Optional[str]:
        try:
            r = self._witness_conn().execute(WITNESS_SEEN, (scope, key)).fetchone()
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: witness {self.witness_path}: read ({scope!r}, {key!r}): {e}") from e
        if r is None:
            return None
        if not isinstance(r[0], str):
            raise LedgerFailure(f"sqlite: witness {self.witness_path}: the body kept for ({scope!r}, {key!r}) is "
                                f"not text ({type(r[0]).__name__})")
        return r[0]

    def witness_keep(self, scope: str, key: str, body: str, at: int) -> None:
        at = checked_int("witness at", at)
        try:
            # One statement, its own transaction: committed (and, at FULL, synced) when it returns.
            self._witness_conn().execute(WITNESS_KEEP, (scope, key, at, body))
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: witness {self.witness_path}: keep ({scope!r}, {key!r}): {e}") from e

    def witness_forget(self, scope: str, key: str, before: int) -> None:
        try:
            # Every `at` held is at most i64::MAX, so a later `before` is that.
            self._witness_conn().execute(WITNESS_FORGET, (scope, key, min(before, I64_MAX)))
        except sqlite3.Error as e:
            raise LedgerFailure(f"sqlite: witness {self.witness_path}: forget ({scope!r}, {key!r}): {e}") from e

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        witness = getattr(self._local, "witness", None)
        if witness is not None:
            witness.close()
            self._local.witness = None
