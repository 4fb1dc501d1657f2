//! Ledger storage: a transactional compare-and-swap row store.
//!
//! The engine (the guest) decides every write; a backend only applies a
//! batch atomically, checks versions, and reads rows back. Backends:
//! [`memory::MemoryStorage`], [`sqlite::SqliteStorage`] and, with the
//! `postgres` cargo feature, `postgres::PostgresStorage`; [`open`] picks one
//! from a location.

mod codec;
mod ddl;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use crate::bindings::types::{AuditEvent, Batch, Row, State, Table, Timestamp};
use crate::io::{Clock, SystemClock};

/// A storage failure: the operation did not happen, or its outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage: {0}")]
pub struct StorageError(pub String);

/// The `meta` key under which a ledger records the format of its row bodies.
pub const BODY_FORMAT_KEY: &str = "body_format";

/// The body format of a ledger that records none: it was created before the
/// key existed, when every body was format 1.
pub const UNRECORDED_BODY_FORMAT: u32 = 1;

/// A ledger holds row bodies of a later format than this build's engine
/// reads: opening it is refused before any row is read or written, because
/// this build could misread them (and a sweep would act on what it misread).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "ledger {ledger} holds record bodies of format {holds}; this build of once reads format {reads}: \
     upgrade once (any build reading format {holds})"
)]
pub struct NewerBodyFormat {
    /// The ledger, as its store names it (a file path, a PostgreSQL schema and server).
    pub ledger: String,
    /// The format its `meta` records.
    pub holds: u32,
    /// The latest format this build's engine reads (the one it writes).
    pub reads: u32,
}

impl From<NewerBodyFormat> for StorageError {
    fn from(e: NewerBodyFormat) -> Self {
        StorageError(e.to_string())
    }
}

/// What a ledger's recorded body format must become before an engine that
/// writes `format` (and reads every earlier one) uses it: `Some` to write
/// (nothing recorded yet: the ledger holds format
/// [`UNRECORDED_BODY_FORMAT`]; or an earlier format, which this engine
/// reads and from now on writes over), `None` when it already says
/// `format`. A later format is refused ([`NewerBodyFormat`]), and so is a
/// value that is not a number. Every backend runs this inside the write
/// transaction that reads the value and writes the answer, so hosts opening
/// one ledger at once cannot interleave the read and the write.
pub(crate) fn next_body_format(ledger: &str, stored: Option<&str>, format: u32) -> Result<Option<u32>, StorageError> {
    let holds = match stored {
        None => UNRECORDED_BODY_FORMAT,
        Some(text) => text.parse::<u32>().map_err(|_| {
            StorageError(format!(
                "ledger {ledger}: unreadable {BODY_FORMAT_KEY} {text:?} in its meta table (expected a number)"
            ))
        })?,
    };
    if holds > format {
        return Err(NewerBodyFormat {
            ledger: ledger.to_string(),
            holds,
            reads: format,
        }
        .into());
    }
    Ok((stored.is_none() || holds < format).then_some(format))
}

/// Why a batch did not apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// A put's expected version did not match (or a row to insert exists, or an
    /// audit event already exists): nothing was applied.
    #[error("version conflict")]
    Conflict,
    /// The store failed; nothing was applied, or the outcome is unknown.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Counts for `once ledger stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Operation records per state.
    pub by_state: Vec<(State, u64)>,
    /// Audit events per kind (e.g. `replay`, `conflict`, `lease-expired`).
    pub events: Vec<(String, u64)>,
}

/// How soon one commit must reach stable storage (DESIGN.md "Durability budget").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Flush {
    /// Durable before `Ok` is returned: intents, rejections, reconciliation,
    /// sweeps, resolutions: every batch the engine did not mark deferrable.
    #[default]
    Now,
    /// May become durable with the next `Now` commit: a batch the engine marked
    /// [`Batch::deferrable`] (an attempt's own success, a replay or conflict
    /// count). If it is lost, a later read restores what it said: slower, never
    /// a duplicate. A backend without a cheaper mode treats it as `Now`.
    Deferred,
}

/// The record store behind the `ledger` import.
pub trait Storage: Send + Sync {
    /// Read one row.
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError>;
    /// Apply every put and event of `batch` atomically, or nothing.
    fn commit(&self, batch: &Batch) -> Result<(), CommitError>;
    /// [`Storage::commit`], told how soon the batch must be durable; the
    /// default ignores the hint and commits durably.
    fn commit_with(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        let _ = flush;
        self.commit(batch)
    }
    /// Rows of `table` in `states` (empty: any) with `due_at <= due_before`,
    /// earliest due first; with `owner`, only rows of that owner.
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError>;
    /// The audit trail of one operation, oldest first.
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError>;
    /// Operation rows, optionally in one state, ordered by scope and key.
    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError>;
    /// Operation records per state and audit events per kind; with `scope`, that scope's only.
    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError>;
    /// Bind `name` to `holder` unless it is bound already (first come, atomic across processes
    /// sharing the ledger), and return the holder it is bound to: `holder` itself, or the one
    /// that came first. Kept in the ledger's `meta` table under `binding:NAME`, beside the schema
    /// version; never removed. A gateway binds each scope it serves to its upstream, so a second
    /// upstream on the same ledger is refused instead of answered with the first one's records.
    /// A store that keeps no bindings says so (an error), never pretends to bind.
    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        let _ = (name, holder);
        Err(StorageError("this store keeps no bindings".to_string()))
    }
    /// Hand every binding held by `from` to `to` (an operator adopting a renamed gateway's
    /// records, `once ledger adopt`); the names moved, in order.
    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        let _ = (from, to);
        Err(StorageError("this store keeps no bindings".to_string()))
    }
    /// Settle the ledger's body format with an engine that writes `format`
    /// (and reads every earlier one), before that engine reads or writes a
    /// row: record it if the ledger records none or an earlier one; refuse
    /// a ledger that holds a later one ([`NewerBodyFormat`]), writing
    /// nothing. Atomic: the value is read and written in one transaction
    /// ([`BODY_FORMAT_KEY`] in the ledger's `meta`).
    fn claim_body_format(&self, format: u32) -> Result<(), StorageError>;
    /// The ledger's witness (the `witness` import; docs/design.md "Older
    /// history"): the record body kept for (scope, key), kept where a restore
    /// of this store does not reach. The default, a store with no such place,
    /// keeps nothing: a restore of it from an older backup is not detected.
    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, StorageError> {
        let _ = (scope, key);
        Ok(None)
    }
    /// Keep `body` for (scope, key) in the witness, on disk before answering,
    /// unless what is kept there was granted after `at`.
    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: Timestamp) -> Result<(), StorageError> {
        let _ = (scope, key, body, at);
        Ok(())
    }
    /// Forget what the witness kept for (scope, key) if it was kept as of before `before`.
    fn forget_witnessed(&self, scope: &str, key: &str, before: Timestamp) -> Result<(), StorageError> {
        let _ = (scope, key, before);
        Ok(())
    }
}

