//! [`PostgresStorage`]: a batch as one `READ COMMITTED` transaction of
//! conditional statements, and the reads (see the module docs of [`super`]).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use postgres::error::SqlState;

use super::clock::DatabaseClock;
use super::pacing::{Pacing, PacingCounts};
use super::pool::{Conn, Pool, Shared, lost};
use super::schema::{CONFLICT_SQLSTATE, claim_body_format, is_url, migrate, split_schema};
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
            pacing: Pacing::default(),
        };
        let store = PostgresStorage {
            shared: Arc::new(shared),
        };
        migrate(&store.shared)?;
        Ok(store)
    }

    /// What pacing did since this store opened: how many lost quota-bucket
    /// updates waited a moment before their callers raced again, and how
    /// long (module `pacing`; other conflicts answer at once).
    pub fn pacing(&self) -> PacingCounts {
        self.shared.pacing.counts()
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

    /// Apply the batch in one statement (`apply_batch`, autocommit: one round trip,
    /// durable when it answers).
    fn apply(&self, conn: &mut Conn, args: &BatchArgs<'_>) -> Result<u64, postgres::Error> {
        let statement = conn.statement(&self.shared.sql, Q::Apply)?;
        let params: [&(dyn postgres::types::ToSql + Sync); 19] = [
            &args.kind,
            &args.tbl,
            &args.scope,
            &args.key,
            &args.expected,
            &args.version,
            &args.state,
            &args.due_at,
            &args.body,
            &args.owner,
            &args.e_scope,
            &args.e_key,
            &args.e_version,
            &args.e_at,
            &args.e_kind,
            &args.e_from,
            &args.e_to,
            &args.e_attempt,
            &args.e_detail,
        ];
        conn.client.execute(&statement, &params)
    }
}

/// A batch as the columns `apply_batch` takes: one array per field, puts and
/// events in their lock order.
struct BatchArgs<'a> {
    /// 0 insert, 1 update, 2 delete, 3 check absent.
    kind: Vec<i16>,
    tbl: Vec<&'static str>,
    scope: Vec<&'a str>,
    key: Vec<&'a str>,
    expected: Vec<Option<i64>>,
    version: Vec<i64>,
    state: Vec<Option<&'static str>>,
    due_at: Vec<Option<i64>>,
    body: Vec<Option<&'a str>>,
    owner: Vec<Option<&'a str>>,
    e_scope: Vec<&'a str>,
    e_key: Vec<&'a str>,
    e_version: Vec<i64>,
    e_at: Vec<i64>,
    e_kind: Vec<&'a str>,
    e_from: Vec<Option<&'static str>>,
    e_to: Vec<Option<&'static str>>,
    e_attempt: Vec<Option<i64>>,
    e_detail: Vec<&'a str>,
}

