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
#![allow(missing_docs)]

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use once_guest::engine::BeginRequest;
use once_guest::engine::{begin, finish, inspect, prune, reconcile, sweep};
use once_guest::host::CommitError;
use once_guest::host::Host;
use once_guest::policy::Policy;
use once_guest::policy::Quota;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    AuditEvent, Batch, BlockReason, Decision, Error, Escalation, Evidence, FinishAck, Outcome, RecordView, Row,
    Settings, State, Table,
};

pub const SECOND: u64 = 1_000;
pub const DAY: u64 = 24 * 3_600 * SECOND;

/// (scope, key, amount): the same key name in two scopes is two operations.
pub const KEYS: [(&str, &str, &str); 3] = [("a", "k0", "3.00"), ("a", "k1", "4.00"), ("b", "k0", "5.00")];

// ---------------------------------------------------------------- the host

/// What the provider answers to every lookup during one step.
#[derive(Debug, Clone, Copy)]
pub enum Ev {
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
    memory_ledger!();
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
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.mem.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.mem.secret_cache()
    }
}

// ---------------------------------------------------------------- operations

#[derive(Debug, Clone, Copy)]
pub enum FenceChoice {
    Current,
    Stale(usize),
    Bogus,
}

#[derive(Debug, Clone, Copy)]
pub enum Out {
    Success(u8),
    Rejected,
    Ambiguous,
    NotSent,
}

/// One step of a run.
#[derive(Debug, Clone)]
pub enum Op {
    Begin(usize, Ev),
    Finish(usize, FenceChoice, Out),
    Reconcile(usize, Ev),
    Sweep(Ev),
    Prune,
    Advance(u64),
    FailNextCommit { applied: bool },
}

/// The policy knobs of one run.
#[derive(Debug, Clone)]
pub struct Knobs {
    pub provider_claims_key: bool,
    pub verify_first: bool,
    pub attempt_budget: u32,
}

fn policy(k: &Knobs) -> Policy {
    let mut p = default_policy();
    p.provider_claims_key = k.provider_claims_key;
    // A provider can only claim a key that reaches it; here the host sends it.
    p.key_sent_by_host = k.provider_claims_key;
    p.verify_first = k.verify_first;
    p.attempt_budget = k.attempt_budget;
    p.quota = Some(Quota {
        spend_field: "/amount".to_string(),
        ceiling: "10.00".to_string(),
        decimals: 2,
        window_ms: DAY,
        bucket: None,
    });
    p
}

/// The begin request of key `i` of [`KEYS`].
pub fn request(i: usize, policy: &Policy) -> BeginRequest {
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
    /// Per key, the first grant of its current record. Once a record is
    /// pruned and its tombstone has expired, the key may begin again as a new
    /// operation (attempt 1); the grants before belong to the forgotten one.
    /// (A fuzzer finding: the proptest model assumed one record per key.)
    first: [usize; 3],
}

/// A reservation a record holds: (scope, bucket, window start, units).
type Held = (String, String, u64, u128);

