//! `once demo --db postgres://…`: one schema for the whole run, so every
//! trial's agents (threads and processes) share one PostgreSQL ledger, each
//! trial in a scope of its own, as many agents on many hosts would.

use once::storage::postgres::{PostgresOptions, PostgresStorage, is_url};

/// A schema made for one demo run and dropped at its end.
pub struct RunSchema {
    /// The server URL as given (no schema).
    url: String,
    /// The schema's name.
    schema: String,
    /// The URL that selects the schema, handed to every agent.
    location: String,
}

impl RunSchema {
    /// Refuse a `--db` the demo cannot use (bad input, before anything starts).
    pub fn check(url: &str) -> Result<(), String> {
        if !is_url(url) {
            return Err(format!(
                "--db takes a postgres:// URL (without it every trial gets a fresh SQLite file), not {url:?}"
            ));
        }
        if url.contains("schema=") {
            return Err("--db: the demo makes a schema of its own for each run; leave `schema=` out".to_string());
        }
        Ok(())
    }

    /// Make (and migrate) a fresh schema on the server at `url`.
    pub fn create(url: &str) -> Result<RunSchema, String> {
        Self::check(url)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let schema = format!("once_demo_{}_{}", std::process::id(), nanos % 1_000_000_000_000);
        let options = PostgresOptions {
            schema: schema.clone(),
            ..PostgresOptions::default()
        };
        PostgresStorage::open_with(url, options).map_err(|e| e.to_string())?;
        let sep = if url.contains('?') { '&' } else { '?' };
        Ok(RunSchema {
            url: url.to_string(),
            location: format!("{url}{sep}schema={schema}"),
            schema,
        })
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The ledger location of every trial of this run.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Drop the schema and everything in it, saying so if that failed.
    pub fn drop_schema(mut self) -> Result<(), String> {
        self.drop_now()
    }

    fn drop_now(&mut self) -> Result<(), String> {
        if self.schema.is_empty() {
            return Ok(());
        }
        let schema = std::mem::take(&mut self.schema);
        let mut client = postgres::Client::connect(&self.url, postgres::NoTls)
            .map_err(|e| format!("dropping the demo schema {schema}: {e}"))?;
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .map_err(|e| format!("dropping the demo schema {schema}: {e}"))
    }
}

impl Drop for RunSchema {
    /// A run that ended early (an error, a panicking trial) leaves nothing behind either.
    fn drop(&mut self) {
        let _ = self.drop_now();
    }
}
