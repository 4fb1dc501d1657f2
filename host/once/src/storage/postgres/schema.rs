//! Where the ledger lives on the server: the URL and its `schema` parameter,
//! schema names, and the migrations that create or upgrade a schema.

use super::pool::Shared;
use super::sql::quote_ident;
use super::{col, err};
use crate::storage::{BODY_FORMAT_KEY, Location, StorageError, next_body_format};

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: u32 = 3;

/// The SQLSTATE `apply_batch` raises when a put's version check or an audit insert fails.
pub(super) const CONFLICT_SQLSTATE: &str = "OC409";

/// The schema that holds the ledger unless the URL or the options name another.
pub const DEFAULT_SCHEMA: &str = "once";

/// Migrations by target version (index 0 makes version 1); `{s}` is the quoted schema.
/// Version 3 adds `apply_batch`: a whole batch in one statement, so one round trip
/// (its puts' compare-and-swap, then its audit events; a conflict raises SQLSTATE
/// [`CONFLICT_SQLSTATE`] and so rolls the statement back).
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
    r#"
CREATE OR REPLACE FUNCTION {s}.apply_batch(
  p_kind smallint[], p_tbl text[], p_scope text[], p_key text[], p_expected bigint[],
  p_version bigint[], p_state text[], p_due bigint[], p_body text[], p_owner text[],
  e_scope text[], e_key text[], e_version bigint[], e_at bigint[], e_kind text[],
  e_from text[], e_to text[], e_attempt bigint[], e_detail text[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  n bigint;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
    IF p_kind[i] = 0 THEN
      INSERT INTO {s}.rows (tbl, scope, key, version, state, due_at, body, owner)
        VALUES (p_tbl[i], p_scope[i], p_key[i], p_version[i], p_state[i], p_due[i], p_body[i], p_owner[i])
        ON CONFLICT DO NOTHING;
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSIF p_kind[i] = 1 THEN
      UPDATE {s}.rows SET version = p_version[i], state = p_state[i], due_at = p_due[i], body = p_body[i],
          owner = p_owner[i]
        WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i] AND version = p_expected[i];
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSIF p_kind[i] = 2 THEN
      DELETE FROM {s}.rows
        WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i] AND version = p_expected[i];
      GET DIAGNOSTICS n = ROW_COUNT;
    ELSE
      -- Must not exist, and stays absent: take the key as an insert would, then let go.
      INSERT INTO {s}.rows (tbl, scope, key, version, state, due_at, body)
        VALUES (p_tbl[i], p_scope[i], p_key[i], 0, NULL, NULL, '') ON CONFLICT DO NOTHING;
      GET DIAGNOSTICS n = ROW_COUNT;
      IF n = 1 THEN
        DELETE FROM {s}.rows WHERE tbl = p_tbl[i] AND scope = p_scope[i] AND key = p_key[i];
      END IF;
    END IF;
    IF n <> 1 THEN
      RAISE EXCEPTION USING ERRCODE = 'OC409', MESSAGE = 'once: version conflict';
    END IF;
  END LOOP;
  FOR i IN 1 .. coalesce(array_length(e_scope, 1), 0) LOOP
    INSERT INTO {s}.audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
      VALUES (e_scope[i], e_key[i], e_version[i], e_at[i], e_kind[i], e_from[i], e_to[i], e_attempt[i], e_detail[i])
      ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
      RAISE EXCEPTION USING ERRCODE = 'OC409', MESSAGE = 'once: version conflict';
    END IF;
  END LOOP;
END
$$;
"#,
];

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
