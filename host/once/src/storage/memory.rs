//! In-process storage: ordered maps behind one mutex.
//!
//! Same semantics as the SQLite backend (compare-and-swap puts, append-only
//! audit events, one all-or-nothing batch), without durability or sharing
//! between processes. For tests, embedding and ephemeral runs.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use super::codec::table_index;
use super::{CommitError, Stats, Storage, StorageError, next_body_format};
use crate::bindings::types::{AuditEvent, Batch, Row, State, Table, Timestamp};

/// Row key: (table index, scope, key).
type RowKey = (u8, String, String);
/// Audit key: (scope, key, version).
type AuditKey = (String, String, u64);

#[derive(Default)]
struct Inner {
    rows: BTreeMap<RowKey, Row>,
    audit: BTreeMap<AuditKey, AuditEvent>,
    /// [`Storage::bind`]'s bindings, by name.
    bindings: BTreeMap<String, String>,
    /// The body format recorded by the first engine built over the store:
    /// one store may be shared by engines of several builds (a test, an
    /// embedding that swaps runtimes), which must agree as on a file.
    body_format: Option<String>,
    /// The witness: (granted at, body) by (scope, key). Nothing restores a
    /// memory store from a backup, so kept here it is exact.
    witness: BTreeMap<(String, String), (Timestamp, String)>,
}

/// A [`Storage`] held in memory by this process; lost when dropped.
#[derive(Default)]
pub struct MemoryStorage {
    inner: Mutex<Inner>,
}

impl MemoryStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A commit validates everything before it mutates, so a panic while
        // the lock was held cannot have left a half-applied batch behind.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn row_key(table: Table, scope: &str, key: &str) -> RowKey {
    (table_index(table), scope.to_owned(), key.to_owned())
}

fn take(limit: u32) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}

impl Storage for MemoryStorage {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        Ok(self.lock().rows.get(&row_key(table, scope, key)).cloned())
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        super::check_batch(batch)?;
        let mut inner = self.lock();

        // Stage every write over the current maps; apply only when all checks pass.
        let mut staged: BTreeMap<RowKey, Option<Row>> = BTreeMap::new();
        for put in &batch.puts {
            let k = row_key(put.table, &put.scope, &put.key);
            let current_version = match staged.get(&k) {
                Some(staged_row) => staged_row.as_ref().map(|r| r.version),
                None => inner.rows.get(&k).map(|r| r.version),
            };
            if current_version != put.expected {
                return Err(CommitError::Conflict);
            }
            staged.insert(k, put.row.clone());
        }
        let mut events: BTreeMap<AuditKey, &AuditEvent> = BTreeMap::new();
        for event in &batch.events {
            let k = (event.scope.clone(), event.key.clone(), event.version);
            if inner.audit.contains_key(&k) || events.insert(k, event).is_some() {
                return Err(CommitError::Conflict);
            }
        }

        for (k, row) in staged {
            match row {
                Some(row) => inner.rows.insert(k, row),
                None => inner.rows.remove(&k),
            };
        }
        for (k, event) in events {
            inner.audit.insert(k, event.clone());
        }
        Ok(())
    }

    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: Timestamp,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Row>, StorageError> {
        let inner = self.lock();
        let t = table_index(table);
        let mut rows: Vec<&Row> = inner
            .rows
            .iter()
            .filter(|((tbl, _, _), row)| {
                *tbl == t
                    && row.due_at.is_some_and(|due| due <= due_before)
                    && (states.is_empty() || row.state.is_some_and(|s| states.contains(&s)))
                    && owner.is_none_or(|o| row.owner.as_deref() == Some(o))
            })
            .map(|(_, row)| row)
            .collect();
        // The map is already ordered by (scope, key); a stable sort on due_at keeps that.
        rows.sort_by_key(|row| row.due_at);
        Ok(rows.into_iter().take(take(limit)).cloned().collect())
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        let inner = self.lock();
        let from = (scope.to_owned(), key.to_owned(), 0);
        let to = (scope.to_owned(), key.to_owned(), u64::MAX);
        Ok(inner.audit.range(from..=to).map(|(_, e)| e.clone()).collect())
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        let inner = self.lock();
        let t = table_index(Table::Operation);
        Ok(inner
            .rows
            .iter()
            .filter(|((tbl, _, _), row)| *tbl == t && (state.is_none() || row.state == state))
            .take(take(limit))
            .map(|(_, row)| row.clone())
            .collect())
    }

    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
        let inner = self.lock();
        let t = table_index(Table::Operation);
        let mut counts = [0u64; State::ALL.len()];
        let in_scope = |s: &str| scope.is_none_or(|want| want == s);
        for ((tbl, row_scope, _), row) in &inner.rows {
            if let (true, Some(state)) = (*tbl == t && in_scope(row_scope), row.state) {
                counts[state as usize] += 1;
            }
        }
        let by_state = State::ALL
            .iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .map(|(s, n)| (*s, n))
            .collect();
        let mut events: BTreeMap<&str, u64> = BTreeMap::new();
        for event in inner.audit.values().filter(|e| in_scope(&e.scope)) {
            *events.entry(event.kind.as_str()).or_default() += 1;
        }
        Ok(Stats {
            by_state,
            events: events.into_iter().map(|(k, n)| (k.to_owned(), n)).collect(),
        })
    }

    fn bind(&self, name: &str, holder: &str) -> Result<String, StorageError> {
        let mut inner = self.lock();
        Ok(inner
            .bindings
            .entry(name.to_owned())
            .or_insert_with(|| holder.to_owned())
            .clone())
    }

    fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, StorageError> {
        let mut inner = self.lock();
        let mut moved = Vec::new();
        for (name, holder) in inner.bindings.iter_mut().filter(|(_, h)| h.as_str() == from) {
            *holder = to.to_owned();
            moved.push(name.clone());
        }
        Ok(moved)
    }

    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        let mut inner = self.lock();
        if let Some(next) = next_body_format("(in memory)", inner.body_format.as_deref(), format)? {
            inner.body_format = Some(next.to_string());
        }
        Ok(())
    }

    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, StorageError> {
        let id = (scope.to_string(), key.to_string());
        Ok(self.lock().witness.get(&id).map(|(_, body)| body.clone()))
    }

    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: Timestamp) -> Result<(), StorageError> {
        let mut inner = self.lock();
        let id = (scope.to_string(), key.to_string());
        if inner.witness.get(&id).is_none_or(|(kept_at, _)| *kept_at <= at) {
            inner.witness.insert(id, (at, body.to_string()));
        }
        Ok(())
    }

    fn forget_witnessed(&self, scope: &str, key: &str, before: Timestamp) -> Result<(), StorageError> {
        let mut inner = self.lock();
        let id = (scope.to_string(), key.to_string());
        if inner.witness.get(&id).is_some_and(|(at, _)| *at < before) {
            inner.witness.remove(&id);
        }
        Ok(())
    }
}
