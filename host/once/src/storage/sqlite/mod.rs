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
//! [`Synchronous::IntentOnly`] is FULL for every commit but the ones the
//! engine marks deferrable (the trade-off in DESIGN.md "Durability budget").
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
//! write lock one by one. A leader that expects company (the last group
//! was larger than one batch) waits for it before it begins, at most about
//! one commit's duration and never more than [`MAX_COMMIT_DELAY`]; a lone
//! caller never waits, and `Ok` still comes only after `COMMIT`. A batch
//! that lost its version check returns [`CommitError::Conflict`] after a
//! random back-off (see `group.rs`), so the losers of one hot row do not
//! all come back into the next group at once (the calls through one
//! `Once` take turns at a quota bucket before they read it, `crate::turns`,
//! so a bucket's losers are mostly other processes' or handles' callers). A
//! small pool of reader connections lets reads see
//! the last commit without waiting for a writer's fsync. Several
//! `SqliteStorage`s, in one or many processes, may open the same file;
//! SQLite's file locks arbitrate between them.
//!
//! # Schema (version [`SCHEMA_VERSION`])
//!
//! The tables and indexes are `schema/sqlite/` at the repository's root
//! (`ledger.sql` makes a new file; schema/README.md says how a file is
//! upgraded), shared with the Python and npm packages:
//!
//! - `meta (key, value)`: `('schema_version', '2')`, `('body_format', '1')`,
//!   `('binding:NAME', holder)` of `Storage::bind`;
//! - `rows (tbl, scope, key, version, state, due_at, body, owner)`, keyed by
//!   `(tbl, scope, key)`, `WITHOUT ROWID`: `tbl` is `'operation'`,
//!   `'tombstone'` or `'quota'`; `state` the WIT name (`'in-flight'`, …);
//!   `due_at` ms since the epoch; `body` the engine's JSON, never
//!   interpreted; `owner` (operation rows) whose background work may touch
//!   it; indexed by `(tbl, due_at)`, `(tbl, owner, due_at)` where `due_at` is
//!   set, and `(tbl, state)`;
//! - `audit (scope, key, version, at, kind, from_state, to_state, attempt,
//!   detail)`, keyed by `(scope, key, version)`, `WITHOUT ROWID`, indexed by
//!   `kind`.
//!
//! Version 1 files (no `owner`) are migrated on open: their operation rows
//! were all written by hosts without an owner name, so they get `default`.
//!
//! `body_format` is the format of the row bodies (the engine's, see
//! `Configured::body_format`), written when an engine is built over the file
//! ([`Storage::claim_body_format`]): a file without it predates the key and
//! holds format 1; a file holding a later format than the engine reads is
//! refused before any row is read. It changes independently of
//! `schema_version`, which is this store's tables and columns.
//!
//! Integers are SQLite's signed 64-bit: a version or timestamp above
//! `i64::MAX` is refused with a storage error (the row codec, shared with
//! PostgreSQL, is `storage/codec.rs`).
//!
//! # Files
//!
//! This file holds the store, its options and its reads; `open.rs` the
//! connections and the schema; `group.rs` the group commit (the queue, the
//! leader, a savepoint per batch); `batch.rs` one batch's puts and events.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

pub use self::group::MAX_COMMIT_DELAY;
use self::group::Queue;
use self::open::{claim_body_format, open_reader, open_writer};
use super::codec::{self, EVENT_COLUMNS, ROW_COLUMNS, RawEvent, RawRow, SQLITE};
use super::{CommitError, Flush, Stats, Storage, StorageError};
use crate::bindings::types::{AuditEvent, Batch, Row, State, Table, Timestamp};

mod batch;
mod group;
mod open;
mod witness;

use self::witness::SqliteWitness;
pub use self::witness::witness_path;

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
    /// Intent-only durability (DESIGN.md "Durability budget"): the batches
    /// the engine marks deferrable ([`Flush::Deferred`]: an attempt's own
    /// success, a replay or conflict count) run at `NORMAL`, every other
    /// commit (an intent, a rejection, reconcile, sweep, resolve) at `FULL`.
    /// After power loss every other commit is kept, and so is every deferred
    /// one followed by a later FULL commit (its fsync covers the WAL frames
    /// before it); a success after the last FULL commit may be lost: its
    /// record is back in flight, its lease expires into unknown and
    /// reconciliation restores the outcome (a lost count is only a count).
    /// Slower to heal, never a second dispatch. A process crash loses nothing.
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
    /// Batches that lost their version check to another batch of their group and
    /// waited before answering (the back-off in `group.rs`).
    pub backed_off: u64,
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
    /// Wakes a leader waiting for company (the commit delay) when a batch is queued.
    arrived: Condvar,
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
    backed_off: AtomicU64,
    /// The ledger's witness, in its own file beside this one.
    witness: SqliteWitness,
}

/// The writer connection and the `synchronous` level it is set to.
struct Writer {
    conn: Connection,
    level: Level,
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
    SQLITE.error(format_args!("{what}: {e}"))
}

/// A row's columns, as `SELECT {ROW_COLUMNS}` returns them.
fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(codec::raw_row!(rusqlite::Row::get, r))
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
    raws.into_iter().map(|raw| SQLITE.row(raw)).collect()
}

