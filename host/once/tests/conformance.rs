//! The conformance suite (`tests/conformance/`) through the built component.
//!
//! This is the Rust runner: it loads the component file with the host
//! crate's loader (`once::runtime`, wasmtime) and supplies only the imports
//! the scenarios script: a compare-and-swap store (the host crate's memory
//! and SQLite backends, wrapped to inject storage failures and races), a
//! manual clock, scripted provider evidence and a recording escalation sink
//! — and configures each instance (`configure`) with the settings and the
//! tool policy a step needs. Every decision comes from the component;
//! nothing here knows a rule. The Python and Node.js runners do the same and
//! must write byte-identical transcripts (`tests/conformance/run-all.sh`
//! compares them).
//!
//! Environment: `ONCE_CONFORMANCE_COMPONENT` (the `.wasm` to load; default:
//! the one `host/once/build.rs` built), `ONCE_CONFORMANCE_TRANSCRIPTS` (a folder
//! to write `rust-memory.jsonl`, `rust-sqlite.jsonl` and `component.txt`, the
//! path of the component file used, into),
//! `ONCE_CONFORMANCE_FILTER` (run only scenarios whose name contains it),
//! `ONCE_VECTORS` (the JCS vectors; default `../shared/vectors/jcs`). A
//! clone without the vectors skips the scenarios that read them, saying
//! `skipped: ../shared/vectors not found` (under `CI` that fails instead).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use once::io::{Clock, HostState, Operator, Provider};
use once::runtime::{Instance, Runtime};
use once::storage::memory::MemoryStorage;
use once::storage::sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use once::storage::{CommitError, Stats, Storage, StorageError};
use once::types::{
    Account, ApprovalInfo, ApprovalRule, ApprovalThreshold, AuditEvent, Awaited, Batch, BlockReason, Blocked, Call,
    Configuration, Configured, Confirmation, ConfirmedInfo, Decision, Effect, Ending, Error, Escalation, Evidence,
    FinishAck, Grant, IdentityMode, InFlightInfo, JsonError, JsonErrorKind, KeySource, LedgerEncoding, Outcome,
    PolicyInput, ProviderReads, PruneReport, QuotaInput, RecordSummary, RecordView, RejectedInfo, Repeat, ReplayVia,
    Resolution, Route, Row, Settings, State, Step, SweepResult, Table, Timestamp, ToolConfig, ToolDescriptor,
    ToolPolicy, UnknownInfo, WaitReason,
};
use serde_json::{Map, Value, json};

// ------------------------------------------------------------------ files

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("host/once/ lives two levels below the repository root")
        .to_path_buf()
}

#[path = "../../../tests/support/shared_vectors.rs"]
mod shared_vectors;

fn vectors_dir() -> PathBuf {
    std::env::var_os("ONCE_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| shared_vectors::dir().join("jcs"))
}

/// Whether a scenario reads the vectors (a `file`, `$file` or `$csv` step).
fn reads_vectors(text: &str) -> bool {
    ["\"file\":", "\"$file\"", "\"$csv\""].iter().any(|k| text.contains(k))
}

fn component_path() -> PathBuf {
    std::env::var_os("ONCE_CONFORMANCE_COMPONENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("ONCE_COMPONENT_PATH")))
}

/// Every scenario file, in file-name order.
fn scenarios() -> Vec<(String, Value)> {
    let dir = repo().join("tests/conformance/scenarios");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let filter = std::env::var("ONCE_CONFORMANCE_FILTER").unwrap_or_default();
    let have_vectors = vectors_dir().is_dir();
    if !have_vectors {
        assert!(
            std::env::var_os("CI").is_none(),
            "the vectors ({}) are not there, and CI is set: the vector scenarios must run",
            vectors_dir().display()
        );
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            if !have_vectors && reads_vectors(&text) {
                eprintln!("skipped: ../shared/vectors not found ({})", p.display());
                return None;
            }
            Some((p, text))
        })
        .map(|(p, text)| {
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()));
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            assert_eq!(
                value["name"].as_str(),
                Some(name.as_str()),
                "{}: \"name\" must be the file name",
                p.display()
            );
            (name, value)
        })
        .filter(|(name, _)| name.contains(&filter))
        .collect()
}

// ------------------------------------------------------------------ the component

/// The component file, compiled once per process (or loaded from the
/// compiled-artifact cache the host uses, keyed by the file's bytes).
fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let path = component_path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading the component {}: {e}", path.display()));
        Runtime::load_component(&bytes, once::runtime::cache_dir().as_deref()).expect("compiling the component")
    })
}

// ------------------------------------------------------------------ the imports

/// The scenario's clock: it moves only by `advance`, backwards too (a clock
/// stepped back, e.g. by NTP), so the component's own rule that time never
/// runs backwards in a comparison can be tested.
struct ScriptClock(AtomicU64);

impl ScriptClock {
    fn now(&self) -> Timestamp {
        self.0.load(Ordering::SeqCst)
    }

    /// Move by `ms` (negative: backwards); never below 0.
    fn advance(&self, ms: i64) -> Res<()> {
        let now = self.now();
        let next = now
            .checked_add_signed(ms)
            .ok_or_else(|| format!("advance {ms} from {now} leaves the clock's range"))?;
        self.0.store(next, Ordering::SeqCst);
        Ok(())
    }
}

/// Clock, settings, scripted evidence and the logs of lookups and escalations.
struct Env {
    clock: ScriptClock,
    settings: Mutex<Settings>,
    evidence: Mutex<VecDeque<Evidence>>,
    lookups: Mutex<Vec<Value>>,
    escalations: Mutex<Vec<Value>>,
    ack: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Provider for Env {
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        lock(&self.lookups).push(json!({"tool": tool, "provider-key": provider_key, "args": args}));
        lock(&self.evidence)
            .pop_front()
            .unwrap_or_else(|| Evidence::Unknown("no scripted evidence".to_string()))
    }
}

impl Operator for Env {
    fn escalate(&self, e: &Escalation) -> bool {
        lock(&self.escalations).push(render_escalation(e));
        self.ack.load(Ordering::SeqCst)
    }
}

struct EnvClock(Arc<Env>);

impl Clock for EnvClock {
    fn now(&self) -> Timestamp {
        self.0.clock.now()
    }
}

/// The deliberately broken hosts the suite must catch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Broken {
    /// A correct store.
    No,
    /// Every put applies whatever the row's version is (audit events still unique).
    CasIgnoresVersion,
    /// As above, and a repeated audit event is silently dropped: no conflict is ever reported.
    NoConflicts,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Memory,
    Sqlite,
}

type Hook = Box<dyn FnOnce() + Send>;

/// A backend of the host crate, wrapped to inject what scenarios script.
struct Scripted {
    backend: Backend,
    dir: PathBuf,
    inner: Mutex<Arc<dyn Storage>>,
    generation: AtomicU32,
    fail_commits: AtomicU32,
    lose_replies: AtomicU32,
    fail_reads: AtomicBool,
    /// A deliberately broken host, for the negative tests.
    broken: Broken,
    race: Mutex<Option<Hook>>,
    touched: Mutex<BTreeSet<(u8, String, String)>>,
}

fn table_index(t: Table) -> u8 {
    match t {
        Table::Operation => 0,
        Table::Tombstone => 1,
        Table::Quota => 2,
    }
}

/// What every runner's `entropy.fill` answers (cycled to the length asked): the
/// ledger's provider-key secret, so every provider key in a transcript, is the
/// same in every runner and every run (tests/conformance/README.md).
const ENTROPY: &[u8; 32] = b"once conformance: a fixed secret";

const TABLES: [Table; 3] = [Table::Operation, Table::Tombstone, Table::Quota];

/// The scenarios test semantics, not power loss: commits need not wait for an fsync each.
fn sqlite_options() -> SqliteOptions {
    SqliteOptions {
        synchronous: Synchronous::Normal,
        ..SqliteOptions::default()
    }
}

impl Scripted {
    fn new(backend: Backend, dir: &Path, broken: Broken) -> Self {
        let s = Scripted {
            backend,
            dir: dir.to_path_buf(),
            inner: Mutex::new(Arc::new(MemoryStorage::new())),
            generation: AtomicU32::new(0),
            fail_commits: AtomicU32::new(0),
            lose_replies: AtomicU32::new(0),
            fail_reads: AtomicBool::new(false),
            broken,
            race: Mutex::new(None),
            touched: Mutex::new(BTreeSet::new()),
        };
        s.wipe();
        s
    }

    /// A fresh, empty ledger (a lost ledger, or the first one).
    fn wipe(&self) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst);
        let store: Arc<dyn Storage> = match self.backend {
            Backend::Memory => Arc::new(MemoryStorage::new()),
            Backend::Sqlite => Arc::new(
                SqliteStorage::open(self.dir.join(format!("ledger-{generation}.db")), sqlite_options())
                    .expect("opening a SQLite ledger"),
            ),
        };
        *lock(&self.inner) = store;
        lock(&self.touched).clear();
    }

    fn inner(&self) -> Arc<dyn Storage> {
        lock(&self.inner).clone()
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Rows per table and audit events, as the store holds them now.
    fn counts(&self) -> Value {
        let inner = self.inner();
        let mut n = [0u64; 3];
        for (t, scope, key) in lock(&self.touched).iter() {
            // `quota` counts buckets: the ledger's provider-key secret shares the table (README).
            if (scope.as_str(), key.as_str()) == (once_guest::secret::SECRET_SCOPE, once_guest::secret::SECRET_KEY) {
                continue;
            }
            if inner
                .get(TABLES[*t as usize], scope, key)
                .expect("counting rows")
                .is_some()
            {
                n[*t as usize] += 1;
            }
        }
        let events: u64 = inner
            .stats(None)
            .expect("counting events")
            .events
            .iter()
            .map(|(_, c)| c)
            .sum();
        json!({"operation": n[0], "tombstone": n[1], "quota": n[2], "events": events})
    }
}

