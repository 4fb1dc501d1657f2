//! PostgreSQL storage: one database shared by every gateway and agent host.
//!
//! Selected by a URL, `postgres://user@host:5432/db` (or `postgresql://`),
//! with an optional `schema=NAME` query parameter naming the schema that
//! holds the ledger (default [`DEFAULT_SCHEMA`]); every other parameter is
//! the client's own (`application_name`, `connect_timeout`, `host=/socket/dir`…).
//!
//! # Transactions
//!
//! A batch is one `READ COMMITTED` transaction. Each put is one conditional
//! statement whose affected-row count is the compare-and-swap verdict:
//! `UPDATE … WHERE version = $n` (a concurrent writer's update makes the
//! condition false once it commits, so the count is 0: a conflict),
//! `INSERT … ON CONFLICT DO NOTHING` (insert-if-absent; a concurrent
//! uncommitted insert of the same key is waited for), `DELETE … WHERE
//! version = $n`. A put that only asserts absence inserts a placeholder and
//! deletes it in the same transaction, so it takes the key's unique-index
//! lock exactly like an insert would. Puts are applied in (table, scope,
//! key) order, which keeps two batches over the same rows from deadlocking.
//! A serialization failure or a deadlock (nothing applied) re-runs the batch.
//!
//! `Ok` is reported only when `COMMIT` answered. A connection lost before
//! that is a storage error; a `COMMIT` without an answer is a storage error
//! that says the outcome is unknown (the engine answers `blocked(storage)`
//! and never dispatches; a claim that did commit expires into `unknown`).
//! Nothing is retried once a batch's statements have been sent, except
//! after the server itself reported that it rolled the batch back.
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
//! ```sql
//! CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);  -- ('schema_version', '2')
//! CREATE TABLE rows (
//!   tbl text COLLATE "C" NOT NULL,         -- 'operation' | 'tombstone' | 'quota'
//!   scope text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL,
//!   version bigint NOT NULL, state text,   -- WIT name: 'in-flight', 'confirmed', ...
//!   due_at bigint,                         -- ms since the epoch
//!   body text NOT NULL,                    -- the engine's JSON, never interpreted
//!   owner text COLLATE "C",                -- operation rows: whose background work may touch it
//!   PRIMARY KEY (tbl, scope, key));
//! CREATE INDEX rows_due ON rows (tbl, due_at, scope, key) WHERE due_at IS NOT NULL;
//! CREATE INDEX rows_owner_due ON rows (tbl, owner, due_at, scope, key) WHERE due_at IS NOT NULL;
//! CREATE INDEX rows_state ON rows (tbl, state, scope, key);
//! CREATE TABLE audit (
//!   scope text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL, version bigint NOT NULL,
//!   at bigint NOT NULL, kind text COLLATE "C" NOT NULL,
//!   from_state text, to_state text, attempt bigint, detail text NOT NULL,
//!   PRIMARY KEY (scope, key, version));
//! CREATE INDEX audit_kind ON audit (kind);
//! -- plus a trigger that refuses UPDATE and DELETE on audit: it is append-only.
//! ```
//!
//! `COLLATE "C"` orders names by their UTF-8 bytes, as the other backends do.
//! Integers are signed 64-bit: a version or timestamp above `i64::MAX` is
//! refused with a storage error, and so is text containing U+0000, which
//! PostgreSQL cannot store (the engine writes neither: names exclude control
//! characters and bodies are JSON, which escapes them).

use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{Client, NoTls, Statement};

use super::{CommitError, Stats, Storage, StorageError};
use crate::bindings::types::{AuditEvent, Batch, Put, Row, State, Table, Timestamp};
use crate::io::Clock;

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: u32 = 2;

/// The schema that holds the ledger unless the URL or the options name another.
pub const DEFAULT_SCHEMA: &str = "once";

/// Migrations by target version (index 0 makes version 1); `{s}` is the quoted schema.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE {s}.rows (
  tbl text COLLATE "C" NOT NULL CHECK (tbl IN ('operation', 'tombstone', 'quota')),
  scope text COLLATE "C" NOT NULL,
  key text COLLATE "C" NOT NULL,
  version bigint NOT NULL CHECK (version >= 0),
  state text,
  due_at bigint,
  body text NOT NULL,
  PRIMARY KEY (tbl, scope, key)
);
CREATE INDEX rows_due ON {s}.rows (tbl, due_at, scope, key) WHERE due_at IS NOT NULL;
CREATE INDEX rows_state ON {s}.rows (tbl, state, scope, key);
CREATE TABLE {s}.audit (
  scope text COLLATE "C" NOT NULL,
  key text COLLATE "C" NOT NULL,
  version bigint NOT NULL,
  at bigint NOT NULL,
  kind text COLLATE "C" NOT NULL,
  from_state text,
  to_state text,
  attempt bigint,
  detail text NOT NULL,
  PRIMARY KEY (scope, key, version)
);
CREATE INDEX audit_kind ON {s}.audit (kind);
CREATE FUNCTION {s}.audit_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the once audit trail is append-only';
END
$$;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON {s}.audit
  FOR EACH ROW EXECUTE FUNCTION {s}.audit_is_append_only();
