//! A store that shows a test every commit: it forwards everything to the
//! store it wraps and hands each commit's batch, flush and result to `seen`.

use once::storage::{CommitError, Flush, Stats, Storage, StorageError};
use once::types::{AuditEvent, Batch, Row, State, Table, Timestamp};

/// `store`, with every commit shown to `seen` once it returned.
pub struct Observed<S, F> {
    /// The store every call goes to.
    pub store: S,
    /// Called with each commit's batch, the flush it was asked for, and its result.
    pub seen: F,
}

impl<S, F> Storage for Observed<S, F>
where
    S: Storage,
    F: Fn(&Batch, Flush, &Result<(), CommitError>) + Send + Sync,
{
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        self.store.get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        self.commit_with(batch, Flush::Now)
    }
    fn commit_with(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        let result = self.store.commit_with(batch, flush);
        (self.seen)(batch, flush, &result);
        result
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError> {
        self.store.scan(table, states, due_before, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        self.store.audit(scope, key)
    }
    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        self.store.list(state, limit)
    }
    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
        self.store.stats(scope)
    }
    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        self.store.bind(name, holder)
    }
    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        self.store.rebind(from, to)
    }
    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        self.store.claim_body_format(format)
    }
}
