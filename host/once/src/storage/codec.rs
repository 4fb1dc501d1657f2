//! The row codec of the stores: how tables, states and the engine's rows and
//! audit events are written as columns and read back.
//!
//! The SQL stores keep the same columns (`tbl, scope, key, version, state,
//! due_at, body, owner`, and the audit trail's) as text and signed 64-bit
//! integers. Writing refuses an integer above `i64::MAX`; reading refuses
//! anything the engine cannot have written (an unknown table or state, a
//! negative integer), with a storage error naming the backend.

use super::{Stats, StorageError};
use crate::bindings::types::{AuditEvent, Put, Row, State, Table};

/// The row columns, in the order [`raw_row!`] reads them.
pub(crate) const ROW_COLUMNS: &str = "tbl, scope, key, version, state, due_at, body, owner";

/// The audit columns, in the order [`raw_event!`] reads them.
pub(crate) const EVENT_COLUMNS: &str = "scope, key, version, at, kind, from_state, to_state, attempt, detail";

/// A [`RawRow`] from a result row of `SELECT {ROW_COLUMNS}`: `$get(row, i)` is
/// the backend's generic getter of column `i`, whose error `?` returns.
macro_rules! raw_row {
    ($get:path, $row:expr) => {
        $crate::storage::codec::RawRow {
            tbl: $get($row, 0)?,
            scope: $get($row, 1)?,
            key: $get($row, 2)?,
            version: $get($row, 3)?,
            state: $get($row, 4)?,
            due_at: $get($row, 5)?,
            body: $get($row, 6)?,
            owner: $get($row, 7)?,
        }
    };
}
pub(crate) use raw_row;

/// A [`RawEvent`] from a result row of `SELECT {EVENT_COLUMNS}`, as
/// [`raw_row!`]; the attempt (column 7) is the backend's to read.
macro_rules! raw_event {
    ($get:path, $row:expr, attempt: $attempt:expr) => {
        $crate::storage::codec::RawEvent {
            scope: $get($row, 0)?,
            key: $get($row, 1)?,
            version: $get($row, 2)?,
            at: $get($row, 3)?,
            kind: $get($row, 4)?,
            from_state: $get($row, 5)?,
            to_state: $get($row, 6)?,
            attempt: $attempt,
            detail: $get($row, 8)?,
        }
    };
}
pub(crate) use raw_event;

/// The stored name of a table.
pub(crate) fn table_name(table: Table) -> &'static str {
    match table {
        Table::Operation => "operation",
        Table::Tombstone => "tombstone",
        Table::Quota => "quota",
    }
}

/// A table's rank in the order rows are kept (and locked): operation, tombstone, quota.
pub(crate) fn table_index(table: Table) -> u8 {
    match table {
        Table::Operation => 0,
        Table::Tombstone => 1,
        Table::Quota => 2,
    }
}

/// A timestamp bound (`due_at <= bound`) as a signed integer. Stored values
/// never exceed `i64::MAX`, so clamping the bound is exact.
pub(crate) fn bound(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

/// A row as read from its columns ([`raw_row!`]), before its names and integers are checked.
pub(crate) struct RawRow {
    pub tbl: String,
    pub scope: String,
    pub key: String,
    pub version: i64,
    pub state: Option<String>,
    pub due_at: Option<i64>,
    pub body: String,
    pub owner: Option<String>,
}

/// An audit event as read from its columns ([`raw_event!`]).
pub(crate) struct RawEvent {
    pub scope: String,
    pub key: String,
    pub version: i64,
    pub at: i64,
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    pub attempt: Option<u32>,
    pub detail: String,
}

/// The integer columns of one put, checked.
pub(crate) struct PutValues {
    /// The version the put expects (none: the row must not exist).
    pub expected: Option<i64>,
    /// The new row's version (0 when the put writes no row).
    pub version: i64,
    /// The new row's due time.
    pub due_at: Option<i64>,
}

/// The integer columns of one audit event, checked.
pub(crate) struct EventValues {
    pub version: i64,
    pub at: i64,
}

/// One backend's codec: the same encoding, in that backend's words.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Codec {
    /// What every message starts with (`sqlite`, `postgres`).
    backend: &'static str,
    /// Where a stored value was found (`in file`, `in the ledger`).
    place: &'static str,
}