/// The `meta` key prefix of a binding made with [`Storage::bind`].
pub const BINDING_PREFIX: &str = "binding:";

/// The `meta` key of a binding made with [`Storage::bind`].
pub fn binding_key(name: &str) -> String {
    format!("{BINDING_PREFIX}{name}")
}

/// A shared store is a store: the engine and its owner (a bench, an
/// operator tool) can hold the same one.
impl<T: Storage + ?Sized> Storage for Arc<T> {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        (**self).get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        (**self).commit(batch)
    }
    fn commit_with(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        (**self).commit_with(batch, flush)
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError> {
        (**self).scan(table, states, due_before, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        (**self).audit(scope, key)
    }
    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        (**self).list(state, limit)
    }
    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
        (**self).stats(scope)
    }
    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        (**self).bind(name, holder)
    }
    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        (**self).rebind(from, to)
    }
    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        (**self).claim_body_format(format)
    }
    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, StorageError> {
        (**self).witnessed(scope, key)
    }
    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: Timestamp) -> Result<(), StorageError> {
        (**self).keep_witness(scope, key, body, at)
    }
    fn forget_witnessed(&self, scope: &str, key: &str, before: Timestamp) -> Result<(), StorageError> {
        (**self).forget_witnessed(scope, key, before)
    }
}

/// Checks shared by every backend before a batch touches the store: a put's
/// new row must name the put's own (table, scope, key).
pub(crate) fn check_batch(batch: &Batch) -> Result<(), StorageError> {
    for put in &batch.puts {
        if let Some(row) = &put.row
            && (row.table != put.table || row.scope != put.scope || row.key != put.key)
        {
            return Err(StorageError(format!(
                "put on ({:?}, {:?}, {:?}) carries a row for ({:?}, {:?}, {:?})",
                put.table, put.scope, put.key, row.table, row.scope, row.key
            )));
        }
    }
    Ok(())
}

/// Where a ledger lives, as a user writes it (`--db`, `ONCE_DB`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file (any location that is not a PostgreSQL URL).
    Sqlite(PathBuf),
    /// A PostgreSQL URL, `postgres://…` or `postgresql://…`, optionally `?schema=NAME`.
    Postgres(String),
}

impl Location {
    /// Whether `location` is a PostgreSQL URL (`postgres://…` or `postgresql://…`) rather than a file path.
    pub fn is_postgres(location: &str) -> bool {
        location.starts_with("postgres://") || location.starts_with("postgresql://")
    }

    /// Read a location: a PostgreSQL URL, else a file path.
    pub fn parse(location: &str) -> Location {
        if Location::is_postgres(location) {
            Location::Postgres(location.to_string())
        } else {
            Location::Sqlite(PathBuf::from(location))
        }
    }
}

/// A store and the clock its leases are measured in.
pub struct Opened {
    /// The store.
    pub storage: Arc<dyn Storage>,
    /// The ledger clock: the database's for PostgreSQL, this host's for SQLite.
    pub clock: Arc<dyn Clock>,
}

/// Open the ledger at `location` with default options: an SQLite file
/// (created if missing), or a PostgreSQL database (migrated on open; a build
/// without the `postgres` feature refuses the URL with a storage error).
pub fn open(location: &str) -> Result<Opened, StorageError> {
    match Location::parse(location) {
        Location::Sqlite(path) => Ok(Opened {
            storage: Arc::new(sqlite::SqliteStorage::open(path, sqlite::SqliteOptions::default())?),
            clock: Arc::new(SystemClock::default()),
        }),
        Location::Postgres(url) => open_postgres(&url),
    }
}

#[cfg(feature = "postgres")]
fn open_postgres(url: &str) -> Result<Opened, StorageError> {
    let store = postgres::PostgresStorage::open(url)?;
    let clock = store.clock()?;
    Ok(Opened {
        storage: Arc::new(store),
        clock: Arc::new(clock),
    })
}

/// What [`open`] answers for a PostgreSQL URL in a build without PostgreSQL.
#[cfg(not(feature = "postgres"))]
fn open_postgres(_url: &str) -> Result<Opened, StorageError> {
    Err(StorageError(
        "postgres: this build of once has no PostgreSQL support; build once-host with its `postgres` \
         feature to use a postgres:// ledger"
            .to_string(),
    ))
}

/// A random number, different on every call (std's hasher keys are random per
/// instance): enough to spread contenders, no generator to keep.
fn jitter() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::Instant::now())
}
