//! Random interleavings of begin / finish / reconcile / sweep / prune, clock
//! advances and storage failures over three keys (two scopes), with the
//! DESIGN.md invariants checked after every step:
//!
//! - never two outstanding executes (live, unreported leases) for one key;
//! - no execute for a key once its effect is confirmed;
//! - a receipt never changes once set (records, replays);
//! - every record is in a consistent DESIGN.md state;
//! - audit versions are contiguous 1..=version and chained state to state;
//! - each quota bucket's `used` equals the reservations held by records in
//!   that window (plus those of records pruned while holding one).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use once_guest::engine::{begin, finish, inspect, prune, reconcile, sweep};
use once_guest::host::Host;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    AuditEvent, Batch, BeginRequest, BlockReason, CommitError, Decision, Error, Escalation, Evidence, FinishAck,
    Outcome, QuotaPolicy, RecordView, Row, Settings, State, Table, ToolPolicy,
};
use proptest::prelude::*;

const SECOND: u64 = 1_000;
const DAY: u64 = 24 * 3_600 * SECOND;

/// (scope, key, amount): the same key name in two scopes is two operations.
const KEYS: [(&str, &str, &str); 3] = [("a", "k0", "3.00"), ("a", "k1", "4.00"), ("b", "k0", "5.00")];

// ---------------------------------------------------------------- the host

/// What the provider answers to every lookup during one step.
#[derive(Debug, Clone, Copy)]
enum Ev {
    Confirmed(u8),
    /// ABSENT at now + offset (negative: a read position in the past).
    Absent(i64),
    Unknown,
}

/// `MemoryHost` with a per-step provider answer and storage failures that
/// either apply nothing or apply and then report failure (outcome unknown).
struct PropHost {
    mem: MemoryHost,
    ev: Cell<Ev>,
    /// Armed failure of the next commit: Some(applied).
    fail: Cell<Option<bool>>,
}

