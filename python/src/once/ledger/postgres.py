"""The PostgreSQL ledger (psycopg 3): the Rust host's schema, the database's clock.

A batch is one `READ COMMITTED` transaction of conditional statements whose
changed-row counts are the compare-and-swap verdict; rows are written in one
order (table, scope, key) so concurrent batches do not deadlock. The tables
(schema `once` unless the URL says `?schema=NAME`) are the Rust host's, made by the same files (the
repository's schema/postgres, shipped as once/schema/postgres), so
`once ledger ... --db postgres://...` reads a ledger written here. Leases are
measured in the database's clock, one clock for every host.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Optional, Sequence

from ._base import (
    BODY_FORMAT_KEY, I64_MAX, Event, Ledger, LedgerFailure, Put, Row, event_values, insert_values, next_body_format,
    update_values,
)
from ._schema import for_schema, migrations

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("the PostgreSQL ledger needs psycopg 3: pip install 'once-exactly[postgres]'") from e

# The schema version this package writes and understands: the highest step of its schema/postgres files.
SCHEMA_VERSION = 3
DEFAULT_SCHEMA = "once"
ROW_COLUMNS = "tbl, scope, key, version, state, due_at, body, owner"
TABLE_ORDER = {"operation": 0, "tombstone": 1, "quota": 2}
RETRIES = 5
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def split_schema(url: str) -> tuple[str, Optional[str]]:
    """The URL without its `schema=` parameter, and that parameter."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, None
    schema, rest = None, []
    for pair in (p for p in query.split("&") if p):
        name, _, value = pair.partition("=")
        if name == "schema":
            if schema is not None:
                raise LedgerFailure("postgres: the URL names `schema` twice")
            schema = value
        else:
            rest.append(pair)
    return (f"{base}?{'&'.join(rest)}" if rest else base), schema


def _row(r: Sequence[Any]) -> Row:
    tbl, scope, key, version, state, due_at, body, owner = r
    return Row(tbl, scope, key, version, state, due_at, owner, body)


def _text(what: str, s: str) -> None:
    if "\0" in s:
        raise LedgerFailure(f"postgres: {what} contains U+0000, which PostgreSQL text cannot hold")


