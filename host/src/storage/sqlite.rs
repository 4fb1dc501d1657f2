//! SQLite storage: one database file, shared by threads and processes.
//!
//! # Durability and concurrency
//!
//! The file is in WAL mode. A batch is one `BEGIN IMMEDIATE` transaction:
//! the write lock is taken first (waiting up to `busy_timeout` for another
//! writer, in this process or another), every version check runs inside it,
//! and `Ok` is reported only once `COMMIT` returned OK. With the default
//! `synchronous=FULL`, a committed batch survives power loss; `NORMAL` may
//! lose the last commits on power loss, but never corrupts the file;
//! [`Synchronous::IntentOnly`] is FULL for every commit but `finish`'s (the
//! trade-off in DESIGN.md "Durability budget").
//!
//! # Group commit
//!
//! Each [`SqliteStorage`] has one writer connection and an in-process commit
//! queue. A caller that finds no commit running leads: it takes every batch
//! queued meanwhile (up to [`MAX_GROUP`]) and applies them, in arrival
//! order, in one `BEGIN IMMEDIATE` transaction, each inside its own
//! `SAVEPOINT`, so a batch whose version check fails is rolled back alone
//! and only its caller sees [`CommitError::Conflict`]. One `COMMIT`, so one
//! fsync, covers the group; each caller gets its own result, and a failed
//! `COMMIT` is an error for every batch in the group, never a success.
//! Concurrent callers thus share fsyncs instead of queueing for SQLite's
//! write lock one by one. A small pool of reader connections lets reads see
//! the last commit without waiting for a writer's fsync. Several
//! `SqliteStorage`s, in one or many processes, may open the same file;
//! SQLite's file locks arbitrate between them.
//!
//! # Schema (version [`SCHEMA_VERSION`])
//!
//! ```sql
//! CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
//!   -- ('schema_version', '2')
//! CREATE TABLE rows (
//!   tbl TEXT NOT NULL,        -- 'operation' | 'tombstone' | 'quota'
//!   scope TEXT NOT NULL, key TEXT NOT NULL,
//!   version INTEGER NOT NULL,
//!   state TEXT,               -- WIT name: 'in-flight', 'confirmed', ...
//!   due_at INTEGER,           -- ms since the epoch
//!   body TEXT NOT NULL,       -- the engine's JSON, never interpreted
//!   owner TEXT,               -- operation rows: whose background work may touch it
//!   PRIMARY KEY (tbl, scope, key)) WITHOUT ROWID;
//! CREATE INDEX rows_due ON rows (tbl, due_at) WHERE due_at IS NOT NULL;
//! CREATE INDEX rows_owner_due ON rows (tbl, owner, due_at) WHERE due_at IS NOT NULL;
//! CREATE INDEX rows_state ON rows (tbl, state);
//! CREATE TABLE audit (
//!   scope TEXT NOT NULL, key TEXT NOT NULL, version INTEGER NOT NULL,
//!   at INTEGER NOT NULL, kind TEXT NOT NULL,
//!   from_state TEXT, to_state TEXT, attempt INTEGER, detail TEXT NOT NULL,
//!   PRIMARY KEY (scope, key, version)) WITHOUT ROWID;
//! CREATE INDEX audit_kind ON audit (kind);
//! ```
//!
//! Version 1 files (no `owner`) are migrated on open: their operation rows
//! were all written by hosts without an owner name, so they get `default`.
//!
//! Integers are SQLite's signed 64-bit: a version or timestamp above
//! `i64::MAX` is refused with a storage error.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{CommitError, Flush, Stats, Storage, StorageError};
use crate::bindings::types::{AuditEvent, Batch, Put, Row, State, Table, Timestamp};

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: u32 = 2;

/// Reader connections kept open between calls.
const MAX_IDLE_READERS: usize = 4;

/// Most batches applied in one group transaction; later ones wait for the next.
pub const MAX_GROUP: usize = 64;

