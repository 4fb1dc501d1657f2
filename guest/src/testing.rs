//! An in-memory [`Host`] for native tests of the rules: a versioned row
//! store with the ledger's exact semantics, a settable clock, scripted
//! provider evidence and a recording escalation sink.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};

use crate::host::CommitError;
use crate::host::Host;
use crate::types::{AuditEvent, Batch, Escalation, Evidence, Row, Settings, State, Stored, Table};

type RowKey = (u8, String, String);

/// An in-memory host for tests.
pub struct MemoryHost {
    ledger: RefCell<Ledger>,
    now: Cell<u64>,
    /// Settings handed to the engine.
    pub settings: RefCell<Settings>,
    evidence: RefCell<VecDeque<Evidence>>,
    lookups: RefCell<Vec<(String, String, String)>>,
    escalations: RefCell<Vec<Escalation>>,
    ack_escalations: Cell<bool>,
    fail_commits: Cell<u32>,
    fail_reads: Cell<bool>,
    lookup_configured: Cell<bool>,
    account: RefCell<Option<String>>,
    records: crate::store::RecordCache,
    entropy: RefCell<Vec<u8>>,
    secret: crate::secret::SecretCache,
    reads: Option<crate::reads::Reads>,
    witness: RefCell<Witness>,
    fail_witness: Cell<bool>,
}

/// The bytes a [`MemoryHost`]'s `entropy` gives unless told otherwise: fixed,
/// so the provider keys of a test are the same on every run.
pub const TEST_ENTROPY: [u8; 32] = *b"once test entropy, never secret!";

impl Default for MemoryHost {
    fn default() -> Self {
        Self::new()
    }
}

/// The engine's default settings ([`crate::config::default_settings`]).
pub use crate::config::default_settings;

fn table_id(t: Table) -> u8 {
    match t {
        Table::Operation => 0,
        Table::Tombstone => 1,
        Table::Quota => 2,
    }
}

impl MemoryHost {
    /// A ledger at time 1,000,000 that holds only its provider-key secret
    /// (made from [`TEST_ENTROPY`]), as a ledger has after its first
    /// operation: so injected faults and counted writes land on transitions.
    pub fn new() -> Self {
        let host = Self::without_secret();
        let secret = crate::secret::KeySecret::from_bytes(TEST_ENTROPY.to_vec());
        host.ledger
            .borrow_mut()
            .commit(&crate::secret::creation(&secret))
            .expect("an empty ledger takes its secret");
        host
    }