impl Storage for Scripted {
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, StorageError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StorageError("injected read failure".to_string()));
        }
        self.inner().get(table, scope, key)
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        // A racing writer goes first, against the same ledger.
        let hook = lock(&self.race).take();
        if let Some(hook) = hook {
            hook();
        }
        if Self::take(&self.fail_commits) {
            return Err(CommitError::Storage(StorageError(
                "injected commit failure".to_string(),
            )));
        }
        let inner = self.inner();
        let mut batch = batch.clone();
        if self.broken != Broken::No {
            for put in &mut batch.puts {
                put.expected = inner
                    .get(put.table, &put.scope, &put.key)
                    .map_err(CommitError::Storage)?
                    .map(|row| row.version);
            }
        }
        if self.broken == Broken::NoConflicts {
            let mut kept = Vec::new();
            for event in batch.events {
                let trail = inner.audit(&event.scope, &event.key).map_err(CommitError::Storage)?;
                if !trail.iter().any(|e| e.version == event.version) {
                    kept.push(event);
                }
            }
            batch.events = kept;
        }
        {
            let mut touched = lock(&self.touched);
            for put in &batch.puts {
                touched.insert((table_index(put.table), put.scope.clone(), put.key.clone()));
            }
        }
        inner.commit(&batch)?;
        if Self::take(&self.lose_replies) {
            return Err(CommitError::Storage(StorageError(
                "injected lost commit reply".to_string(),
            )));
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
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StorageError("injected read failure".to_string()));
        }
        self.inner().scan(table, states, due_before, owner, limit)
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, StorageError> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(StorageError("injected read failure".to_string()));
        }
        self.inner().audit(scope, key)
    }

    fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<Row>, StorageError> {
        self.inner().list(state, limit)
    }

    fn stats(&self, scope: Option<&str>) -> Result<Stats, StorageError> {
        self.inner().stats(scope)
    }
    fn claim_body_format(&self, format: u32) -> Result<(), StorageError> {
        self.inner().claim_body_format(format)
    }
}

// ------------------------------------------------------------------ WIT values -> neutral JSON

fn state_name(s: State) -> &'static str {
    match s {
        State::InFlight => "in-flight",
        State::Confirmed => "confirmed",
        State::Failed => "failed",
        State::Unknown => "unknown",
        State::Absent => "absent",
        State::Superseded => "superseded",
        State::AwaitingApproval => "awaiting-approval",
        State::Denied => "denied",
    }
}

fn opt_state(s: Option<State>) -> Value {
    s.map_or(Value::Null, |s| json!(state_name(s)))
}

fn reason_name(r: BlockReason) -> &'static str {
    match r {
        BlockReason::RouteBlocked => "route-blocked",
        BlockReason::DescriptorChanged => "descriptor-changed",
        BlockReason::Quota => "quota",
        BlockReason::AttemptBudget => "attempt-budget",
        BlockReason::IdentityRequired => "identity-required",
        BlockReason::IdentityConflict => "identity-conflict",
        BlockReason::PayloadRequired => "payload-required",
        BlockReason::Superseded => "superseded",
        BlockReason::SupersededUnresolved => "superseded-unresolved",
        BlockReason::SupersededConfirmed => "superseded-confirmed",
        BlockReason::SupersedesMissing => "supersedes-missing",
        BlockReason::Expired => "expired",
        BlockReason::Unverified => "unverified",
        BlockReason::Storage => "storage",
        BlockReason::Failed => "failed",
        BlockReason::OtherOwner => "other-owner",
        BlockReason::ApprovalDenied => "approval-denied",
        BlockReason::OtherAccount => "other-account",
    }
}

fn via_name(v: ReplayVia) -> &'static str {
    match v {
        ReplayVia::Key => "key",
        ReplayVia::DerivedArgs => "derived-args",
        ReplayVia::Provider => "provider",
    }
}

fn route_name(r: Route) -> &'static str {
    match r {
        Route::Direct => "direct",
        Route::Protect => "protect",
        Route::Block => "block",
    }
}

fn identity_name(i: IdentityMode) -> &'static str {
    match i {
        IdentityMode::Required => "required",
        IdentityMode::Derived => "derived",
    }
}

fn key_source_name(k: KeySource) -> &'static str {
    match k {
        KeySource::Application => "application",
        KeySource::Derived => "derived",
    }
}

fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::Happened => "happened",
        Effect::None => "none",
        Effect::Unknown => "unknown",
    }
}

fn repeat_name(r: Repeat) -> &'static str {
    match r {
        Repeat::Replays => "replays",
        Repeat::Waits => "waits",
        Repeat::Retries => "retries",
        Repeat::Refused => "refused",
    }
}

fn confirmation_name(c: Confirmation) -> &'static str {
    match c {
        Confirmation::Answer => "answer",
        Confirmation::Provider => "provider",
        Confirmation::Operator => "operator",
    }
}

fn wait_reason_name(r: WaitReason) -> &'static str {
    match r {
        WaitReason::Holder => "holder",
        WaitReason::Reconciliation => "reconciliation",
        WaitReason::Retry => "retry",
    }
}

fn kind_name(k: JsonErrorKind) -> &'static str {
    match k {
        JsonErrorKind::Syntax => "syntax",
        JsonErrorKind::TrailingData => "trailing-data",
        JsonErrorKind::DuplicateKey => "duplicate-key",
        JsonErrorKind::LoneSurrogate => "lone-surrogate",
        JsonErrorKind::InvalidUtf8 => "invalid-utf8",
        JsonErrorKind::NonFiniteNumber => "non-finite-number",
        JsonErrorKind::NumberOutOfRange => "number-out-of-range",
        JsonErrorKind::InexactNumber => "inexact-number",
        JsonErrorKind::TooDeep => "too-deep",
        JsonErrorKind::TooLarge => "too-large",
    }
}

fn render_json_error(e: &JsonError) -> Value {
    json!({"kind": kind_name(e.kind), "pointer": e.pointer, "offset": e.offset, "message": e.message})
}

fn render_error(e: &Error) -> Value {
    let inner = match e {
        Error::InvalidJson(j) => json!({"invalid-json": render_json_error(j)}),
        Error::InvalidRequest(m) => json!({"invalid-request": m}),
        Error::InvalidPolicy(m) => json!({"invalid-policy": m}),
        Error::Storage(m) => json!({"storage": m}),
        Error::NotFound => json!("not-found"),
        Error::FenceMismatch => json!("fence-mismatch"),
        Error::InvalidTransition(m) => json!({"invalid-transition": m}),
        Error::NotConfigured => json!("not-configured"),
    };
    json!({ "error": inner })
}

fn render_grant(g: &Grant) -> Value {
    json!({
        "scope": g.scope, "key": g.key, "tool": g.tool, "attempt": g.attempt, "fence": g.fence,
        "provider-key": g.provider_key, "args": g.args, "lease-until": g.lease_until, "send-by": g.send_by,
        "timeout-ms": g.timeout_ms,
    })
}

fn render_confirmed(c: &ConfirmedInfo) -> Value {
    json!({
        "receipt": c.receipt, "replayed": c.replayed, "via": c.via.map(via_name),
        "confirmed-by": confirmation_name(c.confirmed_by), "at": c.at, "window-until": c.window_until,
        "attempt": c.attempt, "earlier-attempts": effect_name(c.earlier_attempts),
        "possible-duplicate": c.possible_duplicate,
    })
}

fn render_rejected(r: &RejectedInfo) -> Value {
    json!({"error": r.error, "attempt": r.attempt})
}

fn render_unknown(u: &UnknownInfo) -> Value {
    json!({"since": u.since, "deadline": u.deadline, "reason": u.reason, "next-read": u.next_read})
}

fn render_in_flight(i: &InFlightInfo) -> Value {
    json!({"lease-until": i.lease_until})
}

fn render_summary(s: &RecordSummary) -> Value {
    json!({
        "key": s.key, "tool": s.tool, "fingerprint": s.fingerprint, "args": s.args,
        "state": state_name(s.state), "created-at": s.created_at,
    })
}

fn render_blocked(b: &Blocked) -> Value {
    json!({"reason": reason_name(b.reason), "detail": b.detail, "receipt": b.receipt})
}

fn render_decision(d: &Decision) -> Value {
    match d {
        Decision::Execute(g) => json!({ "execute": render_grant(g) }),
        Decision::Replay(c) => json!({ "replay": render_confirmed(c) }),
        Decision::Conflict(s) => json!({ "conflict": render_summary(s) }),
        Decision::InFlight(i) => json!({ "in-flight": render_in_flight(i) }),
        Decision::Unknown(u) => json!({ "unknown": render_unknown(u) }),
        Decision::AwaitingApproval(p) => json!({ "awaiting-approval": render_approval(p) }),
        Decision::Blocked(b) => json!({ "blocked": render_blocked(b) }),
        Decision::Direct => json!("direct"),
    }
}

fn render_awaited(a: &Awaited) -> Value {
    match a {
        Awaited::Pending(i) => json!({ "pending": render_in_flight(i) }),
        Awaited::Rejected(r) => json!({ "rejected": render_rejected(r) }),
        Awaited::Decided(d) => json!({ "decided": render_decision(d) }),
    }
}

fn render_ack(a: &FinishAck) -> Value {
    match a {
        FinishAck::Recorded(s) => json!({"recorded": state_name(*s)}),
        FinishAck::Ignored(s) => json!({"ignored": state_name(*s)}),
        FinishAck::Unrecorded => json!("unrecorded"),
    }
}

fn render_ending(e: &Ending) -> Value {
    match e {
        Ending::Confirmed(c) => json!({ "confirmed": render_confirmed(c) }),
        Ending::Rejected(r) => json!({ "rejected": render_rejected(r) }),
        Ending::NotSent(n) => json!({"not-sent": {"attempts": n.attempts}}),
        Ending::Unknown(u) => json!({ "unknown": render_unknown(u) }),
        Ending::InFlight(i) => json!({ "in-flight": render_in_flight(i) }),
        Ending::Conflict(s) => json!({ "conflict": render_summary(s) }),
        Ending::Blocked(b) => json!({ "blocked": render_blocked(b) }),
        Ending::Unrecorded(u) => json!({"unrecorded": {"response": u.response}}),
        Ending::AwaitsApproval(p) => json!({ "awaits-approval": render_approval(p) }),
    }
}

