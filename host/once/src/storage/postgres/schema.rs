//! Where the ledger lives on the server: the URL and its `schema` parameter,
//! schema names, and the migrations that create or upgrade a schema (the
//! files of `schema/postgres`, applied as schema/README.md says).

use super::pool::Shared;
use super::sql::quote_ident;
use super::{col, err};
use crate::storage::ddl;
use crate::storage::{BODY_FORMAT_KEY, Location, StorageError, next_body_format};

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: u32 = 3;

/// The SQLSTATE `apply_batch` (schema/postgres/003-apply-batch.sql) raises when
/// a put's version check or an audit insert fails.
pub(super) const CONFLICT_SQLSTATE: &str = "OC409";

/// The schema that holds the ledger unless the URL or the options name another.
pub const DEFAULT_SCHEMA: &str = "once";

/// True when `location` is a PostgreSQL URL rather than a file path.
pub fn is_url(location: &str) -> bool {
    Location::is_postgres(location)
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
pub(super) fn split_schema(url: &str) -> Result<(String, Option<String>), StorageError> {
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

fn parse_version(s: &str) -> Result<u32, StorageError> {
    s.parse()
        .map_err(|_| StorageError(format!("postgres: unreadable schema version {s:?}")))
}

/// Create the schema and the tables the stored version lacks, under an
/// advisory lock so processes opening one schema at once do not race.
pub(super) fn migrate(shared: &Shared) -> Result<(), StorageError> {
    let schema = &shared.schema;
    let quoted = quote_ident(schema);
    let mut checkout = shared.pool.get()?;
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
        if let Some(bootstrap) = ddl::POSTGRES.bootstrap {
            tx.batch_execute(&ddl::for_schema(bootstrap, &quoted))
                .map_err(|e| err(format_args!("create schema {schema}"), &e))?;
        }
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
        // schema/postgres: the steps above the recorded version (all of them for a new schema).
        for step in ddl::POSTGRES.plan(found) {
            tx.batch_execute(&ddl::for_schema(step.sql, &quoted))
                .map_err(|e| err(format_args!("migrate {schema} to version {}", step.version), &e))?;
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

/// The ledger's recorded body format, settled with an engine that writes
/// `format` ([`next_body_format`]): read, and written if it must change, in
/// one transaction under the schema's migration lock, so hosts opening one
/// schema at once cannot both act on the old value. A schema already at
/// `format` is only read (no lock taken).
pub(super) fn claim_body_format(shared: &Shared, format: u32) -> Result<(), StorageError> {
    let schema = &shared.schema;
    let ledger = format!("schema {schema} on {}", shared.pool.server());
    let quoted = quote_ident(schema);
    let read_sql = format!("SELECT value FROM {quoted}.meta WHERE key = $1");
    let mut checkout = shared.pool.get()?;
    let client = &mut checkout.conn().client;
    let stored = match client
        .query_opt(&read_sql, &[&BODY_FORMAT_KEY])
        .map_err(|e| err("read body format", &e))?
    {
        Some(row) => Some(col::<String>(&row, 0)?),
        None => None,
    };
    if next_body_format(&ledger, stored.as_deref(), format)?.is_none() {
        checkout.keep();
        return Ok(());
    }
    let mut tx = client
        .transaction()
        .map_err(|e| err("begin body format transaction", &e))?;
    tx.execute("SELECT pg_advisory_xact_lock(1869505381, hashtext($1))", &[schema])
        .map_err(|e| err("lock for body format", &e))?;
    // Read again under the lock: another host may have raised it meanwhile.
    let stored = match tx
        .query_opt(&read_sql, &[&BODY_FORMAT_KEY])
        .map_err(|e| err("read body format", &e))?
    {
        Some(row) => Some(col::<String>(&row, 0)?),
        None => None,
    };
    if let Some(next) = next_body_format(&ledger, stored.as_deref(), format)? {
        tx.execute(
            &format!(
                "INSERT INTO {quoted}.meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ),
            &[&BODY_FORMAT_KEY, &next.to_string()],
        )
        .map_err(|e| err("record body format", &e))?;
    }
    tx.commit().map_err(|e| err("commit body format", &e))?;
    checkout.keep();
    Ok(())
}