/// SQLite's codec.
pub(crate) const SQLITE: Codec = Codec {
    backend: "sqlite",
    place: "in file",
};

/// PostgreSQL's codec.
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Codec = Codec {
    backend: "postgres",
    place: "in the ledger",
};

impl Codec {
    /// A storage error in this backend's words.
    pub(crate) fn error(&self, message: impl std::fmt::Display) -> StorageError {
        StorageError(format!("{}: {message}", self.backend))
    }

    /// A table from its stored name.
    pub(crate) fn table(&self, name: &str) -> Result<Table, StorageError> {
        Ok(match name {
            "operation" => Table::Operation,
            "tombstone" => Table::Tombstone,
            "quota" => Table::Quota,
            other => return Err(self.error(format_args!("unknown table {other:?} {}", self.place))),
        })
    }

    /// A state from its stored (WIT) name.
    pub(crate) fn state(&self, name: &str) -> Result<State, StorageError> {
        State::parse(name).ok_or_else(|| self.error(format_args!("unknown state {name:?} {}", self.place)))
    }

    /// An optional state from its stored name.
    pub(crate) fn opt_state(&self, name: Option<String>) -> Result<Option<State>, StorageError> {
        name.as_deref().map(|s| self.state(s)).transpose()
    }

    /// A u64 as a signed 64-bit column, refusing values it cannot hold.
    pub(crate) fn int(&self, what: &str, v: u64) -> Result<i64, StorageError> {
        i64::try_from(v).map_err(|_| self.error(format_args!("{what} {v} exceeds i64::MAX")))
    }

    /// A signed 64-bit column as the u64 it was written from.
    pub(crate) fn uint(&self, what: &str, v: i64) -> Result<u64, StorageError> {
        u64::try_from(v).map_err(|_| self.error(format_args!("negative {what} {v} {}", self.place)))
    }

    /// The integer columns of a put.
    pub(crate) fn put(&self, put: &Put) -> Result<PutValues, StorageError> {
        let expected = put.expected.map(|v| self.int("expected version", v)).transpose()?;
        let (version, due_at) = match &put.row {
            Some(row) => (
                self.int("version", row.version)?,
                row.due_at.map(|d| self.int("due_at", d)).transpose()?,
            ),
            None => (0, None),
        };
        Ok(PutValues {
            expected,
            version,
            due_at,
        })
    }

    /// The integer columns of an audit event.
    pub(crate) fn event_values(&self, event: &AuditEvent) -> Result<EventValues, StorageError> {
        Ok(EventValues {
            version: self.int("audit version", event.version)?,
            at: self.int("audit at", event.at)?,
        })
    }

    /// A row from its columns.
    pub(crate) fn row(&self, raw: RawRow) -> Result<Row, StorageError> {
        Ok(Row {
            table: self.table(&raw.tbl)?,
            scope: raw.scope,
            key: raw.key,
            version: self.uint("version", raw.version)?,
            state: self.opt_state(raw.state)?,
            due_at: raw.due_at.map(|d| self.uint("due_at", d)).transpose()?,
            owner: raw.owner,
            body: raw.body,
        })
    }

    /// An audit event from its columns.
    pub(crate) fn event(&self, raw: RawEvent) -> Result<AuditEvent, StorageError> {
        Ok(AuditEvent {
            scope: raw.scope,
            key: raw.key,
            version: self.uint("audit version", raw.version)?,
            at: self.uint("audit at", raw.at)?,
            kind: raw.kind,
            from_state: self.opt_state(raw.from_state)?,
            to_state: self.opt_state(raw.to_state)?,
            attempt: raw.attempt,
            detail: raw.detail,
        })
    }

    /// [`Stats`] from the counts per stored state and per audit kind.
    pub(crate) fn stats(
        &self,
        by_state: Vec<(String, i64)>,
        events: Vec<(String, i64)>,
    ) -> Result<Stats, StorageError> {
        let mut by_state = by_state
            .into_iter()
            .map(|(s, n)| Ok((self.state(&s)?, self.uint("count", n)?)))
            .collect::<Result<Vec<_>, StorageError>>()?;
        by_state.sort_by_key(|(s, _)| *s as usize);
        let events = events
            .into_iter()
            .map(|(k, n)| Ok((k, self.uint("count", n)?)))
            .collect::<Result<_, StorageError>>()?;
        Ok(Stats { by_state, events })
    }
}
