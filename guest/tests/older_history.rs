//! Older history (DESIGN.md "Authority"): a ledger restored from an older
//! backup never re-sends what the newer history had. The witness, kept apart
//! from the ledger, gives back the record of every attempt handed out; the
//! engine writes it back and settles it by a read (or an operator), never by
//! a second dispatch.

mod common;

use common::*;
use once_guest::engine::{begin, inspect, prune, reconcile, sweep};
use once_guest::host::Host;
use once_guest::testing::MemoryHost;
use once_guest::types::{BlockReason, Decision, Evidence, Grant, ReplayVia, State, Table};

/// The restore event of a record, if it has one.
fn restored(h: &MemoryHost, key: &str) -> Option<serde_json::Value> {
    view(h, key)
        .audit
        .iter()
        .find(|e| e.kind == "restored-from-witness")
        .map(|e| serde_json::from_str(&e.detail).unwrap())
}

/// `k` sent and confirmed, then the ledger put back to a copy taken before the call.
fn confirmed_then_restored(h: &MemoryHost) -> Grant {
    let backup = h.ledger();
    let e = execute_of(go(h, refund("k", ARGS)));
    fin(h, "k", &e.fence, success(RECEIPT));
    h.set_ledger(backup);
    e
}

/// The newest history a key had: dispatched once, then confirmed; the ledger
/// then goes back to a copy taken before the key existed.
#[test]
fn a_ledger_restored_from_before_a_sent_call_replays_it_after_a_read_never_sends_it_again() {
    let h = MemoryHost::new();
    let e = confirmed_then_restored(&h);

    // The same call: its first attempt is the newer history's, still in its lease.
    let Decision::InFlight(info) = go(&h, refund("k", ARGS)) else {
        panic!("a restored attempt within its lease is in flight")
    };
    assert_eq!(info.lease_until, e.lease_until);
    let detail = restored(&h, "k").expect("audited");
    assert_eq!(detail["ledger_held"], "no record");
    assert_eq!(detail["attempt"], 1);

    // Past its lease: unknown, and a read (by the provider key it was sent with) settles it.
    h.advance(LEASE);
    unknown_of(go(&h, refund("k", ARGS)));
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let r = replay_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Provider), RECEIPT));
    assert_eq!(
        h.lookups(),
        [("refund".to_string(), e.provider_key.clone(), e.args.clone())]
    );
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Confirmed, 1), "never a second attempt");
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, RECEIPT);
}

/// Without a read for the tool, nothing settles the restored attempt but an
/// operator: it stays unknown and escalates, and is never sent again.
#[test]
fn without_a_read_the_restored_attempt_waits_for_an_operator() {
    let h = MemoryHost::new();
    confirmed_then_restored(&h);
    assert!(matches!(go(&h, refund("k", ARGS)), Decision::InFlight(_)));
    for _ in 0..4 {
        h.advance(DEADLINE);
        sweep(&h, 10).unwrap();
        unknown_of(go(&h, refund("k", ARGS)));
    }
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Unknown, 1));
    assert!(v.escalated, "an operator is told");
}

/// The restored ledger holds the key, but not its last attempt: the first was
/// rejected there, and the newer history sent a second. No third is granted
/// before a read proves the second absent.
#[test]
fn a_restored_record_missing_its_last_attempt_gets_it_back() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e1.fence, rejected());
    let backup = h.ledger();
    h.advance(SECOND);
    let e2 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(e2.attempt, 2);
    h.set_ledger(backup);

    assert!(matches!(go(&h, refund("k", ARGS)), Decision::InFlight(_)));
    let detail = restored(&h, "k").expect("audited");
    assert_eq!(detail["ledger_held"], "failed record with 1 attempt(s)");
    assert_eq!(detail["attempt"], 2);
    assert_eq!(view(&h, "k").attempts, 2);
    h.advance(LEASE);
    unknown_of(go(&h, refund("k", ARGS)));
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    replay_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(view(&h, "k").attempts, 2);
}