    /// An empty ledger at time 1,000,000: the first key derived creates its secret.
    pub fn without_secret() -> Self {
        MemoryHost {
            ledger: RefCell::new(Ledger::default()),
            now: Cell::new(1_000_000),
            settings: RefCell::new(default_settings()),
            evidence: RefCell::new(VecDeque::new()),
            lookups: RefCell::new(Vec::new()),
            escalations: RefCell::new(Vec::new()),
            ack_escalations: Cell::new(true),
            fail_commits: Cell::new(0),
            records: crate::store::RecordCache::new(),
            entropy: RefCell::new(TEST_ENTROPY.to_vec()),
            secret: crate::secret::SecretCache::new(),
            fail_reads: Cell::new(false),
            lookup_configured: Cell::new(false),
            account: RefCell::new(None),
            reads: None,
            witness: RefCell::new(Witness::default()),
            fail_witness: Cell::new(false),
        }
    }
    /// This host with the protocol's provider reads as steps of their own (configuration
    /// `reads: steps`): the protocol answers `read` where it would call `lookup`.
    pub fn with_read_steps(mut self) -> Self {
        self.reads = Some(crate::reads::Reads::new());
        self
    }
    /// Move the clock forward.
    pub fn advance(&self, ms: u64) {
        self.now.set(self.now.get() + ms);
    }
    /// The next provider lookup answers this (then `unknown` once the script runs out).
    pub fn script_lookup(&self, evidence: Evidence) {
        self.evidence.borrow_mut().push_back(evidence);
    }
    /// Whether the host says it can read the provider for every tool now
    /// (whatever the records' own policies say).
    pub fn configure_lookup(&self, on: bool) {
        self.lookup_configured.set(on);
    }
    /// The provider account this host sends and reads every tool through from now on (a
    /// begin's own policy names the account its new record is bound to: keep the two alike).
    pub fn use_account(&self, account: Option<&str>) {
        *self.account.borrow_mut() = account.map(String::from);
    }
    /// Lookups made so far: (tool, provider key, args).
    pub fn lookups(&self) -> Vec<(String, String, String)> {
        self.lookups.borrow().clone()
    }
    /// Escalations delivered so far.
    pub fn escalations(&self) -> Vec<Escalation> {
        self.escalations.borrow().clone()
    }
    /// Whether the sink acknowledges escalations.
    pub fn set_ack_escalations(&self, ack: bool) {
        self.ack_escalations.set(ack);
    }
    /// What `entropy` answers from now on (fewer bytes than asked: a host without entropy).
    pub fn set_entropy(&self, bytes: Vec<u8>) {
        *self.entropy.borrow_mut() = bytes;
    }
    /// The next `n` commits fail with a storage error.
    pub fn fail_next_commits(&self, n: u32) {
        self.fail_commits.set(n);
    }
    /// Every read fails while set.
    pub fn set_fail_reads(&self, fail: bool) {
        self.fail_reads.set(fail);
    }
    /// One row as stored, indexed fields and all.
    pub fn row(&self, table: Table, scope: &str, key: &str) -> Option<Row> {
        self.ledger.borrow().row(table, scope, key).cloned()
    }
    /// Every row (for invariant checks).
    pub fn rows(&self) -> Vec<Row> {
        self.ledger.borrow().rows.values().cloned().collect()
    }
    /// Drop every row and event: a lost ledger (its witness, kept apart, stays).
    pub fn wipe(&self) {
        *self.ledger.borrow_mut() = Ledger::default();
    }
    /// What the witness holds now, a plain value.
    pub fn witness(&self) -> Witness {
        self.witness.borrow().clone()
    }
    /// Replace the witness (none kept: a witness lost, or restored with its ledger).
    pub fn set_witness(&self, witness: Witness) {
        *self.witness.borrow_mut() = witness;
    }
    /// Every witness read and write fails while set.
    pub fn set_fail_witness(&self, fail: bool) {
        self.fail_witness.set(fail);
    }
    /// Number of audit events.
    pub fn event_count(&self) -> usize {
        self.ledger.borrow().audit.len()
    }
    /// Overwrite a row as stored, version and all (a row left by an older host).
    pub fn put_row(&self, row: Row) {
        let id = (table_id(row.table), row.scope.clone(), row.key.clone());
        self.ledger.borrow_mut().rows.insert(id, row);
    }
    /// The ledger as it is now: rows and audit trail, a plain value.
    pub fn ledger(&self) -> Ledger {
        self.ledger.borrow().clone()
    }
    /// Replace the ledger (a model checker restoring a state it explored).
    pub fn set_ledger(&self, ledger: Ledger) {
        *self.ledger.borrow_mut() = ledger;
    }
    /// Set the clock.
    pub fn set_now(&self, now: u64) {
        self.now.set(now);
    }
}

/// The rows and audit trail of an in-memory ledger, with the store's exact
/// semantics (a batch applies whole or not at all; a put's expected version
/// is a compare-and-swap). A plain value: `Clone + Hash + Eq`, so a model
/// checker can keep one per explored state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Ledger {
    /// Rows by (table, scope, key).
    pub rows: BTreeMap<RowKey, Row>,
    /// Audit events by (scope, key, version).
    pub audit: BTreeMap<(String, String, u64), AuditEvent>,
}

impl Ledger {
    /// One row as stored.
    pub fn row(&self, table: Table, scope: &str, key: &str) -> Option<&Row> {
        self.rows.get(&(table_id(table), scope.to_string(), key.to_string()))
    }

    /// `ledger.get`.
    pub fn get(&self, table: Table, scope: &str, key: &str) -> Option<Stored> {
        self.row(table, scope, key).map(|r| Stored {
            version: r.version,
            body: r.body.clone(),
        })
    }

    /// `ledger.commit`: every put's expected version holds and no event
    /// exists yet, or nothing applies.
    pub fn commit(&mut self, batch: &Batch) -> Result<(), CommitError> {
        let mut rows = self.rows.clone();
        for put in &batch.puts {
            let id = (table_id(put.table), put.scope.clone(), put.key.clone());
            let current = rows.get(&id).map(|r| r.version);
            if current != put.expected {
                return Err(CommitError::Conflict);
            }
            match &put.row {
                Some(row) => rows.insert(id, row.clone()),
                None => rows.remove(&id),
            };
        }
        let mut audit = self.audit.clone();
        for event in &batch.events {
            let id = (event.scope.clone(), event.key.clone(), event.version);
            if audit.insert(id, event.clone()).is_some() {
                return Err(CommitError::Conflict);
            }
        }
        self.rows = rows;
        self.audit = audit;
        Ok(())
    }

