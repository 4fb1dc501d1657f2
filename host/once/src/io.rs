//! The I/O the component imports: storage, clock, provider lookup and
//! escalation, bound to the WIT imports. Nothing here decides anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::bindings::once::core::{clock, entropy, ledger, ledger_json, operator, provider, types};
use crate::bindings::types::{
    Audited, Batch, BatchHead, Committed, Escalation, Evidence, Failure, Got, Put, Row, Rows, Scanned, State, Stored,
    Table, Timestamp, Trail,
};
use crate::storage::{self, Flush, Storage};

/// The ledger's clock: milliseconds since the epoch, never running backwards.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock, clamped so it never runs backwards within a process.
#[derive(Debug, Default)]
pub struct SystemClock {
    last: AtomicU64,
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let prev = self.last.fetch_max(wall, Ordering::SeqCst);
        prev.max(wall)
    }
}

/// A clock that only moves when told to (tests, simulations).
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start)))
    }
    /// Move forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    /// Set the time (never backwards).
    pub fn set(&self, t: Timestamp) {
        self.0.fetch_max(t, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.0.load(Ordering::SeqCst)
    }
}

/// The provider's authoritative read path (never the write path).
pub trait Provider: Send + Sync {
    /// Does the effect for `provider_key` exist? `args` are the canonical dispatch args.
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence;
}

impl<F> Provider for F
where
    F: Fn(&str, &str, &str) -> Evidence + Send + Sync,
{
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self(tool, provider_key, args)
    }
}

/// No lookup configured: every read is inconclusive, so unknown stays unknown
/// until an operator resolves it.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProvider;

impl Provider for NoProvider {
    fn lookup(&self, tool: &str, _: &str, _: &str) -> Evidence {
        Evidence::Unknown(format!("no provider lookup is configured for {tool}"))
    }
}

/// The operator's escalation sink.
pub trait Operator: Send + Sync {
    /// Deliver; true when acknowledged. Must dedupe on `escalation.id`.
    fn escalate(&self, escalation: &Escalation) -> bool;
}

impl<F> Operator for F
where
    F: Fn(&Escalation) -> bool + Send + Sync,
{
    fn escalate(&self, escalation: &Escalation) -> bool {
        self(escalation)
    }
}

/// Escalations go to the log (`tracing` at error level) and count as delivered.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogOperator;

impl Operator for LogOperator {
    fn escalate(&self, e: &Escalation) -> bool {
        tracing::error!(
            id = %e.id, scope = %e.scope, key = %e.key, tool = %e.tool, reason = %e.reason,
            deadline = e.deadline, "once: operator attention needed"
        );
        true
    }
}

/// Random bytes for the component's `entropy` import: it asks once per
/// ledger, to create the secret provider keys are derived with
/// (guest/src/secret.rs). The secret itself stays in the ledger and the
/// guest; a host never sees it.
pub trait Entropy: Send + Sync {
    /// `len` cryptographically secure random bytes, or fewer (none) when
    /// there are none to give: the guest then refuses the call.
    fn fill(&self, len: u32) -> Vec<u8>;
}

/// The operating system's random source (`getrandom`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemEntropy;

impl Entropy for SystemEntropy {
    fn fill(&self, len: u32) -> Vec<u8> {
        let mut bytes = vec![0; len as usize];
        match getrandom::fill(&mut bytes) {
            Ok(()) => bytes,
            Err(e) => {
                // No weaker fallback: the guest refuses a call it cannot key, and says so.
                tracing::error!(error = %e, "once: the operating system gave no random bytes");
                Vec::new()
            }
        }
    }
}

/// The same bytes every time (conformance runs, tests, or a secret kept
/// outside the ledger): the ledger's secret, and so every provider key, is
/// then the same in every run. Give at least as many bytes as asked (32):
/// fewer are handed over as they are, and the engine refuses to make a
/// secret of them rather than stretch them.
#[derive(Clone)]
pub struct FixedEntropy(pub Vec<u8>);

impl std::fmt::Debug for FixedEntropy {
    // They may be a deployment's provider-key secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FixedEntropy({} bytes, redacted)", self.0.len())
    }
}

impl Entropy for FixedEntropy {
    fn fill(&self, len: u32) -> Vec<u8> {
        self.0.iter().copied().take(len as usize).collect()
    }
}

/// Everything a component instance's imports reach.
#[derive(Clone)]
pub struct HostState {
    /// The record store.
    pub storage: Arc<dyn Storage>,
    /// The ledger's clock.
    pub clock: Arc<dyn Clock>,
    /// The provider lookup.
    pub provider: Arc<dyn Provider>,
    /// The escalation sink.
    pub operator: Arc<dyn Operator>,
    /// Random bytes (the ledger's provider-key secret is made of them).
    pub entropy: Arc<dyn Entropy>,
}

