//! The I/O the component imports: storage, clock, provider lookup and
//! escalation, bound to the WIT imports. Nothing here decides anything but
//! which ledger encoding an instance answers: the one it was configured with.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::bindings::once::core::{clock, entropy, ledger, ledger_json, operator, provider, types, witness};
use crate::bindings::types::{
    Audited, Batch, BatchHead, Committed, Escalation, Evidence, Failure, Got, LedgerEncoding, Put, Row, Rows, Scanned,
    State, Stored, Table, Timestamp, Trail,
};
use crate::storage::{self, Flush, Storage};
use crate::turns::{self, RowId, Took, Turn, Turns};

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
    /// Does the effect for `provider_key` exist? `args` are the canonical dispatch args. A lookup
    /// answers within its own timeout (an unanswered read is [`Evidence::Unknown`]): while it runs,
    /// the call that asked holds the operation, and settle rounds of its handle leave it alone.
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

/// The I/O a component instance's imports reach.
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

impl HostState {
    /// The I/O over `storage` and `clock`, the rest as [`Once`](crate::Once)'s builder has it by
    /// default: no provider to read ([`NoProvider`]), escalations logged ([`LogOperator`]), the
    /// operating system's randomness ([`SystemEntropy`]). Set a field to change one.
    pub fn new(storage: Arc<dyn Storage>, clock: Arc<dyn Clock>) -> Self {
        HostState {
            storage,
            clock,
            provider: Arc::new(NoProvider),
            operator: Arc::new(LogOperator),
            entropy: Arc::new(SystemEntropy),
        }
    }

    /// A row's version and body, as `ledger.get` answers.
    fn get_row(&self, table: Table, scope: &str, key: &str) -> Got {
        match self.storage.get(table, scope, key) {
            Ok(Some(row)) => Got::Found(Stored {
                version: row.version,
                body: row.body,
            }),
            Ok(None) => Got::Missing,
            Err(e) => Got::Failed(failure(e)),
        }
    }

    /// A batch applied whole or not at all, as `ledger.commit` answers.
    fn commit_batch(&self, batch: &Batch) -> Committed {
        // Checked here, where the batch arrives, so every `Storage` (a user's too) gets only
        // rows whose table, scope and key are their put's.
        if let Err(e) = storage::check_batch(batch) {
            return Committed::Failed(failure(e));
        }
        // The engine says which batches may wait for the disk (DESIGN.md "Durability budget").
        let flush = if batch.deferrable { Flush::Deferred } else { Flush::Now };
        match self.storage.commit_with(batch, flush) {
            Ok(()) => Committed::Applied,
            Err(storage::CommitError::Conflict) => Committed::Conflict,
            Err(storage::CommitError::Storage(e)) => Committed::Failed(failure(e)),
        }
    }
}

/// What a component instance's imports answer from: the host's I/O, and
/// which encoding of the ledger's `get` and `commit` the instance was
/// configured with. The other encoding's `get` and `commit` answer `failed`,
/// as `wit/once.wit` requires: a guest that called them (a bug) is refused,
/// never answered from the store.
pub(crate) struct Imports {
    /// The quota row this export holds the turn of (`crate::turns`), until it
    /// writes the row or returns. First, so it is handed on before the store
    /// it names can be dropped with `host`.
    pub(crate) turn: Option<Turn>,
    /// The engine read the clock before it waited for a turn in this export:
    /// its next commit of the held row is answered `conflict` once, unapplied,
    /// so the engine decides again (holding the turn, it reads the row at once)
    /// with the clock as it is now. Otherwise a lease, a fence and a quota
    /// window would date from before the wait. Kept when the export moves on
    /// to another bucket (its decision still holds that clock).
    decide_again: bool,
    /// A quota row whose queue did not move for [`turns::MAX_WAIT`] while this
    /// export waited: it reads the row without a turn from then on.
    gave_up: Option<RowId>,
    /// The host's I/O.
    pub(crate) host: HostState,
    /// Set by an accepted `configure`; none before (no export reads the ledger then).
    pub(crate) encoding: Option<LedgerEncoding>,
}

