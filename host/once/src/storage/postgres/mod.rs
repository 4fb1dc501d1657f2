//! PostgreSQL storage: one database shared by every gateway and agent host.
//!
//! Selected by a URL, `postgres://user@host:5432/db` (or `postgresql://`),
//! with an optional `schema=NAME` query parameter naming the schema that
//! holds the ledger (default [`DEFAULT_SCHEMA`]); every other parameter is
//! the client's own (`application_name`, `connect_timeout`, `host=/socket/dir`…).
//!
//! # Transactions
//!
//! A batch is one statement, `SELECT apply_batch(…)` (a PL/pgSQL function
//! the migration to version 3 installs), run in autocommit: one round trip
//! per transition, its compare-and-swap, audit events and quota changes
//! together. Inside it each put is one conditional statement whose
//! affected-row count is the compare-and-swap verdict: `UPDATE … WHERE
//! version = $n` (a concurrent writer's update makes the condition false
//! once it commits, so the count is 0: a conflict), `INSERT … ON CONFLICT
//! DO NOTHING` (insert-if-absent; a concurrent uncommitted insert of the
//! same key is waited for), `DELETE … WHERE version = $n`. A put that only
//! asserts absence inserts a placeholder and deletes it, so it takes the
//! key's unique-index lock exactly like an insert would. A count other than
//! 1 raises SQLSTATE `OC409`, which rolls the whole statement back and is
//! reported as a conflict. Puts are applied in (table, scope, key) order,
//! which keeps two batches over the same rows from deadlocking. A
//! serialization failure or a deadlock (nothing applied) re-runs the batch.
//!
//! `Ok` is reported only when the statement answered (it has committed by
//! then). A connection lost before the answer is a storage error that says
//! the outcome is unknown (the engine answers `blocked(storage)` and never
//! dispatches; a claim that did commit expires into `unknown`). So that a
//! server restart does not turn into such errors, a pooled connection idle
//! for more than 10 ms is first checked with an empty query and replaced if
//! dead. Nothing is retried once a batch has been sent, except after the
//! server itself reported that it rolled the batch back.
//!
//! Durability is the server's: commits wait for `synchronous_commit` as
//! configured, except that `off` is raised to `on` for this backend's
//! sessions, because an intent must be durable before dispatch.
//!
//! # Connections
//!
//! A small pool: at most [`PostgresOptions::max_connections`] open, idle
//! ones reused, prepared statements cached per connection. A connection that
//! failed mid-operation is discarded, never reused. A pooled connection that
//! fails before any statement of an operation ran (the server restarted, or
//! an administrator terminated it while idle) is replaced once, transparently.
//!
//! # Clock
//!
//! [`DatabaseClock`] is the ledger clock for this backend: the database
//! server's `clock_timestamp()`, read at most every
//! [`PostgresOptions::clock_resample`] and carried forward in between on this
//! host's monotonic clock, never running backwards within a process. So every
//! host compares leases and deadlines in one clock domain, whatever its own
//! wall clock says; the residual error is half the round trip of the last
//! read plus this host's monotonic drift since (microseconds over a second).
//!
//! # Schema (version [`SCHEMA_VERSION`]); migrations run on open, idempotently
//!
//! The tables, indexes, trigger and function are `schema/postgres/` at the
//! repository's root (numbered steps, applied as schema/README.md says),
//! shared with the Python and npm packages; `{schema}` in them is the
//! quoted schema name:
//!
//! - `meta (key, value)`: `('schema_version', '3')`, `('body_format', '1')`,
//!   `('binding:NAME', holder)` of `Storage::bind`;
//! - `rows (tbl, scope, key, version, state, due_at, body, owner)`, keyed by
//!   `(tbl, scope, key)`: `tbl` is `'operation'`, `'tombstone'` or
//!   `'quota'`; `state` the WIT name (`'in-flight'`, …); `due_at` ms since
//!   the epoch; `body` the engine's JSON, never interpreted; `owner`
//!   (operation rows) whose background work may touch it; indexed by
//!   `(tbl, due_at, scope, key)`, `(tbl, owner, due_at, scope, key)` where
//!   `due_at` is set, and `(tbl, state, scope, key)`;
//! - `audit (scope, key, version, at, kind, from_state, to_state, attempt,
//!   detail)`, keyed by `(scope, key, version)`, indexed by `kind`, with a
//!   trigger that refuses `UPDATE` and `DELETE`: it is append-only;
//! - `apply_batch(puts as arrays, events as arrays)` (version 3): a whole
//!   batch in one statement.
//!
//! `body_format` is the format of the row bodies (the engine's), written
//! when an engine is built over the schema ([`Storage::claim_body_format`](crate::storage::Storage::claim_body_format),
//! under the migration lock): a schema without it predates the key and holds
//! format 1; one holding a later format than the engine reads is refused
//! before any row is read. It changes independently of `schema_version`.
//!
//! `COLLATE "C"` orders names by their UTF-8 bytes, as the other backends do.
//! Integers are signed 64-bit: a version or timestamp above `i64::MAX` is
//! refused with a storage error, and so is text containing U+0000, which
//! PostgreSQL cannot store (the engine writes neither: names exclude control
//! characters and bodies are JSON, which escapes them).
//!
//! # Files
//!
//! `schema.rs` (the URL, schema names, migrations), `sql.rs` (every
//! statement), `pool.rs` (connections), `pacing.rs` (a hot quota bucket's losers), `clock.rs` ([`DatabaseClock`]) and
//! `store.rs` ([`PostgresStorage`]); the row codec, shared with SQLite, is
//! `storage/codec.rs`.

mod clock;
mod pacing;
mod pool;
mod schema;
mod sql;
mod store;

use std::time::Duration;

use super::StorageError;

pub use self::clock::DatabaseClock;
pub use self::pacing::PacingCounts;
pub use self::schema::{DEFAULT_SCHEMA, SCHEMA_VERSION, check_schema_name, is_url};
pub use self::store::PostgresStorage;

/// How [`PostgresStorage`] connects and where it keeps the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Schema of the ledger's tables, created if missing (default [`DEFAULT_SCHEMA`]);
    /// a `schema` parameter in the URL wins over this.
    pub schema: String,
    /// Most connections this store keeps open at once (default 8).
    pub max_connections: usize,
    /// Longest wait to connect, or for a connection when all are busy (default 5 s).
    pub connect_timeout: Duration,
    /// Longest wait for another transaction's row lock before a batch fails (default 5 s).
    pub lock_timeout: Duration,
    /// How often [`DatabaseClock`] re-reads the database clock (default 1 s; zero: on every read).
    pub clock_resample: Duration,
    /// `application_name` of the connections (default: the URL's, else `once`).
    pub application_name: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            schema: DEFAULT_SCHEMA.to_string(),
            max_connections: 8,
            connect_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(5),
            clock_resample: Duration::from_secs(1),
            application_name: None,
        }
    }
}

/// A client error, in the server's words, after what was being done.
fn err(what: impl std::fmt::Display, e: &postgres::Error) -> StorageError {
    StorageError(format!("postgres: {what}: {}", describe(e)))
}

/// The server's own words when it sent any (the client's `Display` says only "db error").
fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// Column `i` of a result row; a column of an unexpected type (a schema
/// altered by hand) is a storage error, not a panic.
fn col<'a, T: postgres::types::FromSql<'a>>(r: &'a postgres::Row, i: usize) -> Result<T, StorageError> {
    r.try_get(i).map_err(|e| {
        StorageError(format!(
            "postgres: unreadable column {i} in the ledger: {}",
            describe(&e)
        ))
    })
}
