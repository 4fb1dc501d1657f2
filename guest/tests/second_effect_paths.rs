//! Paths to a second effect or a false report, each closed in the engine:
//! stale successes in any order, numbers a double changes, shared quota
//! buckets in two units, a provider claiming a key it never saw, "not sent",
//! owners on a shared ledger, and derived keys past their window.

mod common;

use common::*;
use once_guest::engine::{adopt, await_holder, begin, finish, inspect, prune, reconcile, sweep};
use once_guest::host::Host;
use once_guest::policy::{Policy, Quota};
use once_guest::testing::MemoryHost;
use once_guest::types::{
    Awaited, BlockReason, Decision, Error, Evidence, FinishAck, IdentityMode, JsonErrorKind, KeySource, Outcome,
    ReplayVia, State, Table,
};

// ---------------------------------------------------------------- a success after another attempt's

/// The newer attempt confirms first; the older attempt's success arrives
/// later: a second effect may exist. Flagged, audited with its receipt,
/// escalated; the stored receipt stays the first.
#[test]
fn a_stale_success_after_a_newer_attempt_confirmed_is_a_possible_duplicate() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(e2.attempt, 2);
    assert_eq!(
        fin(&h, "k", &e2.fence, success(RECEIPT2)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert!(h.escalations().is_empty());

    assert_eq!(
        fin(&h, "k", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = view(&h, "k");
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT2), "the stored receipt never changes");
    assert!(v.possible_duplicate && v.escalated);
    let flagged = v
        .audit
        .iter()
        .find(|e| e.kind == "late-success-possible-duplicate")
        .expect("the second success is audited");
    assert_eq!(flagged.attempt, Some(1));
    let detail: serde_json::Value = serde_json::from_str(&flagged.detail).unwrap();
    assert_eq!(
        detail["receipt"],
        serde_json::json!({"refund_id": "r-1", "status": "done"})
    );
    let esc = h.escalations();
    assert_eq!(esc.len(), 1);
    assert_eq!(
        (esc[0].reason.as_str(), esc[0].state),
        ("possible-duplicate", State::Confirmed)
    );
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, RECEIPT2);
}