/// A ledger that lost nothing restores nothing: a retry replays as always.
#[test]
fn a_ledger_that_is_not_behind_its_witness_is_left_alone() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, RECEIPT);
    assert!(restored(&h, "k").is_none());
    let e1 = execute_of(go(&h, refund("r", ARGS)));
    fin(&h, "r", &e1.fence, rejected());
    assert_eq!(execute_of(go(&h, refund("r", ARGS))).attempt, 2);
    assert!(restored(&h, "r").is_none());
}

/// The restored record keeps the provider key it was sent with, even when the
/// backup predates the ledger's provider-key secret: a new process over it
/// makes another secret, and still reads by the key that was sent.
#[test]
fn a_backup_from_before_the_secret_still_reads_by_the_key_that_was_sent() {
    let h = MemoryHost::without_secret();
    let backup = h.ledger();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    let restarted = MemoryHost::without_secret();
    restarted.set_ledger(backup);
    restarted.set_witness(h.witness());
    restarted.set_entropy(b"another secret, after a restore!".to_vec());
    restarted.set_now(h.now());
    assert!(matches!(go(&restarted, refund("k", ARGS)), Decision::InFlight(_)));
    restarted.advance(LEASE);
    restarted.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    replay_of(reconcile(&restarted, "s", "k").unwrap());
    assert_eq!(restarted.lookups()[0].1, e.provider_key);
    // A new key of the restarted process is derived with the new secret.
    let other = execute_of(go(&restarted, refund("k2", ARGS)));
    let before = execute_of(go(&h, refund("k2", ARGS)));
    assert_ne!(other.provider_key, before.provider_key);
}

/// A witness that cannot be read grants nothing: blocked(storage), nothing written.
#[test]
fn an_unreadable_witness_grants_nothing() {
    let h = MemoryHost::new();
    h.set_fail_witness(true);
    let b = blocked_of(go(&h, refund("k", ARGS)), BlockReason::Storage);
    assert!(b.detail.contains("witness"), "{b:?}");
    // The first try claims without reading the ledger; the witness is asked before any claim.
    assert_nothing_written(&h);
}

/// A grant the witness could not keep never leaves: its attempt ends not
/// sent, and once the witness is back the call is sent once.
#[test]
fn a_grant_the_witness_cannot_keep_is_not_sent() {
    let h = MemoryHost::new();
    // The first look (nothing kept) passes; the keep after the claim fails.
    let failing = FailKeep::new(&h);
    let b = blocked_of(begin(&failing, refund("k", ARGS)).unwrap(), BlockReason::Storage);
    assert!(b.detail.contains("was not sent"), "{b:?}");
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Failed, 1));
    assert!(h.witness().kept.is_empty());
    h.advance(10 * SECOND);
    let e = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(e.attempt, 2);
    assert_eq!(h.witness().kept.len(), 1);
}

/// What it cannot detect: a witness restored with the ledger (or lost with
/// it) holds no newer history, and the call is sent again.
#[test]
fn a_witness_restored_with_its_ledger_cannot_tell() {
    let h = MemoryHost::new();
    let (ledger, witness) = (h.ledger(), h.witness());
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    h.set_ledger(ledger);
    h.set_witness(witness);
    assert_eq!(
        execute_of(go(&h, refund("k", ARGS))).attempt,
        1,
        "sent again: the documented limit"
    );
}

/// A key the ledger itself forgets (its record pruned, then its tombstone) names a new
/// operation: prune has the witness forget it first, so nothing is restored.
#[test]
fn a_key_the_ledger_forgot_is_forgotten_by_the_witness_first() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    h.advance(RETENTION);
    assert_eq!(prune(&h, 10).unwrap().pruned, 1);
    assert_eq!(
        h.witness().kept.len(),
        1,
        "while the tombstone holds the key, so does the witness"
    );
    h.advance(policy().tombstone_retention_ms);
    assert_eq!(prune(&h, 10).unwrap().tombstones_removed, 1);
    assert!(h.witness().kept.is_empty());
    assert_eq!(execute_of(go(&h, refund("k", ARGS))).attempt, 1);
    assert!(restored(&h, "k").is_none());
}