fn reservation_of(v: &RecordView, body: &serde_json::Value) -> Option<Held> {
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

fn check(h: &PropHost, m: &mut Model, knobs: &Knobs, trace: &[Op]) -> Result<(), String> {
    let now = h.now();
    for (i, (scope, key, _)) in KEYS.iter().enumerate() {
        let live: Vec<&Grant> = m.grants[i]
            .iter()
            .filter(|g| !g.reported && g.lease_until > now)
            .collect();
        ensure!(
            live.len() <= 1,
            "{scope}/{key}: two outstanding executes {live:?}\n{trace:?}"
        );

        let Some(v) = inspect(h, scope, key).map_err(|e| format!("inspect: {e:?}"))? else {
            // Pruned (or never created): what it held is accounted as retired.
            if let Some(Some((s, b, w, u))) = m.held.remove(&(scope.to_string(), key.to_string())) {
                *m.retired.entry((s, b, w)).or_default() += u;
            }
            m.receipts[i] = None;
            m.first[i] = m.grants[i].len();
            continue;
        };
        // Parsed once: the reservation and the attempts below both read it.
        let body: serde_json::Value = serde_json::from_str(&v.body).unwrap();
        m.held
            .insert((scope.to_string(), key.to_string()), reservation_of(&v, &body));

        // Audit: contiguous, chained, ending in the record's state.
        let versions: Vec<u64> = v.audit.iter().map(|e| e.version).collect();
        ensure_eq!(
            versions,
            (1..=v.version).collect::<Vec<_>>(),
            "{}/{} audit {:?}",
            scope,
            key,
            trace
        );
        for w in v.audit.windows(2) {
            ensure_eq!(
                w[1].from_state,
                w[0].to_state,
                "{}/{}: broken chain at {}\n{:?}",
                scope,
                key,
                w[1].kind,
                trace
            );
        }
        ensure_eq!(v.audit.last().unwrap().to_state, Some(v.state));

        // A consistent DESIGN.md state.
        ensure!(
            v.attempts <= knobs.attempt_budget,
            "{scope}/{key}: {} attempts over the budget",
            v.attempts
        );
        match v.state {
            State::InFlight => ensure!(v.attempts >= 1),
            State::Confirmed => ensure!(v.receipt.is_some()),
            State::Failed => ensure!(v.error.is_some()),
            State::Superseded => ensure!(v.superseded_by.is_some()),
            State::Unknown | State::Absent | State::AwaitingApproval | State::Denied => {}
        }
        if matches!(
            v.state,
            State::Unknown
                | State::Absent
                | State::Failed
                | State::Superseded
                | State::AwaitingApproval
                | State::Denied
        ) {
            ensure!(
                live.is_empty(),
                "{scope}/{key} is {:?} while {live:?} may still send\n{trace:?}",
                v.state
            );
        }
        if v.escalated {
            ensure!(
                matches!(v.state, State::Unknown | State::Absent | State::AwaitingApproval) || v.possible_duplicate,
                "{scope}/{key}: escalated flag on {:?}",
                v.state
            );
        }
        if let Some(g) = live.first() {
            ensure!(
                v.state == State::InFlight || v.possible_duplicate,
                "{scope}/{key}: {:?} with a live execute {g:?}\n{trace:?}",
                v.state
            );
        }

        // A receipt never changes once set.
        if let Some(seen) = &m.receipts[i] {
            ensure_eq!(
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
            Some(pk) => ensure_eq!(&v.provider_key, pk),
            None => m.provider_keys[i] = Some(v.provider_key.clone()),
        }

        // Every execute handed out is an attempt of the record, with its lease.
        let attempts = body["attempts"].as_array().unwrap();
        for g in &m.grants[i][m.first[i]..] {
            let found = attempts.iter().find(|a| a["fence"] == g.fence.as_str());
            ensure!(
                found.is_some(),
                "{scope}/{key}: execute {g:?} is no attempt of the record"
            );
            let a = found.unwrap();
            ensure_eq!(a["n"].as_u64(), Some(u64::from(g.attempt)));
            ensure_eq!(a["lease_until"].as_u64(), Some(g.lease_until));
        }
    }

    // Quota: each bucket's used is the sum of what records hold in it.
    let mut expected: BTreeMap<(String, String, u64), u128> = m.retired.clone();
    for (s, b, w, u) in m.held.values().flatten() {
        *expected.entry((s.clone(), b.clone(), *w)).or_default() += u;
    }
    // (The ledger's provider-key secret shares the quota table, in a scope no bucket can have.)
    let buckets = h.mem.rows().into_iter();
    for row in buckets.filter(|r| r.table == Table::Quota && r.scope != once_guest::secret::SECRET_SCOPE) {
        let (bucket, window) = row.key.rsplit_once('@').unwrap();
        let window: u64 = window.parse().unwrap();
        let body: serde_json::Value = serde_json::from_str(&row.body).unwrap();
        let used: u128 = body["used"].as_str().unwrap().parse().unwrap();
        let want = expected
            .get(&(row.scope.clone(), bucket.to_string(), window))
            .copied()
            .unwrap_or(0);
        ensure_eq!(
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

fn grant(m: &mut Model, i: usize, e: &once_guest::types::Grant, trace: &[Op]) -> Result<(), String> {
    ensure!(
        m.receipts[i].is_none(),
        "{:?}: execute after the effect was confirmed\n{trace:?}",
        KEYS[i]
    );
    let last = m.grants[i][m.first[i]..].iter().map(|g| g.attempt).max().unwrap_or(0);
    ensure!(e.attempt > last, "attempt {} after {}", e.attempt, last);
    if let Some(pk) = &m.provider_keys[i] {
        ensure_eq!(&e.provider_key, pk, "the provider key never changes");
    }
    m.grants[i].push(Grant {
        fence: e.fence.clone(),
        attempt: e.attempt,
        lease_until: e.lease_until,
        reported: false,
    });
    Ok(())
}

fn replayed(m: &Model, i: usize, receipt: &str, trace: &[Op]) -> Result<(), String> {
    if let Some(seen) = &m.receipts[i] {
        ensure_eq!(
            receipt,
            seen.as_str(),
            "{:?}: a replay changed the receipt\n{:?}",
            KEYS[i],
            trace
        );
    }
    Ok(())
}

pub fn run(knobs: Knobs, ops: Vec<Op>) -> Result<(), String> {
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
                        ensure!(armed, "blocked(storage) on a healthy ledger: {b:?}\n{trace:?}")
                    }
                    Ok(Decision::Conflict(c)) => ensure!(false, "conflict on an identical call: {c:?}"),
                    Ok(Decision::Direct) => ensure!(false, "a protected tool went direct"),
                    Ok(_) => {}
                    Err(e) => ensure!(false, "begin failed: {e:?}\n{trace:?}"),
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
                            ensure!(armed, "unrecorded on a healthy ledger\n{trace:?}");
                        }
                        if let Some(g) = m.grants[i].iter_mut().find(|g| g.fence == fence) {
                            g.reported = true;
                        }
                    }
                    Err(Error::NotFound) => {}
                    // The fence of a forgotten record means nothing to the new one.
                    Err(Error::FenceMismatch) if m.grants[i][..m.first[i]].iter().any(|g| g.fence == fence) => {}
                    Err(Error::FenceMismatch) => {
                        ensure_eq!(
                            fence.as_str(),
                            "no-such-fence",
                            "a granted fence was refused\n{:?}",
                            trace
                        )
                    }
                    Err(e) => ensure!(false, "finish failed: {e:?}\n{trace:?}"),
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
                    Err(e) => ensure!(false, "reconcile failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Sweep(ev) => {
                h.ev.set(ev);
                match sweep(&h, 16) {
                    Ok(_) => {}
                    Err(e) if storage_ok(&e) => {}
                    Err(e) => ensure!(false, "sweep failed: {e:?}\n{trace:?}"),
                }
            }
            Op::Prune => match prune(&h, 16) {
                Ok(_) => {}
                Err(e) if storage_ok(&e) => {}
                Err(e) => ensure!(false, "prune failed: {e:?}\n{trace:?}"),
            },
            Op::Advance(ms) => h.mem.advance(ms),
            Op::FailNextCommit { applied } => h.fail.set(Some(applied)),
        }
        check(&h, &mut m, &knobs, &trace)?;
    }
    Ok(())
}
