//! What an operator (and a tool that examines the engine) does with a
//! handle: sweeps that send nothing, pruning, a record and its trail,
//! resolutions, listings, and the single transitions of the state machine.
//! Not a host loop: a call is driven by [`Once::call`], which never reads
//! what is here.

use crate::bindings::types::{
    AdoptReport, Awaited, Call, Decision, FinishAck, OperatorQueue, Outcome, PruneReport, QueueFilter, RecordView,
    Resolution, Row, State, SweepResult,
};
use crate::once::{Once, OnceError, storage_error};
use crate::storage::Stats;

impl Once {
    /// An operator's sweep (it sends nothing): expire leases and escalate.
    /// It reads no provider either (a read is a step this host follows with
    /// a sender): due reads are listed (`reads`) and owed dispatches listed,
    /// not granted. [`Once::settle`] makes the reads and sends what they prove owed.
    pub fn sweep(&self, limit: u32) -> Result<SweepResult, OnceError> {
        Ok(self.with_instance(|i| i.sweep(limit, false))??)
    }

    /// Records past retention become tombstones.
    pub fn prune(&self, limit: u32) -> Result<PruneReport, OnceError> {
        Ok(self.with_instance(|i| i.prune(limit))??)
    }

    /// Move up to `limit` records of owner `from` to owner `to`, each audited (`adopted`, with the
    /// note): the records of a gateway or host whose owner name changed or that is gone, so a live
    /// one reads, escalates and dispatches them (`once ledger adopt`). Call again while
    /// [`AdoptReport::more`] says records are left.
    pub fn adopt(&self, from: &str, to: &str, note: &str, limit: u32) -> Result<AdoptReport, OnceError> {
        Ok(self.with_instance(|i| i.adopt(from, to, note, limit))??)
    }

    /// What needs a person (unknown, absent, lease-expired records matching
    /// `filter`), judged by the engine at the ledger clock; at most `limit`
    /// pending records are examined. Read-only.
    pub fn queue(&self, filter: &QueueFilter, limit: u32) -> Result<OperatorQueue, OnceError> {
        Ok(self.with_instance(|i| i.queue(filter, limit))??)
    }

    /// A record and its audit trail. Read-only.
    pub fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordView>, OnceError> {
        Ok(self.with_instance(|i| i.inspect(scope, key))??)
    }

    /// An operator's resolution of an unknown or absent record, audited with `note`.
    pub fn resolve(
        &self,
        scope: &str,
        key: &str,
        resolution: &Resolution,
        note: &str,
        force: bool,
    ) -> Result<State, OnceError> {
        Ok(self.with_instance(|i| i.resolve(scope, key, resolution, note, force))??)
    }

    /// Operation records, optionally only those in `state`, ordered by scope
    /// and key, at most `limit` (what `once ledger list` prints). Read-only.
    pub fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<ListedRecord>, OnceError> {
        let rows = self.host.storage.list(state, limit).map_err(storage_error)?;
        Ok(rows.into_iter().map(ListedRecord::from).collect())
    }

    /// Operation records per state and audit events per kind (what `once ledger stats` prints);
    /// with `scope`, that scope's only. Read-only.
    pub fn stats(&self, scope: Option<&str>) -> Result<Stats, OnceError> {
        self.host.storage.stats(scope).map_err(storage_error)
    }

    /// The record state machine's single transitions, for tests and tools
    /// that examine the engine step by step. A host drives [`Once::call`].
    pub fn transitions(&self) -> Transitions<'_> {
        Transitions(self)
    }
}

/// Single transitions (`begin`, `finish`, `reconcile`, `await-holder`): see [`Once::transitions`].
pub struct Transitions<'a>(&'a Once);

impl Transitions<'_> {
    /// Claim a call before dispatch.
    pub fn begin(&self, call: &Call) -> Result<Decision, OnceError> {
        Ok(self.0.with_instance(|i| i.begin(call))??)
    }

    /// Record what the provider answered to an attempt.
    pub fn finish(&self, scope: &str, key: &str, fence: &str, outcome: &Outcome) -> Result<FinishAck, OnceError> {
        Ok(self.0.with_instance(|i| i.finish(scope, key, fence, outcome))??)
    }

    /// Resolve an unknown (or lease-expired) record against the provider.
    pub fn reconcile(&self, scope: &str, key: &str) -> Result<Decision, OnceError> {
        Ok(self.0.with_instance(|i| i.reconcile(scope, key))??)
    }

    /// For a caller answered in-flight: the holder's outcome once there is one.
    pub fn await_holder(&self, scope: &str, key: &str) -> Result<Awaited, OnceError> {
        Ok(self.0.with_instance(|i| i.await_holder(scope, key))??)
    }
}

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