impl Imports {
    /// What an instance's imports answer from, before `configure`.
    pub(crate) fn new(host: HostState) -> Imports {
        Imports {
            turn: None,
            decide_again: false,
            gave_up: None,
            host,
            encoding: None,
        }
    }

    /// Before a read: a quota bucket's waits for its turn (`crate::turns`).
    /// An export holds one turn at most, so it hands the one it holds on
    /// before it waits for another, and it holds none while a provider or an
    /// operator sink answers (those imports hand it on; a later write of the
    /// row is then checked by its compare-and-swap alone). The ledger's
    /// provider-key secret is kept in the quota table under the empty scope,
    /// which no bucket has (guest/src/secret.rs): every new instance reads
    /// it, and it takes no turn.
    fn take_turn(&mut self, table: Table, scope: &str, key: &str) {
        if !matches!(table, Table::Quota)
            || scope.is_empty()
            || self.turn.as_ref().is_some_and(|t| t.row().is(scope, key))
            || self.gave_up.as_ref().is_some_and(|r| r.is(scope, key))
        {
            return;
        }
        self.turn = None;
        let store = Arc::as_ptr(&self.host.storage) as *const () as usize;
        let row = RowId::new(store, scope, key);
        match Turns::shared().take(row.clone(), turns::MAX_WAIT) {
            Took::AtOnce(turn) => self.turn = Some(turn),
            Took::AfterWaiting(turn) => {
                self.turn = Some(turn);
                self.decide_again = true;
            }
            Took::No => self.gave_up = Some(row),
        }
    }

    /// A commit. A batch that writes the held row hands its turn on, unless
    /// it lost its compare-and-swap (to a writer that takes no turns here:
    /// another process or handle, a nested export, a caller that gave up
    /// waiting; the engine reads the row again at once and keeps its place);
    /// the first such batch after a wait is not applied (see
    /// [`Imports::decide_again`]).
    fn commit_batch(&mut self, batch: &Batch) -> Committed {
        let writes_held = self.turn.as_ref().is_some_and(|turn| {
            batch
                .puts
                .iter()
                .any(|p| matches!(p.table, Table::Quota) && turn.row().is(&p.scope, &p.key))
        });
        // A deferrable batch (a count, an attempt's own success) is committed as it comes: some are
        // not decided again after a conflict. None writes a bucket today.
        if writes_held && !batch.deferrable && std::mem::take(&mut self.decide_again) {
            return Committed::Conflict;
        }
        let committed = self.host.commit_batch(batch);
        if writes_held && !matches!(committed, Committed::Conflict) {
            self.turn = None;
        }
        committed
    }

    /// At the end of every export: its turn, if it still holds one, goes on.
    pub(crate) fn end_export(&mut self) {
        self.turn = None;
        self.decide_again = false;
        self.gave_up = None;
    }

    /// Why `import` (`ledger.get`, `ledger-json.commit`, …) of `encoding` is refused, if that is not
    /// the encoding this instance was configured with.
    fn refused(&self, import: &str, encoding: LedgerEncoding) -> Option<Failure> {
        let configured = match self.encoding {
            Some(e) if e == encoding => return None,
            Some(LedgerEncoding::Typed) => "configured with the typed ledger",
            Some(LedgerEncoding::Json) => "configured with ledger-json",
            None => "not configured yet",
        };
        Some(Failure {
            message: format!("{import}: refused: this instance is {configured}"),
        })
    }
}

impl types::Host for Imports {}

// The generated (empty) trait of the shared types, as `HostState` has always had it.
impl types::Host for HostState {}

impl ledger::Host for Imports {
    fn get(&mut self, table: Table, scope: String, key: String) -> Got {
        match self.refused("ledger.get", LedgerEncoding::Typed) {
            Some(f) => Got::Failed(f),
            None => {
                self.take_turn(table, &scope, &key);
                self.host.get_row(table, &scope, &key)
            }
        }
    }