impl types::Host for HostState {}

impl ledger::Host for HostState {
    fn get(&mut self, table: Table, scope: String, key: String) -> Got {
        match self.storage.get(table, &scope, &key) {
            Ok(Some(row)) => Got::Found(Stored {
                version: row.version,
                body: row.body,
            }),
            Ok(None) => Got::Missing,
            Err(e) => Got::Failed(failure(e)),
        }
    }

    fn commit(&mut self, batch: Batch) -> Committed {
        // The engine says which batches may wait for the disk (DESIGN.md "Durability budget").
        let flush = if batch.deferrable { Flush::Deferred } else { Flush::Now };
        match self.storage.commit_with(&batch, flush) {
            Ok(()) => Committed::Applied,
            Err(storage::CommitError::Conflict) => Committed::Conflict,
            Err(storage::CommitError::Storage(e)) => Committed::Failed(failure(e)),
        }
    }

    fn scan(
        &mut self,
        table: Table,
        states: Vec<State>,
        due_before: Timestamp,
        owner: Option<String>,
        limit: u32,
    ) -> Scanned {
        match self.storage.scan(table, &states, due_before, owner.as_deref(), limit) {
            Ok(rows) => Scanned::Found(Rows { rows }),
            Err(e) => Scanned::Failed(failure(e)),
        }
    }

    fn audit(&mut self, scope: String, key: String) -> Audited {
        match self.storage.audit(&scope, &key) {
            Ok(events) => Audited::Found(Trail { events }),
            Err(e) => Audited::Failed(failure(e)),
        }
    }
}

/// `ledger.get` and `ledger.commit` in the derived JSON encoding: what a guest
/// configured with `ledger-encoding` `json` calls. This host configures
/// `typed` ([`crate::Once`]); the conformance suite drives this encoding too.
impl ledger_json::Host for HostState {
    fn get(&mut self, table: Table, scope: String, key: String) -> String {
        json(&ledger::Host::get(self, table, scope, key))
    }

    fn commit(&mut self, batch: String, bodies: Vec<String>) -> String {
        match batch_of(&batch, bodies) {
            Ok(batch) => json(&ledger::Host::commit(self, batch)),
            Err(why) => json(&Committed::Failed(Failure { message: why })),
        }
    }
}

/// The batch `ledger-json.commit` was handed: the JSON form of a `batch-head` and the
/// written rows' bodies, in put order. Anything else is refused whole, so a
/// malformed batch from the guest writes nothing.
fn batch_of(head: &str, bodies: Vec<String>) -> Result<Batch, String> {
    let head: BatchHead = serde_json::from_str(head)
        .map_err(|e| format!("ledger.commit: the batch is not the JSON form of a batch-head: {e}"))?;
    let written = head.puts.iter().filter(|p| p.row.is_some()).count();
    if written != bodies.len() {
        return Err(format!(
            "ledger.commit: the batch writes {written} row(s) but {} bodies came with it",
            bodies.len()
        ));
    }
    let mut bodies = bodies.into_iter();
    let puts = head
        .puts
        .into_iter()
        .map(|p| {
            let row = p.row.map(|r| Row {
                table: p.table,
                scope: p.scope.clone(),
                key: p.key.clone(),
                version: r.version,
                state: r.state,
                due_at: r.due_at,
                owner: r.owner,
                // Counted above: one body per written row.
                body: bodies.next().unwrap_or_default(),
            });
            Put {
                table: p.table,
                scope: p.scope,
                key: p.key,
                expected: p.expected,
                row,
            }
        })
        .collect();
    Ok(Batch {
        puts,
        events: head.events,
        deferrable: head.deferrable,
    })
}

/// The JSON form of an import's answer (`wit/once.wit`).
fn json(answer: &impl serde::Serialize) -> String {
    // WIT values are strings, integers, bools and containers of them: nothing fails to serialize.
    serde_json::to_string(answer).unwrap_or_default()
}

fn failure(e: storage::StorageError) -> Failure {
    Failure { message: e.to_string() }
}

impl clock::Host for HostState {
    fn now(&mut self) -> Timestamp {
        self.clock.now()
    }
}

impl provider::Host for HostState {
    fn lookup(&mut self, tool: String, provider_key: String, args: String) -> Evidence {
        self.provider.lookup(&tool, &provider_key, &args)
    }
}

impl entropy::Host for HostState {
    fn fill(&mut self, len: u32) -> Vec<u8> {
        self.entropy.fill(len)
    }
}

impl operator::Host for HostState {
    fn escalate(&mut self, escalation: Escalation) -> bool {
        self.operator.escalate(&escalation)
    }
}