/// SQLite's `synchronous` setting for the writer connection: how durable a
/// commit is when `Ok` is returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Every commit is fsynced: durable across power loss (the default).
    #[default]
    Full,
    /// WAL commits are not fsynced one by one: the last commits may be lost on
    /// power loss (not on a process crash); the file stays consistent.
    Normal,
    /// Intent-only durability (DESIGN.md "Durability budget"): `finish`'s
    /// commits ([`Flush::Deferred`]) run at `NORMAL`, every other commit
    /// (`begin`'s intent, reconcile, sweep, resolve) at `FULL`. After power
    /// loss every intent and every non-finish commit is kept, and so is every
    /// finish followed by a later FULL commit (its fsync covers the WAL
    /// frames before it); a finish after the last FULL commit may be lost:
    /// its record is back in flight, its lease expires into unknown and
    /// reconciliation restores the outcome. Slower to heal, never a second
    /// dispatch. A process crash loses nothing.
    IntentOnly,
}

impl Synchronous {
    /// The pragma value for a commit (or group) needing `flush`.
    fn level(self, flush: Flush) -> Level {
        match (self, flush) {
            (Synchronous::Full, _) | (Synchronous::IntentOnly, Flush::Now) => Level::Full,
            (Synchronous::Normal, _) | (Synchronous::IntentOnly, Flush::Deferred) => Level::Normal,
        }
    }
}

/// One value of `PRAGMA synchronous`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Full,
    Normal,
}

impl Level {
    fn pragma(self) -> &'static str {
        match self {
            Level::Full => "FULL",
            Level::Normal => "NORMAL",
        }
    }
}

/// What the writer has committed since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Transactions committed at `synchronous=FULL` (one fsync each).
    pub full: u64,
    /// Transactions committed at `synchronous=NORMAL` (no fsync of their own).
    pub normal: u64,
    /// Batches applied by those transactions (more than transactions when groups formed).
    pub batches: u64,
}

/// How [`SqliteStorage::open`] configures its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Durability of each commit (default [`Synchronous::Full`]).
    pub synchronous: Synchronous,
    /// How long to wait for another writer's lock before failing (default 5 s).
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// A [`Storage`] in one SQLite database file (WAL mode).
pub struct SqliteStorage {
    path: PathBuf,
    options: SqliteOptions,
    /// The writer; `None` after a connection was discarded in an unknown
    /// transaction state (reopened on next use). Only a group leader takes it.
    writer: Mutex<Option<Writer>>,
    /// Batches waiting for a group leader, and the results of finished ones.
    queue: Mutex<Queue>,
    /// Wakes waiting callers when a group finishes.
    group_done: Condvar,
    /// Idle reader connections.
    readers: Mutex<Vec<Connection>>,
    /// The file's identity when opened: writes stop if the path stops naming it.
    file: Option<FileId>,
    /// Transactions committed at FULL.
    commits_full: AtomicU64,
    /// Transactions committed at NORMAL.
    commits_normal: AtomicU64,
    /// Batches committed.
    commits_batches: AtomicU64,
}

/// The writer connection and the `synchronous` level it is set to.
struct Writer {
    conn: Connection,
    level: Level,
}

/// The commit queue: callers append, one leader at a time drains.
#[derive(Default)]
struct Queue {
    /// Whether a leader is applying a group now.
    leading: bool,
    /// Batches waiting, oldest first.
    pending: VecDeque<Pending>,
    /// Results of applied batches, until their callers take them.
    done: HashMap<u64, Result<(), CommitError>>,
    /// The next ticket.
    next: u64,
}

/// A queued batch: a caller is waiting for its result under `id`.
struct Pending {
    id: u64,
    batch: Batch,
    flush: Flush,
}

/// A file's (device, inode).
type FileId = (u64, u64);

#[cfg(unix)]
fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<FileId> {
    None
}

impl std::fmt::Debug for SqliteStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStorage")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> StorageError {
    StorageError(format!("sqlite: {what}: {e}"))
}

fn table_name(table: Table) -> &'static str {
    match table {
        Table::Operation => "operation",
        Table::Tombstone => "tombstone",
        Table::Quota => "quota",
    }
}