fn render_approval(p: &ApprovalInfo) -> Value {
    json!({"asked-at": p.asked_at, "reason": p.reason, "valid-ms": p.valid_ms, "wait-until": p.wait_until})
}

fn render_account(a: &Account) -> Value {
    json!({
        "scope": a.scope, "key": a.key, "key-source": a.key_source.map(key_source_name), "tool": a.tool,
        "ending": render_ending(&a.ending), "effect": effect_name(a.effect), "repeat": repeat_name(a.repeat),
        "awaits-operator": a.awaits_operator,
    })
}

fn render_step(s: &Step) -> Value {
    match s {
        Step::Dispatch(g) => json!({ "dispatch": render_grant(g) }),
        Step::Wait(w) => json!({"wait": {
            "scope": w.scope, "key": w.key, "next": w.next, "until": w.until,
            "reason": wait_reason_name(w.reason), "meanwhile": render_account(&w.meanwhile),
        }}),
        Step::Read(r) => json!({"read": {
            "scope": r.scope, "key": r.key, "tool": r.tool, "provider-key": r.provider_key, "args": r.args,
            "asked-at": r.asked_at,
        }}),
        Step::Done(a) => json!({ "done": render_account(a) }),
        Step::Direct => json!("direct"),
    }
}

fn render_event(e: &AuditEvent) -> Value {
    json!({
        "scope": e.scope, "key": e.key, "version": e.version, "at": e.at, "kind": e.kind,
        "from-state": opt_state(e.from_state), "to-state": opt_state(e.to_state),
        "attempt": e.attempt, "detail": e.detail,
    })
}

fn render_view(v: &RecordView) -> Value {
    json!({
        "scope": v.scope, "key": v.key, "key-source": key_source_name(v.key_source),
        "tool": v.tool, "fingerprint": v.fingerprint, "args": v.args, "provider-key": v.provider_key,
        "owner": v.owner, "state": state_name(v.state), "version": v.version, "attempts": v.attempts,
        "receipt": v.receipt, "error": v.error, "escalated": v.escalated,
        "possible-duplicate": v.possible_duplicate, "supersedes": v.supersedes,
        "superseded-by": v.superseded_by, "replays": v.replays, "conflicts": v.conflicts,
        "created-at": v.created_at, "updated-at": v.updated_at,
        "resolvable": {
            "confirmed": v.resolvable.confirmed, "absent": v.resolvable.absent,
            "absent-needs-force": v.resolvable.absent_needs_force, "approve": v.resolvable.approve,
        },
        "body": v.body,
        "audit": v.audit.iter().map(render_event).collect::<Vec<_>>(),
    })
}

fn render_escalation(e: &Escalation) -> Value {
    json!({
        "id": e.id, "scope": e.scope, "key": e.key, "tool": e.tool,
        "state": state_name(e.state), "reason": e.reason, "deadline": e.deadline,
    })
}

fn render_sweep(r: &SweepResult) -> Value {
    json!({
        "expired": r.expired, "reconciled": r.reconciled, "confirmed": r.confirmed, "escalated": r.escalated,
        "owed": r.owed.iter().map(|(s, k)| json!([s, k])).collect::<Vec<_>>(),
        "dispatches": r.dispatches.iter().map(render_grant).collect::<Vec<_>>(),
        "reads": r.reads.iter().map(|(s, k)| json!([s, k])).collect::<Vec<_>>(),
    })
}

fn render_prune(r: &PruneReport) -> Value {
    json!({"pruned": r.pruned, "tombstones-removed": r.tombstones_removed})
}

fn render_policy(p: &ToolPolicy) -> Value {
    json!({
        "route": p.route.map(route_name), "identity": identity_name(p.identity),
        "key-argument": p.key_argument, "key-sent-by-host": p.key_sent_by_host,
        "effect-fields": p.effect_fields, "verify-first": p.verify_first,
        "provider-claims-key": p.provider_claims_key, "lookup": p.lookup,
        "max-in-flight-ms": p.max_in_flight_ms, "dispatch-timeout-ms": p.dispatch_timeout_ms,
        "lease-ms": p.lease_ms, "attempt-budget": p.attempt_budget,
        "derived-window-ms": p.derived_window_ms, "resolve-deadline-ms": p.resolve_deadline_ms,
        "reconcile-interval-ms": p.reconcile_interval_ms, "retention-ms": p.retention_ms,
        "tombstone-retention-ms": p.tombstone_retention_ms,
        "quota": p.quota.as_ref().map(|q| json!({
            "spend-field": q.spend_field, "ceiling": q.ceiling, "decimals": q.decimals,
            "window-ms": q.window_ms, "bucket": q.bucket,
        })),
        "descriptor-pin": p.descriptor_pin,
        "approval": render_approval_rule(&p.approval), "approval-valid-ms": p.approval_valid_ms,
        "approval-wait-ms": p.approval_wait_ms, "provider-account": p.provider_account,
    })
}

fn render_approval_rule(r: &ApprovalRule) -> Value {
    match r {
        ApprovalRule::Never => json!("never"),
        ApprovalRule::Always => json!("always"),
        ApprovalRule::Above(t) => json!({"above": {"field": t.field, "above": t.above}}),
    }
}

fn render_configured(c: &Configured) -> Value {
    json!({
        "body-format": c.body_format,
        "defaults": render_policy(&c.defaults),
        "tools": c.tools.iter().map(|t| json!({
            "tool": t.tool, "route": route_name(t.route), "blocked": t.blocked, "policy": render_policy(&t.policy),
        })).collect::<Vec<_>>(),
    })
}

/// The transcript's byte form: keys sorted, no whitespace, non-ASCII as is.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", serde_json::to_string(k).unwrap(), canonical(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical).collect::<Vec<_>>().join(",")),
        other => serde_json::to_string(other).unwrap(),
    }
}

// ------------------------------------------------------------------ neutral JSON -> WIT values

type Res<T> = Result<T, String>;

fn text(v: &Value, what: &str) -> Res<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what}: expected a string, got {v}"))
}

fn opt_text(v: &Value, what: &str) -> Res<Option<String>> {
    if v.is_null() { Ok(None) } else { text(v, what).map(Some) }
}

fn num(v: &Value, what: &str) -> Res<u64> {
    v.as_u64()
        .ok_or_else(|| format!("{what}: expected an unsigned integer, got {v}"))
}

fn opt_num(v: &Value, what: &str) -> Res<Option<u64>> {
    if v.is_null() { Ok(None) } else { num(v, what).map(Some) }
}

fn small(v: &Value, what: &str) -> Res<u32> {
    u32::try_from(num(v, what)?).map_err(|_| format!("{what}: too large"))
}

fn flag(v: &Value, what: &str) -> Res<bool> {
    v.as_bool()
        .ok_or_else(|| format!("{what}: expected a boolean, got {v}"))
}

fn opt_flag(v: &Value, what: &str) -> Res<Option<bool>> {
    if v.is_null() { Ok(None) } else { flag(v, what).map(Some) }
}

fn parse_route(v: &Value) -> Res<Route> {
    match v.as_str() {
        Some("direct") => Ok(Route::Direct),
        Some("protect") => Ok(Route::Protect),
        Some("block") => Ok(Route::Block),
        _ => Err(format!("route: {v}")),
    }
}

/// A scenario's policy (an object of `policy-input` fields by WIT name; a
/// field not given, or `null`, is unset and the engine fills it).
fn parse_policy(overrides: &Value) -> Res<PolicyInput> {
    let mut p = once::policy_input();
    let Some(map) = overrides.as_object() else {
        return Err(format!("policy: expected an object, got {overrides}"));
    };
    for (k, v) in map {
        match k.as_str() {
            "route" => p.route = if v.is_null() { None } else { Some(parse_route(v)?) },
            "identity" => {
                p.identity = match v.as_str() {
                    None if v.is_null() => None,
                    Some("required") => Some(IdentityMode::Required),
                    Some("derived") => Some(IdentityMode::Derived),
                    _ => return Err(format!("identity: {v}")),
                }
            }
            "key-argument" => p.key_argument = opt_text(v, k)?,
            "key-sent-by-host" => p.key_sent_by_host = opt_flag(v, k)?,
            "effect-fields" => {
                p.effect_fields = match v {
                    Value::Null => None,
                    Value::Array(a) => Some(a.iter().map(|f| text(f, k)).collect::<Res<_>>()?),
                    _ => return Err(format!("effect-fields: {v}")),
                }
            }
            "verify-first" => p.verify_first = opt_flag(v, k)?,
            "provider-claims-key" => p.provider_claims_key = opt_flag(v, k)?,
            "lookup" => p.lookup = opt_flag(v, k)?,
            "max-in-flight-ms" => p.max_in_flight_ms = opt_num(v, k)?,
            "dispatch-timeout-ms" => p.dispatch_timeout_ms = opt_num(v, k)?,
            "lease-ms" => p.lease_ms = opt_num(v, k)?,
            "attempt-budget" => p.attempt_budget = if v.is_null() { None } else { Some(small(v, k)?) },
            "derived-window-ms" => p.derived_window_ms = opt_num(v, k)?,
            "resolve-deadline-ms" => p.resolve_deadline_ms = opt_num(v, k)?,
            "reconcile-interval-ms" => p.reconcile_interval_ms = opt_num(v, k)?,
            "retention-ms" => p.retention_ms = opt_num(v, k)?,
            "tombstone-retention-ms" => p.tombstone_retention_ms = opt_num(v, k)?,
            "descriptor-pin" => p.descriptor_pin = opt_text(v, k)?,
            "approval-valid-ms" => p.approval_valid_ms = opt_num(v, k)?,
            "approval-wait-ms" => p.approval_wait_ms = opt_num(v, k)?,
            "provider-account" => p.provider_account = opt_text(v, k)?,
            "approval" => {
                p.approval = match v {
                    Value::Null => None,
                    v => Some(match case(v)? {
                        (tag, _) if tag == "never" => ApprovalRule::Never,
                        (tag, _) if tag == "always" => ApprovalRule::Always,
                        (tag, t) if tag == "above" => ApprovalRule::Above(ApprovalThreshold {
                            field: text(&t["field"], "approval field")?,
                            above: text(&t["above"], "approval above")?,
                        }),
                        (other, _) => return Err(format!("approval {other:?}")),
                    }),
                }
            }
            "quota" => {
                p.quota = if v.is_null() {
                    None
                } else {
                    Some(QuotaInput {
                        spend_field: text(&v["spend-field"], "spend-field")?,
                        ceiling: text(&v["ceiling"], "ceiling")?,
                        decimals: match opt_num(&v["decimals"], "decimals")? {
                            None => None,
                            Some(d) => Some(u8::try_from(d).map_err(|_| "decimals: too large")?),
                        },
                        window_ms: num(&v["window-ms"], "window-ms")?,
                        bucket: opt_text(&v["bucket"], "bucket")?,
                    })
                }
            }
            other => return Err(format!("unknown policy field {other:?}")),
        }
    }
    Ok(p)
}

