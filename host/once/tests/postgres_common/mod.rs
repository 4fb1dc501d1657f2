//! Shared by the PostgreSQL tests: the server named by `ONCE_TEST_DATABASE_URL`
//! and a schema of its own for every test, dropped afterwards. The `once`
//! binary's tests (`host/cli/tests/`, `host/gateway/tests/`) include this file by path.
#![allow(dead_code)]

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use once::storage::postgres::{PostgresOptions, PostgresStorage};

/// The variable that names the test server, e.g. `postgres://postgres@127.0.0.1:5432/test`.
pub const URL_VAR: &str = "ONCE_TEST_DATABASE_URL";

/// Whether this is a CI run (`CI` set, as `.ci/run` does), where a skip is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// The test server's URL, or `None` after saying so where the test runner
/// does not swallow it (libtest captures `eprintln!`, not direct writes).
/// Under CI a missing URL fails the test instead: CI must not skip these.
pub fn database_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if in_ci() => panic!("CI is set but {URL_VAR} is not: the PostgreSQL tests would be skipped"),
        _ => {
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = writeln!(std::io::stderr(), "skipped: no database ({URL_VAR} is unset): {test}");
            None
        }
    }
}

/// A name no other test run or test uses.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() % 1_000_000_000_000;
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// A plain client on the test server (for setup, blockers and checks).
pub fn client(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect to the test database")
}

/// A schema of one test; dropped (with everything in it) when this is dropped.
pub struct TestSchema {
    /// The server's URL, without a schema.
    pub url: String,
    /// The schema's name.
    pub name: String,
}

impl TestSchema {
    /// A fresh schema name on the test server, or `None` (and a visible line) without one.
    /// The schema itself is created by whoever opens it first.
    pub fn new() -> Option<TestSchema> {
        let url = database_url()?;
        Some(TestSchema {
            url,
            name: unique_name("once_test"),
        })
    }

    /// The URL that selects this schema (`?schema=…`).
    pub fn location(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}schema={}", self.url, self.name)
    }

    /// Options for a store in this schema.
    pub fn options(&self) -> PostgresOptions {
        PostgresOptions {
            schema: self.name.clone(),
            ..PostgresOptions::default()
        }
    }

    /// Open a store in this schema (migrating it on first use).
    pub fn open(&self) -> PostgresStorage {
        PostgresStorage::open_with(&self.url, self.options()).expect("open the test schema")
    }

    /// A plain client whose `search_path` is this schema.
    pub fn client(&self) -> postgres::Client {
        let mut c = client(&self.url);
        c.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {0}; SET search_path TO {0}",
            self.name
        ))
        .unwrap();
        c
    }
}

impl Drop for TestSchema {
    /// Drops the schema from a thread of its own: the blocking client cannot run on an async
    /// runtime's thread, and a test that panics drops its schema wherever it stands.
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
            }
        })
        .join();
    }
}

/// Terminate the server sessions whose `application_name` is `app`; only those
/// waiting on a lock when `waiting_on_lock`. Returns how many were terminated.
pub fn terminate(admin: &mut postgres::Client, app: &str, waiting_on_lock: bool) -> usize {
    let rows = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1 AND pid <> pg_backend_pid()
               AND (NOT $2 OR wait_event_type = 'Lock')",
            &[&app, &waiting_on_lock],
        )
        .unwrap();
    rows.iter().filter(|r| r.get::<_, bool>(0)).count()
}

/// Wait (bounded) until a session of `app` waits on a lock, then terminate it.
pub fn terminate_when_waiting(url: &str, app: &str, within: Duration) -> usize {
    let mut admin = client(url);
    let give_up = Instant::now() + within;
    loop {
        let n = terminate(&mut admin, app, true);
        if n > 0 || Instant::now() >= give_up {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