fn parse_table(s: &str) -> Result<Table, StorageError> {
    Ok(match s {
        "operation" => Table::Operation,
        "tombstone" => Table::Tombstone,
        "quota" => Table::Quota,
        other => {
            return Err(StorageError(format!("sqlite: unknown table {other:?} in file")));
        }
    })
}

fn parse_state(s: &str) -> Result<State, StorageError> {
    State::parse(s).ok_or_else(|| StorageError(format!("sqlite: unknown state {s:?} in file")))
}

fn parse_opt_state(s: Option<String>) -> Result<Option<State>, StorageError> {
    s.as_deref().map(parse_state).transpose()
}

/// A u64 as SQLite's i64, refusing values it cannot hold.
fn int(what: &str, v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError(format!("sqlite: {what} {v} exceeds i64::MAX")))
}

fn uint(what: &str, v: i64) -> Result<u64, StorageError> {
    u64::try_from(v).map_err(|_| StorageError(format!("sqlite: negative {what} {v} in file")))
}

const ROW_COLUMNS: &str = "tbl, scope, key, version, state, due_at, body, owner";

/// A row as read from SQL, before its enums are parsed.
type RawRow = (
    String,
    String,
    String,
    i64,
    Option<String>,
    Option<i64>,
    String,
    Option<String>,
);

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn cook_row(raw: RawRow) -> Result<Row, StorageError> {
    let (tbl, scope, key, version, state, due_at, body, owner) = raw;
    Ok(Row {
        table: parse_table(&tbl)?,
        scope,
        key,
        version: uint("version", version)?,
        state: parse_opt_state(state)?,
        due_at: due_at.map(|d| uint("due_at", d)).transpose()?,
        owner,
        body,
    })
}

fn query_rows(
    conn: &Connection,
    what: &str,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Row>, StorageError> {
    let mut stmt = conn.prepare_cached(sql).map_err(|e| err(what, e))?;
    let raws = stmt
        .query_map(params, raw_row)
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(|e| err(what, e))?;
    raws.into_iter().map(cook_row).collect()
}

/// Why a batch stopped inside its transaction.
enum Abort {
    Conflict,
    Storage(StorageError),
}

impl From<StorageError> for Abort {
    fn from(e: StorageError) -> Self {
        Abort::Storage(e)
    }
}

impl SqliteStorage {
    /// Open (creating if needed) the database at `path`, set WAL mode and
    /// create or check the schema. Refuses a read-only file, a path that is
    /// not a database, and a schema newer than [`SCHEMA_VERSION`].
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StorageError> {
        let path = path.as_ref().to_path_buf();
        let writer = open_writer(&path, &options)?;
        let file = file_id(&path);
        Ok(Self {
            path,
            options,
            writer: Mutex::new(Some(writer)),
            queue: Mutex::new(Queue::default()),
            group_done: Condvar::new(),
            readers: Mutex::new(Vec::new()),
            file,
            commits_full: AtomicU64::new(0),
            commits_normal: AtomicU64::new(0),
            commits_batches: AtomicU64::new(0),
        })
    }

    /// Transactions and batches the writer has committed, by `synchronous`
    /// level (to observe intent-only durability and group commit).
    pub fn commit_counts(&self) -> CommitCounts {
        CommitCounts {
            full: self.commits_full.load(Ordering::Relaxed),
            normal: self.commits_normal.load(Ordering::Relaxed),
            batches: self.commits_batches.load(Ordering::Relaxed),
        }
    }

    /// Refuse to write unless the path still names the file we opened. An
    /// open connection keeps writing into a deleted or replaced file, and
    /// those commits would be lost to every later reader of the path (a
    /// new ledger there would dispatch again what this one recorded).
    fn check_file(&self) -> Result<(), StorageError> {
        let Some(opened) = self.file else {
            return Ok(());
        };
        match file_id(&self.path) {
            Some(now) if now == opened => Ok(()),
            Some(_) => Err(StorageError(format!(
                "sqlite: {}: the ledger file was replaced since it was opened; refusing to write",
                self.path.display()
            ))),
            None => Err(StorageError(format!(
                "sqlite: {}: the ledger file was deleted since it was opened; refusing to write",
                self.path.display()
            ))),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options the store was opened with.
    pub fn options(&self) -> SqliteOptions {
        self.options
    }

    fn writer(&self) -> Result<MutexGuard<'_, Option<Writer>>, StorageError> {
        // A panic while holding the lock leaves the connection possibly inside
        // a transaction: discard it and reopen.
        let mut guard = self.writer.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            *guard = None;
            guard
        });
        self.writer.clear_poison();
        if guard.is_none() {
            // Reopening a deleted path would create an empty ledger there.
            self.check_file()?;
            *guard = Some(open_writer(&self.path, &self.options)?);
        }
        Ok(guard)
    }

    /// Run `f` on a reader connection; the connection goes back to the pool
    /// only if `f` succeeded.
    fn read<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, StorageError>) -> Result<T, StorageError> {
        let idle = self
            .readers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        let mut conn = match idle {
            Some(conn) => conn,
            None => open_reader(&self.path, &self.options)?,
        };
        let out = f(&mut conn)?;
        if conn.is_autocommit() {
            let mut idle = self.readers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
        }
        Ok(out)
    }
}