impl<'a> BatchArgs<'a> {
    fn new(puts: &[PutPlan<'a>], events: &[EventPlan<'a>]) -> Self {
        let put_kind = |p: &PutPlan<'_>| match (p.values.expected, &p.put.row) {
            (None, Some(_)) => 0,
            (Some(_), Some(_)) => 1,
            (Some(_), None) => 2,
            (None, None) => 3,
        };
        BatchArgs {
            kind: puts.iter().map(put_kind).collect(),
            tbl: puts.iter().map(|p| codec::table_name(p.put.table)).collect(),
            scope: puts.iter().map(|p| p.put.scope.as_str()).collect(),
            key: puts.iter().map(|p| p.put.key.as_str()).collect(),
            expected: puts.iter().map(|p| p.values.expected).collect(),
            version: puts.iter().map(|p| p.values.version).collect(),
            state: puts
                .iter()
                .map(|p| p.put.row.as_ref().and_then(|r| r.state).map(State::name))
                .collect(),
            due_at: puts.iter().map(|p| p.values.due_at).collect(),
            body: puts
                .iter()
                .map(|p| p.put.row.as_ref().map(|r| r.body.as_str()))
                .collect(),
            owner: puts
                .iter()
                .map(|p| p.put.row.as_ref().and_then(|r| r.owner.as_deref()))
                .collect(),
            e_scope: events.iter().map(|e| e.event.scope.as_str()).collect(),
            e_key: events.iter().map(|e| e.event.key.as_str()).collect(),
            e_version: events.iter().map(|e| e.values.version).collect(),
            e_at: events.iter().map(|e| e.values.at).collect(),
            e_kind: events.iter().map(|e| e.event.kind.as_str()).collect(),
            e_from: events.iter().map(|e| e.event.from_state.map(State::name)).collect(),
            e_to: events.iter().map(|e| e.event.to_state.map(State::name)).collect(),
            e_attempt: events.iter().map(|e| e.attempt).collect(),
            e_detail: events.iter().map(|e| e.event.detail.as_str()).collect(),
        }
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
        let args = BatchArgs::new(&puts, &events);
        let pool = &self.shared.pool;
        let mut committing = self.shared.pacing.begin();
        let mut rolled_back = 0;
        let mut replaced = false;
        loop {
            let mut checkout = if replaced { pool.fresh()? } else { pool.get()? };
            // Nothing of the batch is sent yet: a pooled connection that died while idle
            // is replaced once (the single statement leaves no later point to find out safely).
            if checkout.pooled && !replaced && checkout.conn().ended_while_idle() {
                replaced = true;
                continue;
            }
            if let Err(e) = checkout.conn().statement(&self.shared.sql, Q::Apply) {
                if checkout.pooled && !replaced && lost(&e) {
                    replaced = true;
                    continue;
                }
                return Err(err("prepare the batch", &e).into());
            }
            committing.sending();
            let applied = self.apply(checkout.conn(), &args);
            committing.answered();
            return match applied {
                Ok(_) => {
                    checkout.keep();
                    Ok(())
                }
                // Raised by `apply_batch`: the statement, so the whole batch, rolled back.
                Err(e) if e.code().is_some_and(|c| c.code() == CONFLICT_SQLSTATE) => {
                    // The connection goes back before any wait: others commit meanwhile.
                    checkout.keep();
                    committing.lost(batch);
                    Err(CommitError::Conflict)
                }
                // The server said it rolled back: nothing applied, and the batch may run again.
                Err(e) if is_retryable(&e) && rolled_back < MAX_ROLLED_BACK => {
                    rolled_back += 1;
                    checkout.keep();
                    continue;
                }
                // Any other answer of the server's: the statement failed, so nothing applied.
                Err(e) if e.as_db_error().is_some() && !lost(&e) => {
                    checkout.keep();
                    Err(CommitError::Storage(err("apply the batch", &e)))
                }
                // No answer: the statement may have committed.
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

    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        let key = crate::storage::binding_key(name);
        text("binding", &key)?;
        text("holder", holder)?;
        // Twice at most: an empty answer means another host's binding committed during the first.
        for _ in 0..2 {
            let bound = self.shared.read("bind", |conn, sql| {
                let statement = conn.statement(sql, Q::Bind)?;
                conn.client.query(&statement, &[&key, &holder])
            })?;
            if let Some(row) = bound.first() {
                return col(row, 0);
            }
        }
        Err(StorageError(format!(
            "postgres: bind {key}: no binding after two tries"
        )))
    }

    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        text("holder", from)?;
        text("holder", to)?;
        let prefix = crate::storage::BINDING_PREFIX;
        // One statement, so a retry after a lost connection moves nothing twice: it is idempotent.
        let rows = self.shared.read("rebind", |conn, sql| {
            let statement = conn.statement(sql, Q::Rebind)?;
            conn.client.query(&statement, &[&from, &to, &prefix])
        })?;
        let mut names = rows
            .iter()
            .map(|r| col::<String>(r, 0).map(|k| k[prefix.len()..].to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        names.sort();
        Ok(names)
    }

    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        claim_body_format(&self.shared, format)
    }
}