    /// `ledger.scan`: due rows of a table in some states (of one owner), oldest due first.
    pub fn scan(&self, table: Table, states: &[State], due_before: u64, owner: Option<String>, limit: u32) -> Vec<Row> {
        let mut due: Vec<Row> = self
            .rows
            .values()
            .filter(|r| r.table == table)
            .filter(|r| r.due_at.is_some_and(|d| d <= due_before))
            .filter(|r| states.is_empty() || r.state.is_some_and(|s| states.contains(&s)))
            .filter(|r| owner.is_none() || r.owner == owner)
            .cloned()
            .collect();
        due.sort_by(|a, b| (a.due_at, &a.scope, &a.key).cmp(&(b.due_at, &b.scope, &b.key)));
        due.truncate(limit as usize);
        due
    }

    /// `ledger.audit`: one operation's trail, in version order.
    pub fn audit(&self, scope: &str, key: &str) -> Vec<AuditEvent> {
        self.audit
            .values()
            .filter(|e| e.scope == scope && e.key == key)
            .cloned()
            .collect()
    }
}

/// The ledger's witness as the `witness` import keeps it: the record body last
/// kept for each (scope, key), with when its attempt was granted. A plain value,
/// so a model checker can keep one per explored state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Witness {
    /// (granted at, body) by (scope, key).
    pub kept: BTreeMap<(String, String), (u64, String)>,
}

impl Witness {
    /// `witness.seen`.
    pub fn seen(&self, scope: &str, key: &str) -> Option<String> {
        self.kept
            .get(&(scope.to_string(), key.to_string()))
            .map(|(_, body)| body.clone())
    }
    /// `witness.keep`: in place of what is kept, unless that was granted later.
    pub fn keep(&mut self, scope: &str, key: &str, body: &str, at: u64) {
        let id = (scope.to_string(), key.to_string());
        if self.kept.get(&id).is_none_or(|(kept_at, _)| *kept_at <= at) {
            self.kept.insert(id, (at, body.to_string()));
        }
    }
    /// `witness.forget`.
    pub fn forget(&mut self, scope: &str, key: &str, before: u64) {
        let id = (scope.to_string(), key.to_string());
        if self.kept.get(&id).is_some_and(|(at, _)| *at < before) {
            self.kept.remove(&id);
        }
    }
}

impl Host for MemoryHost {
    fn now(&self) -> u64 {
        self.now.get()
    }

    fn settings(&self) -> Settings {
        self.settings.borrow().clone()
    }

    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        if self.fail_reads.get() {
            return Err("injected read failure".to_string());
        }
        Ok(self.ledger.borrow().get(table, scope, key))
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        if self.fail_commits.get() > 0 {
            self.fail_commits.set(self.fail_commits.get() - 1);
            return Err(CommitError::Storage("injected commit failure".to_string()));
        }
        self.ledger.borrow_mut().commit(batch)
    }

    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String> {
        Ok(self.ledger.borrow().scan(table, states, due_before, owner, limit))
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        Ok(self.ledger.borrow().audit(scope, key))
    }

    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self.lookups
            .borrow_mut()
            .push((tool.to_string(), provider_key.to_string(), args.to_string()));
        self.evidence
            .borrow_mut()
            .pop_front()
            .unwrap_or_else(|| Evidence::Unknown("no scripted evidence".to_string()))
    }

    fn escalate(&self, escalation: &Escalation) -> bool {
        self.escalations.borrow_mut().push(escalation.clone());
        self.ack_escalations.get()
    }
    fn lookup_configured(&self, _tool: &str) -> bool {
        self.lookup_configured.get()
    }
    fn provider_account(&self, _tool: &str) -> Option<String> {
        self.account.borrow().clone()
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        let bytes = self.entropy.borrow();
        bytes[..bytes.len().min(len as usize)].to_vec()
    }
    fn record_cache(&self) -> Option<&crate::store::RecordCache> {
        Some(&self.records)
    }
    fn secret_cache(&self) -> Option<&crate::secret::SecretCache> {
        Some(&self.secret)
    }
    fn reads(&self) -> Option<&crate::reads::Reads> {
        self.reads.as_ref()
    }
    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, String> {
        if self.fail_witness.get() {
            return Err("injected witness failure".to_string());
        }
        Ok(self.witness.borrow().seen(scope, key))
    }
    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: u64) -> Result<(), String> {
        if self.fail_witness.get() {
            return Err("injected witness failure".to_string());
        }
        self.witness.borrow_mut().keep(scope, key, body, at);
        Ok(())
    }
    fn forget_witnessed(&self, scope: &str, key: &str, before: u64) -> Result<(), String> {
        if self.fail_witness.get() {
            return Err("injected witness failure".to_string());
        }
        self.witness.borrow_mut().forget(scope, key, before);
        Ok(())
    }
}