/// The busy timeout and the `synchronous` level every commit starts from.
fn configure(conn: &Connection, path: &Path, options: &SqliteOptions) -> Result<Level, StorageError> {
    let at = path.display();
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| err(format_args!("{at}: set busy_timeout"), e))?;
    let level = options.synchronous.level(Flush::Now);
    conn.pragma_update(None, "synchronous", level.pragma())
        .map_err(|e| err(format_args!("{at}: set synchronous"), e))?;
    Ok(level)
}

fn open_writer(path: &Path, options: &SqliteOptions) -> Result<Writer, StorageError> {
    let at = path.display();
    if path.is_dir() {
        return Err(StorageError(format!("sqlite: {at}: is a directory")));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| err(format_args!("open {at}"), e))?;
    let level = configure(&conn, path, options)?;
    // SQLite silently falls back to read-only for a write-protected file.
    if conn
        .is_readonly(rusqlite::MAIN_DB)
        .map_err(|e| err(format_args!("{at}"), e))?
    {
        return Err(StorageError(format!("sqlite: {at}: the database file is read-only")));
    }
    enable_wal(&conn, path, options.busy_timeout)?;
    init_schema(&conn).map_err(|e| StorageError(format!("{} ({at})", e.0)))?;
    Ok(Writer { conn, level })
}