impl Host for PropHost {
    fn now(&self) -> u64 {
        self.mem.now()
    }
    fn settings(&self) -> Settings {
        self.mem.settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, String> {
        self.mem.get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        match self.fail.take() {
            None => self.mem.commit(batch),
            Some(false) => Err(CommitError::Storage("injected: nothing applied".to_string())),
            Some(true) => {
                self.mem.commit(batch)?;
                Err(CommitError::Storage("injected: applied, reply lost".to_string()))
            }
        }
    }
    fn scan(&self, table: Table, states: &[State], due_before: u64, limit: u32) -> Result<Vec<Row>, String> {
        self.mem.scan(table, states, due_before, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        self.mem.audit(scope, key)
    }
    fn lookup(&self, _tool: &str, _provider_key: &str, _args: &str) -> Evidence {
        match self.ev.get() {
            Ev::Confirmed(n) => Evidence::Confirmed(format!(r#"{{"provider_receipt":{n}}}"#)),
            Ev::Absent(offset) => Evidence::Absent(self.now().saturating_add_signed(offset)),
            Ev::Unknown => Evidence::Unknown("the provider could not tell".to_string()),
        }
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        self.mem.escalate(escalation)
    }
}

// ---------------------------------------------------------------- operations

#[derive(Debug, Clone, Copy)]
enum FenceChoice {
    Current,
    Stale(usize),
    Bogus,
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Success(u8),
    Rejected,
    Ambiguous,
    NotSent,
}

#[derive(Debug, Clone)]
enum Op {
    Begin(usize, Ev),
    Finish(usize, FenceChoice, Out),
    Reconcile(usize, Ev),
    Sweep(Ev),
    Prune,
    Advance(u64),
    FailNextCommit { applied: bool },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        2 => (0u8..3).prop_map(Ev::Confirmed),
        4 => prop_oneof![
            Just(0i64),
            Just(-1),
            Just(-1_000),
            Just(-60_000),
            Just(-120_000),
            Just(5_000),
        ]
        .prop_map(Ev::Absent),
        2 => Just(Ev::Unknown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let fence = prop_oneof![6 => Just(FenceChoice::Current), 3 => (0..8usize).prop_map(FenceChoice::Stale), 1 => Just(FenceChoice::Bogus)];
    let out = prop_oneof![
        3 => (0u8..3).prop_map(Out::Success),
        2 => Just(Out::Rejected),
        3 => Just(Out::Ambiguous),
        1 => Just(Out::NotSent),
    ];
    let advance = prop_oneof![
        4 => 0..2_000u64,
        3 => 34_000..37_000u64,
        3 => 59_000..63_000u64,
        1 => Just(15 * 60 * SECOND),
        1 => Just(DAY),
        1 => Just(7 * DAY + 1),
    ];
    prop_oneof![
        5 => (key.clone(), ev()).prop_map(|(k, e)| Op::Begin(k, e)),
        5 => (key.clone(), fence, out).prop_map(|(k, f, o)| Op::Finish(k, f, o)),
        3 => (key, ev()).prop_map(|(k, e)| Op::Reconcile(k, e)),
        2 => ev().prop_map(Op::Sweep),
        1 => Just(Op::Prune),
        4 => advance.prop_map(Op::Advance),
        1 => any::<bool>().prop_map(|applied| Op::FailNextCommit { applied }),
    ]
}

#[derive(Debug, Clone)]
struct Knobs {
    provider_claims_key: bool,
    verify_first: bool,
    attempt_budget: u32,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (any::<bool>(), prop::bool::weighted(0.25), 1..=4u32).prop_map(
        |(provider_claims_key, verify_first, attempt_budget)| Knobs {
            provider_claims_key,
            verify_first,
            attempt_budget,
        },
    )
}

fn policy(k: &Knobs) -> ToolPolicy {
    let mut p = default_policy();
    p.provider_claims_key = k.provider_claims_key;
    p.verify_first = k.verify_first;
    p.attempt_budget = k.attempt_budget;
    p.quota = Some(QuotaPolicy {
        spend_field: "/amount".to_string(),
        ceiling: "10.00".to_string(),
        decimals: 2,
        window_ms: DAY,
        bucket: None,
    });
    p
}

fn request(i: usize, policy: &ToolPolicy) -> BeginRequest {
    let (scope, key, amount) = KEYS[i];
    BeginRequest {
        scope: scope.to_string(),
        keys: vec![("api".to_string(), key.to_string())],
        tool: "pay".to_string(),
        args: format!(r#"{{"amount":{amount},"to":"acct-{i}"}}"#),
        policy: policy.clone(),
        descriptor: None,
        supersedes: None,
        acknowledge_confirmed: false,
    }
}

// ---------------------------------------------------------------- the model

/// One execute handed to a caller.
#[derive(Debug, Clone)]
struct Grant {
    fence: String,
    attempt: u32,
    lease_until: u64,
    /// The holder called `finish` (and stops sending).
    reported: bool,
}

#[derive(Default)]
struct Model {
    grants: [Vec<Grant>; 3],
    receipts: [Option<String>; 3],
    provider_keys: [Option<String>; 3],
    /// Reservations of each live record, as last seen: (scope, bucket, window_start) -> units.
    held: BTreeMap<(String, String), Option<Held>>,
    /// Reservations of records pruned while holding one.
    retired: BTreeMap<(String, String, u64), u128>,
}

/// A reservation a record holds: (scope, bucket, window start, units).
type Held = (String, String, u64, u128);

fn reservation_of(v: &RecordView) -> Option<Held> {
    let body: serde_json::Value = serde_json::from_str(&v.body).unwrap();
    let r = body.get("reservation")?;
    if r.is_null() {
        return None;
    }
    Some((
        v.scope.clone(),
        r["bucket"].as_str().unwrap().to_string(),
        r["window_start"].as_u64().unwrap(),
        r["units"].as_str().unwrap().parse().unwrap(),
    ))
}

fn check(h: &PropHost, m: &mut Model, knobs: &Knobs, trace: &[Op]) -> Result<(), TestCaseError> {
    let now = h.now();
    for (i, (scope, key, _)) in KEYS.iter().enumerate() {
        let live: Vec<&Grant> = m.grants[i]
            .iter()
            .filter(|g| !g.reported && g.lease_until > now)
            .collect();
        prop_assert!(
            live.len() <= 1,
            "{scope}/{key}: two outstanding executes {live:?}\n{trace:?}"
        );

        let Some(v) = inspect(h, scope, key).map_err(|e| TestCaseError::fail(format!("inspect: {e:?}")))? else {
            // Pruned (or never created): what it held is accounted as retired.
            if let Some(Some((s, b, w, u))) = m.held.remove(&(scope.to_string(), key.to_string())) {
                *m.retired.entry((s, b, w)).or_default() += u;
            }
            m.receipts[i] = None;
            continue;
        };
        m.held.insert((scope.to_string(), key.to_string()), reservation_of(&v));

        // Audit: contiguous, chained, ending in the record's state.
        let versions: Vec<u64> = v.audit.iter().map(|e| e.version).collect();
        prop_assert_eq!(
            versions,
            (1..=v.version).collect::<Vec<_>>(),
            "{}/{} audit {:?}",
            scope,
            key,
            trace
        );
        for w in v.audit.windows(2) {
            prop_assert_eq!(
                w[1].from_state,
                w[0].to_state,
                "{}/{}: broken chain at {}\n{:?}",
                scope,
                key,
                w[1].kind,
                trace
            );
        }
        prop_assert_eq!(v.audit.last().unwrap().to_state, Some(v.state));

        // A consistent DESIGN.md state.
        prop_assert!(
            v.attempts <= knobs.attempt_budget,
            "{scope}/{key}: {} attempts over the budget",
            v.attempts
        );
        match v.state {
            State::InFlight => prop_assert!(v.attempts >= 1),
            State::Confirmed => prop_assert!(v.receipt.is_some()),
            State::Failed => prop_assert!(v.error.is_some()),
            State::Superseded => prop_assert!(v.superseded_by.is_some()),
            State::Unknown | State::Absent => {}
        }
        if matches!(
            v.state,
            State::Unknown | State::Absent | State::Failed | State::Superseded
        ) {
            prop_assert!(
                live.is_empty(),
                "{scope}/{key} is {:?} while {live:?} may still send\n{trace:?}",
                v.state
            );
        }
        if v.escalated {
            prop_assert!(
                matches!(v.state, State::Unknown | State::Absent) || v.possible_duplicate,
                "{scope}/{key}: escalated flag on {:?}",
                v.state
            );
        }
        if let Some(g) = live.first() {
            prop_assert!(
                v.state == State::InFlight || v.possible_duplicate,
                "{scope}/{key}: {:?} with a live execute {g:?}\n{trace:?}",
                v.state
            );
        }

        // A receipt never changes once set.
        if let Some(seen) = &m.receipts[i] {
            prop_assert_eq!(
                v.receipt.as_ref(),
                Some(seen),
                "{}/{}: receipt changed\n{:?}",
                scope,
                key,
                trace
            );
        }
        if v.receipt.is_some() {
            m.receipts[i] = v.receipt.clone();
        }
        match &m.provider_keys[i] {
            Some(pk) => prop_assert_eq!(&v.provider_key, pk),
            None => m.provider_keys[i] = Some(v.provider_key.clone()),
        }

        // Every execute handed out is an attempt of the record, with its lease.
        let body: serde_json::Value = serde_json::from_str(&v.body).unwrap();
        let attempts = body["attempts"].as_array().unwrap();
        for g in &m.grants[i] {
            let found = attempts.iter().find(|a| a["fence"] == g.fence.as_str());
            prop_assert!(
                found.is_some(),
                "{scope}/{key}: execute {g:?} is no attempt of the record"
            );
            let a = found.unwrap();
            prop_assert_eq!(a["n"].as_u64(), Some(u64::from(g.attempt)));
            prop_assert_eq!(a["lease_until"].as_u64(), Some(g.lease_until));
        }
    }

    // Quota: each bucket's used is the sum of what records hold in it.
    let mut expected: BTreeMap<(String, String, u64), u128> = m.retired.clone();
    for (s, b, w, u) in m.held.values().flatten() {
        *expected.entry((s.clone(), b.clone(), *w)).or_default() += u;
    }
    for row in h.mem.rows().iter().filter(|r| r.table == Table::Quota) {
        let (bucket, window) = row.key.rsplit_once('@').unwrap();
        let window: u64 = window.parse().unwrap();
        let body: serde_json::Value = serde_json::from_str(&row.body).unwrap();
        let used: u128 = body["used"].as_str().unwrap().parse().unwrap();
        let want = expected
            .get(&(row.scope.clone(), bucket.to_string(), window))
            .copied()
            .unwrap_or(0);
        prop_assert_eq!(
            used,
            want,
            "quota {}/{}: used {} but records hold {}\n{:?}",
            row.scope,
            row.key,
            used,
            want,
            trace
        );
    }
    Ok(())
}

fn grant(m: &mut Model, i: usize, e: &once_guest::types::Execute, trace: &[Op]) -> Result<(), TestCaseError> {
    prop_assert!(
        m.receipts[i].is_none(),
        "{:?}: execute after the effect was confirmed\n{trace:?}",
        KEYS[i]
    );
    let last = m.grants[i].iter().map(|g| g.attempt).max().unwrap_or(0);
    prop_assert!(e.attempt > last, "attempt {} after {}", e.attempt, last);
    if let Some(pk) = &m.provider_keys[i] {
        prop_assert_eq!(&e.provider_key, pk, "the provider key never changes");
    }
    m.grants[i].push(Grant {
        fence: e.fence.clone(),
        attempt: e.attempt,
        lease_until: e.lease_until,
        reported: false,
    });
    Ok(())
}

fn replayed(m: &Model, i: usize, receipt: &str, trace: &[Op]) -> Result<(), TestCaseError> {
    if let Some(seen) = &m.receipts[i] {
        prop_assert_eq!(
            receipt,
            seen.as_str(),
            "{:?}: a replay changed the receipt\n{:?}",
            KEYS[i],
            trace
        );
    }
    Ok(())
}

fn run(knobs: Knobs, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let h = PropHost {
        mem: MemoryHost::new(),
        ev: Cell::new(Ev::Unknown),
        fail: Cell::new(None),
    };
    let policy = policy(&knobs);
    let mut m = Model::default();
    let trace = RefCell::new(Vec::new());
    for op in ops {
        trace.borrow_mut().push(op.clone());
        let trace = trace.borrow();
        let armed = h.fail.get().is_some();
        let storage_ok = |e: &Error| armed && matches!(e, Error::Storage(_));
        match op {
            Op::Begin(i, ev) => {
                h.ev.set(ev);
                match begin(&h, request(i, &policy)) {
                    Ok(Decision::Execute(e)) => grant(&mut m, i, &e, &trace)?,
                    Ok(Decision::Replay(r)) => replayed(&m, i, &r.receipt, &trace)?,
                    Ok(Decision::Blocked(b)) if b.reason == BlockReason::Storage => {
                        prop_assert!(armed, "blocked(storage) on a healthy ledger: {b:?}\n{trace:?}")
                    }
                    Ok(Decision::Conflict(c)) => prop_assert!(false, "conflict on an identical call: {c:?}"),
                    Ok(Decision::Direct) => prop_assert!(false, "a protected tool went direct"),
                    Ok(_) => {}
                    Err(e) => prop_assert!(false, "begin failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Finish(i, choice, out) => {
                let (scope, key, _) = KEYS[i];
                let fence = match choice {
                    _ if m.grants[i].is_empty() => "no-such-fence".to_string(),
                    FenceChoice::Current => m.grants[i].last().unwrap().fence.clone(),
                    FenceChoice::Stale(n) => m.grants[i][n % m.grants[i].len()].fence.clone(),
                    FenceChoice::Bogus => "no-such-fence".to_string(),
                };
                let outcome = match out {
                    Out::Success(n) => Outcome::Success(format!(r#"{{"holder_receipt":{n}}}"#)),
                    Out::Rejected => Outcome::Rejected("declined".to_string()),
                    Out::Ambiguous => Outcome::Ambiguous("timeout".to_string()),
                    Out::NotSent => Outcome::NotSent,
                };
                match finish(&h, scope, key, &fence, outcome) {
                    Ok(ack) => {
                        if let FinishAck::Unrecorded = ack {
                            prop_assert!(armed, "unrecorded on a healthy ledger\n{trace:?}");
                        }
                        if let Some(g) = m.grants[i].iter_mut().find(|g| g.fence == fence) {
                            g.reported = true;
                        }
                    }
                    Err(Error::NotFound) => {}
                    Err(Error::FenceMismatch) => {
                        prop_assert_eq!(
                            fence.as_str(),
                            "no-such-fence",
                            "a granted fence was refused\n{:?}",
                            trace
                        )
                    }
                    Err(e) => prop_assert!(false, "finish failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Reconcile(i, ev) => {
                h.ev.set(ev);
                let (scope, key, _) = KEYS[i];
                match reconcile(&h, scope, key) {
                    Ok(Decision::Execute(e)) => grant(&mut m, i, &e, &trace)?,
                    Ok(Decision::Replay(r)) => replayed(&m, i, &r.receipt, &trace)?,
                    Ok(_) | Err(Error::NotFound) => {}
                    Err(e) if storage_ok(&e) => {}
                    Err(e) => prop_assert!(false, "reconcile failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Sweep(ev) => {
                h.ev.set(ev);
                match sweep(&h, 16) {
                    Ok(_) => {}
                    Err(e) if storage_ok(&e) => {}
                    Err(e) => prop_assert!(false, "sweep failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Prune => match prune(&h, 16) {
                Ok(_) => {}
                Err(e) if storage_ok(&e) => {}
                Err(e) => prop_assert!(false, "prune failed: {e:?}\n{trace:?}"),
            },
            Op::Advance(ms) => h.mem.advance(ms),
            Op::FailNextCommit { applied } => h.fail.set(Some(applied)),
        }
        check(&h, &mut m, &knobs, &trace)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_the_invariants(knobs in knobs(), ops in prop::collection::vec(op(), 1..60)) {
        run(knobs, ops)?;
    }
}

// ---------------------------------------------------------------- a truthful provider

/// How a lookup reads the provider: a replica `lag` ms behind (0: a
/// linearizable read), or one that cannot tell.
#[derive(Debug, Clone, Copy)]
struct Read {
    lag: u64,
    cannot_tell: bool,
}

fn read() -> impl Strategy<Value = Read> {
    (
        prop_oneof![Just(0u64), Just(500), Just(5_000), Just(60_000)],
        prop::bool::weighted(0.2),
    )
        .prop_map(|(lag, cannot_tell)| Read { lag, cannot_tell })
}

/// What the provider does with one request.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Commits `delay` ms after it was sent (at most max_in_flight).
    Commit(u64),
    /// Answers and does nothing.
    Reject,
}

#[derive(Debug, Clone)]
enum TOp {
    Begin(usize, Read),
    /// The current holder of key i sends its request (if its lease is live).
    Send(usize, Fate),
    /// A holder (current or older) reports what it truthfully knows; `pick` chooses among the allowed reports.
    Report(usize, Option<usize>, u8),
    /// Send, let `wait` ms pass, report: one whole attempt.
    Attempt(usize, Fate, u64, u8),
    Reconcile(usize, Read),
    Sweep(Read),
    Prune,
    Advance(u64),
    FailNextCommit {
        applied: bool,
    },
}

fn top() -> impl Strategy<Value = TOp> {
    // Most steps go to one key, so whole recoveries happen often.
    let key = prop_oneof![4 => Just(0usize), 1 => Just(1), 1 => Just(2)];
    let fate = prop_oneof![
        1 => Just(Fate::Commit(0)),
        2 => (0..=60_000u64).prop_map(Fate::Commit),
        2 => (45_000..=60_000u64).prop_map(Fate::Commit),
        1 => Just(Fate::Reject),
    ];
    let wait = prop_oneof![Just(0u64), 0..40_000u64];
    let advance = prop_oneof![
        4 => 0..3_000u64,
        3 => 30_000..40_000u64,
        3 => 55_000..65_000u64,
        1 => Just(15 * 60 * SECOND),
    ];
    prop_oneof![
        4 => (key.clone(), read()).prop_map(|(k, r)| TOp::Begin(k, r)),
        2 => (key.clone(), fate.clone()).prop_map(|(k, f)| TOp::Send(k, f)),
        4 => (key.clone(), fate, wait, any::<u8>()).prop_map(|(k, f, w, p)| TOp::Attempt(k, f, w, p)),
        4 => (key.clone(), prop::option::weighted(0.3, 0..6usize), any::<u8>()).prop_map(|(k, w, p)| TOp::Report(k, w, p)),
        3 => (key, read()).prop_map(|(k, r)| TOp::Reconcile(k, r)),
        2 => read().prop_map(TOp::Sweep),
        1 => Just(TOp::Prune),
        4 => advance.prop_map(TOp::Advance),
        1 => any::<bool>().prop_map(|applied| TOp::FailNextCommit { applied }),
    ]
}

/// One request that reached the provider.
#[derive(Debug, Clone)]
struct Request {
    fate: Fate,
    sent_at: u64,
}

#[derive(Debug, Clone)]
struct Holder {
    fence: String,
    lease_until: u64,
    sent: Option<Request>,
    reported: bool,
}

/// The provider's truth and the holders of every execute.
struct World {
    mem: MemoryHost,
    read: Cell<Read>,
    fail: Cell<Option<bool>>,
    provider_keys: Vec<String>,
    /// Per key: every execute's holder.
    holders: RefCell<Vec<Vec<Holder>>>,
}

impl World {
    /// Effects of key i: (commit time, receipt).
    fn effects(&self, i: usize) -> Vec<(u64, String)> {
        self.holders.borrow()[i]
            .iter()
            .filter_map(|h| match &h.sent {
                Some(Request {
                    fate: Fate::Commit(delay),
                    sent_at,
                }) => Some((sent_at + delay, format!(r#"{{"effect_of":"{}"}}"#, h.fence))),
                _ => None,
            })
            .collect()
    }
}

impl Host for World {
    fn now(&self) -> u64 {
        self.mem.now()
    }
    fn settings(&self) -> Settings {
        self.mem.settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, String> {
        self.mem.get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        match self.fail.take() {
            None => self.mem.commit(batch),
            Some(false) => Err(CommitError::Storage("injected: nothing applied".to_string())),
            Some(true) => {
                self.mem.commit(batch)?;
                Err(CommitError::Storage("injected: applied, reply lost".to_string()))
            }
        }
    }
    fn scan(&self, table: Table, states: &[State], due_before: u64, limit: u32) -> Result<Vec<Row>, String> {
        self.mem.scan(table, states, due_before, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        self.mem.audit(scope, key)
    }
    /// A truthful read: every commit at or before the read position is seen;
    /// later ones are not (the most a lagging replica may hide).
    fn lookup(&self, _tool: &str, provider_key: &str, _args: &str) -> Evidence {
        let read = self.read.get();
        if read.cannot_tell {
            return Evidence::Unknown("replica unavailable".to_string());
        }
        let i = self
            .provider_keys
            .iter()
            .position(|k| k == provider_key)
            .expect("a provider key of ours");
        let position = self.now().saturating_sub(read.lag);
        match self.effects(i).into_iter().filter(|(at, _)| *at <= position).min() {
            Some((_, receipt)) => Evidence::Confirmed(receipt),
            None => Evidence::Absent(position),
        }
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        self.mem.escalate(escalation)
    }
}

/// The current holder of key i sends its request: never after its lease,
/// never after reporting, at most once.
fn send(w: &World, i: usize, fate: Fate) {
    let now = w.now();
    let mut holders = w.holders.borrow_mut();
    if let Some(h) = holders[i].last_mut()
        && h.sent.is_none()
        && !h.reported
        && now < h.lease_until
    {
        h.sent = Some(Request { fate, sent_at: now });
    }
}

/// A holder reports what it truthfully knows (once); `pick` chooses among
/// the reports its knowledge allows.
fn report(w: &World, i: usize, which: Option<usize>, pick: u8) {
    let now = w.now();
    let (scope, key, _) = KEYS[i];
    let (idx, h) = {
        let holders = w.holders.borrow();
        let n = holders[i].len();
        if n == 0 {
            return;
        }
        let idx = which.map_or(n - 1, |k| k % n);
        (idx, holders[i][idx].clone())
    };
    if h.reported {
        return;
    }
    let receipt = format!(r#"{{"effect_of":"{}"}}"#, h.fence);
    let allowed: Vec<Outcome> = match &h.sent {
        None => vec![Outcome::NotSent, Outcome::Ambiguous("gave up".to_string())],
        Some(Request { fate: Fate::Reject, .. }) => {
            vec![
                Outcome::Rejected("declined".to_string()),
                Outcome::Ambiguous("reply lost".to_string()),
            ]
        }
        Some(Request {
            fate: Fate::Commit(delay),
            sent_at,
        }) if sent_at + delay <= now => {
            vec![Outcome::Success(receipt), Outcome::Ambiguous("reply lost".to_string())]
        }
        Some(_) => vec![Outcome::Ambiguous("timeout".to_string())],
    };
    let outcome = allowed[usize::from(pick) % allowed.len()].clone();
    let _ = finish(w, scope, key, &h.fence, outcome);
    w.holders.borrow_mut()[i][idx].reported = true;
}

fn truthful_run(verify_first: bool, budget: u32, ops: Vec<TOp>) -> Result<(), TestCaseError> {
    let mut p = default_policy();
    p.verify_first = verify_first;
    p.attempt_budget = budget;
    let w = World {
        mem: MemoryHost::new(),
        read: Cell::new(Read {
            lag: 0,
            cannot_tell: false,
        }),
        fail: Cell::new(None),
        provider_keys: KEYS
            .iter()
            .map(|(s, k, _)| once_guest::identity::provider_key(s, k))
            .collect(),
        holders: RefCell::new(vec![Vec::new(); KEYS.len()]),
    };
    let mut trace = Vec::new();
    let take = |w: &World, i: usize, d: Decision| {
        if let Decision::Execute(e) = d {
            assert_eq!(e.provider_key, w.provider_keys[i]);
            w.holders.borrow_mut()[i].push(Holder {
                fence: e.fence,
                lease_until: e.lease_until,
                sent: None,
                reported: false,
            });
        }
    };
    for op in ops {
        trace.push(op.clone());
        match op {
            TOp::Begin(i, r) => {
                w.read.set(r);
                if let Ok(d) = begin(&w, request(i, &p)) {
                    take(&w, i, d);
                }
            }
            TOp::Send(i, fate) => send(&w, i, fate),
            TOp::Report(i, which, pick) => report(&w, i, which, pick),
            TOp::Attempt(i, fate, wait, pick) => {
                send(&w, i, fate);
                w.mem.advance(wait);
                report(&w, i, None, pick);
            }
            TOp::Reconcile(i, r) => {
                w.read.set(r);
                let (scope, key, _) = KEYS[i];
                if let Ok(d) = reconcile(&w, scope, key) {
                    take(&w, i, d);
                }
            }
            TOp::Sweep(r) => {
                w.read.set(r);
                let _ = sweep(&w, 16);
            }
            TOp::Prune => {
                let _ = prune(&w, 16);
            }
            TOp::Advance(ms) => w.mem.advance(ms),
            TOp::FailNextCommit { applied } => w.fail.set(Some(applied)),
        }

        // Exactly-once's half that can be checked at every step: never a second effect.
        for (i, (scope, key, _)) in KEYS.iter().enumerate() {
            let effects = w.effects(i);
            prop_assert!(
                effects.len() <= 1,
                "{scope}/{key}: {} effects at the provider\n{trace:?}",
                effects.len()
            );
            if let Some(v) = inspect(&w, scope, key).unwrap() {
                if let (Some(receipt), Some((_, effect))) = (&v.receipt, effects.first()) {
                    prop_assert_eq!(
                        receipt,
                        effect,
                        "{}/{}: the receipt is not the effect's\n{:?}",
                        scope,
                        key,
                        trace
                    );
                }
                if v.state == State::Confirmed {
                    prop_assert!(
                        !effects.is_empty(),
                        "{scope}/{key}: confirmed without an effect\n{trace:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Against a provider that tells the truth (with lag and lost replies),
    /// no interleaving makes a second effect for one operation.
    #[test]
    fn truthful_provider_never_sees_two_effects(
        verify_first in prop::bool::weighted(0.25),
        budget in 1..=4u32,
        ops in prop::collection::vec(top(), 1..80),
    ) {
        truthful_run(verify_first, budget, ops)?;
    }
}