impl SqliteStorage {
    /// Open (creating if needed) the database at `path`, set WAL mode and
    /// create or check the schema. Refuses a read-only file, a path that is
    /// not a database, and a schema newer than [`SCHEMA_VERSION`].
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StorageError> {
        let path = path.as_ref().to_path_buf();
        let writer = open_writer(&path, &options)?;
        let file = file_id(&path);
        let witness = SqliteWitness::new(&path, options.busy_timeout);
        Ok(Self {
            witness,
            path,
            options,
            writer: Mutex::new(Some(writer)),
            queue: Mutex::new(Queue::default()),
            group_done: Condvar::new(),
            arrived: Condvar::new(),
            readers: Mutex::new(Vec::new()),
            file,
            commits_full: AtomicU64::new(0),
            commits_normal: AtomicU64::new(0),
            commits_batches: AtomicU64::new(0),
            backed_off: AtomicU64::new(0),
        })
    }

    /// Transactions and batches the writer has committed, by `synchronous`
    /// level (to observe intent-only durability and group commit).
    pub fn commit_counts(&self) -> CommitCounts {
        CommitCounts {
            full: self.commits_full.load(Ordering::Relaxed),
            normal: self.commits_normal.load(Ordering::Relaxed),
            batches: self.commits_batches.load(Ordering::Relaxed),
            backed_off: self.backed_off.load(Ordering::Relaxed),
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

    /// Run `f` in one immediate write transaction on the writer, for the ledger's own `meta` rows
    /// (bindings): committed if `f` succeeds, rolled back otherwise.
    fn write_meta<T>(
        &self,
        what: &str,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, rusqlite::Error>,
    ) -> Result<T, StorageError> {
        let mut guard = self.writer()?;
        // A row written to a replaced file would vouch for a ledger this store never opened.
        self.check_file()?;
        let writer = guard.as_mut().expect("writer() opened it");
        let tx = writer
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| err(what, e))?;
        let out = f(&tx).map_err(|e| err(what, e))?;
        tx.commit().map_err(|e| err(what, e))?;
        Ok(out)
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

impl Storage for SqliteStorage {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        self.read(|conn| {
            let raw = conn
                .prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3"
                ))
                .and_then(|mut s| {
                    s.query_row(params![codec::table_name(table), scope, key], raw_row)
                        .optional()
                })
                .map_err(|e| err("get", e))?;
            raw.map(|raw| SQLITE.row(raw)).transpose()
        })
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        self.commit_with(batch, Flush::Now)
    }

    fn commit_with(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        super::check_batch(batch)?;
        self.group_commit(batch, flush)
    }

    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError> {
        let due_before = codec::bound(due_before);
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
                params![codec::table_name(table), due_before, limit, names, owner],
            )
        })
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        self.read(|conn| {
            let raws: Vec<RawEvent> = conn
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM audit WHERE scope = ?1 AND key = ?2 ORDER BY version"
                ))
                .and_then(|mut s| {
                    s.query_map(params![scope, key], |r| {
                        Ok(codec::raw_event!(rusqlite::Row::get, r, attempt: r.get(7)?))
                    })?
                    .collect()
                })
                .map_err(|e| err("audit", e))?;
            raws.into_iter().map(|raw| SQLITE.event(raw)).collect()
        })
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        let tbl = codec::table_name(Table::Operation);
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

    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        let mut guard = self.writer()?;
        let Some(writer) = guard.as_ref() else {
            unreachable!("writer() always leaves a connection")
        };
        // The path must still name the file opened: a format recorded in a
        // replaced file would vouch for bodies this store never checked.
        self.check_file()?;
        let result = claim_body_format(&writer.conn, &self.path, format);
        if !writer.conn.is_autocommit() {
            // A failed ROLLBACK left a transaction open: closing the connection ends it.
            *guard = None;
        }
        result
    }

    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, StorageError> {
        self.witness.seen(scope, key)
    }

    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: Timestamp) -> Result<(), StorageError> {
        self.witness.keep(scope, key, body, at)
    }

    fn forget_witnessed(&self, scope: &str, key: &str, before: Timestamp) -> Result<(), StorageError> {
        self.witness.forget(scope, key, before)
    }

    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
        self.read(|conn| {
            // One read transaction: both counts from the same snapshot.
            let tx = conn.transaction().map_err(|e| err("stats", e))?;
            let by_state: Vec<(String, i64)> = tx
                .prepare_cached(
                    "SELECT state, count(*) FROM rows
                     WHERE tbl = ?1 AND state IS NOT NULL AND (?2 IS NULL OR scope = ?2) GROUP BY state",
                )
                .and_then(|mut s| {
                    s.query_map(params![codec::table_name(Table::Operation), scope], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })?
                    .collect()
                })
                .map_err(|e| err("stats", e))?;
            let events: Vec<(String, i64)> = tx
                .prepare_cached(
                    "SELECT kind, count(*) FROM audit WHERE (?1 IS NULL OR scope = ?1) GROUP BY kind ORDER BY kind",
                )
                .and_then(|mut s| s.query_map([scope], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(|e| err("stats", e))?;
            tx.finish().map_err(|e| err("stats", e))?;
            SQLITE.stats(by_state, events)
        })
    }

    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        let key = super::binding_key(name);
        // The first process to bind wins; every later one reads its holder.
        self.write_meta("bind", |tx| {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![key, holder],
            )?;
            tx.query_row("SELECT value FROM meta WHERE key = ?1", [&key], |r| r.get(0))
        })
    }

    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        let moved: Vec<String> = self.write_meta("rebind", |tx| {
            tx.prepare("UPDATE meta SET value = ?2 WHERE substr(key, 1, ?3) = ?4 AND value = ?1 RETURNING key")?
                .query_map(
                    params![from, to, super::BINDING_PREFIX.len() as i64, super::BINDING_PREFIX],
                    |r| r.get::<_, String>(0),
                )?
                .collect()
        })?;
        let mut names: Vec<String> = moved
            .into_iter()
            .map(|k| k[super::BINDING_PREFIX.len()..].to_string())
            .collect();
        names.sort();
        Ok(names)
    }
}