/// Switch the file to WAL (a no-op when it already is). Changing the journal
/// mode does not wait on SQLite's busy handler, so a file being created by
/// several connections at once is retried here until `timeout`.
fn enable_wal(conn: &Connection, path: &Path, timeout: Duration) -> Result<(), StorageError> {
    let at = path.display();
    let deadline = Instant::now() + timeout;
    loop {
        let mode = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .and_then(|mode| {
                if mode.eq_ignore_ascii_case("wal") {
                    Ok(mode)
                } else {
                    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
                }
            });
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(StorageError(format!(
                    "sqlite: {at}: WAL journal mode unavailable (got {mode:?})"
                )));
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(err(format_args!("{at}: set journal_mode=WAL"), e)),
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn open_reader(path: &Path, options: &SqliteOptions) -> Result<Connection, StorageError> {
    let at = path.display();
    // Read-write (not read-only) so the reader may use the WAL index; never
    // created here: the writer made the file.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| err(format_args!("open {at}"), e))?;
    configure(&conn, path, options)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| err(format_args!("{at}: set query_only"), e))?;
    Ok(conn)
}

/// Check the schema version, then create what is missing, in one write
/// transaction (so processes opening a new file at once do not race).
fn init_schema(conn: &Connection) -> Result<(), StorageError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| err("begin schema transaction", e))?;
    let result = (|| {
        let has_meta: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| err("read schema", e))?;
        let found: Option<String> = if has_meta {
            conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
                .optional()
                .map_err(|e| err("read schema version", e))?
        } else {
            None
        };
        if let Some(found) = &found {
            let version: u32 = found
                .parse()
                .map_err(|_| StorageError(format!("sqlite: unreadable schema version {found:?}")))?;
            if version > SCHEMA_VERSION {
                return Err(StorageError(format!(
                    "sqlite: schema version {version} is newer than this build understands \
                     ({SCHEMA_VERSION}); upgrade once"
                )));
            }
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS rows (
               tbl TEXT NOT NULL,
               scope TEXT NOT NULL,
               key TEXT NOT NULL,
               version INTEGER NOT NULL,
               state TEXT,
               due_at INTEGER,
               body TEXT NOT NULL,
               owner TEXT,
               PRIMARY KEY (tbl, scope, key)
             ) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS rows_due ON rows (tbl, due_at) WHERE due_at IS NOT NULL;
             CREATE INDEX IF NOT EXISTS rows_state ON rows (tbl, state);
             CREATE TABLE IF NOT EXISTS audit (
               scope TEXT NOT NULL,
               key TEXT NOT NULL,
               version INTEGER NOT NULL,
               at INTEGER NOT NULL,
               kind TEXT NOT NULL,
               from_state TEXT,
               to_state TEXT,
               attempt INTEGER,
               detail TEXT NOT NULL,
               PRIMARY KEY (scope, key, version)
             ) WITHOUT ROWID;
             CREATE INDEX IF NOT EXISTS audit_kind ON audit (kind);",
        )
        .map_err(|e| err("create schema", e))?;
        if found.as_deref() == Some("1") {
            conn.execute_batch(
                "ALTER TABLE rows ADD COLUMN owner TEXT;
                 UPDATE rows SET owner = 'default' WHERE tbl = 'operation';",
            )
            .map_err(|e| err("migrate schema to version 2", e))?;
        }
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS rows_owner_due ON rows (tbl, owner, due_at) WHERE due_at IS NOT NULL;",
        )
        .map_err(|e| err("create schema", e))?;
        if found.as_deref() != Some(SCHEMA_VERSION.to_string().as_str()) {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [SCHEMA_VERSION.to_string()],
            )
            .map_err(|e| err("write schema version", e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(|e| err("commit schema", e)),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Apply one put inside the open transaction.
fn apply_put(conn: &Connection, put: &Put) -> Result<(), Abort> {
    let tbl = table_name(put.table);
    let what = |op: &str| format!("{op} ({tbl}, {:?}, {:?})", put.scope, put.key);
    let expected = put.expected.map(|v| int("expected version", v)).transpose()?;
    let changed = match (expected, &put.row) {
        (None, Some(row)) => {
            let version = int("version", row.version)?;
            let due_at = row.due_at.map(|d| int("due_at", d)).transpose()?;
            conn.prepare_cached(
                "INSERT INTO rows (tbl, scope, key, version, state, due_at, body, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    tbl,
                    put.scope,
                    put.key,
                    version,
                    row.state.map(State::name),
                    due_at,
                    row.body,
                    row.owner,
                ])
            })
            .map_err(|e| err(what("insert"), e))?
        }
        (Some(expected), Some(row)) => {
            let version = int("version", row.version)?;
            let due_at = row.due_at.map(|d| int("due_at", d)).transpose()?;
            conn.prepare_cached(
                "UPDATE rows SET version = ?5, state = ?6, due_at = ?7, body = ?8, owner = ?9
                 WHERE tbl = ?1 AND scope = ?2 AND key = ?3 AND version = ?4",
            )
            .and_then(|mut s| {
                s.execute(params![
                    tbl,
                    put.scope,
                    put.key,
                    expected,
                    version,
                    row.state.map(State::name),
                    due_at,
                    row.body,
                    row.owner,
                ])
            })
            .map_err(|e| err(what("update"), e))?
        }
        (Some(expected), None) => conn
            .prepare_cached("DELETE FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3 AND version = ?4")
            .and_then(|mut s| s.execute(params![tbl, put.scope, put.key, expected]))
            .map_err(|e| err(what("delete"), e))?,
        // "Must not exist, and stays absent": a pure check.
        (None, None) => {
            let exists: bool = conn
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3)")
                .and_then(|mut s| s.query_row(params![tbl, put.scope, put.key], |r| r.get(0)))
                .map_err(|e| err(what("check absent"), e))?;
            usize::from(!exists)
        }
    };
    if changed == 1 { Ok(()) } else { Err(Abort::Conflict) }
}