class PostgresLedger(Ledger):
    """A ledger in PostgreSQL, one connection per thread, leases in the database's clock."""

    def __init__(self, url: str, *, schema: Optional[str] = None, lock_timeout_ms: int = 5000,
                 connect_timeout: int = 5) -> None:
        if not url.startswith(("postgres://", "postgresql://")):
            raise LedgerFailure("postgres: the location must start with postgres:// or postgresql://")
        self.url, in_url = split_schema(url)
        self.schema = schema or in_url or DEFAULT_SCHEMA
        if not SCHEMA_NAME.fullmatch(self.schema) or self.schema.startswith("pg_"):
            raise LedgerFailure(
                f"postgres: schema name {self.schema!r} is not [a-z_][a-z0-9_]* (at most 63 bytes, not pg_…)"
            )
        self.lock_timeout_ms = max(1, lock_timeout_ms)
        self.connect_timeout = connect_timeout
        self._s = '"' + self.schema + '"'
        self._local = threading.local()
        self._clock_lock = threading.Lock()
        self._last = 0
        self._migrate()

    def _conn(self) -> "psycopg.Connection[Any]":
        conn = getattr(self._local, "conn", None)
        # A connection is never shared by a forked child: it opens its own.
        if conn is not None and not conn.closed and getattr(self._local, "pid", None) == os.getpid():
            return conn  # type: ignore[no-any-return]
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=self.connect_timeout,
                                   application_name="once-python")
            conn.execute(f"SET lock_timeout = {self.lock_timeout_ms}")
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: connect: {e}") from e
        self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _migrate(self) -> None:
        s = self._s
        conn = self._conn()
        version_sql = f"SELECT value FROM {s}.meta WHERE key = 'schema_version'"
        try:
            r = conn.execute(version_sql).fetchone()
            if r is not None and r[0] == str(SCHEMA_VERSION):
                return
        except psycopg.Error:
            pass
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(1869505381, hashtext(%s))", (self.schema,))
                files = migrations("postgres")
                if files.bootstrap is not None:
                    conn.execute(for_schema(files.bootstrap, s).encode())
                r = conn.execute(version_sql).fetchone()
                found = int(r[0]) if r else 0
                if found > SCHEMA_VERSION:
                    raise LedgerFailure(
                        f"postgres: schema {self.schema} is at version {found}, newer than this package "
                        f"understands ({SCHEMA_VERSION}); upgrade once"
                    )
                # The package's schema/postgres files: the steps above the recorded version.
                for step in files.plan(found):
                    conn.execute(for_schema(step.sql, s).encode())
                conn.execute(
                    f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (str(SCHEMA_VERSION),),
                )
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: migrate schema {self.schema}: {e}") from e

    def claim_body_format(self, fmt: int) -> None:
        s = self._s
        conn = self._conn()
        info = conn.info
        ledger = f"schema {self.schema} on {info.host}:{info.port}/{info.dbname}"
        read = f"SELECT value FROM {s}.meta WHERE key = %s"
        try:
            r = conn.execute(read, (BODY_FORMAT_KEY,)).fetchone()
            if next_body_format(ledger, r[0] if r else None, fmt) is None:
                return
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(1869505381, hashtext(%s))", (self.schema,))
                # Read again under the lock: another host may have raised it meanwhile.
                r = conn.execute(read, (BODY_FORMAT_KEY,)).fetchone()
                new = next_body_format(ledger, r[0] if r else None, fmt)
                if new is not None:
                    conn.execute(
                        f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s) "
                        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                        (BODY_FORMAT_KEY, str(new)),
                    )
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: schema {self.schema}: record body format: {e}") from e

    def get(self, table: str, scope: str, key: str) -> Optional[Row]:
        _text("scope", scope)
        _text("key", key)
        try:
            r = self._conn().execute(
                f"SELECT {ROW_COLUMNS} FROM {self._s}.rows WHERE tbl = %s AND scope = %s AND key = %s",
                (table, scope, key),
            ).fetchone()
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: get: {e}") from e
        return _row(r) if r else None

    def commit(self, puts: Sequence[Put], events: Sequence[Event]) -> bool:
        for p in puts:
            _text("scope", p.scope)
            _text("key", p.key)
            if p.row is not None:
                _text("body", p.row.body)
        for e in events:
            for what, v in (("audit scope", e.scope), ("audit key", e.key), ("audit kind", e.kind),
                            ("audit detail", e.detail)):
                _text(what, v)
        ordered = sorted(puts, key=lambda p: (TABLE_ORDER.get(p.table, 3), p.scope.encode(), p.key.encode()))
        ordered_events = sorted(events, key=lambda e: (e.scope.encode(), e.key.encode(), e.version))
        for _ in range(RETRIES + 1):
            conn = self._conn()
            try:
                conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE")
            except psycopg.Error as e:
                raise LedgerFailure(f"postgres: begin transaction: {e}") from e
            try:
                applied = self._apply(conn, ordered, ordered_events)
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected):
                conn.execute("ROLLBACK")
                continue
            except psycopg.Error as e:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    conn.close()
                raise LedgerFailure(f"postgres: commit: {e} (nothing applied)") from e
            if not applied:
                conn.execute("ROLLBACK")
                return False
            try:
                conn.execute("COMMIT")
                return True
            except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected):
                continue
            except psycopg.Error as e:
                conn.close()
                raise LedgerFailure(
                    f"postgres: COMMIT failed; the batch is not known to be durable (it may or may not have "
                    f"applied): {e}"
                ) from e
        raise LedgerFailure("postgres: commit: rolled back by serialization failures or deadlocks too often")

    def _apply(self, conn: "psycopg.Connection[Any]", puts: Sequence[Put], events: Sequence[Event]) -> bool:
        s = self._s
        for p in puts:
            row = p.row
            if p.expected is None and row is not None:
                cur = conn.execute(
                    f"INSERT INTO {s}.rows ({ROW_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
                    insert_values(p, row),
                )
            elif row is not None:
                cur = conn.execute(
                    f"UPDATE {s}.rows SET version = %s, state = %s, due_at = %s, body = %s, owner = %s "
                    "WHERE tbl = %s AND scope = %s AND key = %s AND version = %s",
                    update_values(p, row),
                )
            elif p.expected is not None:
                cur = conn.execute(
                    f"DELETE FROM {s}.rows WHERE tbl = %s AND scope = %s AND key = %s AND version = %s",
                    (p.table, p.scope, p.key, p.expected),
                )
            else:
                # "Must not exist, and stays absent": claim the key for the transaction, then release it.
                cur = conn.execute(
                    f"INSERT INTO {s}.rows (tbl, scope, key, version, state, due_at, body) "
                    "VALUES (%s, %s, %s, 0, NULL, NULL, '') ON CONFLICT DO NOTHING",
                    (p.table, p.scope, p.key),
                )
                if cur.rowcount == 1:
                    conn.execute(f"DELETE FROM {s}.rows WHERE tbl = %s AND scope = %s AND key = %s",
                                 (p.table, p.scope, p.key))
            if cur.rowcount != 1:
                return False
        for e in events:
            cur = conn.execute(
                f"INSERT INTO {s}.audit (scope, key, version, at, kind, from_state, to_state, attempt, detail) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
                event_values(e),
            )
            if cur.rowcount != 1:
                return False
        return True

    def scan(
        self, table: str, states: Sequence[str], due_before: int, owner: Optional[str], limit: int
    ) -> list[Row]:
        q = f"SELECT {ROW_COLUMNS} FROM {self._s}.rows WHERE tbl = %s AND due_at IS NOT NULL AND due_at <= %s"
        args: list[object] = [table, min(due_before, I64_MAX)]
        if states:
            q += " AND state = ANY(%s)"
            args.append(list(states))
        if owner is not None:
            q += " AND owner = %s"
            args.append(owner)
        q += " ORDER BY due_at, scope, key LIMIT %s"
        args.append(limit)
        try:
            return [_row(r) for r in self._conn().execute(q.encode(), args)]
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: scan: {e}") from e

    def audit(self, scope: str, key: str) -> list[Event]:
        try:
            cur = self._conn().execute(
                f"SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail FROM {self._s}.audit "
                "WHERE scope = %s AND key = %s ORDER BY version",
                (scope, key),
            )
            return [Event(*r) for r in cur]
        except psycopg.Error as e:
            raise LedgerFailure(f"postgres: audit: {e}") from e

    def now(self) -> int:
        """The database's clock (one domain for every host), never backwards."""
        r = self._conn().execute("SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint").fetchone()
        assert r is not None
        with self._clock_lock:
            self._last = max(self._last, int(r[0]))
            return self._last

    def counts(self) -> tuple[dict[str, int], int]:
        conn = self._conn()
        n = {t: 0 for t in TABLE_ORDER}
        for t, c in conn.execute(f"SELECT tbl, count(*) FROM {self._s}.rows GROUP BY tbl"):
            n[t] = c
        r = conn.execute(f"SELECT count(*) FROM {self._s}.audit").fetchone()
        return n, int(r[0]) if r else 0

    # No witness: there is no place here outside the ledger that a restore of it does not reach (a table in the
    # same database, or another schema of it, comes back with the database's backup), and this package is not told
    # of one elsewhere. So the engine is answered "nothing kept", and a PostgreSQL ledger restored from an older
    # backup is not detected: what the newer history had sent may be sent again (docs/design.md "Older history").
    def witness_seen(self, scope: str, key: str) -> Optional[str]:
        return None

    def witness_keep(self, scope: str, key: str, body: str, at: int) -> None:
        return None

    def witness_forget(self, scope: str, key: str, before: int) -> None:
        return None

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
