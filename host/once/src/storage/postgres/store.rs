//! [`PostgresStorage`]: a batch as one `READ COMMITTED` transaction of
//! conditional statements, and the reads (see the module docs of [`super`]).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use postgres::error::SqlState;

use super::clock::DatabaseClock;
use super::pool::{Conn, Pool, Shared, lost};
use super::schema::{is_url, migrate, split_schema};
use super::sql::{Q, Sql};
use super::{PostgresOptions, check_schema_name, col, describe, err};
use crate::bindings::types::{AuditEvent, Batch, Put, Row, State, Table, Timestamp};
use crate::storage::codec::{self, EventValues, POSTGRES, PutValues};
use crate::storage::{CommitError, Stats, Storage, StorageError};

/// The server rolled the transaction back on its own; running it again is safe.
fn is_retryable(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
    )
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

/// A [`Storage`] in a PostgreSQL schema, shared by any number of processes and hosts.
pub struct PostgresStorage {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PostgresStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("server", &self.shared.pool.server())
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

/// A prepared put: the checked values of one conditional write.
struct PutPlan<'a> {
    put: &'a Put,
    values: PutValues,
}

/// A prepared audit event.
struct EventPlan<'a> {
    event: &'a AuditEvent,
    values: EventValues,
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
    /// bad URL, an unreachable server and a schema newer than [`SCHEMA_VERSION`](super::SCHEMA_VERSION).
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
            pool: Pool::new(config, setup, options.max_connections, options.connect_timeout),
            sql: Sql::new(&options.schema),
            schema: options.schema.clone(),
            options,
        };
        let store = PostgresStorage {
            shared: Arc::new(shared),
        };
        migrate(&store.shared)?;
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
            let tbl = codec::table_name(put.table);
            let PutValues {
                expected,
                version,
                due_at,
            } = p.values;
            let changed = match (expected, &put.row) {
                (None, Some(row)) => {
                    let state = row.state.map(State::name);
                    let statement = conn.statement(sql, Q::Insert).map_err(|e| Abort::Pg("prepare", e))?;
                    let params: [&(dyn postgres::types::ToSql + Sync); 8] = [
                        &tbl, &put.scope, &put.key, &version, &state, &due_at, &row.body, &row.owner,
                    ];
                    conn.client
                        .execute(&statement, &params)
                        .map_err(|e| Abort::Pg("insert", e))?
                }
                (Some(expected), Some(row)) => {
                    let state = row.state.map(State::name);
                    let statement = conn.statement(sql, Q::Update).map_err(|e| Abort::Pg("prepare", e))?;
                    let params: [&(dyn postgres::types::ToSql + Sync); 9] = [
                        &tbl, &put.scope, &put.key, &expected, &version, &state, &due_at, &row.body, &row.owner,
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
                &ev.scope,
                &ev.key,
                &e.values.version,
                &e.values.at,
                &ev.kind,
                &from,
                &to,
                &e.attempt,
                &ev.detail,
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

/// A row from the columns of `SELECT {ROW_COLUMNS}`.
fn cook_row(r: &postgres::Row) -> Result<Row, StorageError> {
    POSTGRES.row(codec::raw_row!(col, r))
}

/// Check every value of a batch before anything is sent, and order the puts.
fn plan(batch: &Batch) -> Result<(Vec<PutPlan<'_>>, Vec<EventPlan<'_>>), StorageError> {
    let mut puts = batch
        .puts
        .iter()
        .map(|put| {
            text("scope", &put.scope)?;
            text("key", &put.key)?;
            if let Some(row) = &put.row {
                text("body", &row.body)?;
            }
            Ok(PutPlan {
                put,
                values: POSTGRES.put(put)?,
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    // Stable: puts on one row keep their order.
    puts.sort_by(|a, b| {
        let (ta, tb) = (codec::table_index(a.put.table), codec::table_index(b.put.table));
        (ta, &a.put.scope, &a.put.key).cmp(&(tb, &b.put.scope, &b.put.key))
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
                values: POSTGRES.event_values(event)?,
                attempt: event.attempt.map(i64::from),
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    events.sort_by(|a, b| {
        (&a.event.scope, &a.event.key, a.values.version).cmp(&(&b.event.scope, &b.event.key, b.values.version))
    });
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
            conn.client
                .query_opt(&statement, &[&codec::table_name(table), &scope, &key])
        })?;
        raw.as_ref().map(cook_row).transpose()
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        crate::storage::check_batch(batch)?;
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
        let due_before = codec::bound(due_before);
        let limit = i64::from(limit);
        let tbl = codec::table_name(table);
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
                let attempt = col::<Option<i64>>(r, 7)?
                    .map(|a| {
                        u32::try_from(a)
                            .map_err(|_| StorageError(format!("postgres: attempt {a} out of range in the ledger")))
                    })
                    .transpose()?;
                POSTGRES.event(codec::raw_event!(col, r, attempt: attempt))
            })
            .collect()
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        let tbl = codec::table_name(Table::Operation);
        let limit = i64::from(limit);
        match state {
            None => self.rows("list", Q::ListAll, &[&tbl, &limit]),
            Some(state) => self.rows("list", Q::ListState, &[&tbl, &state.name(), &limit]),
        }
    }

    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
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
            let by_state = tx.query(&states, &[&codec::table_name(Table::Operation), &scope])?;
            let events = tx.query(&kinds, &[&scope])?;
            tx.commit()?;
            Ok((by_state, events))
        })?;
        let counts = |rows: Vec<postgres::Row>| -> Result<Vec<(String, i64)>, StorageError> {
            rows.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
        };
        POSTGRES.stats(counts(by_state)?, counts(events)?)
    }
}