/// Append one audit event inside the open transaction; an existing
/// (scope, key, version) is a conflict.
fn apply_event(conn: &Connection, event: &AuditEvent) -> Result<(), Abort> {
    let what = format!("insert audit ({:?}, {:?}, {})", event.scope, event.key, event.version);
    let version = int("audit version", event.version)?;
    let at = int("audit at", event.at)?;
    let changed = conn
        .prepare_cached(
            "INSERT INTO audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| {
            s.execute(params![
                event.scope,
                event.key,
                version,
                at,
                event.kind,
                event.from_state.map(State::name),
                event.to_state.map(State::name),
                event.attempt,
                event.detail,
            ])
        })
        .map_err(|e| err(&what, e))?;
    if changed == 1 { Ok(()) } else { Err(Abort::Conflict) }
}

/// Up to `max` of the oldest queued batches.
fn take_group(queue: &mut Queue, max: usize) -> Vec<Pending> {
    let n = queue.pending.len().min(max);
    queue.pending.drain(..n).collect()
}

/// Hands a group's results to its waiting callers and ends the lead, also
/// when the leader unwinds (those callers then get a storage error rather
/// than waiting forever).
struct Handoff<'a> {
    store: &'a SqliteStorage,
    ids: Vec<u64>,
    results: Vec<Result<(), CommitError>>,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let mut results = std::mem::take(&mut self.results).into_iter();
        let mut queue = self.store.lock_queue();
        for id in self.ids.drain(..) {
            let result = results.next().unwrap_or_else(|| {
                Err(CommitError::Storage(StorageError(
                    "sqlite: the group commit failed before this batch's outcome was known".to_string(),
                )))
            });
            queue.done.insert(id, result);
        }
        queue.leading = false;
        drop(queue);
        self.store.group_done.notify_all();
    }
}

impl SqliteStorage {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        // The queue is only ever left consistent (see `Handoff`): a poisoned lock is usable.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply `own` (the leader's batch, if it has one) and `group` as one
    /// transaction; hand out the group's results, return `own`'s.
    fn lead(&self, own: Option<(&Batch, Flush)>, group: Vec<Pending>) -> Option<Result<(), CommitError>> {
        let mut handoff = Handoff {
            store: self,
            ids: group.iter().map(|p| p.id).collect(),
            results: Vec::new(),
        };
        let batches: Vec<(&Batch, Flush)> = own
            .into_iter()
            .chain(group.iter().map(|p| (&p.batch, p.flush)))
            .collect();
        let mut results = self.apply_group(&batches);
        let own_result = own.map(|_| results.remove(0));
        handoff.results = results;
        drop(handoff);
        own_result
    }