    fn commit(&mut self, batch: Batch) -> Committed {
        match self.refused("ledger.commit", LedgerEncoding::Typed) {
            Some(f) => Committed::Failed(f),
            None => self.commit_batch(&batch),
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
        match self
            .host
            .storage
            .scan(table, &states, due_before, owner.as_deref(), limit)
        {
            Ok(rows) => Scanned::Found(Rows { rows }),
            Err(e) => Scanned::Failed(failure(e)),
        }
    }

    fn audit(&mut self, scope: String, key: String) -> Audited {
        match self.host.storage.audit(&scope, &key) {
            Ok(events) => Audited::Found(Trail { events }),
            Err(e) => Audited::Failed(failure(e)),
        }
    }
}

/// `ledger.get` and `ledger.commit` in the derived JSON encoding: what a guest
/// configured with `ledger-encoding` `json` calls. [`crate::Once`] configures
/// `typed`; the conformance suite drives this encoding too.
impl ledger_json::Host for Imports {
    fn get(&mut self, table: Table, scope: String, key: String) -> String {
        match self.refused("ledger-json.get", LedgerEncoding::Json) {
            Some(f) => json(&Got::Failed(f)),
            None => {
                self.take_turn(table, &scope, &key);
                json(&self.host.get_row(table, &scope, &key))
            }
        }
    }