/// The attempt whose effect is recorded reporting again (a retried finish,
/// or its own late reply after reconciliation found the effect) is nothing new.
#[test]
fn the_confirming_attempt_reporting_again_is_not_a_duplicate() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(
        fin(&h, "k", &e.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert_eq!(
        fin(&h, "k", &e.fence, success(RECEIPT)),
        FinishAck::Ignored(State::Confirmed)
    );

    let u = unknown_record(&h, "u", policy());
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    replay_of(reconcile(&h, "s", "u").unwrap());
    assert_eq!(
        fin(&h, "u", &u.fence, success(RECEIPT)),
        FinishAck::Ignored(State::Confirmed)
    );
    assert!(!view(&h, "u").possible_duplicate);
    assert!(h.escalations().is_empty());
}

// ---------------------------------------------------------------- numbers a double changes

/// In the args (what is fingerprinted and dispatched), a number whose double
/// denotes another decimal is a typed error before any write; 2^53 itself is fine.
#[test]
fn integers_above_2_pow_53_are_refused_in_the_payload() {
    let h = MemoryHost::new();
    let err = begin(&h, refund("k", r#"{"order":9007199254740993,"amount":200}"#)).unwrap_err();
    let Error::InvalidJson(e) = err else { panic!("{err:?}") };
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (JsonErrorKind::InexactNumber, "/order", 9)
    );
    assert!(
        e.message.contains("9007199254740993") && e.message.contains("9007199254740992"),
        "{}",
        e.message
    );
    assert_nothing_written(&h);

    // An effect field and a spend field: refused the same way.
    let mut p = quota_policy("500.00");
    p.effect_fields = Some(vec!["/amount".to_string(), "/to".to_string()]);
    let err = begin(&h, pay("p", "0.30000000000000001", &p)).unwrap_err();
    assert!(matches!(&err, Error::InvalidJson(e) if e.kind == JsonErrorKind::InexactNumber && e.pointer == "/amount"));
    assert_nothing_written(&h);

    // Derived identity would have answered …992's call with …993's receipt.
    let mut derived = policy();
    derived.identity = IdentityMode::Derived;
    let r = |args: &str| req("s", None, "refund", args, derived.clone());
    assert!(begin(&h, r(r#"{"order":9007199254740993}"#)).is_err());
    let e = execute_of(go(&h, r(r#"{"order":9007199254740992}"#)));
    assert_eq!(e.args, r#"{"order":9007199254740992}"#);
    assert!(begin(&h, r(r#"{"order":9007199254740993}"#)).is_err());
}

/// A receipt holding 2^53 + 1 replays as sent, by every path that stores one.
#[test]
fn a_receipt_with_a_big_integer_replays_exactly() {
    let h = MemoryHost::new();
    let receipt = r#"{"refund_id":9007199254740993}"#;
    let e = execute_of(go(&h, refund("a", ARGS)));
    fin(&h, "a", &e.fence, success(receipt));
    assert_eq!(replay_of(go(&h, refund("a", ARGS))).receipt, receipt);

    unknown_record(&h, "b", policy());
    h.script_lookup(Evidence::Confirmed(receipt.to_string()));
    assert_eq!(replay_of(reconcile(&h, "s", "b").unwrap()).receipt, receipt);
    assert_eq!(view(&h, "b").receipt.as_deref(), Some(receipt));
}

// ---------------------------------------------------------------- one bucket, one unit

fn in_bucket(decimals: u8) -> Policy {
    let mut p = policy();
    p.quota = Some(Quota {
        spend_field: "/amount".to_string(),
        ceiling: if decimals == 0 { "500" } else { "500.00" }.to_string(),
        decimals,
        window_ms: DAY,
        bucket: Some("payouts".to_string()),
    });
    p
}

/// `payout 500` (whole units) and `refund 495.00` (cents) in one bucket
/// would both fit a ceiling of 500 if raw minor units were added: the
/// second is refused, naming both units, and nothing of it is written.
#[test]
fn a_shared_bucket_refuses_a_policy_in_another_unit() {
    let h = MemoryHost::new();
    let payout = req("s", Some("p1"), "payout", r#"{"amount":500}"#, in_bucket(0));
    execute_of(go(&h, payout));
    let rows = h.rows().len();
    let refund = req("s", Some("r1"), "refund", r#"{"amount":495.00}"#, in_bucket(2));
    let b = blocked_of(go(&h, refund), BlockReason::Quota);
    assert!(
        b.detail.contains("\"payouts\"") && b.detail.contains("0 decimal places") && b.detail.contains("says 2"),
        "{}",
        b.detail
    );
    assert_eq!(h.rows().len(), rows, "nothing of the refused call is written");
    assert_eq!(quota_used(&h), 500);

    // The same unit sums exactly and stops at the ceiling.
    let more = req("s", Some("p2"), "payout", r#"{"amount":1}"#, in_bucket(0));
    blocked_of(go(&h, more), BlockReason::Quota);
}

/// Money that already moved (a late success after release) is counted in
/// the bucket's unit, rounded up, never dropped.
#[test]
fn spend_that_already_happened_is_counted_in_the_buckets_unit() {
    let h = MemoryHost::new();
    let r1 = req("s", Some("r1"), "refund", r#"{"amount":10.50}"#, in_bucket(2));
    let e = execute_of(go(&h, r1));
    assert_eq!(fin(&h, "r1", &e.fence, rejected()), FinishAck::Recorded(State::Failed));
    assert_eq!(quota_used(&h), 0);
    // The next window's bucket is opened by a whole-unit tool.
    h.advance(DAY);
    let p = req("s", Some("p1"), "payout", r#"{"amount":3}"#, in_bucket(0));
    execute_of(go(&h, p));
    assert_eq!(quota_used(&h), 3);
    // The refund's late success lands in that window: 10.50 counts as 11 whole units.
    assert_eq!(
        fin(&h, "r1", &e.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert_eq!(quota_used(&h), 14);
}

// ---------------------------------------------------------------- a key the provider never saw

/// A provider cannot claim a key it never saw: claims-key without a carrier
/// is an inconsistent policy.
#[test]
fn provider_claims_key_needs_a_carrier() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.provider_claims_key = true;
    let err = begin(&h, with_policy(refund("k", ARGS), p.clone())).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidPolicy(m) if m.contains("key_argument")),
        "{err:?}"
    );
    assert_nothing_written(&h);
    p.key_argument = Some("idempotency_key".to_string());
    execute_of(go(&h, with_policy(refund("k", ARGS), p)));
}

/// An attempt whose dispatched args did not carry the provider key (a
/// record written before that was kept) gets the max_in_flight rule, not
/// the claims-key shortcut: attempt 2 is not granted 1 ms after attempt 1.
#[test]
fn an_attempt_without_the_key_in_its_args_waits_out_max_in_flight() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.provider_claims_key = true;
    p.key_argument = Some("idempotency_key".to_string());
    unknown_record(&h, "k", p);
    // Rewrite the stored body as an old host left it: no `key_in_args`.
    let row = h.row(Table::Operation, "s", "k").unwrap();
    let mut body: serde_json::Value = serde_json::from_str(&row.body).unwrap();
    body.as_object_mut().unwrap().remove("key_in_args");
    h.put_row(once_guest::types::Row {
        body: body.to_string(),
        ..row
    });
    h.advance(1);
    h.script_lookup(Evidence::Absent(h.now()));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    h.advance(MAX_IN_FLIGHT);
    h.script_lookup(Evidence::Absent(h.now()));
    assert_eq!(execute_of(reconcile(&h, "s", "k").unwrap()).attempt, 2);
}

// ---------------------------------------------------------------- not sent is not rejected

/// Nothing was sent: the next attempt of the same operation, within the
/// budget, with the same provider key; when the budget is spent, the
/// refusal says nothing was sent.
#[test]
fn not_sent_leads_to_the_next_attempt_and_then_says_nothing_was_sent() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(
        fin(&h, "k", &e1.fence, Outcome::NotSent),
        FinishAck::Recorded(State::Failed)
    );
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!((e2.attempt, e2.provider_key.as_str()), (2, e1.provider_key.as_str()));
    assert_eq!(
        fin(&h, "k", &e2.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );

    for _ in 0..3 {
        let e = match reconcile(&h, "s", "n") {
            Err(Error::NotFound) => execute_of(go(&h, refund("n", ARGS))),
            other => execute_of(other.unwrap()),
        };
        fin(&h, "n", &e.fence, Outcome::NotSent);
    }
    let b = blocked_of(reconcile(&h, "s", "n").unwrap(), BlockReason::AttemptBudget);
    assert!(
        b.detail.contains("none of them was sent, so nothing happened"),
        "{}",
        b.detail
    );
}

/// A waiter whose holder did not send is not told "rejected".
#[test]
fn a_waiter_is_not_told_rejected_when_the_holder_did_not_send() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e1.fence, Outcome::NotSent);
    match await_holder(&h, "s", "k").unwrap() {
        Awaited::Decided(Decision::Execute(e)) => assert_eq!(e.attempt, 2),
        other => panic!("expected the next attempt, got {other:?}"),
    }
}

/// An owed dispatch that is not sent is still owed: back to absent, listed
/// by every later sweep, never failed (which would drop the intent).
#[test]
fn an_owed_dispatch_that_is_not_sent_is_still_owed() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.owed, [("s".to_string(), "k".to_string())]);
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(
        fin(&h, "k", &e2.fence, Outcome::NotSent),
        FinishAck::Recorded(State::Absent)
    );
    assert_eq!(view(&h, "k").state, State::Absent);
    assert_eq!(sweep(&h, 10).unwrap().owed, [("s".to_string(), "k".to_string())]);
    assert_eq!(execute_of(reconcile(&h, "s", "k").unwrap()).attempt, 3);
}

// ---------------------------------------------------------------- owners on one ledger

fn as_owner(h: &MemoryHost, owner: &str) {
    h.settings.borrow_mut().owner = owner.to_string();
}

/// Two hosts in front of different upstreams share a ledger: each one's
/// background work, reconciliation and dispatches touch only its own records.
#[test]
fn a_host_never_reads_or_sends_another_owners_operation() {
    let h = MemoryHost::new();
    as_owner(&h, "gateway-a");
    execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(view(&h, "k").owner, "gateway-a");
    h.advance(LEASE + MAX_IN_FLIGHT + 10);

    // Owner b: its sweep does not see a's record, its reconcile reads no provider and grants nothing.
    as_owner(&h, "gateway-b");
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!((report.expired, report.reconciled, report.owed.len()), (0, 0, 0));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    assert!(
        h.lookups().is_empty(),
        "b never reads through its provider for a's record"
    );

    // Owner a proves it absent; b is still refused the owed dispatch, by begin and reconcile.
    as_owner(&h, "gateway-a");
    assert_eq!(sweep(&h, 10).unwrap().owed, [("s".to_string(), "k".to_string())]);
    as_owner(&h, "gateway-b");
    let b = blocked_of(go(&h, refund("k", ARGS)), BlockReason::OtherOwner);
    assert!(b.detail.contains("\"gateway-a\""), "{}", b.detail);
    blocked_of(reconcile(&h, "s", "k").unwrap(), BlockReason::OtherOwner);
    assert!(sweep(&h, 10).unwrap().owed.is_empty());
    // a sends it.
    as_owner(&h, "gateway-a");
    let e = execute_of(reconcile(&h, "s", "k").unwrap());
    fin(&h, "k", &e.fence, success(RECEIPT));
    // A receipt is no one's secret within the scope: b replays it.
    as_owner(&h, "gateway-b");
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, RECEIPT);
}

/// A renamed gateway orphans its records (item 4 of issue #29): the new name's sweep never reads or
/// sends them (b58a043: and nothing else did either, while callers were told "once is checking in the
/// background"). The queue names the old owner; `adopt` hands the records to the live owner, audited,
/// and its sweep settles them. b58a043 had no `adopt` and no owner in the queue.
#[test]
fn an_adopted_record_is_settled_by_its_new_owner() {
    let h = MemoryHost::new();
    as_owner(&h, "gateway refund-mcp #old");
    execute_of(go(&h, refund("k", ARGS)));
    execute_of(go(&h, refund("done", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);

    // Renamed: the new name's sweep sees nothing; the queue shows whose the orphan is.
    as_owner(&h, "gateway refund-mcp #new");
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!((report.expired, report.reconciled, report.owed.len()), (0, 0, 0));
    let queue = once_guest::engine::queue(&h, &everything(), 10).unwrap();
    assert!(
        queue.entries.iter().all(|e| e.owner == "gateway refund-mcp #old") && queue.entries.len() == 2,
        "{queue:?}"
    );

    // Bad requests write nothing.
    let refused = adopt(&h, "gateway refund-mcp #old", "gateway refund-mcp #old", "same", 10).unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidRequest(m) if m.contains("already belong")),
        "{refused:?}"
    );
    assert!(matches!(
        adopt(&h, "gateway refund-mcp #old", "x", " ", 10),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(view(&h, "k").owner, "gateway refund-mcp #old");

    // One at a time: the report says more are left.
    let first = adopt(
        &h,
        "gateway refund-mcp #old",
        "gateway refund-mcp #new",
        "renamed the binary",
        1,
    )
    .unwrap();
    assert_eq!((first.adopted, first.unreadable, first.more), (1, 0, true));
    let rest = adopt(
        &h,
        "gateway refund-mcp #old",
        "gateway refund-mcp #new",
        "renamed the binary",
        10,
    )
    .unwrap();
    assert_eq!((rest.adopted, rest.more), (1, false));
    for key in ["k", "done"] {
        let v = view(&h, key);
        assert_eq!(
            (v.owner.as_str(), v.state, v.attempts),
            ("gateway refund-mcp #new", State::InFlight, 1)
        );
        let adopted = v.audit.last().unwrap();
        assert_eq!(adopted.kind, "adopted");
        assert_eq!(
            (adopted.from_state, adopted.to_state),
            (Some(State::InFlight), Some(State::InFlight))
        );
        let detail: serde_json::Value = serde_json::from_str(&adopted.detail).unwrap();
        assert_eq!(
            detail,
            serde_json::json!({"from": "gateway refund-mcp #old", "to": "gateway refund-mcp #new", "note": "renamed the binary"})
        );
        check_audit(&v);
    }

    // The live owner's sweep now expires, reads and owes them.
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.expired, 2, "{report:?}");
    let owed = sweep(&h, 10).unwrap().owed;
    assert!(owed.contains(&("s".to_string(), "k".to_string())), "{owed:?}");
    assert_eq!(execute_of(reconcile(&h, "s", "k").unwrap()).attempt, 2);
}

// ---------------------------------------------------------------- derived keys and their window

fn derived() -> Policy {
    let mut p = policy();
    p.identity = IdentityMode::Derived;
    p
}

/// Inside the window, identical arguments replay and say when the effect
/// happened and until when; past it they are a new operation, with a
/// provider key of its own.
#[test]
fn a_derived_key_is_one_operation_inside_its_window_and_a_new_one_after() {
    let h = MemoryHost::new();
    let call = || req("s", None, "refund", ARGS, derived());
    let e1 = execute_of(go(&h, call()));
    h.advance(SECOND);
    fin(&h, &e1.key, &e1.fence, success(RECEIPT));
    let confirmed_at = h.now();
    let r = replay_of(go(&h, call()));
    assert_eq!(r.via, Some(ReplayVia::DerivedArgs));
    assert_eq!(r.at, confirmed_at);
    assert_eq!(r.window_until, Some(confirmed_at + DAY));

    h.advance(DAY);
    let e2 = execute_of(go(&h, call()));
    assert_eq!((e2.key.as_str(), e2.attempt), (e1.key.as_str(), 1));
    assert_ne!(
        e2.provider_key, e1.provider_key,
        "the provider cannot answer it with the old effect"
    );
    assert_ne!(e2.fence, e1.fence);
    let v = view(&h, &e1.key);
    assert_eq!(
        (v.state, v.key_source, v.attempts),
        (State::InFlight, KeySource::Derived, 1)
    );
    let renewed = v.audit.last().unwrap();
    assert_eq!(renewed.from_state, Some(State::Confirmed));
    assert!(renewed.detail.contains("new_operation_after"), "{}", renewed.detail);
    // An application key never renews: it replays for as long as its record is kept.
    let k = execute_of(go(&h, refund("app", ARGS)));
    fin(&h, "app", &k.fence, success(RECEIPT));
    h.advance(2 * DAY);
    let r = replay_of(go(&h, refund("app", ARGS)));
    assert_eq!((r.via, r.window_until), (Some(ReplayVia::Key), None));
}

/// A derived key is not tombstoned into `expired`: after pruning, the same
/// arguments are a new operation.
#[test]
fn a_pruned_derived_key_is_a_new_operation_not_expired() {
    let h = MemoryHost::new();
    let call = || req("s", None, "refund", ARGS, derived());
    let e1 = execute_of(go(&h, call()));
    fin(&h, &e1.key, &e1.fence, success(RECEIPT));
    h.advance(RETENTION + 1);
    assert_eq!(prune(&h, 10).unwrap().pruned, 1);
    assert!(h.get(Table::Tombstone, "s", &e1.key).unwrap().is_none());
    let e2 = execute_of(go(&h, call()));
    assert_eq!(e2.attempt, 1);
    assert_ne!(e2.provider_key, e1.provider_key);
    let v = inspect(&h, "s", &e1.key).unwrap().unwrap();
    assert!(v.version > 2, "the trail continues after the pruning event");
}

/// The window is declared, and checked against retention when the policy loads.
#[test]
fn the_derived_window_is_checked_with_the_policy() {
    let h = MemoryHost::new();
    for window in [0, RETENTION + 1] {
        let mut p = derived();
        p.derived_window_ms = window;
        let err = begin(&h, req("s", None, "refund", ARGS, p)).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidPolicy(m) if m.contains("derived_window_ms")),
            "{err:?}"
        );
    }
    assert_nothing_written(&h);
}

// ---------------------------------------------------------------- send-by

/// A send started by send-by ends (reply or timeout) inside the lease, on
/// any host's clock: the lease covers claim, send and the whole timeout.
#[test]
fn send_by_leaves_the_whole_timeout_inside_the_lease() {
    let h = MemoryHost::new();
    h.settings.borrow_mut().clock_skew_ms = 100;
    let mut p = policy();
    p.dispatch_timeout_ms = 2 * SECOND;
    p.lease_ms = 3 * SECOND;
    let e = execute_of(go(&h, with_policy(refund("k", ARGS), p)));
    assert_eq!(e.lease_until, T0 + 3 * SECOND);
    assert_eq!(e.send_by, T0 + 3 * SECOND - 2 * SECOND - 100);
}

/// A flagged success reported again (a retried finish) is not a new duplicate.
#[test]
fn a_flagged_success_reported_again_is_flagged_once() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    h.advance(SECOND);
    fin(&h, "k", &e1.fence, ambiguous());
    h.advance(LEASE + MAX_IN_FLIGHT);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    fin(&h, "k", &e2.fence, success(RECEIPT2));
    assert_eq!(
        fin(&h, "k", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    h.advance(SECOND);
    assert_eq!(
        fin(&h, "k", &e1.fence, success(RECEIPT)),
        FinishAck::Ignored(State::Confirmed)
    );
    assert_eq!(h.escalations().len(), 1);
}

/// A late success of the operation a derived record replaced (past its
/// window) is still evidence: audited with its receipt on the new record and
/// escalated, never a fence mismatch that drops it.
#[test]
fn a_success_of_the_replaced_operation_is_audited_not_dropped() {
    let h = MemoryHost::new();
    let call = || req("s", None, "refund", ARGS, derived());
    let e1 = execute_of(go(&h, call()));
    fin(&h, &e1.key, &e1.fence, rejected());
    h.advance(DAY);
    let e2 = execute_of(go(&h, call()));
    assert_eq!(e2.attempt, 1);
    let late = finish(&h, "s", &e1.key, &e1.fence, success(RECEIPT)).unwrap();
    assert_eq!(late, FinishAck::Recorded(State::InFlight));
    let v = view(&h, &e1.key);
    let event = v
        .audit
        .iter()
        .find(|e| e.kind == "late-success-previous-operation")
        .expect("the late success is audited");
    assert!(event.detail.contains(r#""refund_id":"r-1""#), "{}", event.detail);
    assert!(v.possible_duplicate);
    assert_eq!(h.escalations().len(), 1);
    // Reported again: nothing new.
    assert_eq!(
        finish(&h, "s", &e1.key, &e1.fence, success(RECEIPT)).unwrap(),
        FinishAck::Ignored(State::InFlight)
    );
    // The new operation goes on as its own.
    assert_eq!(
        fin(&h, &e1.key, &e2.fence, success(RECEIPT2)),
        FinishAck::Recorded(State::Confirmed)
    );
}

/// An owed dispatch with no attempt left is not listed for hosts to send:
/// it waits for its escalation and an operator.
#[test]
fn an_owed_dispatch_without_budget_is_not_listed() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.attempt_budget = 1;
    execute_of(go(&h, with_policy(refund("k", ARGS), p)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!(view(&h, "k").state, State::Absent);
    assert!(report.owed.is_empty(), "{:?}", report.owed);
    blocked_of(reconcile(&h, "s", "k").unwrap(), BlockReason::AttemptBudget);
}

// ---------------------------------------------------------------- a supersede over a request still out there

/// A successor supersedes only an original with no effect and none possible. An original whose
/// absence the provider's claim proved before max-in-flight may still commit its first request (the
/// claim stops a second effect under its key, not a late first one), and the successor's new
/// provider key would make that a second effect. Until max-in-flight has passed the successor is
/// refused as unresolved, with nothing written; after it, the same call reads the provider for the
/// original and records what it found on the original first: no effect as of a read after that
/// time supersedes it, an effect found confirms the original (answered `superseded-confirmed` with
/// its receipt), and a read that is too early proves nothing. The model's "supersede after a
/// claimed absence" explores the same.
#[test]
fn a_supersede_waits_until_no_request_of_the_original_can_have_committed() {
    for found in ["absent", "confirmed", "too early", "another owner's"] {
        let h = MemoryHost::new();
        let mut p = policy();
        p.provider_claims_key = true;
        p.key_sent_by_host = true;
        let e1 = execute_of(go(&h, with_policy(refund("orig", ARGS), p.clone())));
        fin(&h, "orig", &e1.fence, ambiguous());
        // A read after the last dispatch, well before max-in-flight: the claim makes it absent at once.
        h.advance(5 * SECOND);
        h.script_lookup(Evidence::Absent(h.now()));
        let e2 = execute_of(reconcile(&h, "s", "orig").unwrap());
        assert_eq!((e2.attempt, &e2.provider_key), (2, &e1.provider_key));
        fin(&h, "orig", &e2.fence, rejected());
        let before = view(&h, "orig");
        assert_eq!(before.state, State::Failed);

        let successor = || {
            let mut s = with_policy(refund("succ", r#"{"order":1234,"amount":150}"#), p.clone());
            s.supersedes = Some("orig".into());
            s
        };
        let b = blocked_of(go(&h, successor()), BlockReason::SupersededUnresolved);
        assert!(b.detail.contains("may still take effect until"), "{}", b.detail);
        assert_eq!(view(&h, "orig"), before, "the original is left as it was");
        assert!(
            inspect(&h, "s", "succ").unwrap().is_none(),
            "nothing recorded for the successor"
        );

        h.advance(MAX_IN_FLIGHT);
        match found {
            "absent" => {
                h.script_lookup(Evidence::Absent(h.now()));
                assert_eq!(execute_of(go(&h, successor())).attempt, 1);
                let o = view(&h, "orig");
                assert_eq!((o.state, o.superseded_by.as_deref()), (State::Superseded, Some("succ")));
                assert_eq!(
                    kinds(&o)[kinds(&o).len() - 2..],
                    ["read-absent", "superseded"],
                    "the read that proved it is in the trail"
                );
                let again = blocked_of(go(&h, with_policy(refund("orig", ARGS), p)), BlockReason::Superseded);
                assert!(again.receipt.is_none(), "{again:?}");
            }
            "confirmed" => {
                h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
                let b = blocked_of(go(&h, successor()), BlockReason::SupersededConfirmed);
                assert_eq!(b.receipt.as_deref(), Some(RECEIPT));
                let o = view(&h, "orig");
                assert_eq!((o.state, o.receipt.as_deref()), (State::Confirmed, Some(RECEIPT)));
                assert_eq!(kinds(&o).last(), Some(&"reconciled-confirmed"));
                assert_eq!(
                    body(&o)["confirmed_by"],
                    1,
                    "the lost reply's attempt, not the declined one"
                );
                assert!(inspect(&h, "s", "succ").unwrap().is_none());
                // Acknowledged, the change goes ahead beside the effect the original had.
                let mut acknowledged = successor();
                acknowledged.acknowledge_confirmed = true;
                assert_eq!(execute_of(go(&h, acknowledged)).attempt, 1);
            }
            "another owner's" => {
                // Its owner's hosts read its provider: this one's lookup may reach another account.
                h.settings.borrow_mut().owner = "b".into();
                let b = blocked_of(go(&h, successor()), BlockReason::SupersededUnresolved);
                assert!(b.detail.contains("owner"), "{}", b.detail);
                assert_eq!(h.lookups().len(), 1, "only the reconcile read, none for the successor");
                assert_eq!(view(&h, "orig"), before);
            }
            _ => {
                h.script_lookup(Evidence::Absent(h.now() - MAX_IN_FLIGHT));
                let b = blocked_of(go(&h, successor()), BlockReason::SupersededUnresolved);
                assert!(b.detail.contains("not after"), "{}", b.detail);
                assert_eq!(view(&h, "orig"), before);
            }
        }
    }
}
