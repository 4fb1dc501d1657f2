//! One batch inside the open transaction: each put is one conditional
//! statement whose changed-row count is the compare-and-swap verdict, and
//! each audit event an insert that refuses an existing (scope, key, version).

use rusqlite::{Connection, params};

use super::err;
use crate::bindings::types::{AuditEvent, Put, State};
use crate::storage::StorageError;
use crate::storage::codec::{SQLITE, table_name};

/// Why a batch stopped inside its transaction.
pub(super) enum Abort {
    Conflict,
    Storage(StorageError),
}

impl From<StorageError> for Abort {
    fn from(e: StorageError) -> Self {
        Abort::Storage(e)
    }
}

/// Apply one put inside the open transaction.
pub(super) fn apply_put(conn: &Connection, put: &Put) -> Result<(), Abort> {
    let tbl = table_name(put.table);
    let what = |op: &str| format!("{op} ({tbl}, {:?}, {:?})", put.scope, put.key);
    let values = SQLITE.put(put)?;
    let (version, due_at) = (values.version, values.due_at);
    let changed = match (values.expected, &put.row) {
        (None, Some(row)) => conn
            .prepare_cached(
                "INSERT INTO rows (tbl, scope, key, version, state, due_at, body, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT DO NOTHING",
            )
            .and_then(|mut s| {
                s.execute(params![
                    tbl,
                    put.scope,
                    put.key,
                    version,
                    row.state.map(State::name),
                    due_at,
                    row.body,
                    row.owner,
                ])
            })
            .map_err(|e| err(what("insert"), e))?,
        (Some(expected), Some(row)) => conn
            .prepare_cached(
                "UPDATE rows SET version = ?5, state = ?6, due_at = ?7, body = ?8, owner = ?9
                 WHERE tbl = ?1 AND scope = ?2 AND key = ?3 AND version = ?4",
            )
            .and_then(|mut s| {
                s.execute(params![
                    tbl,
                    put.scope,
                    put.key,
                    expected,
                    version,
                    row.state.map(State::name),
                    due_at,
                    row.body,
                    row.owner,
                ])
            })
            .map_err(|e| err(what("update"), e))?,
        (Some(expected), None) => conn
            .prepare_cached("DELETE FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3 AND version = ?4")
            .and_then(|mut s| s.execute(params![tbl, put.scope, put.key, expected]))
            .map_err(|e| err(what("delete"), e))?,
        // "Must not exist, and stays absent": a pure check.
        (None, None) => {
            let exists: bool = conn
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM rows WHERE tbl = ?1 AND scope = ?2 AND key = ?3)")
                .and_then(|mut s| s.query_row(params![tbl, put.scope, put.key], |r| r.get(0)))
                .map_err(|e| err(what("check absent"), e))?;
            usize::from(!exists)
        }
    };
    if changed == 1 { Ok(()) } else { Err(Abort::Conflict) }
}

/// Append one audit event inside the open transaction; an existing
/// (scope, key, version) is a conflict.
pub(super) fn apply_event(conn: &Connection, event: &AuditEvent) -> Result<(), Abort> {
    let what = format!("insert audit ({:?}, {:?}, {})", event.scope, event.key, event.version);
    let values = SQLITE.event_values(event)?;
    let (version, at) = (values.version, values.at);
    let changed = conn
        .prepare_cached(
            "INSERT INTO audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT DO NOTHING",
        )
        .and_then(|mut s| {
            s.execute(params![
                event.scope,
                event.key,
                version,
                at,
                event.kind,
                event.from_state.map(State::name),
                event.to_state.map(State::name),
                event.attempt,
                event.detail,
            ])
        })
        .map_err(|e| err(&what, e))?;
    if changed == 1 { Ok(()) } else { Err(Abort::Conflict) }
}
