//! The connection pool: at most `max_connections` sessions, idle ones
//! reused with their prepared statements, a connection in an unknown state
//! never reused, and what a store shares with its clocks.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls, Statement};

use super::pacing::Pacing;
use super::sql::{Q, QUERIES, Sql};
use super::{PostgresOptions, col, err};
use crate::storage::StorageError;
use crate::storage::codec::POSTGRES;

/// One open connection and its prepared statements.
pub(super) struct Conn {
    pub(super) client: Client,
    statements: [Option<Statement>; QUERIES],
    /// When the connection last went back to the pool.
    idle_since: Instant,
}

/// A pooled connection idle this long is checked (one empty query) before a
/// batch is sent on it; a busy one is not.
const PROBE_AFTER_IDLE: Duration = Duration::from_millis(10);

impl Conn {
    /// Whether the session ended while the connection sat idle (a server restart, an
    /// administrator's terminate). A batch is one statement that commits as it
    /// runs, so a failure while sending it leaves its outcome unknown: a
    /// connection idle for [`PROBE_AFTER_IDLE`] is checked first with an empty
    /// query, so a dead one is replaced before anything of the batch is sent.
    pub(super) fn ended_while_idle(&mut self) -> bool {
        self.client.is_closed()
            || (self.idle_since.elapsed() >= PROBE_AFTER_IDLE && self.client.batch_execute("").is_err())
    }

    /// The prepared statement `q`, prepared on first use.
    pub(super) fn statement(&mut self, sql: &Sql, q: Q) -> Result<Statement, postgres::Error> {
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
pub(super) struct Pool {
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
pub(super) struct Checkout<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    /// Came from the idle list (it may have died while idle).
    pub(super) pooled: bool,
}

impl Checkout<'_> {
    pub(super) fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a checkout holds its connection until it ends")
    }

    /// Return the connection for reuse.
    pub(super) fn keep(mut self) {
        if let Some(mut conn) = self.conn.take() {
            if conn.client.is_closed() {
                self.pool.forget();
            } else {
                conn.idle_since = Instant::now();
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
    /// A pool of at most `max` connections to `config`, each set up with
    /// `setup`; a caller waits at most `wait` to connect or for a free one.
    pub(super) fn new(config: postgres::Config, setup: String, max: usize, wait: Duration) -> Pool {
        Pool {
            config,
            setup,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
            max,
            wait,
        }
    }

    /// The server's hosts and database, without credentials.
    pub(super) fn server(&self) -> String {
        describe_config(&self.config)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state is two plain fields updated in one statement each: never torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn get(&self) -> Result<Checkout<'_>, StorageError> {
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
    pub(super) fn fresh(&self) -> Result<Checkout<'_>, StorageError> {
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
            idle_since: Instant::now(),
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
pub(super) struct Shared {
    pub(super) pool: Pool,
    pub(super) sql: Sql,
    pub(super) schema: String,
    pub(super) options: PostgresOptions,
    /// How a lost compare-and-swap waits before its caller races again.
    pub(super) pacing: Pacing,
}

impl Shared {
    /// Run a read on a pooled connection; a connection lost on the way is
    /// replaced and the read run again (reads change nothing).
    pub(super) fn read<T>(
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

    pub(super) fn database_now(&self) -> Result<u64, StorageError> {
        let ms: i64 = self.read("read the database clock", |conn, sql| {
            let statement = conn.statement(sql, Q::Now)?;
            conn.client.query_one(&statement, &[])?.try_get(0)
        })?;
        POSTGRES.uint("database clock", ms)
    }
}

/// The connection was lost (or the server is going away): a statement error
/// that leaves the session usable is not this.
pub(super) fn lost(e: &postgres::Error) -> bool {
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
