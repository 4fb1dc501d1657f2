//! Against a provider that tells the truth (with lag and lost replies), no
//! interleaving makes a second effect for one operation.
#![allow(missing_docs)]

use std::cell::{Cell, RefCell};

use once_guest::engine::{begin, finish, inspect, prune, reconcile, sweep};
use once_guest::host::CommitError;
use once_guest::host::Host;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{AuditEvent, Batch, Decision, Escalation, Evidence, Outcome, Row, Settings, State, Table};

use super::machine::{KEYS, request};

// ---------------------------------------------------------------- a truthful provider

/// How a lookup reads the provider: a replica `lag` ms behind (0: a
/// linearizable read), or one that cannot tell.
#[derive(Debug, Clone, Copy)]
pub struct Read {
    pub lag: u64,
    pub cannot_tell: bool,
}

/// What the provider does with one request.
#[derive(Debug, Clone, Copy)]
pub enum Fate {
    /// Commits `delay` ms after it was sent (at most max_in_flight).
    Commit(u64),
    /// Answers and does nothing.
    Reject,
}

/// One step of a run.
#[derive(Debug, Clone)]
pub enum TOp {
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
    memory_ledger!();
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
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.mem.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.mem.secret_cache()
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

pub fn truthful_run(verify_first: bool, budget: u32, ops: Vec<TOp>) -> Result<(), String> {
    let mut p = default_policy();
    p.verify_first = verify_first;
    p.attempt_budget = budget;
    // The MemoryHost's fixed entropy makes the ledger's secret, so these are the keys it derives.
    let test_secret = once_guest::secret::KeySecret::from_bytes(once_guest::testing::TEST_ENTROPY.to_vec());
    let w = World {
        mem: MemoryHost::new(),
        read: Cell::new(Read {
            lag: 0,
            cannot_tell: false,
        }),
        fail: Cell::new(None),
        provider_keys: KEYS
            .iter()
            .map(|(s, k, _)| once_guest::identity::provider_key(&test_secret, s, k, 1))
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
            ensure!(
                effects.len() <= 1,
                "{scope}/{key}: {} effects at the provider\n{trace:?}",
                effects.len()
            );
            if let Some(v) = inspect(&w, scope, key).unwrap() {
                if let (Some(receipt), Some((_, effect))) = (&v.receipt, effects.first()) {
                    ensure_eq!(
                        receipt,
                        effect,
                        "{}/{}: the receipt is not the effect's\n{:?}",
                        scope,
                        key,
                        trace
                    );
                }
                if v.state == State::Confirmed {
                    ensure!(
                        !effects.is_empty(),
                        "{scope}/{key}: confirmed without an effect\n{trace:?}"
                    );
                }
            }
        }
    }
    Ok(())
}