"#,
    r#"
ALTER TABLE {s}.rows ADD COLUMN owner text COLLATE "C";
UPDATE {s}.rows SET owner = 'default' WHERE tbl = 'operation';
CREATE INDEX rows_owner_due ON {s}.rows (tbl, owner, due_at, scope, key) WHERE due_at IS NOT NULL;
"#,
];

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

/// True when `location` is a PostgreSQL URL rather than a file path.
pub fn is_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A schema name this backend accepts: lower-case ASCII letters, digits and
/// `_`, starting with a letter or `_`, at most 63 bytes, not `pg_…`.
pub fn check_schema_name(name: &str) -> Result<(), StorageError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with("pg_")
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StorageError(format!(
            "postgres: schema name {name:?} is not [a-z_][a-z0-9_]* (at most 63 bytes, not pg_…)"
        )))
    }
}

/// Split the `schema` parameter off a URL: (the URL the client sees, the schema).
fn split_schema(url: &str) -> Result<(String, Option<String>), StorageError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let mut schema = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("schema", value)) => {
                if schema.replace(value.to_string()).is_some() {
                    return Err(StorageError("postgres: the URL names `schema` twice".to_string()));
                }
            }
            _ => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, schema))
}

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

/// The server rolled the transaction back on its own; running it again is safe.
fn is_retryable(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
    )
}

fn table_name(table: Table) -> &'static str {
    match table {
        Table::Operation => "operation",
        Table::Tombstone => "tombstone",
        Table::Quota => "quota",
    }
}

fn table_index(table: Table) -> u8 {
    match table {
        Table::Operation => 0,
        Table::Tombstone => 1,
        Table::Quota => 2,
    }
}

fn parse_table(s: &str) -> Result<Table, StorageError> {
    Ok(match s {
        "operation" => Table::Operation,
        "tombstone" => Table::Tombstone,
        "quota" => Table::Quota,
        other => return Err(StorageError(format!("postgres: unknown table {other:?} in the ledger"))),
    })
}

fn parse_state(s: &str) -> Result<State, StorageError> {
    State::parse(s).ok_or_else(|| StorageError(format!("postgres: unknown state {s:?} in the ledger")))
}

fn parse_opt_state(s: Option<String>) -> Result<Option<State>, StorageError> {
    s.as_deref().map(parse_state).transpose()
}

/// A u64 as PostgreSQL's bigint, refusing values it cannot hold.
fn int(what: &str, v: u64) -> Result<i64, StorageError> {
    i64::try_from(v).map_err(|_| StorageError(format!("postgres: {what} {v} exceeds i64::MAX")))
}

fn uint(what: &str, v: i64) -> Result<u64, StorageError> {
    u64::try_from(v).map_err(|_| StorageError(format!("postgres: negative {what} {v} in the ledger")))
}

/// Text PostgreSQL can store (no U+0000).
fn text<'a>(what: &str, s: &'a str) -> Result<&'a str, StorageError> {
    if s.contains('\0') {
        return Err(StorageError(format!(
            "postgres: {what} contains U+0000, which PostgreSQL text cannot hold"
        )));
    }
    Ok(s)
}

/// The statements of one store, by index into [`Sql::texts`].
#[derive(Debug, Clone, Copy)]
enum Q {
    Get,
    Insert,
    Update,
    Delete,
    Claim,
    Unclaim,
    Event,
    ScanAny,
    ScanStates,
    Audit,
    ListAll,
    ListState,
    StatsStates,
    StatsEvents,
    Now,
}

const QUERIES: usize = Q::Now as usize + 1;

const ROW_COLUMNS: &str = "tbl, scope, key, version, state, due_at, body, owner";
const NOW_SQL: &str = "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The SQL of one store, its schema spelled in.
struct Sql {
    texts: Vec<String>,
}