fn parse_descriptor(v: &Value) -> Res<Option<ToolDescriptor>> {
    if v.is_null() {
        return Ok(None);
    }
    Ok(Some(ToolDescriptor {
        name: text(&v["name"], "descriptor name")?,
        input_schema: text(&v["input-schema"], "input-schema")?,
        annotations: opt_text(&v["annotations"], "annotations")?,
    }))
}

/// A configuration in its neutral form: `{"settings", "defaults", "tools": [{"tool", "policy", "descriptor"}]}`,
/// every policy already an object of overrides.
fn parse_configuration(v: &Value, ledger_encoding: LedgerEncoding) -> Res<Configuration> {
    let mut settings = default_settings();
    apply_settings(&mut settings, &v["settings"])?;
    Ok(Configuration {
        settings,
        defaults: parse_policy(&v["defaults"])?,
        tools: v["tools"]
            .as_array()
            .ok_or("configuration: tools must be a list")?
            .iter()
            .map(|t| {
                Ok(ToolConfig {
                    tool: text(&t["tool"], "tool")?,
                    policy: parse_policy(&t["policy"])?,
                    descriptor: parse_descriptor(&t["descriptor"])?,
                })
            })
            .collect::<Res<_>>()?,
        ledger_encoding,
        // As every runner: the transcripts hold the reads made inside the steps.
        reads: ProviderReads::Import,
    })
}

/// A one-key object `{"case": payload}` or a bare `"case"`.
fn case(v: &Value) -> Res<(String, Value)> {
    match v {
        Value::String(s) => Ok((s.clone(), Value::Null)),
        Value::Object(m) if m.len() == 1 => {
            let (k, v) = m.iter().next().unwrap();
            Ok((k.clone(), v.clone()))
        }
        _ => Err(format!("expected a variant case, got {v}")),
    }
}

fn parse_outcome(v: &Value) -> Res<Outcome> {
    let (tag, payload) = case(v)?;
    Ok(match tag.as_str() {
        "success" => Outcome::Success(text(&payload, "success")?),
        "rejected" => Outcome::Rejected(text(&payload, "rejected")?),
        "ambiguous" => Outcome::Ambiguous(text(&payload, "ambiguous")?),
        "not-sent" => Outcome::NotSent,
        other => return Err(format!("outcome {other:?}")),
    })
}

fn parse_evidence(v: &Value) -> Res<Evidence> {
    let (tag, payload) = case(v)?;
    Ok(match tag.as_str() {
        "confirmed" => Evidence::Confirmed(text(&payload, "confirmed")?),
        "absent" => Evidence::Absent(num(&payload, "absent")?),
        "unknown" => Evidence::Unknown(text(&payload, "unknown")?),
        other => return Err(format!("evidence {other:?}")),
    })
}

fn parse_resolution(v: &Value) -> Res<Resolution> {
    let (tag, payload) = case(v)?;
    Ok(match tag.as_str() {
        "confirmed" => Resolution::Confirmed(text(&payload, "confirmed")?),
        "absent" => Resolution::Absent,
        "approve" => Resolution::Approve,
        "deny" => Resolution::Deny,
        other => return Err(format!("resolution {other:?}")),
    })
}

/// The engine's default settings, from the component's own `default-settings`.
fn default_settings() -> Settings {
    static DEFAULTS: OnceLock<Settings> = OnceLock::new();
    DEFAULTS
        .get_or_init(|| runtime().default_settings().expect("default-settings"))
        .clone()
}

/// Settings overrides (`null`: none) applied to `s`.
fn apply_settings(s: &mut Settings, v: &Value) -> Res<()> {
    if v.is_null() {
        return Ok(());
    }
    for (k, v) in v.as_object().ok_or("settings: expected an object")? {
        match k.as_str() {
            "max-input-bytes" => s.max_input_bytes = small(v, k)?,
            "max-depth" => s.max_depth = small(v, k)?,
            "max-key-bytes" => s.max_key_bytes = small(v, k)?,
            "clock-skew-ms" => s.clock_skew_ms = num(v, k)?,
            "owner" => s.owner = text(v, k)?,
            other => return Err(format!("unknown setting {other:?}")),
        }
    }
    Ok(())
}

fn render_settings(s: &Settings) -> Value {
    json!({
        "max-input-bytes": s.max_input_bytes, "max-depth": s.max_depth, "max-key-bytes": s.max_key_bytes,
        "clock-skew-ms": s.clock_skew_ms, "owner": s.owner,
    })
}

// ------------------------------------------------------------------ vectors

fn vector_text(path: &str) -> Res<String> {
    std::fs::read_to_string(vectors_dir().join(path)).map_err(|e| format!("vector {path}: {e}"))
}

fn vector_bytes(path: &str) -> Res<Vec<u8>> {
    std::fs::read(vectors_dir().join(path)).map_err(|e| format!("vector {path}: {e}"))
}