/// A derived key's record leaves no tombstone: pruning it forgets the witness's too, and the
/// same arguments afterwards are a new operation. A witness that cannot forget keeps the record.
#[test]
fn a_pruned_derived_record_is_forgotten_by_the_witness_first() {
    let h = MemoryHost::new();
    let derived = || req("s", None, "refund", ARGS, policy());
    let e = execute_of(go(&h, derived()));
    fin(&h, &e.key, &e.fence, success(RECEIPT));
    h.advance(RETENTION);
    h.set_fail_witness(true);
    assert!(
        prune(&h, 10).is_err(),
        "the witness could not forget: the ledger keeps the record"
    );
    assert!(inspect(&h, "s", &e.key).unwrap().is_some());
    h.set_fail_witness(false);
    assert_eq!(prune(&h, 10).unwrap().pruned, 1);
    assert!(h.witness().kept.is_empty());
    let again = execute_of(go(&h, derived()));
    assert_eq!((again.key.as_str(), again.attempt), (e.key.as_str(), 1));
}

/// However long an operation stayed unsettled in the newer history, a ledger restored from
/// before it gets it back: the witness has no clock of its own.
#[test]
fn an_operation_unsettled_for_months_is_still_restored() {
    let h = MemoryHost::new();
    let backup = h.ledger();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, ambiguous());
    h.advance(RETENTION + policy().tombstone_retention_ms + DAY);
    h.set_ledger(backup);
    unknown_of(go(&h, refund("k", ARGS)));
    assert!(restored(&h, "k").is_some());
    assert_eq!(view(&h, "k").attempts, 1);
}

/// The newer history superseded a failed original and sent its successor; the ledger goes back
/// to before the supersede. The original is not sent again beside the successor: the witness
/// kept it superseded, and gives that back; the successor comes back as sent.
#[test]
fn a_supersede_the_ledger_lost_is_given_back() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("orig", ARGS)));
    fin(&h, "orig", &e.fence, rejected());
    let backup = h.ledger();
    h.advance(SECOND);
    let mut succ = refund("succ", r#"{"order":1234,"amount":150}"#);
    succ.supersedes = Some("orig".to_string());
    execute_of(go(&h, succ.clone()));
    assert_eq!(view(&h, "orig").state, State::Superseded);
    h.set_ledger(backup);
    let stored = h.row(Table::Operation, "s", "orig").unwrap();
    assert_eq!(stored.state, Some(State::Failed), "as the backup holds it");

    // A retry of the original: not a second attempt, the supersede.
    blocked_of(go(&h, refund("orig", ARGS)), BlockReason::Superseded);
    let o = view(&h, "orig");
    assert_eq!((o.state, o.attempts), (State::Superseded, 1));
    assert!(restored(&h, "orig").is_some());
    // The successor's call: its attempt back, in flight, never a second one.
    assert!(matches!(go(&h, succ), Decision::InFlight(_)));
    assert_eq!(view(&h, "succ").attempts, 1);
}

/// A host over a [`MemoryHost`] whose witness refuses every keep.
struct FailKeep<'a>(&'a MemoryHost);

impl<'a> FailKeep<'a> {
    fn new(h: &'a MemoryHost) -> Self {
        FailKeep(h)
    }
}

impl once_guest::host::Host for FailKeep<'_> {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn settings(&self) -> once_guest::types::Settings {
        self.0.settings()
    }
    fn get(
        &self,
        table: once_guest::types::Table,
        scope: &str,
        key: &str,
    ) -> Result<Option<once_guest::types::Stored>, String> {
        self.0.get(table, scope, key)
    }
    fn commit(&self, batch: &once_guest::types::Batch) -> Result<(), once_guest::host::CommitError> {
        self.0.commit(batch)
    }
    fn scan(
        &self,
        table: once_guest::types::Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<once_guest::types::Row>, String> {
        self.0.scan(table, states, due_before, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<once_guest::types::AuditEvent>, String> {
        self.0.audit(scope, key)
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self.0.lookup(tool, provider_key, args)
    }
    fn escalate(&self, escalation: &once_guest::types::Escalation) -> bool {
        self.0.escalate(escalation)
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.0.entropy(len)
    }
    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, String> {
        self.0.witnessed(scope, key)
    }
    fn keep_witness(&self, _: &str, _: &str, _: &str, _: u64) -> Result<(), String> {
        Err("disk full".to_string())
    }
}