impl Sql {
    fn new(schema: &str) -> Self {
        let s = quote_ident(schema);
        let text = |q: Q| -> String {
            match q {
                Q::Get => format!("SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3"),
                Q::Insert => format!(
                    "INSERT INTO {s}.rows (tbl, scope, key, version, state, due_at, body, owner)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING"
                ),
                Q::Update => format!(
                    "UPDATE {s}.rows SET version = $5, state = $6, due_at = $7, body = $8, owner = $9
                     WHERE tbl = $1 AND scope = $2 AND key = $3 AND version = $4"
                ),
                Q::Delete => {
                    format!("DELETE FROM {s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3 AND version = $4")
                }
                Q::Claim => format!(
                    "INSERT INTO {s}.rows (tbl, scope, key, version, state, due_at, body)
                     VALUES ($1, $2, $3, 0, NULL, NULL, '') ON CONFLICT DO NOTHING"
                ),
                Q::Unclaim => format!("DELETE FROM {s}.rows WHERE tbl = $1 AND scope = $2 AND key = $3"),
                Q::Event => format!(
                    "INSERT INTO {s}.audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING"
                ),
                Q::ScanAny => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows
                     WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2
                       AND ($4::text IS NULL OR owner = $4)
                     ORDER BY due_at, scope, key LIMIT $3"
                ),
                Q::ScanStates => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows
                     WHERE tbl = $1 AND due_at IS NOT NULL AND due_at <= $2 AND state = ANY($5)
                       AND ($4::text IS NULL OR owner = $4)
                     ORDER BY due_at, scope, key LIMIT $3"
                ),
                Q::Audit => format!(
                    "SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail
                     FROM {s}.audit WHERE scope = $1 AND key = $2 ORDER BY version"
                ),
                Q::ListAll => format!("SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 ORDER BY scope, key LIMIT $2"),
                Q::ListState => format!(
                    "SELECT {ROW_COLUMNS} FROM {s}.rows WHERE tbl = $1 AND state = $2 ORDER BY scope, key LIMIT $3"
                ),
                Q::StatsStates => {
                    format!("SELECT state, count(*) FROM {s}.rows WHERE tbl = $1 AND state IS NOT NULL GROUP BY state")
                }
                Q::StatsEvents => format!("SELECT kind, count(*) FROM {s}.audit GROUP BY kind ORDER BY kind"),
                Q::Now => NOW_SQL.to_string(),
            }
        };
        const ALL: [Q; QUERIES] = [
            Q::Get,
            Q::Insert,
            Q::Update,
            Q::Delete,
            Q::Claim,
            Q::Unclaim,
            Q::Event,
            Q::ScanAny,
            Q::ScanStates,
            Q::Audit,
            Q::ListAll,
            Q::ListState,
            Q::StatsStates,
            Q::StatsEvents,
            Q::Now,
        ];
        // `texts` is indexed by discriminant: ALL must list Q in declaration order.
        debug_assert!(ALL.iter().enumerate().all(|(i, q)| *q as usize == i));
        Sql {
            texts: ALL.iter().map(|q| text(*q)).collect(),
        }
    }
}

/// A double-quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// One open connection and its prepared statements.
struct Conn {
    client: Client,
    statements: [Option<Statement>; QUERIES],
}

impl Conn {
    fn statement(&mut self, sql: &Sql, q: Q) -> Result<Statement, postgres::Error> {
        let slot = &mut self.statements[q as usize];
        if let Some(statement) = slot {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(&sql.texts[q as usize])?;
        *slot = Some(statement.clone());
        Ok(statement)
    }
}

struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

/// At most `max` connections; idle ones are reused.
struct Pool {
    config: postgres::Config,
    /// Session settings run on every new connection.
    setup: String,
    state: Mutex<PoolState>,
    freed: Condvar,
    max: usize,
    wait: Duration,
}

/// A connection taken from the pool. Dropped without [`Checkout::keep`], it
/// is closed: a connection in an unknown state is never reused.
struct Checkout<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    /// Came from the idle list (it may have died while idle).
    pooled: bool,
}

impl Checkout<'_> {
    fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a checkout holds its connection until it ends")
    }

    /// Return the connection for reuse.
    fn keep(mut self) {
        if let Some(conn) = self.conn.take() {
            if conn.client.is_closed() {
                self.pool.forget();
            } else {
                self.pool.lock().idle.push(conn);
                self.pool.freed.notify_one();
            }
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.pool.forget();
        }
    }
}