fn hex_bytes(s: &str) -> Res<Vec<u8>> {
    s.split_whitespace()
        .flat_map(|w| {
            // "7b 22" or "7b22": pairs of hex digits.
            w.as_bytes()
                .chunks(2)
                .map(|c| std::str::from_utf8(c).unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .map(|pair| u8::from_str_radix(&pair, 16).map_err(|_| format!("bad hex {pair:?}")))
        .collect()
}

fn csv_value(path: &str, key: &str) -> Res<String> {
    let text = vector_text(path)?;
    text.lines()
        .filter_map(|l| l.split_once(','))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .ok_or_else(|| format!("{path}: no row {key:?}"))
}

// ------------------------------------------------------------------ a scenario run

/// One component instance over the scenario's store, and the configuration
/// it was last configured with (neutral JSON), so it is reconfigured only
/// when a step needs another one.
struct Agent {
    instance: Instance,
    configured: Option<Value>,
    generation: u64,
    /// Which encoding of the ledger's `get` and `commit` it configures.
    encoding: LedgerEncoding,
}

impl Agent {
    /// Configure the instance as `configuration` unless it already is; a
    /// refusal is the step's answer (the instance keeps its configuration).
    fn ensure(&mut self, configuration: &Value) -> Res<Option<Value>> {
        if self.configured.as_ref() == Some(configuration) {
            return Ok(None);
        }
        Ok(self.configure(configuration)?.err())
    }

    /// The `configure` export: `Ok(configured)`, or `Err(the rendered error)`.
    fn configure(&mut self, configuration: &Value) -> Res<Result<Value, Value>> {
        let wit = parse_configuration(configuration, self.encoding)?;
        self.generation += 1;
        match self.instance.configure(&wit, self.generation) {
            Ok(Ok(c)) => {
                self.configured = Some(configuration.clone());
                Ok(Ok(render_configured(&c)))
            }
            Ok(Err(e)) => Ok(Err(render_error(&e))),
            Err(trap) => Err(format!("trap: {trap}")),
        }
    }
}

struct Run {
    name: String,
    scenario: Value,
    env: Arc<Env>,
    storage: Arc<Scripted>,
    start: u64,
    encoding: LedgerEncoding,
    vars: Mutex<BTreeMap<String, Value>>,
    transcript: Mutex<Vec<String>>,
    failures: Mutex<Vec<String>>,
    /// The racing agent: runs the steps of a `race` inside another agent's commit.
    other: Mutex<Option<Agent>>,
}

impl Run {
    fn agent(&self) -> Agent {
        let rt = runtime();
        let state = HostState {
            storage: self.storage.clone(),
            clock: Arc::new(EnvClock(self.env.clone())),
            provider: self.env.clone(),
            operator: self.env.clone(),
            entropy: Arc::new(once::FixedEntropy(ENTROPY.to_vec())),
        };
        Agent {
            instance: rt.instantiate(state).expect("instantiating the component"),
            configured: None,
            generation: 0,
            encoding: self.encoding,
        }
    }

    /// The settings the host runs with now, neutral.
    fn settings(&self) -> Value {
        render_settings(&lock(&self.env.settings))
    }

    /// What a step that is not a call needs: the current settings (any tools).
    fn ensure_settings(&self, agent: &mut Agent) -> Res<Option<Value>> {
        let settings = self.settings();
        if agent.configured.as_ref().is_some_and(|c| c["settings"] == settings) {
            return Ok(None);
        }
        agent.ensure(&json!({"settings": settings, "defaults": {}, "tools": []}))
    }

    /// What a `begin` or `start` needs: its tool with the step's policy and
    /// descriptor (none of either: the engine's defaults for every tool).
    fn ensure_tool(&self, agent: &mut Agent, tool: &str, policy: Value, descriptor: Value) -> Res<Option<Value>> {
        let tools = if policy.as_object().is_some_and(Map::is_empty) && descriptor.is_null() {
            json!([])
        } else {
            json!([{"tool": tool, "policy": policy, "descriptor": descriptor}])
        };
        agent.ensure(&json!({"settings": self.settings(), "defaults": {}, "tools": tools}))
    }

    fn fail(&self, label: &str, msg: String) {
        lock(&self.failures).push(format!("{} step {label}: {msg}", self.name));
    }

    fn defaults(&self, step: &Value, field: &str) -> Value {
        match step.get(field) {
            Some(v) => v.clone(),
            None => self.scenario["defaults"].get(field).cloned().unwrap_or(Value::Null),
        }
    }

    /// A step's policy as an object of `policy-input` overrides: a name from
    /// `policies`, an object, or `null` (nothing set).
    fn policy(&self, v: &Value) -> Res<Value> {
        let p = match v {
            Value::Null => json!({}),
            Value::String(name) => self.scenario["policies"]
                .get(name)
                .cloned()
                .ok_or_else(|| format!("no policy named {name:?}"))?,
            other => other.clone(),
        };
        parse_policy(&p)?; // refuse an unknown field here, in every runner alike
        Ok(p)
    }

    /// Replace `{"$": "var/path"}`, `{"$t": n}`, `{"$now": n}`, `{"$file": p}` in an input.
    fn resolve(&self, v: &Value, now: u64) -> Res<Value> {
        if let Some((op, arg)) = special(v) {
            return match op {
                "$" => self.var(arg),
                "$t" => offset(self.start, arg).map(Value::from),
                "$now" => offset(now, arg).map(Value::from),
                "$file" => Ok(json!(vector_text(&text(arg, "$file")?)?)),
                other => Err(format!("{other} is not allowed in an input")),
            };
        }
        Ok(match v {
            Value::Array(a) => Value::Array(a.iter().map(|x| self.resolve(x, now)).collect::<Res<_>>()?),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| Ok((k.clone(), self.resolve(x, now)?)))
                    .collect::<Res<Map<_, _>>>()?,
            ),
            other => other.clone(),
        })
    }

    fn var(&self, path: &Value) -> Res<Value> {
        let path = text(path, "$")?;
        let mut parts = path.split('/');
        let name = parts.next().unwrap_or_default();
        let vars = lock(&self.vars);
        let mut cur = vars.get(name).ok_or_else(|| format!("no saved result {name:?}"))?;
        for part in parts {
            cur = match cur {
                Value::Object(m) => m.get(part),
                Value::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| format!("{path}: nothing at {part:?}"))?;
        }
        Ok(cur.clone())
    }

    fn run(self: &Arc<Self>) {
        let mut agent = self.agent();
        let steps = self.scenario["steps"].as_array().cloned().unwrap_or_default();
        for (i, step) in steps.iter().enumerate() {
            self.step(&mut agent, step, &(i + 1).to_string());
        }
        if lock(&self.storage.race).take().is_some() {
            self.fail("end", "a race was armed but no commit followed".to_string());
        }
    }

    fn step(self: &Arc<Self>, agent: &mut Agent, step: &Value, label: &str) {
        let now = self.env.clock.now();
        let op = step["op"].as_str().unwrap_or("").to_string();
        if EXPORTS.contains(&op.as_str()) && step.get("expect").is_none() {
            self.fail(
                label,
                format!("{op}: a step that calls the component needs an \"expect\""),
            );
        }
        let lookups_before = lock(&self.env.lookups).len();
        let escalations_before = lock(&self.env.escalations).len();
        let result = match self.exec(agent, &op, step, label, now) {
            Ok(v) => v,
            Err(e) => {
                self.fail(label, format!("{op}: {e}"));
                return;
            }
        };
        let lookups: Vec<Value> = lock(&self.env.lookups)[lookups_before..].to_vec();
        let escalations: Vec<Value> = lock(&self.env.escalations)[escalations_before..].to_vec();
        if let Some(name) = step.get("as").and_then(Value::as_str) {
            let mut vars = lock(&self.vars);
            vars.insert(name.to_string(), result.clone());
            vars.insert(format!("{name}:lookups"), Value::Array(lookups.clone()));
            vars.insert(format!("{name}:escalations"), Value::Array(escalations.clone()));
        }
        let mut records = Vec::new();
        let checks: Vec<Value> = match step.get("records") {
            Some(Value::Array(a)) => a.clone(),
            Some(one) => vec![one.clone()],
            None => Vec::new(),
        };
        for check in &checks {
            let scope = self.resolve(&self.defaults(check, "scope"), now).unwrap_or(Value::Null);
            let key = self.resolve(&check["key"], now).unwrap_or(Value::Null);
            let (Some(scope), Some(key)) = (scope.as_str(), key.as_str()) else {
                self.fail(label, format!("a record check needs a scope and a key: {check}"));
                continue;
            };
            let view = self.call_inspect(agent, scope, key);
            records.push(view.clone());
            if let Some(v) = view.as_object().filter(|v| v.contains_key("audit")) {
                audit_invariants(v).unwrap_or_else(|e| self.fail(label, format!("record {scope}/{key}: {e}")));
            }
            let mut pattern = check.clone();
            let pm = pattern.as_object_mut().unwrap();
            pm.remove("scope");
            pm.remove("key");
            let exists = pm.remove("exists");
            let kinds = pm.remove("kinds");
            if exists == Some(Value::Bool(false)) {
                if !view.is_null() {
                    self.fail(label, format!("record {scope}/{key} should not exist, got {view}"));
                }
                continue;
            }
            if view.is_null() || is_error(&view) {
                self.fail(label, format!("record {scope}/{key}: expected a record, got {view}"));
                continue;
            }
            let mut errs = Vec::new();
            self.matches(&pattern, &view, &format!("record {scope}/{key}"), now, &mut errs);
            if let Some(kinds) = kinds {
                let actual: Vec<Value> = view["audit"]
                    .as_array()
                    .map(|a| a.iter().map(|e| e["kind"].clone()).collect())
                    .unwrap_or_default();
                self.matches(
                    &kinds,
                    &Value::Array(actual),
                    &format!("record {scope}/{key} kinds"),
                    now,
                    &mut errs,
                );
            }
            for e in errs {
                self.fail(label, e);
            }
        }
        let store = self.storage.counts();
        let mut errs = Vec::new();
        if let Some(p) = step.get("expect") {
            self.matches(p, &result, "result", now, &mut errs);
        }
        if let Some(p) = step.get("lookups") {
            self.matches(p, &Value::Array(lookups.clone()), "lookups", now, &mut errs);
        }
        if let Some(p) = step.get("escalations") {
            self.matches(p, &Value::Array(escalations.clone()), "escalations", now, &mut errs);
        }
        if let Some(p) = step.get("store") {
            self.matches(p, &store, "store", now, &mut errs);
        }
        for e in errs {
            self.fail(label, e);
        }
        let line = json!({
            "scenario": self.name, "step": label, "op": op, "result": result,
            "lookups": lookups, "escalations": escalations, "records": records, "store": store,
        });
        lock(&self.transcript).push(canonical(&line));
    }

    fn call_inspect(&self, agent: &mut Agent, scope: &str, key: &str) -> Value {
        match self.ensure_settings(agent) {
            Ok(None) => {}
            Ok(Some(error)) => return error,
            Err(e) => return json!({"trap": e}),
        }
        match agent.instance.inspect(scope, key) {
            Ok(Ok(Some(v))) => render_view(&v),
            Ok(Ok(None)) => Value::Null,
            Ok(Err(e)) => render_error(&e),
            Err(trap) => json!({"trap": trap.to_string()}),
        }
    }

    fn exec(self: &Arc<Self>, agent: &mut Agent, op: &str, step: &Value, label: &str, now: u64) -> Res<Value> {
        let input = |field: &str| -> Res<Value> { self.resolve(&self.defaults(step, field), now) };
        Ok(match op {
            // ---- host-side script
            "advance" => {
                let ms = input("ms")?;
                let ms = ms
                    .as_i64()
                    .ok_or_else(|| format!("ms: expected an integer, got {ms}"))?;
                self.env.clock.advance(ms)?;
                Value::Null
            }
            "lookup" => {
                let evidence = input("evidence")?;
                let list = evidence.as_array().ok_or("evidence: expected a list")?;
                for e in list {
                    lock(&self.env.evidence).push_back(parse_evidence(e)?);
                }
                Value::Null
            }
            "fail-commits" => {
                self.storage
                    .fail_commits
                    .store(small(&input("n")?, "n")?, Ordering::SeqCst);
                Value::Null
            }
            "lose-commit-replies" => {
                self.storage
                    .lose_replies
                    .store(small(&input("n")?, "n")?, Ordering::SeqCst);
                Value::Null
            }
            "fail-reads" => {
                self.storage
                    .fail_reads
                    .store(flag(&input("on")?, "on")?, Ordering::SeqCst);
                Value::Null
            }
            "ack-escalations" => {
                self.env.ack.store(flag(&input("ack")?, "ack")?, Ordering::SeqCst);
                Value::Null
            }
            "settings" => {
                apply_settings(&mut lock(&self.env.settings), &input("set")?)?;
                Value::Null
            }
            "wipe-ledger" => {
                self.storage.wipe();
                Value::Null
            }
            "race" => {
                let steps = step["steps"].as_array().cloned().ok_or("race: expected steps")?;
                let run = self.clone();
                let label = label.to_string();
                *lock(&self.storage.race) = Some(Box::new(move || {
                    let mut other = lock(&run.other);
                    let other = other.get_or_insert_with(|| run.agent());
                    for (i, inner) in steps.iter().enumerate() {
                        run.step(other, inner, &format!("{label}.{}", i + 1));
                    }
                }));
                Value::Null
            }
            // ---- the exports
            export => self.call(agent, export, step, now)?,
        })
    }

    /// The `call` record of a `begin` or `start` step.
    fn call_of(&self, step: &Value, now: u64) -> Res<Call> {
        let input = |field: &str| -> Res<Value> { self.resolve(&self.defaults(step, field), now) };
        let keys = match step.get("keys") {
            Some(k) => self
                .resolve(k, now)?
                .as_array()
                .ok_or("keys: expected a list of [carrier, key]")?
                .iter()
                .map(|pair| Ok((text(&pair[0], "carrier")?, text(&pair[1], "key")?)))
                .collect::<Res<Vec<_>>>()?,
            None => match input("key")? {
                Value::Null => Vec::new(),
                k => vec![("api".to_string(), text(&k, "key")?)],
            },
        };
        Ok(Call {
            scope: text(&input("scope")?, "scope")?,
            keys,
            tool: text(&input("tool")?, "tool")?,
            args: text(&input("args")?, "args")?,
            supersedes: opt_text(&input("supersedes")?, "supersedes")?,
            acknowledge_confirmed: input("acknowledge-confirmed")?.as_bool().unwrap_or(false),
        })
    }

    /// A step that calls an export. The instance is configured first as the
    /// step needs (a refusal is the step's result).
    fn call(&self, agent: &mut Agent, op: &str, step: &Value, now: u64) -> Res<Value> {
        let input = |field: &str| -> Res<Value> { self.resolve(&self.defaults(step, field), now) };
        let scope = || -> Res<String> { text(&input("scope")?, "scope") };
        let key = || -> Res<String> { text(&input("key")?, "key") };
        let trap = |e: once::OnceError| format!("trap: {e}");
        let refused = match op {
            "configure" => None,
            "begin" | "start" => {
                let tool = text(&input("tool")?, "tool")?;
                let policy = self.policy(&input("policy")?)?;
                self.ensure_tool(agent, &tool, policy, input("descriptor")?)?
            }
            _ if EXPORTS.contains(&op) => self.ensure_settings(agent)?,
            other => return Err(format!("unknown op {other:?}")),
        };
        if let Some(error) = refused {
            return Ok(error);
        }
        let a = &mut agent.instance;
        Ok(match op {
            "configure" => {
                let mut settings = lock(&self.env.settings).clone();
                apply_settings(&mut settings, &input("settings")?)?;
                let tools = match step.get("tools") {
                    None => Vec::new(),
                    Some(t) => t
                        .as_array()
                        .ok_or("tools: expected a list")?
                        .iter()
                        .map(|t| {
                            let tool = match t.get("tool") {
                                Some(name) => name.clone(),
                                None => input("tool")?,
                            };
                            let policy = self.policy(t.get("policy").unwrap_or(&Value::Null))?;
                            let descriptor = self.resolve(t.get("descriptor").unwrap_or(&Value::Null), now)?;
                            Ok(json!({"tool": tool, "policy": policy, "descriptor": descriptor}))
                        })
                        .collect::<Res<Vec<_>>>()?,
                };
                let configuration = json!({
                    "settings": render_settings(&settings),
                    "defaults": self.policy(step.get("defaults").unwrap_or(&Value::Null))?,
                    "tools": tools,
                });
                match agent.configure(&configuration)? {
                    Ok(c) | Err(c) => c,
                }
            }
            "begin" => match a.begin(&self.call_of(step, now)?).map_err(trap)? {
                Ok(d) => render_decision(&d),
                Err(e) => render_error(&e),
            },
            "start" => match a.start(&self.call_of(step, now)?).map_err(trap)? {
                Ok(s) => render_step(&s),
                Err(e) => render_error(&e),
            },
            "finish" => {
                let outcome = parse_outcome(&input("outcome")?)?;
                let fence = text(&input("fence")?, "fence")?;
                match a.finish(&scope()?, &key()?, &fence, &outcome).map_err(trap)? {
                    Ok(ack) => render_ack(&ack),
                    Err(e) => render_error(&e),
                }
            }
            "report" => {
                let outcome = parse_outcome(&input("outcome")?)?;
                let fence = text(&input("fence")?, "fence")?;
                match a.report(&scope()?, &key()?, &fence, &outcome).map_err(trap)? {
                    Ok(s) => render_step(&s),
                    Err(e) => render_error(&e),
                }
            }
            "resume" => match a.resume(&scope()?, &key()?).map_err(trap)? {
                Ok(s) => render_step(&s),
                Err(e) => render_error(&e),
            },
            "reconcile" => match a.reconcile(&scope()?, &key()?).map_err(trap)? {
                Ok(d) => render_decision(&d),
                Err(e) => render_error(&e),
            },
            "await-holder" => match a.await_holder(&scope()?, &key()?).map_err(trap)? {
                Ok(aw) => render_awaited(&aw),
                Err(e) => render_error(&e),
            },
            "sweep" => {
                let limit = input("limit")?.as_u64().unwrap_or(100) as u32;
                let dispatch = input("dispatch")?.as_bool().unwrap_or(false);
                match a.sweep(limit, dispatch).map_err(trap)? {
                    Ok(r) => render_sweep(&r),
                    Err(e) => render_error(&e),
                }
            }
            "prune" => {
                let limit = input("limit")?.as_u64().unwrap_or(100) as u32;
                match a.prune(limit).map_err(trap)? {
                    Ok(r) => render_prune(&r),
                    Err(e) => render_error(&e),
                }
            }
            "inspect" => match a.inspect(&scope()?, &key()?).map_err(trap)? {
                Ok(Some(v)) => render_view(&v),
                Ok(None) => Value::Null,
                Err(e) => render_error(&e),
            },
            "resolve" => {
                let resolution = parse_resolution(&input("resolution")?)?;
                let note = text(&input("note")?, "note")?;
                let force = input("force")?.as_bool().unwrap_or(false);
                match a.resolve(&scope()?, &key()?, &resolution, &note, force).map_err(trap)? {
                    Ok(state) => json!(state_name(state)),
                    Err(e) => render_error(&e),
                }
            }
            "canonicalize" => {
                let bytes = if let Some(t) = step.get("text") {
                    text(&self.resolve(t, now)?, "text")?.into_bytes()
                } else if let Some(h) = step.get("hex") {
                    hex_bytes(&text(h, "hex")?)?
                } else if let Some(f) = step.get("file") {
                    vector_bytes(&text(f, "file")?)?
                } else {
                    return Err("canonicalize needs text, hex or file".to_string());
                };
                match a.canonicalize(&bytes).map_err(trap)? {
                    Ok(t) => json!(t),
                    Err(e) => json!({"error": render_json_error(&e)}),
                }
            }
            "fingerprint" => {
                let tool = text(&input("tool")?, "tool")?;
                let args = text(&input("args")?, "args")?;
                match a.fingerprint(&tool, &args).map_err(trap)? {
                    Ok(t) => json!(t),
                    Err(e) => json!({"error": render_json_error(&e)}),
                }
            }
            other => return Err(format!("unknown op {other:?}")),
        })
    }

    /// Does `actual` match `pattern`? Differences go to `errs`.
    fn matches(&self, pattern: &Value, actual: &Value, path: &str, now: u64, errs: &mut Vec<String>) {
        let mut fail = |msg: String| errs.push(format!("{path}: {msg}"));
        if let Some((op, arg)) = special(pattern) {
            let expect_eq = |want: Res<Value>, errs: &mut Vec<String>| match want {
                Ok(w) if &w == actual => {}
                Ok(w) => errs.push(format!("{path}: expected {w}, got {actual}")),
                Err(e) => errs.push(format!("{path}: {e}")),
            };
            match op {
                "$" => expect_eq(self.var(arg), errs),
                "$t" => expect_eq(offset(self.start, arg).map(Value::from), errs),
                "$now" => expect_eq(offset(now, arg).map(Value::from), errs),
                "$file" => expect_eq(text(arg, "$file").and_then(|p| vector_text(&p)).map(Value::from), errs),
                "$hexfile" => expect_eq(
                    text(arg, "$hexfile")
                        .and_then(|p| vector_text(&p))
                        .and_then(|h| hex_bytes(&h))
                        .and_then(|b| String::from_utf8(b).map_err(|e| e.to_string()))
                        .map(Value::from),
                    errs,
                ),
                "$csv" => expect_eq(
                    (|| csv_value(&text(&arg[0], "$csv file")?, &text(&arg[1], "$csv key")?))().map(Value::from),
                    errs,
                ),
                "$not" => {
                    let mut inner = Vec::new();
                    self.matches(arg, actual, path, now, &mut inner);
                    if inner.is_empty() {
                        errs.push(format!("{path}: {actual} should not match {arg}"));
                    }
                }
                "$contains" => match (actual.as_str(), arg.as_str()) {
                    (Some(a), Some(b)) if a.contains(b) => {}
                    _ => errs.push(format!("{path}: {actual} does not contain {arg}")),
                },
                "$nonempty" => {
                    if actual.as_str().is_none_or(str::is_empty) {
                        errs.push(format!("{path}: expected a non-empty string, got {actual}"));
                    }
                }
                "$json" => match actual.as_str().map(serde_json::from_str::<Value>) {
                    Some(Ok(parsed)) => self.matches(arg, &parsed, &format!("{path} (JSON)"), now, errs),
                    _ => errs.push(format!("{path}: expected JSON text, got {actual}")),
                },
                "$len" => match (actual.as_array(), arg.as_u64()) {
                    (Some(a), Some(n)) if a.len() as u64 == n => {}
                    _ => errs.push(format!("{path}: expected {arg} elements, got {actual}")),
                },
                "$has" => {
                    let found = actual.as_array().is_some_and(|a| {
                        a.iter().any(|x| {
                            let mut e = Vec::new();
                            self.matches(arg, x, path, now, &mut e);
                            e.is_empty()
                        })
                    });
                    if !found {
                        errs.push(format!("{path}: no element matches {arg} in {actual}"));
                    }
                }
                "$count" => {
                    let n = actual.as_array().map_or(0, |a| {
                        a.iter()
                            .filter(|x| {
                                let mut e = Vec::new();
                                self.matches(&arg[0], x, path, now, &mut e);
                                e.is_empty()
                            })
                            .count()
                    });
                    if Some(n as u64) != arg[1].as_u64() {
                        errs.push(format!("{path}: {n} elements match {}, expected {}", arg[0], arg[1]));
                    }
                }
                "$tail" => match (actual.as_array(), arg.as_array()) {
                    (Some(a), Some(p)) if a.len() >= p.len() => {
                        let tail = Value::Array(a[a.len() - p.len()..].to_vec());
                        self.matches(&Value::Array(p.clone()), &tail, path, now, errs);
                    }
                    _ => errs.push(format!("{path}: {actual} does not end with {arg}")),
                },
                "$gt" | "$ge" | "$lt" | "$le" => {
                    let bound = self.resolve(arg, now).ok().and_then(|b| b.as_u64());
                    let ok = match (actual.as_u64(), bound) {
                        (Some(a), Some(b)) => match op {
                            "$gt" => a > b,
                            "$ge" => a >= b,
                            "$lt" => a < b,
                            _ => a <= b,
                        },
                        _ => false,
                    };
                    if !ok {
                        errs.push(format!("{path}: {actual} is not {op} {arg}"));
                    }
                }
                other => errs.push(format!("{path}: unknown matcher {other}")),
            }
            return;
        }
        match (pattern, actual) {
            (Value::Object(p), Value::Object(a)) => {
                for (k, pv) in p {
                    match a.get(k) {
                        Some(av) => self.matches(pv, av, &format!("{path}/{k}"), now, errs),
                        None => errs.push(format!("{path}: no field {k:?} in {actual}")),
                    }
                }
            }
            (Value::Array(p), Value::Array(a)) => {
                if p.len() != a.len() {
                    fail(format!("expected {} elements, got {}: {actual}", p.len(), a.len()));
                    return;
                }
                for (i, (pv, av)) in p.iter().zip(a).enumerate() {
                    self.matches(pv, av, &format!("{path}/{i}"), now, errs);
                }
            }
            (p, a) if p == a => {}
            (p, a) => fail(format!("expected {p}, got {a}")),
        }
    }
}

/// `base + n` for `{"$t": n}` and `{"$now": n}`; `n` may be negative.
fn offset(base: u64, n: &Value) -> Res<u64> {
    n.as_i64()
        .and_then(|n| base.checked_add_signed(n))
        .ok_or_else(|| format!("bad time offset {n}"))
}

/// An export's error: `{"error": ...}` and nothing else (a record view has many fields).
fn is_error(v: &Value) -> bool {
    v.as_object().is_some_and(|m| m.len() == 1 && m.contains_key("error"))
}

/// `{"$op": arg}`: a matcher or an input expression.
fn special(v: &Value) -> Option<(&str, &Value)> {
    let m = v.as_object()?;
    if m.len() != 1 {
        return None;
    }
    let (k, arg) = m.iter().next()?;
    k.starts_with('$').then_some((k.as_str(), arg))
}

/// What every record view must satisfy, whatever the scenario: its audit
/// trail ends at the record's version and state, versions strictly rising.
fn audit_invariants(view: &Map<String, Value>) -> Res<()> {
    let audit = view["audit"].as_array().ok_or("no audit list")?;
    let last = audit.last().ok_or("a record without an audit event")?;
    if last["version"] != view["version"] {
        return Err(format!(
            "last audit version {} != record version {}",
            last["version"], view["version"]
        ));
    }
    if last["to-state"] != view["state"] {
        return Err(format!(
            "last audit event ends in {}, the record is {}",
            last["to-state"], view["state"]
        ));
    }
    for pair in audit.windows(2) {
        if pair[1]["version"].as_u64() <= pair[0]["version"].as_u64() {
            return Err("audit versions do not rise".to_string());
        }
    }
    Ok(())
}

/// The ops that call an export of the component: each must say what it expects.
const EXPORTS: [&str; 14] = [
    "configure",
    "start",
    "report",
    "resume",
    "sweep",
    "begin",
    "finish",
    "reconcile",
    "await-holder",
    "prune",
    "inspect",
    "resolve",
    "canonicalize",
    "fingerprint",
];

struct ScenarioRun {
    transcript: Vec<String>,
    failures: Vec<String>,
}

fn run_scenario(
    name: &str,
    scenario: &Value,
    backend: Backend,
    encoding: LedgerEncoding,
    broken: Broken,
) -> ScenarioRun {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let start = scenario.get("start").and_then(Value::as_u64).unwrap_or(1_000_000);
    let mut settings = default_settings();
    if let Some(s) = scenario.get("settings") {
        apply_settings(&mut settings, s).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let env = Arc::new(Env {
        clock: ScriptClock(AtomicU64::new(start)),
        settings: Mutex::new(settings),
        evidence: Mutex::new(VecDeque::new()),
        lookups: Mutex::new(Vec::new()),
        escalations: Mutex::new(Vec::new()),
        ack: AtomicBool::new(true),
    });
    let storage = Arc::new(Scripted::new(backend, dir.path(), broken));
    let run = Run {
        name: name.to_string(),
        scenario: scenario.clone(),
        env,
        storage,
        start,
        encoding,
        vars: Mutex::new(BTreeMap::new()),
        transcript: Mutex::new(Vec::new()),
        failures: Mutex::new(Vec::new()),
        other: Mutex::new(None),
    };
    let run = Arc::new(run);
    run.run();
    // Break the cycle a pending race hook would hold.
    lock(&run.storage.race).take();
    lock(&run.other).take();
    let transcript = std::mem::take(&mut *lock(&run.transcript));
    let failures = std::mem::take(&mut *lock(&run.failures));
    ScenarioRun { transcript, failures }
}

fn transcript_of(all: &[(String, ScenarioRun)]) -> String {
    let mut out = String::new();
    for (_, o) in all {
        for line in &o.transcript {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

// ------------------------------------------------------------------ coverage

/// What the suite as run must have shown, measured from the results (not
/// from what the scenario files claim): every state of DESIGN.md's state
/// table, every decision and blocked reason, every finish outcome and answer,
/// every protocol step, wait reason, ending and account fact, a dispatching
/// sweep's grant, and configure's answer and refusal.
fn check_coverage(all: &[(String, ScenarioRun)]) {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (_, o) in all {
        for line in &o.transcript {
            let v: Value = serde_json::from_str(line).unwrap();
            let op = v["op"].as_str().unwrap_or_default();
            let r = &v["result"];
            match op {
                "begin" | "reconcile" => {
                    let tag = match r {
                        Value::String(s) => s.clone(),
                        Value::Object(m) => m.keys().next().cloned().unwrap_or_default(),
                        _ => String::new(),
                    };
                    seen.insert(format!("{op}:{tag}"));
                    if let Some(reason) = r["blocked"]["reason"].as_str() {
                        seen.insert(format!("blocked:{reason}"));
                    }
                    if let Some(via) = r["replay"]["via"].as_str() {
                        seen.insert(format!("via:{via}"));
                    }
                }
                "start" | "report" | "resume" => {
                    let (kind, body) = match r {
                        Value::String(s) => (s.clone(), Value::Null),
                        Value::Object(m) => m.iter().next().map(|(k, v)| (k.clone(), v.clone())).unwrap_or_default(),
                        _ => Default::default(),
                    };
                    seen.insert(format!("step:{kind}"));
                    let account = match kind.as_str() {
                        "wait" => {
                            seen.insert(format!("wait:{}", body["reason"].as_str().unwrap_or_default()));
                            body["meanwhile"].clone()
                        }
                        "done" => body,
                        _ => Value::Null,
                    };
                    if let Some(ending) = account["ending"].as_object().and_then(|m| m.keys().next()) {
                        seen.insert(format!("ending:{ending}"));
                    }
                    for fact in ["effect", "repeat"] {
                        if let Some(v) = account[fact].as_str() {
                            seen.insert(format!("{fact}:{v}"));
                        }
                    }
                    if let Some(v) = account["awaits-operator"].as_bool() {
                        seen.insert(format!("awaits-operator:{v}"));
                    }
                }
                "sweep" if r["dispatches"].as_array().is_some_and(|d| !d.is_empty()) => {
                    seen.insert("sweep:dispatches".to_string());
                }
                "configure" => {
                    seen.insert(format!(
                        "configure:{}",
                        if is_error(r) { "refused" } else { "configured" }
                    ));
                }
                "finish" => match r {
                    Value::String(s) => {
                        seen.insert(format!("finish:{s}"));
                    }
                    Value::Object(m) => {
                        for (k, s) in m {
                            seen.insert(format!("finish:{k}:{}", s.as_str().unwrap_or("?")));
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
            for rec in v["records"].as_array().into_iter().flatten() {
                if let Some(state) = rec["state"].as_str() {
                    seen.insert(format!("state:{state}"));
                }
                for e in rec["audit"].as_array().into_iter().flatten() {
                    seen.insert(format!("event:{}", e["kind"].as_str().unwrap_or_default()));
                }
            }
        }
    }
    let mut required: Vec<String> = Vec::new();
    for s in ["in-flight", "confirmed", "failed", "unknown", "absent", "superseded"] {
        required.push(format!("state:{s}"));
    }
    for d in [
        "execute",
        "replay",
        "conflict",
        "in-flight",
        "unknown",
        "blocked",
        "direct",
    ] {
        required.push(format!("begin:{d}"));
    }
    for d in ["execute", "replay", "in-flight", "unknown", "blocked"] {
        required.push(format!("reconcile:{d}"));
    }
    for r in [
        "route-blocked",
        "descriptor-changed",
        "quota",
        "attempt-budget",
        "identity-required",
        "identity-conflict",
        "payload-required",
        "superseded",
        "superseded-unresolved",
        "superseded-confirmed",
        "supersedes-missing",
        "expired",
        "unverified",
        "storage",
        "failed",
        "other-owner",
    ] {
        required.push(format!("blocked:{r}"));
    }
    for v in ["key", "derived-args", "provider"] {
        required.push(format!("via:{v}"));
    }
    for f in [
        "recorded:confirmed",
        "recorded:failed",
        "recorded:unknown",
        "recorded:superseded",
        "recorded:absent",
        "ignored:in-flight",
        "ignored:unknown",
        "ignored:confirmed",
        "ignored:failed",
        "unrecorded",
    ] {
        required.push(format!("finish:{f}"));
    }
    for e in [
        "begin",
        "finish-success",
        "finish-rejected",
        "finish-not-sent",
        "finish-ambiguous",
        "lease-expired",
        "reconcile-inconclusive",
        "reconciled-confirmed",
        "reconciled-absent",
        "owed-dispatch",
        "retry",
        "late-success",
        "late-success-possible-duplicate",
        "late-success-superseded",
        "verified-confirmed",
        "superseded",
        "succeeded-by",
        "escalated",
        "escalation-acknowledged",
        "replay",
        "conflict",
        "operator-confirmed",
        "operator-absent",
        "pruned",
    ] {
        required.push(format!("event:{e}"));
    }
    for k in [
        "step:dispatch",
        "step:wait",
        "step:done",
        "step:direct",
        "wait:holder",
        "wait:reconciliation",
    ] {
        required.push(k.to_string());
    }
    for e in [
        "confirmed",
        "rejected",
        "not-sent",
        "unknown",
        "in-flight",
        "conflict",
        "blocked",
        "unrecorded",
    ] {
        required.push(format!("ending:{e}"));
    }
    for f in [
        "effect:happened",
        "effect:none",
        "effect:unknown",
        "repeat:replays",
        "repeat:waits",
        "repeat:retries",
        "repeat:refused",
        "awaits-operator:true",
        "awaits-operator:false",
        "sweep:dispatches",
        "configure:configured",
        "configure:refused",
    ] {
        required.push(f.to_string());
    }
    let missing: Vec<&String> = required.iter().filter(|r| !seen.contains(*r)).collect();
    assert!(missing.is_empty(), "the scenarios never showed: {missing:?}");
}

// ------------------------------------------------------------------ tests

fn run_all(backend: Backend, encoding: LedgerEncoding, broken: Broken) -> Vec<(String, ScenarioRun)> {
    scenarios()
        .into_iter()
        .map(|(name, scenario)| {
            let o = run_scenario(&name, &scenario, backend, encoding, broken);
            (name, o)
        })
        .collect()
}

fn write_transcript(file: &str, text: &str) {
    if let Some(dir) = std::env::var_os("ONCE_CONFORMANCE_TRANSCRIPTS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }
}

/// Every scenario on the typed ledger imports over both stores, and on the
/// derived JSON encoding (`ledger-json`) over memory: one transcript.
#[test]
fn every_scenario_passes_on_memory_and_sqlite_and_both_ledger_encodings_with_identical_transcripts() {
    let filtered = std::env::var("ONCE_CONFORMANCE_FILTER").is_ok_and(|f| !f.is_empty());
    let mut transcripts = Vec::new();
    for (backend, encoding, label, file) in [
        (
            Backend::Memory,
            LedgerEncoding::Typed,
            "memory, typed",
            "rust-memory.jsonl",
        ),
        (
            Backend::Sqlite,
            LedgerEncoding::Typed,
            "sqlite, typed",
            "rust-sqlite.jsonl",
        ),
        (
            Backend::Memory,
            LedgerEncoding::Json,
            "memory, json",
            "rust-memory-json.jsonl",
        ),
    ] {
        let all = run_all(backend, encoding, Broken::No);
        if !filtered {
            assert!(all.len() >= 40, "only {} scenarios", all.len());
        }
        let failures: Vec<&String> = all.iter().flat_map(|(_, o)| &o.failures).collect();
        let failed: BTreeSet<&str> = all
            .iter()
            .filter(|(_, o)| !o.failures.is_empty())
            .map(|(n, _)| n.as_str())
            .collect();
        println!(
            "\nrust ({label}): {} passed, {} failed",
            all.len() - failed.len(),
            failed.len()
        );
        let text = transcript_of(&all);
        write_transcript(file, &text);
        assert!(
            failures.is_empty(),
            "{label}: {} failure(s) in {failed:?}:\n{}",
            failures.len(),
            failures.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
        );
        if !filtered {
            check_coverage(&all);
        }
        transcripts.push(text);
    }
    assert!(
        transcripts[0] == transcripts[1],
        "the memory and SQLite transcripts differ"
    );
    assert!(
        transcripts[0] == transcripts[2],
        "the typed and JSON ledger encodings' transcripts differ"
    );
    // Which component file this was, for the other runners (run-all.sh).
    let path = component_path();
    write_transcript(
        "component.txt",
        &format!("{}\n", path.canonicalize().unwrap_or(path).display()),
    );
}

/// The negative tests: hosts whose store is deliberately broken must be
/// caught by the suite, by the scenarios named here at least.
fn broken_store_is_caught(broken: Broken, must: &[&str]) {
    if std::env::var("ONCE_CONFORMANCE_FILTER").is_ok_and(|f| !f.is_empty()) {
        return;
    }
    let all = run_all(Backend::Memory, LedgerEncoding::Typed, broken);
    let caught: BTreeSet<&str> = all
        .iter()
        .filter(|(_, o)| !o.failures.is_empty())
        .map(|(n, _)| n.as_str())
        .collect();
    println!("{broken:?} caught by {} scenario(s): {caught:?}", caught.len());
    for name in must {
        assert!(
            caught.contains(name),
            "{broken:?} went unnoticed by {name}; caught by {caught:?}"
        );
    }
}

/// A compare-and-swap that ignores the version: the quota bucket (a row with
/// no audit event of its own) is overwritten by a racing reservation.
#[test]
fn a_store_whose_compare_and_swap_ignores_the_version_is_caught() {
    broken_store_is_caught(Broken::CasIgnoresVersion, &["race-quota-reservations"]);
}

/// A store that never reports a conflict (versions and audit keys ignored):
/// two racing claims both win.
#[test]
fn a_store_that_never_reports_a_conflict_is_caught() {
    broken_store_is_caught(
        Broken::NoConflicts,
        &[
            "race-concurrent-begins",
            "race-concurrent-starts",
            "race-quota-reservations",
            "race-finish-vs-sweep",
            "race-original-retried-while-superseded",
        ],
    );
}

/// Settings and policies arrive once per instance: before `configure`, every
/// export that needs them is refused (`error.not-configured`), and nothing is read or written.
#[test]
fn every_export_before_configure_is_not_configured() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let env = Arc::new(Env {
        clock: ScriptClock(AtomicU64::new(1_000_000)),
        settings: Mutex::new(default_settings()),
        evidence: Mutex::new(VecDeque::new()),
        lookups: Mutex::new(Vec::new()),
        escalations: Mutex::new(Vec::new()),
        ack: AtomicBool::new(true),
    });
    let storage = Arc::new(Scripted::new(Backend::Memory, dir.path(), Broken::No));
    let state = HostState {
        storage: storage.clone(),
        clock: Arc::new(EnvClock(env.clone())),
        provider: env.clone(),
        operator: env,
        entropy: Arc::new(once::FixedEntropy(ENTROPY.to_vec())),
    };
    let mut i = runtime().instantiate(state).expect("instantiating the component");
    let call = Call {
        scope: "s".into(),
        keys: vec![("api".into(), "k".into())],
        tool: "refund".into(),
        args: "{}".into(),
        supersedes: None,
        acknowledge_confirmed: false,
    };
    let refused = |name: &str, e: Option<Error>| assert_eq!(e, Some(Error::NotConfigured), "{name}");
    refused("start", i.start(&call).unwrap().err());
    refused("report", i.report("s", "k", "f", &Outcome::NotSent).unwrap().err());
    refused("resume", i.resume("s", "k").unwrap().err());
    refused("sweep", i.sweep(10, true).unwrap().err());
    refused("begin", i.begin(&call).unwrap().err());
    refused("finish", i.finish("s", "k", "f", &Outcome::NotSent).unwrap().err());
    refused("reconcile", i.reconcile("s", "k").unwrap().err());
    refused("await-holder", i.await_holder("s", "k").unwrap().err());
    refused("prune", i.prune(10).unwrap().err());
    refused("inspect", i.inspect("s", "k").unwrap().err());
    refused(
        "resolve",
        i.resolve("s", "k", &Resolution::Absent, "n", false).unwrap().err(),
    );
    assert_eq!(storage.counts()["events"], 0);
}

/// The harness itself: every kind of check reports a wrong expectation (so a
/// passing suite is not a vacuous one).
#[test]
fn a_wrong_expectation_is_reported() {
    let scenario = json!({
        "name": "self-test",
        "defaults": {"scope": "s", "tool": "refund", "args": "{\"amount\":1}"},
        "steps": [
            {"op": "begin", "key": "k", "as": "e1", "expect": {"execute": {"attempt": 2}}},
            {"op": "begin", "key": "k", "expect": {"in-flight": {"lease-until": {"$t": 1}}}},
            {"op": "begin", "key": "k", "expect": {"in-flight": {"lease-until": {"$not": {"$t": 35000}}}}},
            {"op": "start", "key": "k", "expect": {"done": {}}},
            {"op": "configure", "tools": [{"policy": {"lease-ms": 1}}], "expect": {"tools": []}},
            {"op": "begin", "key": "k", "expect": {"replay": {}}},
            {"op": "inspect", "key": "k", "expect": {"fingerprint": {"$": "e1/execute/provider-key"}}},
            {"op": "finish", "key": "k", "fence": {"$": "e1/execute/fence"}, "outcome": {"success": "{}"},
             "expect": {"recorded": "confirmed"}, "records": [{"key": "k", "state": "failed"}]},
            {"op": "sweep", "expect": {"expired": 0}, "records": [{"key": "k", "kinds": ["begin"]}]},
            {"op": "sweep", "expect": {"expired": 0}, "records": [{"key": "k", "exists": false}]},
            {"op": "sweep", "expect": {"expired": 0}, "lookups": [{"tool": "refund"}]},
            {"op": "sweep", "expect": {"expired": 0}, "escalations": {"$len": 1}},
            {"op": "sweep", "expect": {"expired": 0}, "store": {"operation": 2}},
            {"op": "canonicalize", "text": "{\"b\":1,\"a\":2}", "expect": {"$contains": "\"b\":2"}},
            {"op": "fingerprint", "tool": "t", "args": "{}", "expect": {"$json": {"a": 1}}},
            {"op": "sweep", "records": [{"key": "k", "state": "confirmed"}]}
        ]
    });
    let run = run_scenario(
        "self-test",
        &scenario,
        Backend::Memory,
        LedgerEncoding::Typed,
        Broken::No,
    );
    let steps: BTreeSet<String> = run
        .failures
        .iter()
        .map(|f| f.split(':').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(steps.len(), 16, "each wrong step is reported: {:#?}", run.failures);
    assert!(
        run.failures
            .iter()
            .any(|f| f.starts_with("self-test step 16: sweep: ") && f.contains("needs an \"expect\"")),
        "a step that calls the component without an expect is reported: {:#?}",
        run.failures
    );
}