    fn commit(&mut self, batch: String, bodies: Vec<String>) -> String {
        if let Some(f) = self.refused("ledger-json.commit", LedgerEncoding::Json) {
            return json(&Committed::Failed(f));
        }
        match batch_of(&batch, bodies) {
            Ok(batch) => json(&self.commit_batch(&batch)),
            Err(why) => json(&Committed::Failed(Failure { message: why })),
        }
    }
}

/// The batch `ledger-json.commit` was handed: the JSON form of a `batch-head` and the
/// written rows' bodies, in put order. Anything else is refused whole, so a
/// malformed batch from the guest writes nothing.
fn batch_of(head: &str, bodies: Vec<String>) -> Result<Batch, String> {
    let head: BatchHead = serde_json::from_str(head)
        .map_err(|e| format!("ledger-json.commit: the batch is not the JSON form of a batch-head: {e}"))?;
    let written = head.puts.iter().filter(|p| p.row.is_some()).count();
    if written != bodies.len() {
        return Err(format!(
            "ledger-json.commit: the batch writes {written} row(s) but {} bodies came with it",
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

impl clock::Host for Imports {
    fn now(&mut self) -> Timestamp {
        self.host.clock.now()
    }
}

impl provider::Host for Imports {
    fn lookup(&mut self, tool: String, provider_key: String, args: String) -> Evidence {
        // A provider may take its timeout to answer: the bucket's other callers do not wait behind it.
        self.turn = None;
        self.host.provider.lookup(&tool, &provider_key, &args)
    }
}

impl entropy::Host for Imports {
    fn fill(&mut self, len: u32) -> Vec<u8> {
        self.host.entropy.fill(len)
    }
}

/// The ledger's witness is its store's ([`Storage::witnessed`]): where it is kept
/// depends on where the ledger is (beside an SQLite file; nowhere for PostgreSQL).
impl witness::Host for Imports {
    fn seen(&mut self, scope: String, key: String) -> witness::Witnessed {
        match self.host.storage.witnessed(&scope, &key) {
            Ok(None) => witness::Witnessed::Nothing,
            Ok(Some(body)) => witness::Witnessed::Kept(body),
            Err(e) => witness::Witnessed::Failed(e.0),
        }
    }
    fn keep(&mut self, scope: String, key: String, body: String, at: types::Timestamp) -> Option<String> {
        self.host
            .storage
            .keep_witness(&scope, &key, &body, at)
            .err()
            .map(|e| e.0)
    }
    fn forget(&mut self, scope: String, key: String, before: types::Timestamp) -> Option<String> {
        self.host
            .storage
            .forget_witnessed(&scope, &key, before)
            .err()
            .map(|e| e.0)
    }
}

impl operator::Host for Imports {
    fn escalate(&mut self, escalation: Escalation) -> bool {
        // A user's sink may be slow, or call `Once` again: the bucket's other callers do not wait behind it.
        self.turn = None;
        self.host.operator.escalate(&escalation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::types::{Call, Configuration, Outcome, ProviderReads, Step};
    use crate::runtime::{Instance, Runtime};
    use crate::storage::memory::MemoryStorage;

    fn host(storage: Arc<MemoryStorage>) -> HostState {
        HostState {
            storage,
            clock: Arc::new(SystemClock::default()),
            provider: Arc::new(NoProvider),
            operator: Arc::new(LogOperator),
            entropy: Arc::new(FixedEntropy(vec![7; 64])),
        }
    }

    fn configuration(instance: &mut Instance, encoding: LedgerEncoding) -> Configuration {
        let mut defaults = crate::policy_input();
        defaults.lookup = Some(false);
        Configuration {
            settings: instance.default_settings().unwrap(),
            defaults,
            tools: Vec::new(),
            ledger_encoding: encoding,
            reads: ProviderReads::Steps,
        }
    }

    /// One protected call, dispatched and confirmed (the ledger read and written on the way).
    fn protect(instance: &mut Instance, storage: &MemoryStorage, key: &str) {
        let call = Call {
            scope: "s".into(),
            keys: vec![("api".into(), key.into())],
            tool: "refund".into(),
            args: "{\"amount\":\"5.00\"}".into(),
            supersedes: None,
            acknowledge_confirmed: false,
        };
        let Step::Dispatch(grant) = instance.start(&call).unwrap().unwrap() else {
            panic!("{key}: no grant");
        };
        let outcome = Outcome::Success("{\"id\":1}".into());
        let step = instance.report(&grant.scope, &grant.key, &grant.fence, &outcome);
        assert!(matches!(step, Ok(Ok(Step::Done(_)))), "{key}: {step:?}");
        assert!(storage.get(Table::Operation, "s", key).unwrap().is_some());
    }

    /// A protected call on an instance configured with `encoding` (whose imports refuse the
    /// other encoding's `get` and `commit`).
    fn call_with(encoding: LedgerEncoding, key: &str) {
        let storage = Arc::new(MemoryStorage::new());
        let mut instance = Runtime::shared().unwrap().instantiate(host(storage.clone())).unwrap();
        let configuration = configuration(&mut instance, encoding);
        instance.configure(&configuration, 1).unwrap().unwrap();
        protect(&mut instance, &storage, key);
    }

    /// The guest calls the encoding it was configured with, and only that one: a call
    /// of the other would be refused, and the protected call with it.
    #[test]
    fn the_guest_answers_through_the_configured_ledger_encoding() {
        call_with(LedgerEncoding::Typed, "typed");
        call_with(LedgerEncoding::Json, "json");
    }

    /// A refused configuration leaves the accepted one's encoding in force on both sides;
    /// an accepted one switches both.
    #[test]
    fn a_refused_configure_keeps_the_encoding_an_accepted_one_switches_it() {
        let storage = Arc::new(MemoryStorage::new());
        let mut instance = Runtime::shared().unwrap().instantiate(host(storage.clone())).unwrap();
        let typed = configuration(&mut instance, LedgerEncoding::Typed);
        instance.configure(&typed, 1).unwrap().unwrap();
        let mut refused = configuration(&mut instance, LedgerEncoding::Json);
        refused.settings.owner = String::new();
        assert!(instance.configure(&refused, 2).unwrap().is_err());
        protect(&mut instance, &storage, "after-refusal");
        let json = configuration(&mut instance, LedgerEncoding::Json);
        instance.configure(&json, 3).unwrap().unwrap();
        protect(&mut instance, &storage, "after-switch");
    }

    /// A verify-first call's read, typed (`driver`) and as JSON text (`protocol`): the same `read`
    /// step, and the same grant once the read is brought back, byte for byte in serde's form.
    #[test]
    fn a_read_step_and_its_read_back_are_the_same_in_both_encodings() {
        let run = |json: bool| -> (serde_json::Value, serde_json::Value) {
            let storage = Arc::new(MemoryStorage::new());
            let mut state = host(storage);
            state.clock = Arc::new(crate::ManualClock::new(1_800_000_000_000));
            let mut instance = Runtime::shared().unwrap().instantiate(state).unwrap();
            let mut configuration = configuration(&mut instance, LedgerEncoding::Typed);
            configuration.defaults.lookup = Some(true);
            configuration.defaults.verify_first = Some(true);
            instance.configure(&configuration, 1).unwrap().unwrap();
            let call = Call {
                scope: "s".into(),
                keys: vec![("api".into(), "k".into())],
                tool: "refund".into(),
                args: "{\"amount\":\"5.00\"}".into(),
                supersedes: None,
                acknowledge_confirmed: false,
            };
            let absent = Evidence::Absent(1_800_000_000_000);
            if json {
                let call_text = serde_json::to_string(&call).unwrap();
                let read: serde_json::Value = serde_json::from_str(&instance.start_json(&call_text).unwrap()).unwrap();
                let reading = serde_json::to_string(&read["Ok"]["Read"]).unwrap();
                let evidence = serde_json::to_string(&absent).unwrap();
                let granted = instance.read_back_json(&call_text, &reading, &evidence).unwrap();
                (read, serde_json::from_str(&granted).unwrap())
            } else {
                let read = instance.start(&call).unwrap();
                let Ok(Step::Read(reading)) = &read else {
                    panic!("{read:?}")
                };
                let granted = instance.read_back(Some(&call), reading, &absent).unwrap();
                assert!(matches!(granted, Ok(Step::Dispatch(_))), "{granted:?}");
                (
                    serde_json::to_value(&read).unwrap(),
                    serde_json::to_value(&granted).unwrap(),
                )
            }
        };
        assert_eq!(run(true), run(false));
    }

    fn imports(storage: Arc<MemoryStorage>, encoding: Option<LedgerEncoding>) -> Imports {
        Imports {
            encoding,
            ..Imports::new(host(storage))
        }
    }

    /// The encoding not configured (or any, before `configure`) answers `failed`, never the store's rows.
    #[test]
    fn the_other_encoding_answers_failed() {
        let storage = Arc::new(MemoryStorage::new());
        let mut typed = imports(storage.clone(), Some(LedgerEncoding::Typed));
        assert_eq!(
            ledger::Host::get(&mut typed, Table::Operation, "s".into(), "k".into()),
            Got::Missing
        );
        let refused = |text: String| matches!(serde_json::from_str(&text), Ok(Got::Failed(_)));
        assert!(refused(ledger_json::Host::get(
            &mut typed,
            Table::Operation,
            "s".into(),
            "k".into()
        )));
        let mut json = imports(storage.clone(), Some(LedgerEncoding::Json));
        assert!(matches!(
            ledger::Host::get(&mut json, Table::Operation, "s".into(), "k".into()),
            Got::Failed(_)
        ));
        let mut unconfigured = imports(storage.clone(), None);
        assert!(matches!(
            ledger::Host::get(&mut unconfigured, Table::Operation, "s".into(), "k".into()),
            Got::Failed(f) if f.message.contains("not configured")
        ));
        assert!(refused(ledger_json::Host::get(
            &mut unconfigured,
            Table::Operation,
            "s".into(),
            "k".into()
        )));
        // Commits of an encoding not configured write nothing, however well formed.
        for instance in [&mut json, &mut unconfigured] {
            assert!(matches!(
                ledger::Host::commit(instance, batch("s")),
                Committed::Failed(_)
            ));
        }
        let committed = ledger_json::Host::commit(&mut typed, HEAD.into(), vec!["{}".into()]);
        assert!(
            matches!(serde_json::from_str(&committed), Ok(Committed::Failed(_))),
            "{committed}"
        );
        assert!(storage.get(Table::Operation, "s", "k").unwrap().is_none());
        assert_eq!(ledger::Host::commit(&mut typed, batch("s")), Committed::Applied);
    }

    /// The JSON form of `batch("s")`'s head.
    const HEAD: &str = r#"{"puts":[{"table":"Operation","scope":"s","key":"k","expected":null,"row":{"version":1,"state":"InFlight","due_at":1,"owner":null}}],"events":[],"deferrable":false}"#;

    /// A batch inserting row (operation, s, k), written as if of scope `row_scope`.
    fn batch(row_scope: &str) -> Batch {
        let row = Row {
            table: Table::Operation,
            scope: row_scope.into(),
            key: "k".into(),
            version: 1,
            state: Some(State::InFlight),
            due_at: Some(1),
            owner: None,
            body: "{}".into(),
        };
        Batch {
            puts: vec![Put {
                table: Table::Operation,
                scope: "s".into(),
                key: "k".into(),
                expected: None,
                row: Some(row),
            }],
            events: Vec::new(),
            deferrable: false,
        }
    }

    /// A malformed `ledger-json` batch is refused whole, saying why; nothing is written.
    #[test]
    fn a_malformed_json_batch_is_refused_whole() {
        let storage = Arc::new(MemoryStorage::new());
        let mut state = imports(storage.clone(), Some(LedgerEncoding::Json));
        let head = HEAD;
        let answer = |state: &mut Imports, head: &str, bodies: Vec<String>| {
            serde_json::from_str::<Committed>(&ledger_json::Host::commit(state, head.into(), bodies)).unwrap()
        };
        for (head, bodies, why) in [
            (head, vec![], "writes 1 row(s) but 0 bodies"),
            (head, vec!["{}".into(), "{}".into()], "writes 1 row(s) but 2 bodies"),
            ("{\"puts\":7}", vec![], "not the JSON form of a batch-head"),
        ] {
            let Committed::Failed(f) = answer(&mut state, head, bodies) else {
                panic!("accepted: {head}");
            };
            assert!(
                f.message.starts_with("ledger-json.commit: ") && f.message.contains(why),
                "{}",
                f.message
            );
        }
        assert!(storage.get(Table::Operation, "s", "k").unwrap().is_none());
        assert_eq!(answer(&mut state, head, vec!["{}".into()]), Committed::Applied);
    }

    /// A typed batch whose row names another table, scope or key than its put is refused, not written.
    #[test]
    fn a_typed_batch_whose_row_is_not_its_puts_is_refused() {
        let storage = Arc::new(MemoryStorage::new());
        let mut state = imports(storage.clone(), Some(LedgerEncoding::Typed));
        let batch = batch("other");
        assert!(matches!(ledger::Host::commit(&mut state, batch), Committed::Failed(_)));
        assert!(storage.get(Table::Operation, "s", "k").unwrap().is_none());
        assert!(storage.get(Table::Operation, "other", "k").unwrap().is_none());
    }

    /// A batch writing quota row (`scope`, b) over version `expected` (none: inserting it).
    fn bucket(scope: &str, expected: Option<u64>) -> Batch {
        let version = expected.map_or(1, |v| v + 1);
        let row = Row {
            table: Table::Quota,
            scope: scope.into(),
            key: "b".into(),
            version,
            state: None,
            due_at: None,
            owner: None,
            body: "{}".into(),
        };
        Batch {
            puts: vec![Put {
                table: Table::Quota,
                scope: scope.into(),
                key: "b".into(),
                expected,
                row: Some(row),
            }],
            events: Vec::new(),
            deferrable: false,
        }
    }

    fn read(state: &mut Imports, table: Table, scope: &str, key: &str) {
        let _ = ledger::Host::get(state, table, scope.into(), key.into());
    }

    /// A bucket's read takes its turn (`crate::turns`); a lost compare-and-swap keeps it; an applied
    /// write of the row, a read of another bucket or the export's end hands it on. The ledger's
    /// secret (quota table, empty scope) takes none.
    #[test]
    fn a_bucket_read_holds_its_turn_until_the_row_is_written_or_the_export_ends() {
        let storage = Arc::new(MemoryStorage::new());
        let mut state = imports(storage.clone(), Some(LedgerEncoding::Typed));
        read(&mut state, Table::Quota, "", "once:provider-key-secret");
        assert!(state.turn.is_none(), "the secret's row takes no turn");
        read(&mut state, Table::Quota, "s", "b");
        assert!(state.turn.as_ref().is_some_and(|t| t.row().is("s", "b")));
        read(&mut state, Table::Operation, "s", "k");
        assert!(state.turn.is_some(), "other rows' reads keep it");
        assert!(matches!(
            ledger::Host::commit(&mut state, bucket("s", Some(7))),
            Committed::Conflict
        ));
        assert!(state.turn.is_some(), "a lost compare-and-swap keeps it");
        assert!(matches!(
            ledger::Host::commit(&mut state, bucket("s", None)),
            Committed::Applied
        ));
        assert!(state.turn.is_none(), "the applied write hands it on");
        read(&mut state, Table::Quota, "s", "b");
        read(&mut state, Table::Quota, "t", "b");
        assert!(
            state.turn.as_ref().is_some_and(|t| t.row().is("t", "b")),
            "one turn at a time"
        );
        let _ = provider::Host::lookup(&mut state, "refund".into(), "pk".into(), "{}".into());
        assert!(state.turn.is_none(), "a provider's read hands it on");
        read(&mut state, Table::Quota, "t", "b");
        state.end_export();
        assert!(state.turn.is_none());
        let store = Arc::as_ptr(&state.host.storage) as *const () as usize;
        for scope in ["s", "t"] {
            assert_eq!(
                Turns::shared().waiting(&RowId::new(store, scope, "b")),
                None,
                "{scope}: freed"
            );
        }
    }

    /// An export that waited for its turn read the clock before it waited: its first write of the
    /// row is answered `conflict` and not applied, so the engine decides again on the clock as it
    /// is; the next write applies. So too when the decision moved on to another bucket after the
    /// wait (`moves_on`): it still holds the clock it read before.
    #[test]
    fn a_write_after_waiting_for_the_turn_is_decided_again() {
        waited_then_wrote(false);
        waited_then_wrote(true);
    }

    fn waited_then_wrote(moves_on: bool) {
        let storage = Arc::new(MemoryStorage::new());
        let mut holder = imports(storage.clone(), Some(LedgerEncoding::Typed));
        read(&mut holder, Table::Quota, "s", "b");
        let row = RowId::new(Arc::as_ptr(&holder.host.storage) as *const () as usize, "s", "b");
        let waiter = {
            let storage = storage.clone();
            std::thread::spawn(move || {
                let mut state = imports(storage.clone(), Some(LedgerEncoding::Typed));
                read(&mut state, Table::Quota, "s", "b");
                let written = if moves_on { "t" } else { "s" };
                if moves_on {
                    read(&mut state, Table::Quota, written, "b");
                }
                let first = ledger::Host::commit(&mut state, bucket(written, None));
                let applied = storage.get(Table::Quota, written, "b").unwrap().is_some();
                let second = ledger::Host::commit(&mut state, bucket(written, None));
                state.end_export();
                (first, applied, second)
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while Turns::shared().waiting(&row) != Some(1) {
            assert!(std::time::Instant::now() < deadline, "the second reader never queued");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        holder.end_export();
        let (first, applied, second) = waiter.join().unwrap();
        assert!(matches!(first, Committed::Conflict), "moves on: {moves_on}");
        assert!(
            !applied,
            "the first write after the wait is not applied (moves on: {moves_on})"
        );
        assert!(matches!(second, Committed::Applied), "moves on: {moves_on}");
    }
}