impl Drop for Pool {
    /// Closes the idle connections on a thread of their own: closing one runs a
    /// small blocking runtime, which would panic if the last handle on the store
    /// were dropped inside an async runtime (a gateway shutting down).
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.lock().idle);
        if idle.is_empty() {
            return;
        }
        let closing = std::thread::Builder::new()
            .name("once-postgres-close".into())
            .spawn(move || drop(idle));
        if let Ok(thread) = closing {
            let _ = thread.join();
        }
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is two plain fields updated in one statement each: never torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self) -> Result<Checkout<'_>, StorageError> {
        let deadline = Instant::now() + self.wait;
        let mut state = self.lock();
        loop {
            if let Some(conn) = state.idle.pop() {
                return Ok(Checkout {
                    pool: self,
                    conn: Some(conn),
                    pooled: true,
                });
            }
            if state.open < self.max {
                state.open += 1;
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StorageError(format!(
                    "postgres: all {} connections stayed busy for {:?}",
                    self.max, self.wait
                )));
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(state);
        match self.connect() {
            Ok(conn) => Ok(Checkout {
                pool: self,
                conn: Some(conn),
                pooled: false,
            }),
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }

    /// A fresh connection (bypassing the idle list); it still counts against `max`.
    fn fresh(&self) -> Result<Checkout<'_>, StorageError> {
        let idle = std::mem::take(&mut self.lock().idle);
        // Connections idle alongside one that died are suspect too (a server
        // restart ends them all): close them rather than fail on each in turn.
        for conn in idle {
            drop(conn);
            self.forget();
        }
        self.get()
    }

    fn forget(&self) {
        let mut state = self.lock();
        state.open = state.open.saturating_sub(1);
        drop(state);
        self.freed.notify_one();
    }

    fn connect(&self) -> Result<Conn, StorageError> {
        let mut client = self
            .config
            .connect(NoTls)
            .map_err(|e| err(format_args!("connect to {}", describe_config(&self.config)), &e))?;
        client
            .batch_execute(&self.setup)
            .map_err(|e| err("set up the session", &e))?;
        // An intent must be durable before dispatch: never run with asynchronous commit.
        let sync = client
            .query_one("SHOW synchronous_commit", &[])
            .map_err(|e| err("read synchronous_commit", &e))?;
        if col::<String>(&sync, 0)? == "off" {
            client
                .batch_execute("SET synchronous_commit = on")
                .map_err(|e| err("set synchronous_commit", &e))?;
        }
        Ok(Conn {
            client,
            statements: Default::default(),
        })
    }
}

/// Hosts and database of a config, without credentials.
fn describe_config(config: &postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "{}:{}/{}",
        hosts.join(","),
        ports.join(","),
        config.get_dbname().unwrap_or("(default database)")
    )
}

/// What a store shares with its clocks.
struct Shared {
    pool: Pool,
    sql: Sql,
    schema: String,
    options: PostgresOptions,
}

impl Shared {
    /// Run a read on a pooled connection; a connection lost on the way is
    /// replaced and the read run again (reads change nothing).
    fn read<T>(
        &self,
        what: &str,
        mut f: impl FnMut(&mut Conn, &Sql) -> Result<T, postgres::Error>,
    ) -> Result<T, StorageError> {
        let mut checkout = self.pool.get()?;
        match f(checkout.conn(), &self.sql) {
            Ok(out) => {
                checkout.keep();
                return Ok(out);
            }
            Err(e) if !lost(&e) => {
                let e = err(what, &e);
                // A failed statement outside a transaction leaves the session usable.
                checkout.keep();
                return Err(e);
            }
            Err(_) => drop(checkout),
        }
        let mut checkout = self.pool.fresh()?;
        let out = f(checkout.conn(), &self.sql).map_err(|e| err(what, &e))?;
        checkout.keep();
        Ok(out)
    }

    fn database_now(&self) -> Result<u64, StorageError> {
        let ms: i64 = self.read("read the database clock", |conn, sql| {
            let statement = conn.statement(sql, Q::Now)?;
            conn.client.query_one(&statement, &[])?.try_get(0)
        })?;
        uint("database clock", ms)
    }
}

/// The connection was lost (or the server is going away): a statement error
/// that leaves the session usable is not this.
fn lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        None => e.as_db_error().is_none(),
        Some(code) => {
            let code = code.code();
            // 08: connection exception; 57P0x: the server is shutting down, or
            // an administrator terminated this session.
            code.starts_with("08") || code.starts_with("57P0")
        }
    }
}

/// A [`Storage`] in a PostgreSQL schema, shared by any number of processes and hosts.
pub struct PostgresStorage {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("server", &describe_config(&self.shared.pool.config))
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

/// A prepared put: the checked values of one conditional write.
struct PutPlan<'a> {
    put: &'a Put,
    expected: Option<i64>,
    version: i64,
    due_at: Option<i64>,
}

/// A prepared audit event.
struct EventPlan<'a> {
    event: &'a AuditEvent,
    version: i64,
    at: i64,
    attempt: Option<i64>,
}

/// Why a batch stopped inside its transaction.
enum Abort {
    Conflict,
    Pg(&'static str, postgres::Error),
}

impl PostgresStorage {
    /// Connect to the database at `url` (`postgres://…`, optionally
    /// `?schema=NAME`) with default options and run the migrations.
    pub fn open(url: &str) -> Result<Self, StorageError> {
        Self::open_with(url, PostgresOptions::default())
    }