    /// One transaction for every batch, in order; one result per batch.
    fn apply_group(&self, batches: &[(&Batch, Flush)]) -> Vec<Result<(), CommitError>> {
        let all = |e: StorageError| batches.iter().map(|_| Err(CommitError::Storage(e.clone()))).collect();
        // The group is as durable as its most demanding batch.
        let flush = if batches.iter().any(|(_, f)| *f == Flush::Now) {
            Flush::Now
        } else {
            Flush::Deferred
        };
        let level = self.options.synchronous.level(flush);
        let mut guard = match self.writer() {
            Ok(guard) => guard,
            Err(e) => return all(e),
        };
        let Some(writer) = guard.as_mut() else {
            unreachable!("writer() always leaves a connection")
        };
        if writer.level != level {
            // Outside any transaction, so it governs the COMMIT below.
            if let Err(e) = writer.conn.pragma_update(None, "synchronous", level.pragma()) {
                return all(err("set synchronous", e));
            }
            writer.level = level;
        }
        let conn = &writer.conn;
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            return all(err("begin transaction", e));
        }
        // Under the write lock: no other once writer is mid-batch while we look.
        let outcome = self.check_file().and_then(|()| apply_each(conn, batches));
        let results = match outcome {
            Ok(results) if results.iter().any(Result::is_ok) => match conn.execute_batch("COMMIT") {
                Ok(()) => {
                    let counter = match level {
                        Level::Full => &self.commits_full,
                        Level::Normal => &self.commits_normal,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let applied = results.iter().filter(|r| r.is_ok()).count() as u64;
                    self.commits_batches.fetch_add(applied, Ordering::Relaxed);
                    return results;
                }
                Err(e) => all(err("COMMIT failed (the batch is not known to be durable)", e)),
            },
            // Nothing applied: the ROLLBACK below ends the transaction.
            Ok(results) => results,
            Err(e) => all(e),
        };
        // Undo; SQLite may already have rolled back on its own (I/O error, full disk).
        if !conn.is_autocommit() {
            let rolled_back = conn.execute_batch("ROLLBACK");
            if rolled_back.is_err() || !conn.is_autocommit() {
                // Closing the connection rolls back whatever is left open.
                *guard = None;
            }
        }
        results
    }
}

/// Apply each batch inside the open transaction. A lone batch needs no
/// savepoint (a failure rolls the transaction back); in a group each batch
/// gets one, so a failed batch is undone alone. `Err` means the transaction
/// itself is lost and no batch may be reported applied.
fn apply_each(conn: &Connection, batches: &[(&Batch, Flush)]) -> Result<Vec<Result<(), CommitError>>, StorageError> {
    let apply = |batch: &Batch| {
        batch
            .puts
            .iter()
            .try_for_each(|put| apply_put(conn, put))
            .and_then(|()| batch.events.iter().try_for_each(|ev| apply_event(conn, ev)))
            .map_err(|abort| match abort {
                Abort::Conflict => CommitError::Conflict,
                Abort::Storage(e) => CommitError::Storage(e),
            })
    };
    if let [(batch, _)] = batches {
        return Ok(vec![apply(batch)]);
    }
    let mut results = Vec::with_capacity(batches.len());
    for (batch, _) in batches {
        conn.execute_batch("SAVEPOINT batch").map_err(|e| err("savepoint", e))?;
        let result = apply(batch);
        if result.is_err() {
            conn.execute_batch("ROLLBACK TO batch")
                .map_err(|e| err("roll back a failed batch of the group", e))?;
        }
        conn.execute_batch("RELEASE batch")
            .map_err(|e| err("release savepoint", e))?;
        if conn.is_autocommit() {
            // SQLite ended the transaction on its own (I/O error, full disk).
            return Err(StorageError(
                "sqlite: the group transaction was rolled back by SQLite".to_string(),
            ));
        }
        results.push(result);
    }
    Ok(results)
}

