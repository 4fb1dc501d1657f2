//! Answers and background work the review of b58a043 found wrong (issue
//! "Safe defaults and true answers"): each test here failed there.

mod common;

use std::cell::RefCell;

use common::*;
use once_guest::engine::{begin, prune, queue, resolve, sweep};
use once_guest::host::{CommitError, Host};
use once_guest::protocol::start_request;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    AuditEvent, Batch, BlockReason, Effect, Ending, Escalation, Evidence, QueueFilter, Resolution, Row, Settings,
    State, Step, Stored, Table,
};

/// `MemoryHost` with two faults of its surroundings: every deferrable
/// batch (a replay's count) loses its race, and the sink refuses one key's
/// escalations for ever. It records every key it was asked to escalate.
struct Faulty {
    mem: MemoryHost,
    lose_deferrable: bool,
    refused: &'static str,
    delivered: RefCell<Vec<String>>,
}

impl Faulty {
    fn new(lose_deferrable: bool, refused: &'static str) -> Self {
        Faulty {
            mem: MemoryHost::new(),
            lose_deferrable,
            refused,
            delivered: RefCell::new(Vec::new()),
        }
    }
}

impl Host for Faulty {
    fn now(&self) -> u64 {
        self.mem.now()
    }
    fn settings(&self) -> Settings {
        self.mem.settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        self.mem.get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        if self.lose_deferrable && batch.deferrable {
            return Err(CommitError::Conflict);
        }
        self.mem.commit(batch)
    }
    fn scan(&self, t: Table, s: &[State], due: u64, owner: Option<String>, limit: u32) -> Result<Vec<Row>, String> {
        self.mem.scan(t, s, due, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        self.mem.audit(scope, key)
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self.mem.lookup(tool, provider_key, args)
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        self.delivered.borrow_mut().push(escalation.key.clone());
        escalation.key != self.refused && self.mem.escalate(escalation)
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.mem.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.mem.secret_cache()
    }
}

/// b58a043 answered `blocked(storage)` "nothing was sent" to a repeat of a
/// confirmed operation whose replay count kept losing its write race.
#[test]
fn a_confirmed_record_replays_when_counting_the_replay_loses_every_race() {
    let h = Faulty::new(true, "");
    let e = execute_of(begin(&h.mem, refund("k", ARGS)).unwrap());
    fin(&h.mem, "k", &e.fence, success(RECEIPT));
    let replay = replay_of(begin(&h, refund("k", ARGS)).unwrap());
    assert_eq!(replay.receipt, RECEIPT);
    assert!(replay.replayed);
}

/// b58a043 answered "effect: none" for a superseded record that stored a
/// late receipt: the effect happened after all.
#[test]
fn a_superseded_record_with_a_late_receipt_says_it_happened() {
    let h = MemoryHost::new();
    let e = unknown_record(&h, "k1", policy());
    h.advance(MAX_IN_FLIGHT + LEASE);
    resolve(&h, "s", "k1", Resolution::Absent, "checked", false).unwrap();
    let mut successor = refund("k2", r#"{"order":1234,"amount":300}"#);
    successor.supersedes = Some("k1".into());
    execute_of(go(&h, successor));
    assert_eq!(view(&h, "k1").state, State::Superseded);
    // The first attempt's success arrives late: the effect happened.
    fin(&h, "k1", &e.fence, success(RECEIPT));
    let Step::Done(account) = start_request(&h, refund("k1", ARGS)).unwrap() else {
        panic!("a superseded key is done")
    };
    assert!(
        matches!(&account.ending, Ending::Blocked(b) if b.reason == BlockReason::Superseded
            && b.receipt.as_deref() == Some(RECEIPT)),
        "{account:?}"
    );
    assert_eq!(account.effect, Effect::Happened);
}

/// b58a043 told a repeat of a pruned confirmed key "expired … mint a new
/// key", effect none: an agent that follows it refunds twice.
#[test]
fn a_pruned_confirmed_key_says_it_happened_and_not_to_repeat_it() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    h.advance(RETENTION + SECOND);
    assert_eq!(prune(&h, 10).unwrap().pruned, 1);
    let Step::Done(account) = start_request(&h, refund("k", ARGS)).unwrap() else {
        panic!("an expired key is done")
    };
    let Ending::Blocked(b) = &account.ending else {
        panic!("{account:?}")
    };
    assert_eq!(b.reason, BlockReason::Expired);
    assert_eq!(account.effect, Effect::Happened, "{account:?}");
    assert!(!b.detail.contains("mint a new key"), "{}", b.detail);
    assert!(b.detail.contains("do not repeat it"), "{}", b.detail);
}

/// A rejected key, pruned, still says nothing happened (and a new key is the way on).
#[test]
fn a_pruned_rejected_key_says_none() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, rejected());
    h.advance(RETENTION + SECOND);
    prune(&h, 10).unwrap();
    let Step::Done(account) = start_request(&h, refund("k", ARGS)).unwrap() else {
        panic!("an expired key is done")
    };
    assert_eq!(account.effect, Effect::None, "{account:?}");
}