    /// Connect with `options` (a `schema` in the URL wins over `options.schema`),
    /// create the schema if missing and run the migrations it lacks. Refuses a
    /// bad URL, an unreachable server and a schema newer than [`SCHEMA_VERSION`].
    pub fn open_with(url: &str, mut options: PostgresOptions) -> Result<Self, StorageError> {
        if !is_url(url) {
            return Err(StorageError(
                "postgres: the location must start with postgres:// or postgresql://".to_string(),
            ));
        }
        let (url, schema) = split_schema(url)?;
        if let Some(schema) = schema {
            options.schema = schema;
        }
        check_schema_name(&options.schema)?;
        if options.max_connections == 0 {
            return Err(StorageError("postgres: max_connections must be at least 1".to_string()));
        }
        // The client's parse errors never echo the URL, so a password cannot leak here.
        let mut config = postgres::Config::from_str(&url)
            .map_err(|e| StorageError(format!("postgres: invalid URL: {}", describe(&e))))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        match (&options.application_name, config.get_application_name()) {
            (Some(name), _) => {
                config.application_name(name);
            }
            (None, None) => {
                config.application_name("once");
            }
            (None, Some(_)) => {}
        }
        // A peer that vanished (no reset, no FIN) fails a call instead of hanging it.
        config.keepalives(true).keepalives_idle(Duration::from_secs(10));
        config.tcp_user_timeout(Duration::from_secs(30));
        let setup = format!("SET lock_timeout = {}", options.lock_timeout.as_millis().max(1));
        let shared = Shared {
            pool: Pool {
                config,
                setup,
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    open: 0,
                }),
                freed: Condvar::new(),
                max: options.max_connections,
                wait: options.connect_timeout,
            },
            sql: Sql::new(&options.schema),
            schema: options.schema.clone(),
            options,
        };
        let store = PostgresStorage {
            shared: Arc::new(shared),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The schema holding the ledger.
    pub fn schema(&self) -> &str {
        &self.shared.schema
    }

    /// The options the store was opened with (the URL's schema applied).
    pub fn options(&self) -> &PostgresOptions {
        &self.shared.options
    }

    /// The ledger clock of this store: the database server's clock (see the module docs).
    pub fn clock(&self) -> Result<DatabaseClock, StorageError> {
        DatabaseClock::new(self.shared.clone())
    }

    /// The database server's clock now, in ms since the epoch (one round trip).
    pub fn database_now(&self) -> Result<u64, StorageError> {
        self.shared.database_now()
    }

    /// Create the schema and the tables the stored version lacks, under an
    /// advisory lock so processes opening one schema at once do not race.
    fn migrate(&self) -> Result<(), StorageError> {
        let schema = &self.shared.schema;
        let quoted = quote_ident(schema);
        let mut checkout = self.shared.pool.get()?;
        let client = &mut checkout.conn().client;
        let version_sql = format!("SELECT value FROM {quoted}.meta WHERE key = 'schema_version'");
        // Fast path: already current, no lock taken.
        if let Ok(Some(row)) = client.query_opt(&version_sql, &[]) {
            let found = parse_version(&col::<String>(&row, 0)?)?;
            if found == SCHEMA_VERSION {
                checkout.keep();
                return Ok(());
            }
        }
        let result = (|| -> Result<(), StorageError> {
            let mut tx = client.transaction().map_err(|e| err("begin migration", &e))?;
            // 0x6f6e6365 is "once": a lock class of our own, one lock per schema.
            tx.execute("SELECT pg_advisory_xact_lock(1869505381, hashtext($1))", &[schema])
                .map_err(|e| err("lock for migration", &e))?;
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {quoted};
                 CREATE TABLE IF NOT EXISTS {quoted}.meta (key text PRIMARY KEY, value text NOT NULL);"
            ))
            .map_err(|e| err(format_args!("create schema {schema}"), &e))?;
            let found = match tx
                .query_opt(&version_sql, &[])
                .map_err(|e| err("read schema version", &e))?
            {
                Some(row) => parse_version(&col::<String>(&row, 0)?)?,
                None => 0,
            };
            if found > SCHEMA_VERSION {
                return Err(StorageError(format!(
                    "postgres: schema {schema} is at version {found}, newer than this build understands \
                     ({SCHEMA_VERSION}); upgrade once"
                )));
            }
            for (i, migration) in MIGRATIONS.iter().enumerate().skip(found as usize) {
                tx.batch_execute(&migration.replace("{s}", &quoted))
                    .map_err(|e| err(format_args!("migrate {schema} to version {}", i + 1), &e))?;
            }
            tx.execute(
                &format!(
                    "INSERT INTO {quoted}.meta (key, value) VALUES ('schema_version', $1)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                ),
                &[&SCHEMA_VERSION.to_string()],
            )
            .map_err(|e| err("record schema version", &e))?;
            tx.commit().map_err(|e| err("commit migration", &e))
        })();
        match result {
            Ok(()) => {
                checkout.keep();
                Ok(())
            }
            // The transaction was rolled back when dropped; the connection may be fine,
            // but an open failure is rare enough to not reuse it.
            Err(e) => Err(e),
        }
    }