impl Storage for SqliteStorage {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        self.read(|conn| {
            let raw = conn
                .prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3"
                ))
                .and_then(|mut s| s.query_row(params![table_name(table), scope, key], raw_row).optional())
                .map_err(|e| err("get", e))?;
            raw.map(cook_row).transpose()
        })
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        self.commit_with(batch, Flush::Now)
    }

    fn commit_with(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        super::check_batch(batch)?;
        let mut queue = self.lock_queue();
        if !queue.leading {
            // No commit running: lead a group of this batch and whatever is queued.
            queue.leading = true;
            let others = take_group(&mut queue, MAX_GROUP - 1);
            drop(queue);
            return self.lead(Some((batch, flush)), others).unwrap_or_else(|| {
                Err(CommitError::Storage(StorageError(
                    "sqlite: the group commit lost this batch's result".to_string(),
                )))
            });
        }
        let id = queue.next;
        queue.next += 1;
        queue.pending.push_back(Pending {
            id,
            batch: batch.clone(),
            flush,
        });
        loop {
            if let Some(result) = queue.done.remove(&id) {
                return result;
            }
            if !queue.leading {
                // No group is running and this batch is still queued (it came after the last
                // leader took its group, or that group was full): lead the next one.
                queue.leading = true;
                let group = take_group(&mut queue, MAX_GROUP);
                drop(queue);
                self.lead(None, group);
                queue = self.lock_queue();
                continue;
            }
            queue = self
                .group_done
                .wait(queue)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError> {
        // Stored values never exceed i64::MAX, so clamping the bound is exact.
        let due_before = i64::try_from(due_before).unwrap_or(i64::MAX);
        // States as a JSON array bound to one parameter keeps the statement cacheable.
        let names = if states.is_empty() {
            None
        } else {
            let names: Vec<&str> = states.iter().map(|s| s.name()).collect();
            Some(serde_json::to_string(&names).map_err(|e| err("scan", e))?)
        };
        self.read(|conn| {
            query_rows(
                conn,
                "scan",
                &format!(
                    "SELECT {ROW_COLUMNS} FROM rows
                     WHERE tbl = ?1 AND due_at IS NOT NULL AND due_at <= ?2
                       AND (?4 IS NULL OR state IN (SELECT value FROM json_each(?4)))
                       AND (?5 IS NULL OR owner = ?5)
                     ORDER BY due_at, scope, key LIMIT ?3"
                ),
                params![table_name(table), due_before, limit, names, owner],
            )
        })
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        type RawEvent = (
            String,
            String,
            i64,
            i64,
            String,
            Option<String>,
            Option<String>,
            Option<u32>,
            String,
        );
        self.read(|conn| {
            let raws: Vec<RawEvent> = conn
                .prepare_cached(
                    "SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail
                     FROM audit WHERE scope = ?1 AND key = ?2 ORDER BY version",
                )
                .and_then(|mut s| {
                    s.query_map(params![scope, key], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                        ))
                    })?
                    .collect()
                })
                .map_err(|e| err("audit", e))?;
            raws.into_iter()
                .map(
                    |(scope, key, version, at, kind, from_state, to_state, attempt, detail)| {
                        Ok(AuditEvent {
                            scope,
                            key,
                            version: uint("audit version", version)?,
                            at: uint("audit at", at)?,
                            kind,
                            from_state: parse_opt_state(from_state)?,
                            to_state: parse_opt_state(to_state)?,
                            attempt,
                            detail,
                        })
                    },
                )
                .collect()
        })
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        let tbl = table_name(Table::Operation);
        self.read(|conn| match state {
            None => query_rows(
                conn,
                "list",
                &format!("SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ?1 ORDER BY scope, key LIMIT ?2"),
                params![tbl, limit],
            ),
            Some(state) => query_rows(
                conn,
                "list",
                &format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ?1 AND state = ?2
                     ORDER BY scope, key LIMIT ?3"
                ),
                params![tbl, state.name(), limit],
            ),
        })
    }

    fn stats(&self) -> Result<Stats, StorageError> {
        self.read(|conn| {
            // One read transaction: both counts from the same snapshot.
            let tx = conn.transaction().map_err(|e| err("stats", e))?;
            let by_state: Vec<(String, i64)> = tx
                .prepare_cached(
                    "SELECT state, count(*) FROM rows
                     WHERE tbl = ?1 AND state IS NOT NULL GROUP BY state",
                )
                .and_then(|mut s| {
                    s.query_map([table_name(Table::Operation)], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect()
                })
                .map_err(|e| err("stats", e))?;
            let events: Vec<(String, i64)> = tx
                .prepare_cached("SELECT kind, count(*) FROM audit GROUP BY kind ORDER BY kind")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(|e| err("stats", e))?;
            tx.finish().map_err(|e| err("stats", e))?;
            let mut by_state = by_state
                .into_iter()
                .map(|(s, n)| Ok((parse_state(&s)?, uint("count", n)?)))
                .collect::<Result<Vec<_>, StorageError>>()?;
            by_state.sort_by_key(|(s, _)| *s as usize);
            let events = events
                .into_iter()
                .map(|(k, n)| Ok((k, uint("count", n)?)))
                .collect::<Result<_, StorageError>>()?;
            Ok(Stats { by_state, events })
        })
    }
}