/// b58a043: an escalation the sink does not acknowledge stayed due in the
/// past (nothing was written on a refusal), and with a row limit of one it
/// filled every sweep: another record's ended lease was never expired.
#[test]
fn a_refused_escalation_backs_off_and_the_sweep_reaches_other_work() {
    let mut p = policy();
    p.lookup = false;
    let h = Faulty::new(false, "stuck");
    unknown_record(&h.mem, "stuck", p);
    h.mem.advance(DEADLINE + SECOND);
    sweep(&h, 1).unwrap();
    assert!(view(&h.mem, "stuck").escalated);
    // Another record, in flight; its lease ends after the refused escalation was due again.
    execute_of(go(&h.mem, refund("other", r#"{"order":7,"amount":1}"#)));
    h.mem.advance(LEASE + SECOND);
    let mut expired = false;
    for _ in 0..8 {
        sweep(&h, 1).unwrap();
        if view(&h.mem, "other").state == State::Unknown {
            expired = true;
            break;
        }
        h.mem.advance(SECOND);
    }
    let refusals = h.delivered.borrow().iter().filter(|k| *k == "stuck").count();
    assert!(expired, "the refused escalation kept every sweep ({refusals} refusals)");
    assert!(refusals >= 2, "re-delivered: {refusals}");
}

/// b58a043 applied the queue's scope filter after its row limit: scope t's
/// unknown record was missing (`entries = 0, truncated = true`).
#[test]
fn the_queue_filters_by_scope_before_its_limit() {
    let h = MemoryHost::new();
    unknown_record(&h, "u1", policy());
    unknown_record(&h, "u2", policy());
    let t = execute_of(go(&h, req("t", Some("t1"), "refund", ARGS, policy())));
    h.advance(SECOND);
    once_guest::engine::finish(&h, "t", "t1", &t.fence, ambiguous()).unwrap();
    let only_t = QueueFilter {
        scopes: Some(vec!["t".into()]),
        tool: None,
        key_prefix: None,
    };
    let q = queue(&h, &only_t, 1).unwrap();
    let keys: Vec<&str> = q.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["t1"]);
    assert!(!q.truncated);
}

/// A possible-duplicate escalation the sink has not acknowledged survives
/// prune until it does.
#[test]
fn an_unacknowledged_possible_duplicate_outlives_retention() {
    let h = MemoryHost::new();
    let first = unknown_record(&h, "k", policy());
    h.advance(SECOND);
    resolve(&h, "s", "k", Resolution::Absent, "forced", true).unwrap();
    let second = execute_of(once_guest::engine::reconcile(&h, "s", "k").unwrap());
    h.set_ack_escalations(false);
    fin(&h, "k", &second.fence, success(RECEIPT2));
    fin(&h, "k", &first.fence, success(RECEIPT));
    let v = view(&h, "k");
    assert!(v.possible_duplicate && v.escalated);
    h.advance(RETENTION + DAY);
    prune(&h, 10).unwrap();
    assert!(
        h.row(Table::Operation, "s", "k").is_some(),
        "pruned before the sink had it"
    );
    h.set_ack_escalations(true);
    sweep(&h, 10).unwrap();
    h.advance(SECOND);
    prune(&h, 10).unwrap();
    assert!(h.row(Table::Operation, "s", "k").is_none(), "acknowledged, then pruned");
}

/// b58a043: one row this build could not read (a newer build's body during
/// a rolling upgrade) made sweep, prune and the queue fail for every row.
#[test]
fn an_unreadable_row_is_skipped_and_escalated_and_the_rest_goes_on() {
    let h = MemoryHost::new();
    unknown_record(&h, "bad", policy());
    let mut row = h.row(Table::Operation, "s", "bad").unwrap();
    row.body = r#"{"format":99,"from":"a newer build"}"#.into();
    h.put_row(row);
    unknown_record(&h, "good", policy());
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    h.advance(SECOND);
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.unreadable, 1);
    assert_eq!(view(&h, "good").state, State::Confirmed);
    let escalated: Vec<(String, String)> = h.escalations().into_iter().map(|e| (e.key, e.reason)).collect();
    assert!(
        escalated.iter().any(|(k, r)| k == "bad" && r.starts_with("unreadable")),
        "{escalated:?}"
    );
    prune(&h, 10).unwrap();
    queue(&h, &everything(), 10).unwrap();
}

/// An original resolved absent by force, then superseded (a tool without a
/// lookup: once no request of it can still commit, on the operator's word):
/// its request may have committed before the force, so a repeat of the
/// original says the effect is unknown, live and after prune.
#[test]
fn a_superseded_original_whose_absence_was_forced_says_unknown_live_and_pruned() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.lookup = false;
    unknown_record(&h, "k1", p.clone());
    resolve(&h, "s", "k1", Resolution::Absent, "forced", true).unwrap();
    let mut successor = with_policy(refund("k2", r#"{"order":1234,"amount":300}"#), p);
    successor.supersedes = Some("k1".into());
    // Not while a request of it may still commit.
    blocked_of(go(&h, successor.clone()), BlockReason::SupersededUnresolved);
    h.advance(MAX_IN_FLIGHT + LEASE);
    execute_of(go(&h, successor));
    let repeat = |h: &MemoryHost| match start_request(h, refund("k1", ARGS)).unwrap() {
        Step::Done(account) => account,
        other => panic!("{other:?}"),
    };
    let live = repeat(&h);
    assert!(
        matches!(&live.ending, Ending::Blocked(b) if b.reason == BlockReason::Superseded),
        "{live:?}"
    );
    assert_eq!(live.effect, Effect::Unknown, "{live:?}");
    h.advance(RETENTION + SECOND);
    prune(&h, 10).unwrap();
    let pruned = repeat(&h);
    assert!(
        matches!(&pruned.ending, Ending::Blocked(b) if b.reason == BlockReason::Expired),
        "{pruned:?}"
    );
    assert_eq!(pruned.effect, Effect::Unknown, "{pruned:?}");
}