    fn rows(&self, what: &'static str, q: Q, params: &[&(dyn postgres::types::ToSql + Sync)]) -> RowsResult {
        let raws = self.shared.read(what, |conn, sql| {
            let statement = conn.statement(sql, q)?;
            conn.client.query(&statement, params)
        })?;
        raws.iter().map(cook_row).collect()
    }

    /// Apply the batch's puts and events inside the open transaction.
    fn apply(&self, conn: &mut Conn, puts: &[PutPlan<'_>], events: &[EventPlan<'_>]) -> Result<(), Abort> {
        let sql = &self.shared.sql;
        for p in puts {
            let put = p.put;
            let tbl = table_name(put.table);
            let changed = match (p.expected, &put.row) {
                (None, Some(row)) => {
                    let state = row.state.map(State::name);
                    let statement = conn.statement(sql, Q::Insert).map_err(|e| Abort::Pg("prepare", e))?;
                    let params: [&(dyn postgres::types::ToSql + Sync); 8] = [
                        &tbl, &put.scope, &put.key, &p.version, &state, &p.due_at, &row.body, &row.owner,
                    ];
                    conn.client
                        .execute(&statement, &params)
                        .map_err(|e| Abort::Pg("insert", e))?
                }
                (Some(expected), Some(row)) => {
                    let state = row.state.map(State::name);
                    let statement = conn.statement(sql, Q::Update).map_err(|e| Abort::Pg("prepare", e))?;
                    let params: [&(dyn postgres::types::ToSql + Sync); 9] = [
                        &tbl, &put.scope, &put.key, &expected, &p.version, &state, &p.due_at, &row.body, &row.owner,
                    ];
                    conn.client
                        .execute(&statement, &params)
                        .map_err(|e| Abort::Pg("update", e))?
                }
                (Some(expected), None) => {
                    let statement = conn.statement(sql, Q::Delete).map_err(|e| Abort::Pg("prepare", e))?;
                    conn.client
                        .execute(&statement, &[&tbl, &put.scope, &put.key, &expected])
                        .map_err(|e| Abort::Pg("delete", e))?
                }
                // "Must not exist, and stays absent": take the key as an insert would, then let go.
                (None, None) => {
                    let claim = conn.statement(sql, Q::Claim).map_err(|e| Abort::Pg("prepare", e))?;
                    let claimed = conn
                        .client
                        .execute(&claim, &[&tbl, &put.scope, &put.key])
                        .map_err(|e| Abort::Pg("check absent", e))?;
                    if claimed == 1 {
                        let unclaim = conn.statement(sql, Q::Unclaim).map_err(|e| Abort::Pg("prepare", e))?;
                        conn.client
                            .execute(&unclaim, &[&tbl, &put.scope, &put.key])
                            .map_err(|e| Abort::Pg("check absent", e))?;
                    }
                    claimed
                }
            };
            if changed != 1 {
                return Err(Abort::Conflict);
            }
        }
        for e in events {
            let ev = e.event;
            let from = ev.from_state.map(State::name);
            let to = ev.to_state.map(State::name);
            let statement = conn.statement(sql, Q::Event).map_err(|e| Abort::Pg("prepare", e))?;
            let params: [&(dyn postgres::types::ToSql + Sync); 9] = [
                &ev.scope, &ev.key, &e.version, &e.at, &ev.kind, &from, &to, &e.attempt, &ev.detail,
            ];
            let changed = conn
                .client
                .execute(&statement, &params)
                .map_err(|e| Abort::Pg("insert audit", e))?;
            if changed != 1 {
                return Err(Abort::Conflict);
            }
        }
        Ok(())
    }
}

type RowsResult = Result<Vec<Row>, StorageError>;

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

fn parse_version(s: &str) -> Result<u32, StorageError> {
    s.parse()
        .map_err(|_| StorageError(format!("postgres: unreadable schema version {s:?}")))
}

fn cook_row(r: &postgres::Row) -> Result<Row, StorageError> {
    Ok(Row {
        table: parse_table(&col::<String>(r, 0)?)?,
        scope: col(r, 1)?,
        key: col(r, 2)?,
        version: uint("version", col(r, 3)?)?,
        state: parse_opt_state(col(r, 4)?)?,
        due_at: col::<Option<i64>>(r, 5)?.map(|d| uint("due_at", d)).transpose()?,
        body: col(r, 6)?,
        owner: col(r, 7)?,
    })
}

