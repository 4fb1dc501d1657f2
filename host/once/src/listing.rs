//! What an operator reads from the ledger without the engine: records as
//! listed ([`crate::Once::list`]). Operator output, not a host loop: nothing
//! here decides what to do with a record.

use crate::bindings::types::{Row, State};

/// One operation record as an operator lists it ([`Once::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRecord {
    /// Scope.
    pub scope: String,
    /// Operation key.
    pub key: String,
    /// The record's state (the engine always sets one on an operation record).
    pub state: Option<State>,
    /// The record's version, its compare-and-swap counter.
    pub version: u64,
    /// Whose background work may touch it (see [`crate::Builder::owner`]).
    pub owner: Option<String>,
    /// When it next needs attention (lease end, reconciliation, retention), in the ledger's clock.
    pub due_at: Option<u64>,
}

impl From<Row> for ListedRecord {
    fn from(row: Row) -> ListedRecord {
        ListedRecord {
            scope: row.scope,
            key: row.key,
            state: row.state,
            version: row.version,
            owner: row.owner,
            due_at: row.due_at,
        }
    }
}