/// Check every value of a batch before anything is sent, and order the puts.
fn plan(batch: &Batch) -> Result<(Vec<PutPlan<'_>>, Vec<EventPlan<'_>>), StorageError> {
    let mut puts = batch
        .puts
        .iter()
        .map(|put| {
            text("scope", &put.scope)?;
            text("key", &put.key)?;
            let (version, due_at) = match &put.row {
                Some(row) => {
                    text("body", &row.body)?;
                    (
                        int("version", row.version)?,
                        row.due_at.map(|d| int("due_at", d)).transpose()?,
                    )
                }
                None => (0, None),
            };
            Ok(PutPlan {
                put,
                expected: put.expected.map(|v| int("expected version", v)).transpose()?,
                version,
                due_at,
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    // Stable: puts on one row keep their order.
    puts.sort_by(|a, b| {
        (table_index(a.put.table), &a.put.scope, &a.put.key).cmp(&(table_index(b.put.table), &b.put.scope, &b.put.key))
    });
    let mut events = batch
        .events
        .iter()
        .map(|event| {
            for (what, s) in [
                ("audit scope", &event.scope),
                ("audit key", &event.key),
                ("audit kind", &event.kind),
                ("audit detail", &event.detail),
            ] {
                text(what, s)?;
            }
            Ok(EventPlan {
                event,
                version: int("audit version", event.version)?,
                at: int("audit at", event.at)?,
                attempt: event.attempt.map(i64::from),
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    events.sort_by(|a, b| (&a.event.scope, &a.event.key, a.version).cmp(&(&b.event.scope, &b.event.key, b.version)));
    Ok((puts, events))
}

/// How often a batch is run again after the server rolled it back on its own.
const MAX_ROLLED_BACK: u32 = 5;

impl Storage for PostgresStorage {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        text("scope", scope)?;
        text("key", key)?;
        let raw = self.shared.read("get", |conn, sql| {
            let statement = conn.statement(sql, Q::Get)?;
            conn.client.query_opt(&statement, &[&table_name(table), &scope, &key])
        })?;
        raw.as_ref().map(cook_row).transpose()
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        super::check_batch(batch)?;
        let (puts, events) = plan(batch)?;
        let pool = &self.shared.pool;
        let mut rolled_back = 0;
        let mut replaced = false;
        loop {
            let mut checkout = if replaced { pool.fresh()? } else { pool.get()? };
            let conn = checkout.conn();
            if let Err(e) = conn
                .client
                .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED, READ WRITE")
            {
                // Nothing of the batch was sent yet: a pooled connection that died
                // while idle is replaced once; anything else is reported.
                if checkout.pooled && !replaced && lost(&e) {
                    replaced = true;
                    continue;
                }
                return Err(err("begin transaction", &e).into());
            }
            match self.apply(conn, &puts, &events) {
                Ok(()) => {}
                Err(abort) => {
                    let outcome = match abort {
                        Abort::Conflict => Err(CommitError::Conflict),
                        Abort::Pg(_, e) if is_retryable(&e) && rolled_back < MAX_ROLLED_BACK => {
                            rolled_back += 1;
                            Ok(())
                        }
                        Abort::Pg(what, e) => Err(CommitError::Storage(err(what, &e))),
                    };
                    // A connection that cannot roll back is in an unknown state: drop it
                    // (the server rolls back whatever a closed session left open).
                    if conn.client.batch_execute("ROLLBACK").is_ok() {
                        checkout.keep();
                    }
                    match outcome {
                        Ok(()) => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            return match conn.client.batch_execute("COMMIT") {
                Ok(()) => {
                    checkout.keep();
                    Ok(())
                }
                // The server said it rolled back: nothing applied, and the batch may run again.
                Err(e) if is_retryable(&e) && rolled_back < MAX_ROLLED_BACK => {
                    rolled_back += 1;
                    continue;
                }
                Err(e) => Err(CommitError::Storage(StorageError(format!(
                    "postgres: COMMIT failed; the batch is not known to be durable (it may or may not \
                     have applied): {}",
                    describe(&e)
                )))),
            };
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
        let limit = i64::from(limit);
        let tbl = table_name(table);
        if let Some(owner) = owner {
            text("owner", owner)?;
        }
        if states.is_empty() {
            return self.rows("scan", Q::ScanAny, &[&tbl, &due_before, &limit, &owner]);
        }
        let names: Vec<&str> = states.iter().map(|s| s.name()).collect();
        self.rows("scan", Q::ScanStates, &[&tbl, &due_before, &limit, &owner, &names])
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        text("scope", scope)?;
        text("key", key)?;
        let raws = self.shared.read("audit", |conn, sql| {
            let statement = conn.statement(sql, Q::Audit)?;
            conn.client.query(&statement, &[&scope, &key])
        })?;
        raws.iter()
            .map(|r| {
                Ok(AuditEvent {
                    scope: col(r, 0)?,
                    key: col(r, 1)?,
                    version: uint("audit version", col(r, 2)?)?,
                    at: uint("audit at", col(r, 3)?)?,
                    kind: col(r, 4)?,
                    from_state: parse_opt_state(col(r, 5)?)?,
                    to_state: parse_opt_state(col(r, 6)?)?,
                    attempt: col::<Option<i64>>(r, 7)?
                        .map(|a| {
                            u32::try_from(a)
                                .map_err(|_| StorageError(format!("postgres: attempt {a} out of range in the ledger")))
                        })
                        .transpose()?,
                    detail: col(r, 8)?,
                })
            })
            .collect()
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        let tbl = table_name(Table::Operation);
        let limit = i64::from(limit);
        match state {
            None => self.rows("list", Q::ListAll, &[&tbl, &limit]),
            Some(state) => self.rows("list", Q::ListState, &[&tbl, &state.name(), &limit]),
        }
    }

    fn stats(&self) -> Result<Stats, StorageError> {
        let (by_state, events) = self.shared.read("stats", |conn, sql| {
            let states = conn.statement(sql, Q::StatsStates)?;
            let kinds = conn.statement(sql, Q::StatsEvents)?;
            // One snapshot for both counts.
            let mut tx = conn
                .client
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let by_state = tx.query(&states, &[&table_name(Table::Operation)])?;
            let events = tx.query(&kinds, &[])?;
            tx.commit()?;
            Ok((by_state, events))
        })?;
        let mut by_state = by_state
            .iter()
            .map(|r| Ok((parse_state(&col::<String>(r, 0)?)?, uint("count", col(r, 1)?)?)))
            .collect::<Result<Vec<_>, StorageError>>()?;
        by_state.sort_by_key(|(s, _)| *s as usize);
        let events = events
            .iter()
            .map(|r| Ok((col::<String>(r, 0)?, uint("count", col(r, 1)?)?)))
            .collect::<Result<_, StorageError>>()?;
        Ok(Stats { by_state, events })
    }
}

struct ClockState {
    /// When the last database reading was taken (the middle of its round trip).
    read_at: Instant,
    /// What it said.
    read_ms: u64,
    /// Half its round trip, rounded up: how far off the reading may be.
    uncertainty_ms: u64,
    /// When to read the database again.
    next_read: Instant,
    /// The latest time handed out.
    last: u64,
}

/// The ledger clock of a [`PostgresStorage`]: the database server's clock,
/// re-read every [`PostgresOptions::clock_resample`], carried forward on this
/// host's monotonic clock in between, and never running backwards.
pub struct DatabaseClock {
    shared: Arc<Shared>,
    state: Mutex<ClockState>,
}

impl std::fmt::Debug for DatabaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseClock")
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

impl DatabaseClock {
    fn new(shared: Arc<Shared>) -> Result<Self, StorageError> {
        let (read_at, read_ms, uncertainty_ms) = Self::read(&shared)?;
        let next_read = read_at + shared.options.clock_resample;
        Ok(DatabaseClock {
            shared,
            state: Mutex::new(ClockState {
                read_at,
                read_ms,
                uncertainty_ms,
                next_read,
                last: read_ms,
            }),
        })
    }

    /// One reading, stamped with the middle of its round trip, and half that
    /// round trip (the most the stamp can be off).
    fn read(shared: &Shared) -> Result<(Instant, u64, u64), StorageError> {
        let sent = Instant::now();
        let ms = shared.database_now()?;
        let answered = Instant::now();
        let half = (answered - sent) / 2;
        let uncertainty_ms = u64::try_from(half.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        Ok((sent + half, ms, uncertainty_ms))
    }

    /// How far the last reading may be off the database's clock: half its
    /// round trip, in ms (rounded up). A loaded host or network stretches it.
    pub fn uncertainty_ms(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).uncertainty_ms
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> Timestamp {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() >= state.next_read {
            // Unreachable database: carry the last reading forward (and do not
            // wait on it again until the next resample); every write fails until
            // it is back, so no decision rests on the estimate alone.
            if let Ok(reading) = Self::read(&self.shared) {
                (state.read_at, state.read_ms, state.uncertainty_ms) = reading;
            }
            state.next_read = Instant::now() + self.shared.options.clock_resample;
        }
        let carried = u64::try_from(state.read_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let estimate = state.read_ms.saturating_add(carried);
        state.last = state.last.max(estimate);
        state.last
    }
}
