//! The record state machine against DESIGN.md, natively over `MemoryHost`.
//!
//! Every test names the DESIGN.md rule it checks and looks at both the
//! engine's answer and the record afterwards (state, attempts, receipt,
//! audit trail).

mod common;

use common::*;
use once_guest::engine::BeginRequest;
use once_guest::engine::{await_holder, begin, fingerprint, finish, inspect, prune, reconcile, resolve, sweep};
use once_guest::host::Host;
use once_guest::policy::Policy;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    Awaited, BlockReason, Decision, Error, Evidence, FinishAck, IdentityMode, JsonErrorKind, KeySource, Outcome,
    RecordView, ReplayVia, Resolution, Route, State, Table,
};

// ---------------------------------------------------------------- basics

#[test]
fn default_policy_is_what_the_tests_assume() {
    let p = default_policy();
    assert_eq!(p.lease_ms, LEASE);
    assert_eq!(p.max_in_flight_ms, MAX_IN_FLIGHT);
    assert_eq!(p.resolve_deadline_ms, DEADLINE);
    assert_eq!(p.retention_ms, RETENTION);
    assert_eq!(p.attempt_budget, 3);
    // A keyless call is deduplicated on its arguments unless the policy requires a key.
    assert_eq!(p.identity, IdentityMode::Derived);
    assert_eq!(MemoryHost::new().now(), T0);
}

/// begin on a new key -> execute(attempt 1) with fence, provider key, lease;
/// the intent is durable before execute is returned; success -> confirmed;
/// repeats replay the same receipt byte for byte with no new attempt.
#[test]
fn new_key_executes_confirms_then_replays() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k1");
    let e = execute_of(go(&h, refund("k1", ARGS)));
    assert_eq!(e.attempt, 1);
    assert!(!e.fence.is_empty());
    assert!(!e.provider_key.is_empty());
    assert_ne!(
        e.provider_key, "k1",
        "the provider key is derived, not the raw operation key"
    );
    assert_eq!(e.lease_until, T0 + LEASE);
    assert!(e.send_by <= e.lease_until);
    assert_eq!(e.key, "k1");
    assert_eq!(e.args, ARGS_CANON);

    // The intent row is there, in flight, when execute is in the caller's hand.
    let v = t.step(&h, 1);
    assert_eq!(v.state, State::InFlight);
    assert_eq!(v.attempts, 1);
    assert_eq!(v.provider_key, e.provider_key);
    assert_eq!(v.args, ARGS_CANON);
    assert_eq!(v.key_source, KeySource::Application);
    assert_eq!(kinds(&v), ["begin"]);
    assert_eq!(v.audit[0].attempt, Some(1));
    assert_eq!(v.audit[0].to_state, Some(State::InFlight));
    let row = h.rows().into_iter().find(|r| r.table == Table::Operation).unwrap();
    assert_eq!(row.state, Some(State::InFlight));

    h.advance(500);
    assert_eq!(
        fin(&h, "k1", &e.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = t.step(&h, 1);
    assert_eq!(v.state, State::Confirmed);
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    assert_eq!(v.audit[1].kind, "finish-success");
    assert_eq!(v.audit[1].attempt, Some(1));

    for n in 1..=2u32 {
        h.advance(10);
        let r = replay_of(go(&h, refund("k1", ARGS)));
        assert!(r.replayed);
        assert_eq!(r.via, Some(ReplayVia::Key));
        assert_eq!(
            r.receipt.as_bytes(),
            RECEIPT.as_bytes(),
            "replay must be byte-for-byte the stored receipt"
        );
        let v = t.step(&h, 1);
        assert_eq!(v.state, State::Confirmed);
        assert_eq!(v.attempts, 1, "a replay is not an attempt");
        assert_eq!(v.replays, n);
        assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    }
    // The same operation written differently (key order, whitespace) is the same operation.
    let r = replay_of(go(&h, refund("k1", r#"{ "amount" : 200, "order" : 1234 }"#)));
    assert_eq!(r.receipt, RECEIPT);
    assert_eq!(
        kinds(&view(&h, "k1")),
        ["begin", "finish-success", "replay", "replay", "replay"]
    );
}

/// A receipt is the provider's words: checked (strict I-JSON, within the
/// limits) and stored as sent, never re-serialized; every replay returns it.
#[test]
fn receipts_are_stored_and_replayed_as_sent() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k1", ARGS)));
    let sent = r#"{ "status" : "done", "refund_id" : 9007199254740993, "fee": 0.30000000000000001 }"#;
    fin(&h, "k1", &e.fence, success(sent));
    let stored = view(&h, "k1").receipt.unwrap();
    assert_eq!(stored, sent);
    assert_eq!(replay_of(go(&h, refund("k1", ARGS))).receipt, sent);
    assert_eq!(replay_of(reconcile(&h, "s", "k1").unwrap()).receipt, sent);
}

/// Same key, changed args or tool -> conflict with the stored summary; the
/// record is unchanged except its counters.
#[test]
fn conflict_on_changed_args_or_tool() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k1");
    let e = execute_of(go(&h, refund("k1", ARGS)));
    fin(&h, "k1", &e.fence, success(RECEIPT));
    let before = t.step(&h, 2);
    assert_eq!(before.fingerprint, fingerprint(&h, "refund", ARGS).unwrap());

    let changed = r#"{"order":1234,"amount":2000}"#;
    let Decision::Conflict(s) = go(&h, refund("k1", changed)) else {
        panic!("expected conflict")
    };
    assert_eq!(s.key, "k1");
    assert_eq!(s.tool, "refund");
    assert_eq!(s.fingerprint, before.fingerprint);
    assert_ne!(s.fingerprint, fingerprint(&h, "refund", changed).unwrap());
    assert_eq!(s.args, ARGS_CANON);
    assert_eq!(s.state, State::Confirmed);
    assert_eq!(s.created_at, T0);

    let Decision::Conflict(s) = go(&h, req("s", Some("k1"), "charge", ARGS, policy())) else {
        panic!("expected conflict on a changed tool")
    };
    assert_eq!(s.tool, "refund");
    assert_eq!(s.fingerprint, before.fingerprint);

    let after = t.step(&h, 2);
    assert_eq!(after.conflicts, 2);
    assert_eq!(after.state, before.state);
    assert_eq!(after.attempts, before.attempts);
    assert_eq!(after.receipt, before.receipt);
    assert_eq!(after.args, before.args);
    assert_eq!(after.tool, before.tool);
    assert_eq!(after.fingerprint, before.fingerprint);
    assert_eq!(after.provider_key, before.provider_key);
    assert_eq!(kinds(&after)[2..], ["conflict", "conflict"]);
    // Still replays the original.
    assert_eq!(replay_of(go(&h, refund("k1", ARGS))).receipt, RECEIPT);
}

#[test]
fn conflict_while_in_flight_leaves_the_attempt_alone() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k1", ARGS)));
    let Decision::Conflict(s) = go(&h, refund("k1", r#"{"order":1,"amount":200}"#)) else {
        panic!("expected conflict")
    };
    assert_eq!(s.state, State::InFlight);
    let v = view(&h, "k1");
    assert_eq!((v.state, v.attempts, v.conflicts), (State::InFlight, 1, 1));
    assert_eq!(
        fin(&h, "k1", &e.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
}

// ---------------------------------------------------------------- identity

#[test]
fn identity_required_without_key_is_blocked_and_writes_nothing() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.identity = IdentityMode::Required;
    blocked_of(go(&h, req("s", None, "refund", ARGS, p)), BlockReason::IdentityRequired);
    assert_nothing_written(&h);
}

#[test]
fn identity_derived_keys_and_replays_via_derived_args() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.identity = IdentityMode::Derived;
    let e = execute_of(go(&h, req("s", None, "refund", ARGS, p.clone())));
    assert!(e.key.starts_with("derived"), "derived key {:?}", e.key);
    let v = view(&h, &e.key);
    assert_eq!(v.key_source, KeySource::Derived);
    fin(&h, &e.key, &e.fence, success(RECEIPT));

    let r = replay_of(go(
        &h,
        req("s", None, "refund", r#"{"amount":200, "order":1234}"#, p.clone()),
    ));
    assert_eq!(r.via, Some(ReplayVia::DerivedArgs));
    assert_eq!(r.receipt, RECEIPT);
    assert_eq!(view(&h, &e.key).attempts, 1);

    // Other args derive another key: a new operation.
    let e2 = execute_of(go(&h, req("s", None, "refund", r#"{"order":1234,"amount":201}"#, p)));
    assert_ne!(e2.key, e.key);
}

#[test]
fn disagreeing_carriers_are_an_identity_conflict() {
    let h = MemoryHost::new();
    let mut r = refund("k1", ARGS);
    r.keys = vec![
        ("api".to_string(), "k1".to_string()),
        ("mcp-meta".to_string(), "k2".to_string()),
    ];
    blocked_of(go(&h, r.clone()), BlockReason::IdentityConflict);
    let mut derived = policy();
    derived.identity = IdentityMode::Derived;
    blocked_of(go(&h, with_policy(r.clone(), derived)), BlockReason::IdentityConflict);
    assert_nothing_written(&h);

    // Carriers that agree are one key.
    r.keys = vec![
        ("api".to_string(), "k1".to_string()),
        ("mcp-meta".to_string(), "k1".to_string()),
    ];
    assert_eq!(execute_of(go(&h, r)).key, "k1");
}

/// The key argument is not effect-bearing and not an identity carrier: it is
/// left out of the fingerprint and overwritten with the provider key.
#[test]
fn key_argument_is_excluded_from_the_fingerprint_and_overwritten() {
    let h = MemoryHost::new();
    let a = r#"{"amount":5,"idempotency_key":"model-minted-a"}"#;
    let b = r#"{"amount":5,"idempotency_key":"model-minted-b"}"#;
    let e = execute_of(go(&h, req("s", Some("k1"), "charge", a, policy())));
    let dispatched: serde_json::Value = serde_json::from_str(&e.args).unwrap();
    assert_eq!(dispatched["idempotency_key"], e.provider_key.as_str());
    assert_eq!(dispatched["amount"], 5);
    let v = view(&h, "k1");
    assert_eq!(v.fingerprint, fingerprint(&h, "charge", r#"{"amount":5}"#).unwrap());
    assert_eq!(v.args, e.args);
    fin(&h, "k1", &e.fence, success(RECEIPT));

    // Only the model-minted key differs: the same operation, not a conflict.
    let r = replay_of(go(&h, req("s", Some("k1"), "charge", b, policy())));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Key), RECEIPT));
    assert_eq!(view(&h, "k1").conflicts, 0);

    // The camelCase name, with derived identity: both calls derive one key.
    let mut p = policy();
    p.identity = IdentityMode::Derived;
    let c1 = r#"{"amount":7,"idempotencyKey":"x-1"}"#;
    let c2 = r#"{"amount":7,"idempotencyKey":"x-2"}"#;
    let e = execute_of(go(&h, req("s", None, "charge", c1, p.clone())));
    let dispatched: serde_json::Value = serde_json::from_str(&e.args).unwrap();
    assert_eq!(dispatched["idempotencyKey"], e.provider_key.as_str());
    fin(&h, &e.key, &e.fence, success(RECEIPT2));
    let r = replay_of(go(&h, req("s", None, "charge", c2, p)));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::DerivedArgs), RECEIPT2));

    // A configured key argument.
    let mut p = policy();
    p.key_argument = Some("request_token".to_string());
    let e = execute_of(go(
        &h,
        req(
            "s",
            Some("k3"),
            "charge",
            r#"{"amount":1,"request_token":"t-1"}"#,
            p.clone(),
        ),
    ));
    let dispatched: serde_json::Value = serde_json::from_str(&e.args).unwrap();
    assert_eq!(dispatched["request_token"], e.provider_key.as_str());
    fin(&h, "k3", &e.fence, success(RECEIPT));
    replay_of(go(
        &h,
        req("s", Some("k3"), "charge", r#"{"amount":1,"request_token":"t-2"}"#, p),
    ));
}

#[test]
fn effect_fields_bound_the_fingerprint_and_are_required() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.effect_fields = Some(vec!["/order".to_string(), "/amount".to_string()]);
    let call = |key: &str, args: &str| req("s", Some(key), "refund", args, p.clone());
    let e = execute_of(go(&h, call("k1", r#"{"order":1,"amount":5,"note":"first"}"#)));
    fin(&h, "k1", &e.fence, success(RECEIPT));
    // A non-effect field changed: the same operation.
    assert_eq!(
        replay_of(go(&h, call("k1", r#"{"order":1,"amount":5,"note":"second"}"#))).receipt,
        RECEIPT
    );
    // An effect field changed: a conflict.
    assert!(matches!(
        go(&h, call("k1", r#"{"order":1,"amount":6,"note":"first"}"#)),
        Decision::Conflict(_)
    ));

    let rows = h.rows();
    let events = h.event_count();
    blocked_of(
        go(&h, call("k2", r#"{"order":1,"note":"no amount"}"#)),
        BlockReason::PayloadRequired,
    );
    assert_eq!(h.rows(), rows, "a payload-required call writes nothing");
    assert_eq!(h.event_count(), events);
    assert!(inspect(&h, "s", "k2").unwrap().is_none());
}

// ---------------------------------------------------------------- scopes

#[test]
fn provider_keys_differ_across_scopes() {
    let h = MemoryHost::new();
    let args = r#"{"order":1234,"amount":200,"idempotency_key":"m"}"#;
    let a = execute_of(go(&h, req("tenant-a", Some("refund-1234"), "refund", args, policy())));
    let b = execute_of(go(&h, req("tenant-b", Some("refund-1234"), "refund", args, policy())));
    assert_eq!(a.attempt, 1);
    assert_eq!(b.attempt, 1);
    assert_ne!(a.provider_key, b.provider_key);
    assert_ne!(a.args, b.args, "the dispatched key argument differs too");
    assert_ne!(a.fence, b.fence);
}

/// A provider key cannot be computed from (scope, key) alone: it is an HMAC
/// under the ledger's secret, so another tenant who knows both (the old
/// unsalted derivation, or the new one under any other secret) gets another
/// key; the record names the secret by id and never holds it.
#[test]
fn provider_keys_need_the_ledgers_secret() {
    use once_guest::identity::{legacy_provider_key, provider_key};
    use once_guest::secret::{KeySecret, key_secret};
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    let secret = key_secret(&h).unwrap();
    assert_eq!(e.provider_key, provider_key(&secret, "s", "k", 1));
    assert_ne!(
        e.provider_key,
        legacy_provider_key("s", "k", 1),
        "not the unsalted derivation"
    );
    let guessed = KeySecret::from_bytes(vec![0; 32]);
    assert_ne!(
        e.provider_key,
        provider_key(&guessed, "s", "k", 1),
        "not under another secret"
    );
    let v = view(&h, "k");
    let body: serde_json::Value = serde_json::from_str(&v.body).unwrap();
    assert_eq!(body["key_secret"], secret.id.as_str());
    let secret_hex: String = secret.key.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!v.body.contains(&secret_hex), "a record never holds the secret");
    // Two ledgers (two secrets): the same scope and key get different provider keys.
    let other = MemoryHost::without_secret();
    other.set_entropy(vec![7; 32]);
    let e2 = execute_of(go(&other, refund("k", ARGS)));
    assert_ne!(e2.provider_key, e.provider_key);
}

/// The first call on a ledger without a secret creates it once; the key it
/// derives is the one a second host (instance) of the same ledger derives.
#[test]
fn the_first_call_creates_the_secret_every_host_then_shares() {
    let h = MemoryHost::without_secret();
    let a = execute_of(go(&h, refund("a", ARGS)));
    let stored = h
        .row(Table::Quota, "", once_guest::secret::SECRET_KEY)
        .expect("created");
    // A second instance over the same rows: empty cache, other entropy; it reads the ledger's.
    let second = MemoryHost::without_secret();
    second.set_entropy(vec![9; 32]);
    second.set_ledger(h.ledger());
    let b = execute_of(go(&second, refund("b", ARGS)));
    assert_eq!(
        second.row(Table::Quota, "", once_guest::secret::SECRET_KEY),
        Some(stored)
    );
    let secret = once_guest::secret::key_secret(&h).unwrap();
    assert_eq!(a.provider_key, once_guest::identity::provider_key(&secret, "s", "a", 1));
    assert_eq!(b.provider_key, once_guest::identity::provider_key(&secret, "s", "b", 1));
}

/// A fresh instance that cannot read the ledger's secret, or whose host has
/// no entropy to make one, refuses the claim: never a weaker key.
#[test]
fn a_secret_that_cannot_be_read_refuses_the_claim() {
    let h = MemoryHost::new();
    h.set_fail_reads(true);
    blocked_of(go(&h, refund("k", ARGS)), BlockReason::Storage);
    h.set_fail_reads(false);
    assert!(h.row(Table::Operation, "s", "k").is_none());
    let bare = MemoryHost::without_secret();
    bare.set_entropy(Vec::new());
    let b = blocked_of(go(&bare, refund("k", ARGS)), BlockReason::Storage);
    assert!(b.detail.contains("random bytes"), "{b:?}");
    assert_eq!(operation_rows(&bare), 0);
}

/// Nothing crosses scopes: not a replay, a conflict, an inspect, a
/// reconcile, a resolve, a finish or a supersedes link.
#[test]
fn scopes_are_isolated() {
    let h = MemoryHost::new();
    let ea = execute_of(go(&h, req("A", Some("k"), "refund", ARGS, policy())));
    finish(&h, "A", "k", &ea.fence, success(RECEIPT)).unwrap();
    let ua = execute_of(go(&h, req("A", Some("u"), "refund", ARGS, policy())));
    finish(&h, "A", "u", &ua.fence, ambiguous()).unwrap();
    let a_before = view_in(&h, "A", "k");
    let u_before = view_in(&h, "A", "u");

    assert!(inspect(&h, "B", "k").unwrap().is_none());
    assert_eq!(reconcile(&h, "B", "u"), Err(Error::NotFound));
    assert_eq!(
        resolve(
            &h,
            "B",
            "u",
            Resolution::Confirmed(RECEIPT.to_string()),
            "operator note",
            true
        ),
        Err(Error::NotFound)
    );
    assert_eq!(
        resolve(&h, "B", "u", Resolution::Absent, "operator note", true),
        Err(Error::NotFound)
    );
    assert_eq!(finish(&h, "B", "k", &ea.fence, success(RECEIPT2)), Err(Error::NotFound));
    assert!(h.lookups().is_empty(), "no lookup for another scope's record");

    let mut sup = req("B", Some("k2"), "refund", ARGS, policy());
    sup.supersedes = Some("u".to_string());
    blocked_of(go(&h, sup), BlockReason::SupersedesMissing);

    // Same key, other args, other scope: a new operation (no conflict, no replay).
    let eb = execute_of(go(
        &h,
        req("B", Some("k"), "refund", r#"{"order":9,"amount":1}"#, policy()),
    ));
    assert_eq!(eb.attempt, 1);
    assert_ne!(eb.provider_key, ea.provider_key);
    // Same key, same args, other scope: still a new operation.
    let eb2 = execute_of(go(&h, req("B", Some("u"), "refund", ARGS, policy())));
    assert_eq!(eb2.attempt, 1);

    assert_eq!(view_in(&h, "A", "k"), a_before);
    assert_eq!(view_in(&h, "A", "u"), u_before);
    assert_eq!(view_in(&h, "B", "k").state, State::InFlight);
}

// ---------------------------------------------------------------- fences

/// A stale fence cannot change a record's state by claiming failure or
/// ambiguity; a fence of no attempt is a fence mismatch.
#[test]
fn stale_fences_cannot_claim_failure_or_ambiguity() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(fin(&h, "k", &e1.fence, rejected()), FinishAck::Recorded(State::Failed));
    let e2 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(e2.attempt, 2);
    assert_ne!(e2.fence, e1.fence);
    assert_eq!(e2.provider_key, e1.provider_key);
    let v = t.step(&h, 3);

    for outcome in [rejected(), ambiguous(), Outcome::NotSent] {
        assert_eq!(fin(&h, "k", &e1.fence, outcome), FinishAck::Ignored(State::InFlight));
    }
    let after = t.step(&h, 0);
    assert_eq!(after.body, v.body, "a stale fence changed nothing");

    assert_eq!(
        fin(&h, "k", &e2.fence, ambiguous()),
        FinishAck::Recorded(State::Unknown)
    );
    t.step(&h, 1);
    for outcome in [rejected(), ambiguous(), Outcome::NotSent] {
        assert_eq!(fin(&h, "k", &e1.fence, outcome), FinishAck::Ignored(State::Unknown));
    }
    t.step(&h, 0);
    assert_eq!(
        finish(&h, "s", "k", "no-such-fence", rejected()),
        Err(Error::FenceMismatch)
    );
    assert_eq!(
        finish(&h, "s", "k", "no-such-fence", success(RECEIPT)),
        Err(Error::FenceMismatch)
    );
    assert_eq!(finish(&h, "s", "nobody", &e1.fence, rejected()), Err(Error::NotFound));
    assert_eq!(t.step(&h, 0).state, State::Unknown);
}

/// Evidence beats fences: a success from an old attempt moves unknown,
/// absent or failed to confirmed.
#[test]
fn old_success_confirms_unknown_failed_and_absent() {
    // unknown: attempt 1 rejected, attempt 2 ambiguous, then attempt 1's success arrives.
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("u", ARGS)));
    fin(&h, "u", &e1.fence, rejected());
    let e2 = execute_of(go(&h, refund("u", ARGS)));
    fin(&h, "u", &e2.fence, ambiguous());
    assert_eq!(
        fin(&h, "u", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = view(&h, "u");
    assert_eq!((v.state, v.receipt.as_deref()), (State::Confirmed, Some(RECEIPT)));
    assert_eq!(v.audit.last().unwrap().attempt, Some(1));
    assert!(!v.possible_duplicate);

    // failed: attempt 1 expired, proven absent, attempt 2 rejected; attempt 1's success arrives.
    let e1 = execute_of(go(&h, refund("f", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "f").unwrap());
    assert_eq!(e2.attempt, 2);
    assert_eq!(fin(&h, "f", &e2.fence, rejected()), FinishAck::Recorded(State::Failed));
    assert_eq!(
        fin(&h, "f", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert_eq!(view(&h, "f").receipt.as_deref(), Some(RECEIPT));

    // absent: attempt 1 expired and proven absent by a sweep; its success arrives before the redispatch.
    let e1 = execute_of(go(&h, refund("a", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.owed, [("s".to_string(), "a".to_string())]);
    assert_eq!(view(&h, "a").state, State::Absent);
    assert_eq!(
        fin(&h, "a", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert_eq!(view(&h, "a").attempts, 1);
    assert_eq!(replay_of(go(&h, refund("a", ARGS))).receipt, RECEIPT);
    assert!(h.escalations().is_empty());
}

/// A success from an old attempt while a newer attempt is in flight:
/// confirmed, flagged possible-duplicate, escalated exactly once.
#[test]
fn old_success_during_newer_attempt_is_a_possible_duplicate() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(e2.attempt, 2);
    t.step(&h, 4); // lease-expired, reconciled-absent, owed-dispatch
    h.advance(100);
    assert_eq!(
        fin(&h, "k", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = t.step(&h, 2); // the confirmation (with the mark) + the acknowledgement
    assert_eq!(v.state, State::Confirmed);
    assert!(v.possible_duplicate);
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    let esc = h.escalations();
    assert_eq!(esc.len(), 1);
    assert_eq!(esc[0].reason, "possible-duplicate");
    assert_eq!(
        (esc[0].scope.as_str(), esc[0].key.as_str(), esc[0].tool.as_str()),
        ("s", "k", "refund")
    );
    assert!(kinds(&v).contains(&"late-success-possible-duplicate"));

    // The newer attempt's own success is a second effect: audited with its receipt and escalated
    // again, while the stored receipt never changes.
    assert_eq!(
        fin(&h, "k", &e2.fence, success(RECEIPT2)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = t.step(&h, 2); // the second success (with a new mark) + its acknowledgement
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    let second = &v.audit[v.audit.len() - 2];
    assert_eq!(
        (second.kind.as_str(), second.attempt),
        ("late-success-possible-duplicate", Some(2))
    );
    assert!(second.detail.contains(RECEIPT2), "{}", second.detail);
    let esc = h.escalations();
    assert_eq!(esc.len(), 2);
    assert_ne!(
        esc[0].id, esc[1].id,
        "a second possible duplicate is a second escalation"
    );
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    assert_eq!(h.escalations().len(), 2, "an acknowledged escalation is delivered once");
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, RECEIPT);
}

// ---------------------------------------------------------------- leases

#[test]
fn lease_expiry_on_begin_gives_unknown_and_no_dispatch() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e = execute_of(go(&h, refund("k", ARGS)));
    t.step(&h, 1);
    h.advance(LEASE - 1);
    let Decision::InFlight(info) = go(&h, refund("k", ARGS)) else {
        panic!("expected in_flight")
    };
    assert_eq!(info.lease_until, e.lease_until);
    t.step(&h, 0);
    h.advance(1);
    let u = unknown_of(go(&h, refund("k", ARGS)));
    assert_eq!(u.since, e.lease_until);
    assert_eq!(u.deadline, e.lease_until + DEADLINE);
    let v = t.step(&h, 1);
    assert_eq!(v.state, State::Unknown);
    assert_eq!(v.audit.last().unwrap().kind, "lease-expired");
    // begin on unknown: unknown, never a blind retry.
    h.advance(SECOND);
    let u2 = unknown_of(go(&h, refund("k", ARGS)));
    assert_eq!(u2, u);
    assert_eq!(t.step(&h, 0).attempts, 1);
    assert!(h.lookups().is_empty());
}

#[test]
fn lease_expiry_on_reconcile() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE / 2);
    let Decision::InFlight(info) = reconcile(&h, "s", "k").unwrap() else {
        panic!("expected in_flight")
    };
    assert_eq!(info.lease_until, e.lease_until);
    assert!(
        h.lookups().is_empty(),
        "reconcile on a live lease does not read the provider"
    );
    assert_eq!(view(&h, "k").version, 1);
    h.advance(LEASE);
    // Default script: unknown evidence.
    let u = unknown_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(u.since, e.lease_until);
    let v = view(&h, "k");
    assert_eq!(v.state, State::Unknown);
    assert_eq!(v.attempts, 1);
    assert_eq!(h.lookups().len(), 1);
    assert!(kinds(&v).contains(&"lease-expired"));
}

#[test]
fn lease_expiry_on_sweep() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE - 1);
    assert_eq!(sweep(&h, 10).unwrap().expired, 0);
    assert_eq!(view(&h, "k").state, State::InFlight);
    h.advance(1);
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.expired, 1);
    let v = view(&h, "k");
    assert_eq!(v.state, State::Unknown);
    assert_eq!(v.attempts, 1);
    unknown_of(go(&h, refund("k", ARGS)));
}

// ---------------------------------------------------------------- reconciliation

#[test]
fn ambiguous_is_unknown_and_reconcile_confirms_via_provider() {
    let h = MemoryHost::new();
    let e = unknown_record(&h, "k", policy());
    let v = view(&h, "k");
    assert_eq!(v.state, State::Unknown);
    unknown_of(go(&h, refund("k", ARGS)));
    let found = r#"{ "refund_id" : "r-1", "status" : "done" }"#;
    h.script_lookup(Evidence::Confirmed(found.to_string()));
    let r = replay_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(
        (r.via, r.receipt.as_str(), r.replayed),
        (Some(ReplayVia::Provider), found, true)
    );
    let lookups = h.lookups();
    assert_eq!(
        lookups,
        [("refund".to_string(), e.provider_key.clone(), e.args.clone())]
    );
    let v = view(&h, "k");
    assert_eq!(
        (v.state, v.receipt.as_deref(), v.attempts),
        (State::Confirmed, Some(found), 1)
    );
    let r = replay_of(go(&h, refund("k", ARGS)));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Key), found));
}

/// ABSENT counts only after the last dispatch, and moves the record to absent
/// only past last dispatch + max_in_flight; then the owed dispatch reuses
/// the provider key and the stored args.
#[test]
fn absent_evidence_respects_last_dispatch_and_max_in_flight() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e1 = unknown_record(&h, "k", policy());
    let last_dispatch = T0 + SECOND; // the holder's finish was recorded then
    let settled = last_dispatch + MAX_IN_FLIGHT;
    t.step(&h, 2);

    for rp in [T0 + 500, last_dispatch] {
        h.script_lookup(Evidence::Absent(rp));
        unknown_of(reconcile(&h, "s", "k").unwrap());
        let v = t.step(&h, 1);
        assert_eq!(
            v.state,
            State::Unknown,
            "absent at {rp} is not after the last dispatch {last_dispatch}"
        );
    }

    h.advance(10);
    h.script_lookup(Evidence::Absent(last_dispatch + 1));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    let v = t.step(&h, 1);
    assert_eq!(v.state, State::Unknown, "an earlier request may still commit");
    let next_check = body(&v)["next_check"]
        .as_u64()
        .expect("the record says when to read again");
    assert!(next_check > settled, "next read {next_check} must be after {settled}");
    let detail: serde_json::Value = serde_json::from_str(&v.audit.last().unwrap().detail).unwrap();
    assert_eq!(detail["next_check"].as_u64(), Some(next_check));
    // A sweep before that time does not read again.
    let lookups = h.lookups().len();
    sweep(&h, 10).unwrap();
    assert_eq!(h.lookups().len(), lookups);
    t.step(&h, 0);

    // At exactly last dispatch + max_in_flight: still not later than it.
    h.advance(settled - h.now());
    h.script_lookup(Evidence::Absent(settled));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(t.step(&h, 1).state, State::Unknown);

    h.advance(2);
    h.script_lookup(Evidence::Absent(settled + 1));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(e2.attempt, 2);
    assert_eq!(
        e2.provider_key, e1.provider_key,
        "the owed dispatch uses the same provider key"
    );
    assert_eq!(e2.args, e1.args, "the owed dispatch uses the stored args");
    assert_ne!(e2.fence, e1.fence);
    let v = t.step(&h, 2);
    assert_eq!((v.state, v.attempts), (State::InFlight, 2));
    assert_eq!(kinds(&v)[kinds(&v).len() - 2..], ["reconciled-absent", "owed-dispatch"]);
}

/// A read position is at or before the moment the lookup was sent: one in
/// the future cannot prove that no earlier request will still commit.
#[test]
fn absent_read_position_in_the_future_cannot_skip_max_in_flight() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    h.advance(10);
    h.script_lookup(Evidence::Absent(h.now() + 3_600 * SECOND));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Unknown, 1));
    assert!(body(&v)["next_check"].as_u64().unwrap() > T0 + SECOND + MAX_IN_FLIGHT);
    // Once the time has really passed, the same answer settles it.
    h.advance(MAX_IN_FLIGHT);
    h.script_lookup(Evidence::Absent(h.now() + 3_600 * SECOND));
    assert_eq!(execute_of(reconcile(&h, "s", "k").unwrap()).attempt, 2);
}

/// When the lease ended without a finish, the last dispatch is the lease end.
#[test]
fn absent_after_lease_expiry_counts_from_the_lease_end() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.provider_claims_key = true;
    p.key_sent_by_host = true;
    let e1 = execute_of(go(&h, with_policy(refund("k", ARGS), p)));
    h.advance(LEASE + 10 * SECOND);
    h.script_lookup(Evidence::Absent(e1.lease_until));
    unknown_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(view(&h, "k").state, State::Unknown);
    h.script_lookup(Evidence::Absent(e1.lease_until + 1));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!((e2.attempt, e2.provider_key.as_str()), (2, e1.provider_key.as_str()));
}

#[test]
fn provider_claims_key_makes_absent_immediate() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.provider_claims_key = true;
    p.key_sent_by_host = true;
    let e1 = unknown_record(&h, "k", p);
    h.advance(1);
    h.script_lookup(Evidence::Absent(T0 + SECOND + 1));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(
        (e2.attempt, e2.provider_key.as_str(), e2.args.as_str()),
        (2, e1.provider_key.as_str(), e1.args.as_str())
    );
}

/// A read position may come from a host's clock: the declared skew is added
/// to the comparisons with the last dispatch and with max_in_flight.
#[test]
fn declared_clock_skew_widens_the_absent_rules() {
    let h = MemoryHost::new();
    h.settings.borrow_mut().clock_skew_ms = 500;
    // Finished at T0 + 1 s: the last dispatch.
    let _ = unknown_record(&h, "k", policy());
    let last_dispatch = T0 + SECOND;
    h.advance(MAX_IN_FLIGHT + SECOND);
    // After the last dispatch, but not by more than the skew: still unknown.
    h.script_lookup(Evidence::Absent(last_dispatch + 400));
    assert!(matches!(reconcile(&h, "s", "k").unwrap(), Decision::Unknown(_)));
    // Past max_in_flight, but not by more than the skew: still unknown.
    h.script_lookup(Evidence::Absent(last_dispatch + MAX_IN_FLIGHT + 400));
    assert!(matches!(reconcile(&h, "s", "k").unwrap(), Decision::Unknown(_)));
    // Past max_in_flight plus the skew: proven absent, the dispatch is owed.
    h.script_lookup(Evidence::Absent(last_dispatch + MAX_IN_FLIGHT + 501));
    assert_eq!(execute_of(reconcile(&h, "s", "k").unwrap()).attempt, 2);
}

/// absent: a dispatch is owed, taken by the next begin or reconcile.
#[test]
fn absent_owes_a_dispatch_to_begin_or_reconcile() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k1", ARGS)));
    let f1 = execute_of(go(&h, refund("k2", r#"{"order":2,"amount":1}"#)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    h.script_lookup(Evidence::Absent(h.now()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.expired, 2);
    assert_eq!(report.reconciled, 2);
    let mut owed = report.owed.clone();
    owed.sort();
    assert_eq!(
        owed,
        [("s".to_string(), "k1".to_string()), ("s".to_string(), "k2".to_string())]
    );
    for k in ["k1", "k2"] {
        let v = view(&h, k);
        assert_eq!((v.state, v.attempts), (State::Absent, 1));
    }
    let e2 = execute_of(go(&h, refund("k1", ARGS)));
    assert_eq!(
        (e2.attempt, e2.provider_key.as_str(), e2.args.as_str()),
        (2, e1.provider_key.as_str(), e1.args.as_str())
    );
    let f2 = execute_of(reconcile(&h, "s", "k2").unwrap());
    assert_eq!(
        (f2.attempt, f2.provider_key.as_str(), f2.args.as_str()),
        (2, f1.provider_key.as_str(), f1.args.as_str())
    );
    assert_eq!(view(&h, "k1").audit.last().unwrap().kind, "owed-dispatch");
}

#[test]
fn failed_retries_with_the_same_key_within_the_budget() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(fin(&h, "k", &e1.fence, rejected()), FinishAck::Recorded(State::Failed));
    let v = t.step(&h, 2);
    assert_eq!(v.state, State::Failed);
    assert!(v.error.is_some());
    let e2 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(
        (e2.attempt, e2.provider_key.as_str(), e2.args.as_str()),
        (2, e1.provider_key.as_str(), e1.args.as_str())
    );
    // not_sent ends the attempt as failed, and still counts against the budget.
    assert_eq!(
        fin(&h, "k", &e2.fence, Outcome::NotSent),
        FinishAck::Recorded(State::Failed)
    );
    let e3 = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(e3.attempt, 3);
    fin(&h, "k", &e3.fence, rejected());
    t.step(&h, 4);
    blocked_of(go(&h, refund("k", ARGS)), BlockReason::AttemptBudget);
    let v = t.step(&h, 0);
    assert_eq!((v.state, v.attempts), (State::Failed, 3));
}

#[test]
fn not_sent_and_expired_attempts_spend_the_budget() {
    let h = MemoryHost::new();
    for _ in 0..3 {
        let e = execute_of(go(&h, refund("ns", ARGS)));
        assert_eq!(
            fin(&h, "ns", &e.fence, Outcome::NotSent),
            FinishAck::Recorded(State::Failed)
        );
    }
    blocked_of(go(&h, refund("ns", ARGS)), BlockReason::AttemptBudget);
    assert_eq!(view(&h, "ns").attempts, 3);

    // Every granted execute counts, including ones that expired.
    let mut p = policy();
    p.attempt_budget = 2;
    p.provider_claims_key = true;
    p.key_sent_by_host = true;
    let r = || with_policy(refund("ex", ARGS), p.clone());
    execute_of(go(&h, r()));
    h.advance(LEASE + 1);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "ex").unwrap());
    assert_eq!(e2.attempt, 2);
    h.advance(LEASE + 1);
    h.script_lookup(Evidence::Absent(h.now()));
    blocked_of(reconcile(&h, "s", "ex").unwrap(), BlockReason::AttemptBudget);
    let v = view(&h, "ex");
    assert_eq!((v.state, v.attempts), (State::Absent, 2));
    blocked_of(go(&h, r()), BlockReason::AttemptBudget);
}

// ---------------------------------------------------------------- escalation

#[test]
fn deadline_escalates_exactly_once_when_acknowledged() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    let deadline = T0 + SECOND + DEADLINE;
    h.advance(DEADLINE - 1);
    sweep(&h, 10).unwrap();
    assert!(h.escalations().is_empty(), "not before the deadline");
    h.advance(1);
    let report = sweep(&h, 10).unwrap();
    assert_eq!(report.escalated, 1);
    let esc = h.escalations();
    assert_eq!(esc.len(), 1);
    assert_eq!(
        (esc[0].scope.as_str(), esc[0].key.as_str(), esc[0].tool.as_str()),
        ("s", "k", "refund")
    );
    assert_eq!(
        (esc[0].state, esc[0].reason.as_str(), esc[0].deadline),
        (State::Unknown, "deadline", deadline)
    );
    let v = view(&h, "k");
    assert!(v.escalated);
    assert_eq!(v.state, State::Unknown, "escalated is a flag, not a state");
    for _ in 0..2 {
        h.advance(10 * SECOND);
        sweep(&h, 10).unwrap();
    }
    unknown_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(h.escalations().len(), 1);
    let v = view(&h, "k");
    assert_eq!(kinds(&v).iter().filter(|k| **k == "escalated").count(), 1);
    // Reconciliation goes on after the escalation.
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    h.advance(10 * MAX_IN_FLIGHT);
    sweep(&h, 10).unwrap();
    assert_eq!(view(&h, "k").state, State::Confirmed);
}

#[test]
fn deadline_escalation_via_reconcile_is_marked_once() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    h.advance(DEADLINE + 5);
    unknown_of(reconcile(&h, "s", "k").unwrap());
    unknown_of(reconcile(&h, "s", "k").unwrap());
    sweep(&h, 10).unwrap();
    assert_eq!(h.escalations().len(), 1);
}

#[test]
fn unacknowledged_escalation_is_redelivered_with_the_same_id() {
    let h = MemoryHost::new();
    h.set_ack_escalations(false);
    unknown_record(&h, "k", policy());
    h.advance(DEADLINE);
    sweep(&h, 10).unwrap();
    assert_eq!(h.escalations().len(), 1);
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    let esc = h.escalations();
    assert!(esc.len() >= 2, "sweep re-delivers an unacknowledged escalation");
    assert!(esc.iter().all(|e| e.id == esc[0].id), "a re-delivery keeps its id");
    h.set_ack_escalations(true);
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    let delivered = h.escalations().len();
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    assert_eq!(h.escalations().len(), delivered, "acknowledged: no more deliveries");
    assert!(h.escalations().iter().all(|e| e.id == esc[0].id));
    assert_eq!(kinds(&view(&h, "k")).iter().filter(|k| **k == "escalated").count(), 1);
}

/// A possible-duplicate escalation is delivered at least once too.
#[test]
fn unacknowledged_possible_duplicate_is_redelivered() {
    let h = MemoryHost::new();
    h.set_ack_escalations(false);
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    execute_of(reconcile(&h, "s", "k").unwrap());
    fin(&h, "k", &e1.fence, success(RECEIPT));
    assert_eq!(h.escalations().len(), 1);
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    let esc = h.escalations();
    assert!(
        esc.len() >= 2,
        "sweep must re-deliver an unacknowledged possible-duplicate escalation"
    );
    assert!(
        esc.iter()
            .all(|e| e.id == esc[0].id && e.reason == "possible-duplicate")
    );
    h.set_ack_escalations(true);
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    let n = h.escalations().len();
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    assert_eq!(h.escalations().len(), n);
    assert_eq!(view(&h, "k").state, State::Confirmed);
}

#[test]
fn absent_past_its_deadline_is_escalated() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    sweep(&h, 10).unwrap();
    assert_eq!(view(&h, "k").state, State::Absent);
    h.advance(DEADLINE);
    sweep(&h, 10).unwrap();
    let esc = h.escalations();
    assert_eq!(esc.len(), 1);
    assert_eq!(esc[0].state, State::Absent);
    let v = view(&h, "k");
    assert!(v.escalated);
    assert_eq!(v.state, State::Absent);
    // The owed dispatch can still be taken.
    assert_eq!(execute_of(go(&h, refund("k", ARGS))).attempt, 2);
}

// ---------------------------------------------------------------- retention

#[test]
fn prune_never_removes_open_records() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("absent", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    sweep(&h, 10).unwrap();
    execute_of(go(&h, refund("in-flight", ARGS)));
    unknown_record(&h, "unknown", policy());
    let before: Vec<RecordView> = ["absent", "in-flight", "unknown"].iter().map(|k| view(&h, k)).collect();
    assert_eq!(
        before.iter().map(|v| v.state).collect::<Vec<_>>(),
        [State::Absent, State::InFlight, State::Unknown]
    );
    h.advance(400 * DAY);
    let report = prune(&h, 100).unwrap();
    assert_eq!(report.pruned, 0);
    for v in before {
        let mut after = view(&h, &v.key);
        // What `resolve` accepts is judged at the clock, not stored: 400 days on, the lease has ended.
        after.resolvable = v.resolvable;
        assert_eq!(after, v);
    }
    assert!(!h.rows().iter().any(|r| r.table == Table::Tombstone));
}

#[test]
fn prune_counts_retention_from_the_last_transition_and_leaves_tombstones() {
    let h = MemoryHost::new();
    let c = execute_of(go(&h, refund("confirmed", ARGS)));
    fin(&h, "confirmed", &c.fence, success(RECEIPT));
    let f = execute_of(go(&h, refund("failed", ARGS)));
    fin(&h, "failed", &f.fence, rejected());
    unknown_record(&h, "late", policy());
    h.advance(3 * DAY);
    assert_eq!(
        resolve(
            &h,
            "s",
            "late",
            Resolution::Confirmed(RECEIPT.to_string()),
            "bank statement",
            false
        ),
        Ok(State::Confirmed)
    );
    let late_at = h.now();
    let last_version = view(&h, "confirmed").version;

    h.advance(T0 + RETENTION - h.now() - 1);
    assert_eq!(prune(&h, 100).unwrap().pruned, 0);
    h.advance(SECOND);
    assert_eq!(prune(&h, 100).unwrap().pruned, 2);
    assert!(inspect(&h, "s", "confirmed").unwrap().is_none());
    assert!(inspect(&h, "s", "failed").unwrap().is_none());
    assert_eq!(
        view(&h, "late").state,
        State::Confirmed,
        "retention counts from the last transition"
    );
    let trail = h.audit("s", "confirmed").unwrap();
    let pruned = trail.last().unwrap();
    assert_eq!(
        (pruned.kind.as_str(), pruned.version, pruned.to_state),
        ("pruned", last_version + 1, None)
    );
    assert_eq!(h.rows().iter().filter(|r| r.table == Table::Tombstone).count(), 2);

    h.advance(late_at + RETENTION - h.now());
    assert_eq!(prune(&h, 100).unwrap().pruned, 1);
    assert!(inspect(&h, "s", "late").unwrap().is_none());

    // A tombstoned key is expired, never silently a new operation.
    let events = h.event_count();
    blocked_of(go(&h, refund("confirmed", ARGS)), BlockReason::Expired);
    blocked_of(
        go(&h, refund("confirmed", r#"{"order":1,"amount":1}"#)),
        BlockReason::Expired,
    );
    blocked_of(go(&h, refund("failed", ARGS)), BlockReason::Expired);
    assert_eq!(operation_rows(&h), 0);
    assert_eq!(h.event_count(), events);

    // With verify_first, the provider is asked: confirmed evidence replays.
    let mut vf = policy();
    vf.verify_first = true;
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let r = replay_of(go(&h, with_policy(refund("confirmed", ARGS), vf.clone())));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Provider), RECEIPT));
    assert_eq!(h.lookups().last().unwrap().1, c.provider_key);
    // ... and evidence that does not confirm stays expired.
    h.script_lookup(Evidence::Unknown("down".to_string()));
    blocked_of(
        go(&h, with_policy(refund("confirmed", ARGS), vf.clone())),
        BlockReason::Expired,
    );
    h.script_lookup(Evidence::Absent(h.now()));
    blocked_of(go(&h, with_policy(refund("confirmed", ARGS), vf)), BlockReason::Expired);
    assert_eq!(operation_rows(&h), 0);
}

// ---------------------------------------------------------------- verify_first

fn verify_first() -> Policy {
    let mut p = policy();
    p.verify_first = true;
    p
}

#[test]
fn verify_first_confirmed_on_a_new_key_replays_without_dispatch() {
    let h = MemoryHost::new();
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let r = replay_of(go(&h, with_policy(refund("k", ARGS), verify_first())));
    assert_eq!(
        (r.via, r.receipt.as_str(), r.replayed),
        (Some(ReplayVia::Provider), RECEIPT, true)
    );
    let lookups = h.lookups();
    assert_eq!(lookups.len(), 1);
    let v = view(&h, "k");
    assert_eq!(
        lookups[0],
        ("refund".to_string(), v.provider_key.clone(), v.args.clone())
    );
    assert_eq!(
        (v.state, v.attempts, v.receipt.as_deref()),
        (State::Confirmed, 0, Some(RECEIPT))
    );
    let r = replay_of(go(&h, with_policy(refund("k", ARGS), verify_first())));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Key), RECEIPT));
    assert_eq!(h.lookups().len(), 1, "a key the ledger knows is not looked up again");
}

#[test]
fn verify_first_after_a_lost_ledger_replays() {
    let h = MemoryHost::new();
    h.script_lookup(Evidence::Absent(h.now()));
    let e = execute_of(go(&h, with_policy(refund("k", ARGS), verify_first())));
    fin(&h, "k", &e.fence, success(RECEIPT));
    // Lost with its witness (which, kept, would give the record back: tests/older_history.rs).
    h.wipe();
    h.set_witness(Default::default());
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let r = replay_of(go(&h, with_policy(refund("k", ARGS), verify_first())));
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Provider), RECEIPT));
    let last = h.lookups().last().cloned().unwrap();
    assert_eq!(
        (last.1.as_str(), last.2.as_str()),
        (e.provider_key.as_str(), e.args.as_str())
    );
    assert_eq!(view(&h, "k").attempts, 0, "no second dispatch");
}

#[test]
fn verify_first_without_proof_is_unverified() {
    let h = MemoryHost::new();
    h.script_lookup(Evidence::Unknown("timeout".to_string()));
    blocked_of(
        go(&h, with_policy(refund("k", ARGS), verify_first())),
        BlockReason::Unverified,
    );
    h.script_lookup(Evidence::Absent(h.now() - 1));
    blocked_of(
        go(&h, with_policy(refund("k", ARGS), verify_first())),
        BlockReason::Unverified,
    );
    assert_nothing_written(&h);
    h.script_lookup(Evidence::Absent(h.now()));
    assert_eq!(
        execute_of(go(&h, with_policy(refund("k", ARGS), verify_first()))).attempt,
        1
    );
}

// ---------------------------------------------------------------- quotas

#[test]
fn quota_boundary_is_exact() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    execute_of(go(&h, pay("a", "300", &p)));
    execute_of(go(&h, pay("b", "199.99", &p)));
    execute_of(go(&h, pay("c", "0.01", &p)));
    assert_eq!(quota_used(&h), 50_000);
    let rows = operation_rows(&h);
    let b = blocked_of(go(&h, pay("d", "0.01", &p)), BlockReason::Quota);
    assert!(!b.detail.is_empty());
    assert_eq!(operation_rows(&h), rows, "a blocked call writes no record");
    assert!(inspect(&h, "s", "d").unwrap().is_none());
    assert_eq!(quota_used(&h), 50_000);
    // Zero fits at the ceiling.
    execute_of(go(&h, pay("z", "0", &p)));
}

#[test]
fn quota_sums_decimals_exactly() {
    let h = MemoryHost::new();
    let p = quota_policy("0.30");
    execute_of(go(&h, pay("a", "0.1", &p)));
    execute_of(go(&h, pay("b", "0.2", &p)));
    assert_eq!(quota_used(&h), 30);
    blocked_of(go(&h, pay("c", "0.01", &p)), BlockReason::Quota);
    // String amounts and exponents are exact too.
    let h = MemoryHost::new();
    let p = quota_policy("1.00");
    execute_of(go(&h, pay("a", "\"0.70\"", &p)));
    execute_of(go(&h, pay("b", "3e-1", &p)));
    blocked_of(go(&h, pay("c", "1e-2", &p)), BlockReason::Quota);
}

#[test]
fn rejected_call_releases_its_reservation_once() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    let e1 = execute_of(go(&h, pay("a", "500", &p)));
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);
    fin(&h, "a", &e1.fence, rejected());
    assert_eq!(quota_used(&h), 0);
    // The retry reserves again.
    let e2 = execute_of(go(&h, pay("a", "500", &p)));
    assert_eq!(quota_used(&h), 50_000);
    // A stale finish must not release a second time.
    assert_eq!(fin(&h, "a", &e1.fence, rejected()), FinishAck::Ignored(State::InFlight));
    assert_eq!(
        fin(&h, "a", &e1.fence, Outcome::NotSent),
        FinishAck::Ignored(State::InFlight)
    );
    assert_eq!(quota_used(&h), 50_000);
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);
    // A repeated finish of the current attempt must not release twice either.
    fin(&h, "a", &e2.fence, rejected());
    assert_eq!(fin(&h, "a", &e2.fence, rejected()), FinishAck::Ignored(State::Failed));
    let hold = execute_of(go(&h, pay("b", "100", &p)));
    assert_eq!(quota_used(&h), 10_000);
    fin(&h, "a", &e1.fence, rejected());
    fin(&h, "a", &e2.fence, Outcome::NotSent);
    assert_eq!(quota_used(&h), 10_000);
    execute_of(go(&h, pay("c", "400", &p)));
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);
    let _ = hold;
}

#[test]
fn owed_redispatch_reuses_its_reservation() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    let e1 = execute_of(go(&h, pay("a", "500", &p)));
    h.advance(SECOND);
    fin(&h, "a", &e1.fence, ambiguous());
    assert_eq!(quota_used(&h), 50_000, "an unknown record keeps its reservation");
    h.advance(2 * MAX_IN_FLIGHT);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "a").unwrap());
    assert_eq!(e2.attempt, 2);
    assert_eq!(quota_used(&h), 50_000, "the owed dispatch reuses the reservation");
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);

    // Same through sweep + begin.
    let h = MemoryHost::new();
    execute_of(go(&h, pay("a", "500", &p)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    sweep(&h, 10).unwrap();
    assert_eq!(view(&h, "a").state, State::Absent);
    assert_eq!(execute_of(go(&h, pay("a", "500", &p))).attempt, 2);
    assert_eq!(quota_used(&h), 50_000);
}

#[test]
fn superseding_a_failed_original_releases_nothing_twice() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    let held = execute_of(go(&h, pay("held", "200", &p)));
    fin(&h, "held", &held.fence, success(RECEIPT));
    let e = execute_of(go(&h, pay("orig", "300", &p)));
    fin(&h, "orig", &e.fence, rejected());
    assert_eq!(quota_used(&h), 20_000);
    let mut succ = pay("succ", "300", &p);
    succ.supersedes = Some("orig".to_string());
    execute_of(go(&h, succ));
    assert_eq!(quota_used(&h), 50_000);
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);
    assert_eq!(view(&h, "orig").state, State::Superseded);
}

#[test]
fn superseding_an_absent_original_releases_its_reservation() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    execute_of(go(&h, pay("orig", "300", &p)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    sweep(&h, 10).unwrap();
    assert_eq!(view(&h, "orig").state, State::Absent);
    assert_eq!(quota_used(&h), 30_000);
    let mut succ = pay("succ", "500", &p);
    succ.supersedes = Some("orig".to_string());
    execute_of(go(&h, succ));
    assert_eq!(quota_used(&h), 50_000);
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);
}

/// The window is fixed when the amount is reserved: a release goes back to
/// that window, and an owed redispatch in a later window reserves nothing new.
#[test]
fn quota_window_is_fixed_at_reservation() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    let old = execute_of(go(&h, pay("old", "500", &p)));
    h.advance(DAY);
    execute_of(go(&h, pay("new", "500", &p)));
    assert_eq!(quota_used(&h), 100_000);
    fin(&h, "old", &old.fence, rejected());
    assert_eq!(quota_used(&h), 50_000, "released from the window it was reserved in");
    blocked_of(go(&h, pay("x", "0.01", &p)), BlockReason::Quota);

    // A record reserved yesterday, proven absent today: the redispatch reuses yesterday's reservation.
    let h = MemoryHost::new();
    execute_of(go(&h, pay("a", "500", &p)));
    h.advance(DAY);
    execute_of(go(&h, pay("b", "500", &p)));
    h.script_lookup(Evidence::Absent(h.now()));
    assert_eq!(execute_of(reconcile(&h, "s", "a").unwrap()).attempt, 2);
    assert_eq!(quota_used(&h), 100_000);
}

/// A success that arrives after the rejection released the reservation:
/// the money moved after all, so it is counted again.
#[test]
fn late_success_after_release_counts_the_spend() {
    let h = MemoryHost::new();
    let p = quota_policy("500.00");
    let e1 = execute_of(go(&h, pay("a", "300", &p)));
    fin(&h, "a", &e1.fence, rejected());
    assert_eq!(quota_used(&h), 0);
    assert_eq!(
        fin(&h, "a", &e1.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Confirmed)
    );
    assert_eq!(quota_used(&h), 30_000);
    blocked_of(go(&h, pay("b", "200.01", &p)), BlockReason::Quota);
}

// ---------------------------------------------------------------- supersedes

fn successor(key: &str, original: &str, args: &str) -> BeginRequest {
    let mut r = refund(key, args);
    r.supersedes = Some(original.to_string());
    r
}

const NEW_ARGS: &str = r#"{"order":1234,"amount":150}"#;

#[test]
fn supersedes_an_unresolved_original_is_blocked() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("in-flight", ARGS)));
    blocked_of(
        go(&h, successor("s1", "in-flight", NEW_ARGS)),
        BlockReason::SupersededUnresolved,
    );
    unknown_record(&h, "unknown", policy());
    blocked_of(
        go(&h, successor("s2", "unknown", NEW_ARGS)),
        BlockReason::SupersededUnresolved,
    );
    assert!(inspect(&h, "s", "s1").unwrap().is_none());
    assert!(inspect(&h, "s", "s2").unwrap().is_none());
    assert_eq!(view(&h, "in-flight").state, State::InFlight);
    assert_eq!(view(&h, "unknown").state, State::Unknown);
    blocked_of(
        go(&h, successor("s3", "nothing", NEW_ARGS)),
        BlockReason::SupersedesMissing,
    );
}

#[test]
fn supersedes_a_confirmed_original_needs_acknowledgement() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("orig", ARGS)));
    fin(&h, "orig", &e.fence, success(RECEIPT));
    let b = blocked_of(
        go(&h, successor("succ", "orig", NEW_ARGS)),
        BlockReason::SupersededConfirmed,
    );
    assert_eq!(b.receipt.as_deref(), Some(RECEIPT));
    assert!(inspect(&h, "s", "succ").unwrap().is_none());
    let mut ack = successor("succ", "orig", NEW_ARGS);
    ack.acknowledge_confirmed = true;
    execute_of(go(&h, ack));
    let o = view(&h, "orig");
    assert_eq!((o.state, o.superseded_by.as_deref()), (State::Confirmed, Some("succ")));
    assert_eq!(view(&h, "succ").supersedes.as_deref(), Some("orig"));
    assert_eq!(replay_of(go(&h, refund("orig", ARGS))).receipt, RECEIPT);
}

#[test]
fn supersedes_failed_or_absent_original_in_the_same_write() {
    for original_state in [State::Failed, State::Absent] {
        let h = MemoryHost::new();
        let e = execute_of(go(&h, refund("orig", ARGS)));
        match original_state {
            State::Failed => {
                fin(&h, "orig", &e.fence, rejected());
            }
            _ => {
                h.advance(LEASE + MAX_IN_FLIGHT + 10);
                h.script_lookup(Evidence::Absent(h.now()));
                sweep(&h, 10).unwrap();
            }
        }
        let before = view(&h, "orig");
        assert_eq!(before.state, original_state);

        // The successor's claim and the original's move commit together or not at all.
        h.advance(SECOND);
        h.fail_next_commits(1);
        blocked_of(go(&h, successor("succ", "orig", NEW_ARGS)), BlockReason::Storage);
        assert_eq!(view(&h, "orig"), before);
        assert!(inspect(&h, "s", "succ").unwrap().is_none());

        let s = execute_of(go(&h, successor("succ", "orig", NEW_ARGS)));
        assert_eq!(s.attempt, 1);
        let o = view(&h, "orig");
        assert_eq!((o.state, o.superseded_by.as_deref()), (State::Superseded, Some("succ")));
        assert_eq!(o.version, before.version + 1);
        let moved = o.audit.last().unwrap();
        assert_eq!(
            (moved.kind.as_str(), moved.from_state),
            ("superseded", Some(original_state))
        );
        let sv = view(&h, "succ");
        assert_eq!(sv.supersedes.as_deref(), Some("orig"));
        assert_eq!(moved.at, sv.audit[0].at, "one write, one time");
        assert!(moved.detail.contains("succ"), "lineage in the audit trail");

        let b = blocked_of(go(&h, refund("orig", ARGS)), BlockReason::Superseded);
        assert!(b.detail.contains("succ"));
        assert!(!matches!(reconcile(&h, "s", "orig").unwrap(), Decision::Execute(_)));
        // A second successor cannot take the same original.
        blocked_of(go(&h, successor("succ2", "orig", NEW_ARGS)), BlockReason::Superseded);
    }
}

// ---------------------------------------------------------------- storage

#[test]
fn commit_failure_during_begin_is_blocked_storage() {
    let h = MemoryHost::new();
    h.fail_next_commits(1);
    blocked_of(go(&h, refund("k", ARGS)), BlockReason::Storage);
    assert_nothing_written(&h);
    let p = quota_policy("500.00");
    h.fail_next_commits(1);
    blocked_of(go(&h, pay("q", "500", &p)), BlockReason::Storage);
    assert_nothing_written(&h);
    // Nothing was recorded, so the next begin is the first attempt.
    assert_eq!(execute_of(go(&h, refund("k", ARGS))).attempt, 1);
    assert_eq!(execute_of(go(&h, pay("q", "500", &p))).attempt, 1);
}

/// A decision that needs a read is `blocked(storage)` when reads fail. A new key
/// needs none: its claim is a write that asserts the key is unused, so it applies
/// exactly when a read would have found nothing.
#[test]
fn read_failure_is_blocked_storage() {
    let h = MemoryHost::new();
    // An instance past its first call holds the ledger's provider-key secret (a fresh
    // instance whose read of it fails is refused: `a_secret_that_cannot_be_read_refuses_the_claim`).
    once_guest::secret::key_secret(&h).unwrap();
    h.set_fail_reads(true);
    let e = execute_of(go(&h, refund("k", ARGS)));
    // The key is taken now: deciding again needs the record, which cannot be read.
    blocked_of(go(&h, refund("k", ARGS)), BlockReason::Storage);
    assert!(matches!(reconcile(&h, "s", "k"), Err(Error::Storage(_))));
    // A key whose claim needs a read first (verify-first asks the provider about a
    // key the ledger never saw) is refused without a write or a lookup.
    let mut verified = refund("v", ARGS);
    verified.policy.verify_first = true;
    blocked_of(go(&h, verified), BlockReason::Storage);
    h.set_fail_reads(false);
    assert!(
        h.row(Table::Operation, "s", "v").is_none(),
        "a refused claim wrote a record"
    );
    assert!(h.lookups().is_empty(), "the provider was read before the ledger");
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::InFlight, 1));
    assert!(v.body.contains(&e.fence), "the blind claim is the record: {}", v.body);
}

#[test]
fn unrecorded_success_expires_into_unknown_and_reconciles() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    h.advance(SECOND);
    h.fail_next_commits(1);
    assert_eq!(fin(&h, "k", &e.fence, success(RECEIPT)), FinishAck::Unrecorded);
    let v = view(&h, "k");
    assert_eq!((v.state, v.version), (State::InFlight, 1));
    h.advance(LEASE);
    unknown_of(go(&h, refund("k", ARGS)));
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let r = replay_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!((r.via, r.receipt.as_str()), (Some(ReplayVia::Provider), RECEIPT));
    let v = view(&h, "k");
    assert_eq!(
        (v.state, v.attempts, v.receipt.as_deref()),
        (State::Confirmed, 1, Some(RECEIPT))
    );
    // Through sweep as well.
    let e = execute_of(go(&h, refund("k2", ARGS)));
    h.fail_next_commits(1);
    assert_eq!(fin(&h, "k2", &e.fence, success(RECEIPT2)), FinishAck::Unrecorded);
    h.advance(LEASE);
    h.script_lookup(Evidence::Confirmed(RECEIPT2.to_string()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!((report.expired, report.confirmed), (1, 1));
    assert_eq!(view(&h, "k2").receipt.as_deref(), Some(RECEIPT2));
}

// ---------------------------------------------------------------- bad input

fn json_error_of(r: Result<Decision, Error>) -> once_guest::types::JsonError {
    match r {
        Err(Error::InvalidJson(e)) => e,
        other => panic!("expected invalid-json, got {other:?}"),
    }
}

#[test]
fn bad_args_are_typed_errors_and_write_nothing() {
    let h = MemoryHost::new();
    let deep = format!(r#"{{"items":{}{}}}"#, "[".repeat(10_000), "]".repeat(10_000));
    let huge = format!(r#"{{"memo":"{}"}}"#, "a".repeat(16 << 20));
    let cases: Vec<(&str, String, JsonErrorKind, &str)> = vec![
        (
            "malformed",
            r#"{"order":1234,"amount":}"#.to_string(),
            JsonErrorKind::Syntax,
            "/amount",
        ),
        (
            "duplicate",
            r#"{"order":{"id":1,"id":2}}"#.to_string(),
            JsonErrorKind::DuplicateKey,
            "/order",
        ),
        (
            "surrogate",
            r#"{"memo":"\ud800"}"#.to_string(),
            JsonErrorKind::LoneSurrogate,
            "/memo",
        ),
        (
            "nan",
            r#"{"amount":NaN}"#.to_string(),
            JsonErrorKind::NonFiniteNumber,
            "/amount",
        ),
        ("deep", deep, JsonErrorKind::TooDeep, "/items"),
        ("huge", huge, JsonErrorKind::TooLarge, ""),
    ];
    for (name, args, kind, pointer) in cases {
        let e = json_error_of(begin(&h, refund("k", &args)));
        assert_eq!(e.kind, kind, "{name}: {e:?}");
        assert!(
            e.pointer.starts_with(pointer),
            "{name}: pointer {:?} should name {pointer:?}",
            e.pointer
        );
        if !pointer.is_empty() {
            assert!(!e.pointer.is_empty(), "{name}: the error names a pointer");
        }
        assert!(!e.message.is_empty());
        assert_nothing_written(&h);
    }
    // Not an object.
    assert!(matches!(begin(&h, refund("k", "[1,2]")), Err(Error::InvalidRequest(_))));
    assert_nothing_written(&h);
}

/// An operator's receipt that is not strict I-JSON is refused without a
/// write (the operator can correct it); a provider's is evidence of the
/// effect and is stored as it came, flagged (tests/flawed_receipts.rs).
#[test]
fn an_operators_bad_receipt_is_refused_without_a_write_and_a_providers_is_stored() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Confirmed("{".to_string()), "note", true),
        Err(Error::InvalidJson(_))
    ));
    assert_eq!(view(&h, "k").version, 1);
    assert_eq!(
        finish(&h, "s", "k", &e.fence, success(r#"{"a":1,"a":2}"#)),
        Ok(FinishAck::Recorded(State::Confirmed))
    );
    let v = view(&h, "k");
    assert_eq!((v.version, v.receipt.as_deref()), (2, Some(r#"{"a":1,"a":2}"#)));
    assert!(
        body(&v)["receipt_flaw"]["problem"]
            .as_str()
            .unwrap()
            .contains("duplicate key")
    );
}

// ---------------------------------------------------------------- resolve

#[test]
fn resolve_absent_before_max_in_flight_needs_force_and_is_audited() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    let v = view(&h, "k");
    assert!(matches!(
        resolve(
            &h,
            "s",
            "k",
            Resolution::Absent,
            "provider support says no charge",
            false
        ),
        Err(Error::InvalidTransition(_))
    ));
    assert_eq!(view(&h, "k"), v, "a refused resolution writes nothing");
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Absent, "  ", true),
        Err(Error::InvalidRequest(_))
    ));
    assert_eq!(
        resolve(
            &h,
            "s",
            "k",
            Resolution::Absent,
            "provider support says no charge",
            true
        ),
        Ok(State::Absent)
    );
    let v = view(&h, "k");
    assert_eq!(v.state, State::Absent);
    let last = v.audit.last().unwrap();
    assert_eq!(last.kind, "operator-absent");
    let detail: serde_json::Value = serde_json::from_str(&last.detail).unwrap();
    assert_eq!(detail["note"], "provider support says no charge");
    assert_eq!(detail["forced"], true);
    // The owed dispatch.
    assert_eq!(execute_of(go(&h, refund("k", ARGS))).attempt, 2);

    // After max_in_flight, no force is needed.
    unknown_record(&h, "k2", policy());
    h.advance(MAX_IN_FLIGHT + 1);
    assert_eq!(
        resolve(&h, "s", "k2", Resolution::Absent, "checked the statement", false),
        Ok(State::Absent)
    );
}

#[test]
fn resolve_confirmed_stores_the_receipt() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    assert_eq!(
        resolve(
            &h,
            "s",
            "k",
            Resolution::Confirmed(r#"{ "refund_id":"r-1", "status":"done" }"#.to_string()),
            "seen",
            false
        ),
        Ok(State::Confirmed)
    );
    let v = view(&h, "k");
    let as_given = r#"{ "refund_id":"r-1", "status":"done" }"#;
    assert_eq!((v.state, v.receipt.as_deref()), (State::Confirmed, Some(as_given)));
    let last = v.audit.last().unwrap();
    assert_eq!(last.kind, "operator-confirmed");
    assert!(last.detail.contains("seen"));
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, as_given);
    // Confirmed is terminal: no resolution changes it.
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Confirmed(RECEIPT2.to_string()), "again", true),
        Err(Error::InvalidTransition(_))
    ));
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Absent, "again", true),
        Err(Error::InvalidTransition(_))
    ));
    assert_eq!(view(&h, "k").receipt.as_deref(), Some(as_given));
    // A live lease cannot be resolved.
    execute_of(go(&h, refund("live", ARGS)));
    assert!(matches!(
        resolve(&h, "s", "live", Resolution::Absent, "n", true),
        Err(Error::InvalidTransition(_))
    ));
}

// ---------------------------------------------------------------- policy

/// A lease is at least the dispatch timeout plus a margin, checked when the
/// policy is loaded; a bad policy writes nothing.
#[test]
fn lease_below_dispatch_timeout_is_an_invalid_policy() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.lease_ms = p.dispatch_timeout_ms;
    assert!(matches!(
        begin(&h, with_policy(refund("k", ARGS), p)),
        Err(Error::InvalidPolicy(_))
    ));
    let mut p = policy();
    p.attempt_budget = 0;
    assert!(matches!(
        begin(&h, with_policy(refund("k", ARGS), p)),
        Err(Error::InvalidPolicy(_))
    ));
    assert_nothing_written(&h);
}

// ---------------------------------------------------------------- routing

#[test]
fn direct_route_records_nothing_unless_a_record_exists() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.route = Some(Route::Direct);
    assert_eq!(go(&h, with_policy(refund("k", ARGS), p.clone())), Decision::Direct);
    assert_nothing_written(&h);
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    assert_eq!(
        replay_of(go(&h, with_policy(refund("k", ARGS), p.clone()))).receipt,
        RECEIPT
    );
    // A read-only call is not refused for a payload only protected calls need,
    // but malformed args are still an error.
    p.effect_fields = Some(vec!["/not_there".to_string()]);
    assert_eq!(go(&h, with_policy(refund("k2", ARGS), p.clone())), Decision::Direct);
    assert!(matches!(
        begin(&h, with_policy(refund("k3", "{"), p)),
        Err(Error::InvalidJson(_))
    ));
}

fn described(annotations: Option<&str>) -> once_guest::types::ToolDescriptor {
    once_guest::types::ToolDescriptor {
        name: "refund".to_string(),
        input_schema: r#"{"type":"object"}"#.to_string(),
        annotations: annotations.map(str::to_string),
    }
}

/// Explicit policy first, then MCP annotations; an unclassified tool never
/// becomes direct; contradictory hints block; a pinned descriptor that
/// changed blocks until the pin is updated.
#[test]
fn routing_from_annotations_and_pins() {
    let h = MemoryHost::new();
    let call = |key: &str, ann: Option<&str>| {
        let mut r = refund(key, ARGS);
        r.descriptor = Some(described(ann));
        r
    };
    assert_eq!(go(&h, call("ro", Some(r#"{"readOnlyHint":true}"#))), Decision::Direct);
    assert!(inspect(&h, "s", "ro").unwrap().is_none());
    execute_of(go(&h, call("d", Some(r#"{"destructiveHint":true}"#))));
    execute_of(go(&h, call("none", Some("{}"))));
    execute_of(go(&h, call("absent", None)));
    execute_of(go(&h, refund("no-descriptor", ARGS)));
    blocked_of(
        go(
            &h,
            call("both", Some(r#"{"readOnlyHint":true,"destructiveHint":true}"#)),
        ),
        BlockReason::RouteBlocked,
    );
    let mut blocked = policy();
    blocked.route = Some(Route::Block);
    blocked_of(
        go(&h, with_policy(call("b", Some(r#"{"readOnlyHint":true}"#)), blocked)),
        BlockReason::RouteBlocked,
    );
    // Explicit policy beats annotations.
    let mut protect = policy();
    protect.route = Some(Route::Protect);
    execute_of(go(
        &h,
        with_policy(call("p", Some(r#"{"readOnlyHint":true}"#)), protect),
    ));

    let pin = once_guest::policy::descriptor_fingerprint(&described(Some("{}")), &h.settings()).unwrap();
    let mut pinned = policy();
    pinned.descriptor_pin = Some(pin);
    execute_of(go(&h, with_policy(call("pin-ok", Some("{}")), pinned.clone())));
    blocked_of(
        go(
            &h,
            with_policy(
                call("pin-changed", Some(r#"{"destructiveHint":false}"#)),
                pinned.clone(),
            ),
        ),
        BlockReason::DescriptorChanged,
    );
    blocked_of(
        go(&h, with_policy(refund("pin-missing", ARGS), pinned)),
        BlockReason::DescriptorChanged,
    );
    assert!(inspect(&h, "s", "pin-changed").unwrap().is_none());
}

// ---------------------------------------------------------------- audit

/// Every transition writes exactly one audit event whose version is the
/// record's new version; a long life, checked write by write.
#[test]
fn every_transition_writes_exactly_one_audit_event() {
    let h = MemoryHost::new();
    let mut t = Tracker::new("s", "k");
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    t.step(&h, 1);
    fin(&h, "k", &e1.fence, rejected());
    t.step(&h, 1);
    let e2 = execute_of(go(&h, refund("k", ARGS)));
    t.step(&h, 1);
    h.advance(SECOND);
    fin(&h, "k", &e2.fence, ambiguous());
    t.step(&h, 1);
    unknown_of(reconcile(&h, "s", "k").unwrap()); // unknown evidence
    t.step(&h, 1);
    h.advance(DEADLINE);
    sweep(&h, 10).unwrap(); // read, mark escalated, acknowledge
    t.step(&h, 3);
    h.script_lookup(Evidence::Absent(h.now()));
    let e3 = execute_of(reconcile(&h, "s", "k").unwrap()); // reconciled-absent, owed-dispatch
    t.step(&h, 2);
    fin(&h, "k", &e3.fence, success(RECEIPT));
    t.step(&h, 1);
    replay_of(go(&h, refund("k", ARGS)));
    let v = t.step(&h, 1);
    let tos: Vec<Option<State>> = v.audit.iter().map(|e| e.to_state).collect();
    assert_eq!(tos.last(), Some(&Some(State::Confirmed)));
    assert_eq!(h.event_count() as u64, v.version);
}

// ---------------------------------------------------------------- races

type Hook = Box<dyn FnOnce(&MemoryHost)>;

/// A host whose next commit first lets a concurrent writer in (the hook runs
/// against the same ledger), or applies and then reports a storage failure
/// (a connection lost mid-commit).
struct RacyHost {
    inner: MemoryHost,
    before_commit: std::cell::RefCell<Option<Hook>>,
    /// Runs before the next read of the given table.
    before_get: std::cell::RefCell<Option<(Table, Hook)>>,
    applied_but_failed: std::cell::Cell<u32>,
}

impl RacyHost {
    fn new() -> Self {
        RacyHost {
            inner: MemoryHost::new(),
            before_commit: std::cell::RefCell::new(None),
            before_get: std::cell::RefCell::new(None),
            applied_but_failed: std::cell::Cell::new(0),
        }
    }
    fn race(&self, hook: impl FnOnce(&MemoryHost) + 'static) {
        *self.before_commit.borrow_mut() = Some(Box::new(hook));
    }
    fn race_before_reading(&self, table: Table, hook: impl FnOnce(&MemoryHost) + 'static) {
        *self.before_get.borrow_mut() = Some((table, Box::new(hook)));
    }
}

impl Host for RacyHost {
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn settings(&self) -> once_guest::types::Settings {
        self.inner.settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<once_guest::types::Stored>, String> {
        let due = matches!(&*self.before_get.borrow(), Some((t, _)) if *t == table);
        if due && let Some((_, hook)) = self.before_get.borrow_mut().take() {
            hook(&self.inner);
        }
        self.inner.get(table, scope, key)
    }
    fn commit(&self, batch: &once_guest::types::Batch) -> Result<(), once_guest::host::CommitError> {
        let hook = self.before_commit.borrow_mut().take();
        if let Some(hook) = hook {
            hook(&self.inner);
        }
        let result = self.inner.commit(batch);
        if result.is_ok() && self.applied_but_failed.get() > 0 {
            self.applied_but_failed.set(self.applied_but_failed.get() - 1);
            return Err(once_guest::host::CommitError::Storage(
                "connection lost mid-commit".to_string(),
            ));
        }
        result
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<once_guest::types::Row>, String> {
        self.inner.scan(table, states, due_before, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<once_guest::types::AuditEvent>, String> {
        self.inner.audit(scope, key)
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self.inner.lookup(tool, provider_key, args)
    }
    fn escalate(&self, escalation: &once_guest::types::Escalation) -> bool {
        self.inner.escalate(escalation)
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.inner.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.inner.secret_cache()
    }
}

#[test]
fn concurrent_begins_grant_one_execute() {
    let h = RacyHost::new();
    h.race(|inner| {
        execute_of(begin(inner, refund("k", ARGS)).unwrap());
    });
    let Decision::InFlight(_) = begin(&h, refund("k", ARGS)).unwrap() else {
        panic!("the loser must wait in flight")
    };
    let v = view(&h.inner, "k");
    assert_eq!((v.state, v.attempts, v.version), (State::InFlight, 1, 1));

    // Two grants racing from failed: one execute.
    let e1 = execute_of(begin(&h, refund("f", ARGS)).unwrap());
    finish(&h, "s", "f", &e1.fence, rejected()).unwrap();
    h.race(|inner| {
        execute_of(begin(inner, refund("f", ARGS)).unwrap());
    });
    assert!(matches!(begin(&h, refund("f", ARGS)).unwrap(), Decision::InFlight(_)));
    assert_eq!(view(&h.inner, "f").attempts, 2);

    // An owed dispatch taken by begin and reconcile at once: one execute.
    execute_of(begin(&h, refund("a", ARGS)).unwrap());
    h.inner.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.inner.script_lookup(Evidence::Absent(h.now()));
    sweep(&h, 10).unwrap();
    assert_eq!(view(&h.inner, "a").state, State::Absent);
    h.race(|inner| {
        execute_of(reconcile(inner, "s", "a").unwrap());
    });
    assert!(matches!(begin(&h, refund("a", ARGS)).unwrap(), Decision::InFlight(_)));
    assert_eq!(view(&h.inner, "a").attempts, 2);
}

#[test]
fn concurrent_reservations_respect_the_ceiling() {
    let h = RacyHost::new();
    let p = quota_policy("500.00");
    let p2 = p.clone();
    h.race(move |inner| {
        execute_of(begin(inner, pay("b", "300", &p2)).unwrap());
    });
    blocked_of(begin(&h, pay("a", "300", &p)).unwrap(), BlockReason::Quota);
    assert_eq!(quota_used(&h.inner), 30_000);
    assert!(inspect(&h.inner, "s", "a").unwrap().is_none());
}

/// The duplicate reads "no record", then the quota bucket after the first
/// claim of the same key committed: the bucket holds that claim's
/// reservation, which must not make the duplicate look like new spend.
#[test]
fn a_duplicate_is_not_refused_for_its_own_reservation() {
    let h = RacyHost::new();
    let p = quota_policy("500.00");
    let p2 = p.clone();
    h.race_before_reading(Table::Quota, move |inner| {
        execute_of(begin(inner, pay("k", "300", &p2)).unwrap());
    });
    let Decision::InFlight(_) = begin(&h, pay("k", "300", &p)).unwrap() else {
        panic!("the duplicate must wait for the claim in flight")
    };
    assert_eq!(quota_used(&h.inner), 30_000);

    // The same for a retry from failed: the retry that won reserved again.
    let h = RacyHost::new();
    let e = execute_of(begin(&h, pay("f", "300", &p)).unwrap());
    finish(&h, "s", "f", &e.fence, rejected()).unwrap();
    assert_eq!(quota_used(&h.inner), 0);
    h.race_before_reading(Table::Quota, move |inner| {
        assert_eq!(execute_of(begin(inner, pay("f", "300", &p)).unwrap()).attempt, 2);
    });
    let quota = quota_policy("500.00");
    let Decision::InFlight(_) = begin(&h, pay("f", "300", &quota)).unwrap() else {
        panic!("the duplicate retry must wait for the attempt in flight")
    };
    assert_eq!((view(&h.inner, "f").attempts, quota_used(&h.inner)), (2, 30_000));
}

#[test]
fn finish_racing_a_sweep_keeps_the_success() {
    let h = RacyHost::new();
    let e = execute_of(begin(&h, refund("k", ARGS)).unwrap());
    h.inner.advance(LEASE);
    // The holder's success lands while the sweep is expiring the lease.
    let fence = e.fence.clone();
    h.race(move |inner| {
        assert_eq!(
            finish(inner, "s", "k", &fence, success(RECEIPT)),
            Ok(FinishAck::Recorded(State::Confirmed))
        );
    });
    sweep(&h, 10).unwrap();
    let v = view(&h.inner, "k");
    assert_eq!((v.state, v.receipt.as_deref()), (State::Confirmed, Some(RECEIPT)));
}

#[test]
fn original_retried_while_being_superseded() {
    let h = RacyHost::new();
    let e = execute_of(begin(&h, refund("orig", ARGS)).unwrap());
    finish(&h, "s", "orig", &e.fence, rejected()).unwrap();
    h.race(|inner| {
        assert_eq!(execute_of(begin(inner, refund("orig", ARGS)).unwrap()).attempt, 2);
    });
    blocked_of(
        begin(&h, successor("succ", "orig", NEW_ARGS)).unwrap(),
        BlockReason::SupersededUnresolved,
    );
    assert!(inspect(&h.inner, "s", "succ").unwrap().is_none());
    assert_eq!(view(&h.inner, "orig").state, State::InFlight);
}

/// A claim whose commit outcome is unknown is blocked(storage): the caller
/// never dispatches, and a repeat does not hand out a second execute for
/// the claim that did land.
#[test]
fn claim_with_unknown_commit_outcome_is_blocked_and_never_doubled() {
    let h = RacyHost::new();
    h.applied_but_failed.set(1);
    blocked_of(begin(&h, refund("k", ARGS)).unwrap(), BlockReason::Storage);
    let v = view(&h.inner, "k");
    assert_eq!((v.state, v.attempts), (State::InFlight, 1));
    assert!(matches!(begin(&h, refund("k", ARGS)).unwrap(), Decision::InFlight(_)));
    // The landed claim expires into unknown and is reconciled like any other.
    h.inner.advance(LEASE + MAX_IN_FLIGHT + 1);
    h.inner.script_lookup(Evidence::Absent(h.now()));
    let e = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(e.attempt, 2);
}

/// A success on a superseded original: the effect happened after all. The
/// receipt is kept, the record flagged and escalated (at least once).
#[test]
fn success_on_a_superseded_original_is_escalated() {
    let h = MemoryHost::new();
    h.set_ack_escalations(false);
    let e = execute_of(go(&h, refund("orig", ARGS)));
    fin(&h, "orig", &e.fence, rejected());
    execute_of(go(&h, successor("succ", "orig", NEW_ARGS)));
    assert_eq!(
        fin(&h, "orig", &e.fence, success(RECEIPT)),
        FinishAck::Recorded(State::Superseded)
    );
    let v = view(&h, "orig");
    assert!(v.possible_duplicate);
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    assert_eq!(h.escalations().len(), 1);
    h.advance(10 * SECOND);
    sweep(&h, 10).unwrap();
    assert!(h.escalations().len() >= 2, "re-delivered while unacknowledged");
    let ids: Vec<String> = h.escalations().iter().map(|e| e.id.clone()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]));
}

/// After its tombstone's own retention the key is forgotten: a new record
/// continues the old audit trail (events are never rewritten) instead of
/// colliding with it.
#[test]
fn key_after_tombstone_retention_starts_a_new_operation_after_the_old_trail() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    h.advance(RETENTION);
    assert_eq!(prune(&h, 10).unwrap().pruned, 1);
    h.advance(default_policy().tombstone_retention_ms);
    assert_eq!(prune(&h, 10).unwrap().tombstones_removed, 1);
    let old_trail = h.audit("s", "k").unwrap();
    let last_old = old_trail.last().unwrap().version;
    let d = go(&h, refund("k", ARGS));
    let e2 = execute_of(d);
    assert_eq!(e2.attempt, 1);
    let trail = h.audit("s", "k").unwrap();
    assert_eq!(trail.len(), old_trail.len() + 1, "the old events are kept");
    assert_eq!(trail.last().unwrap().version, last_old + 1);
    assert_eq!(trail.last().unwrap().kind, "begin");
    fin(&h, "k", &e2.fence, success(RECEIPT));
    assert_eq!(view(&h, "k").state, State::Confirmed);
}

// ------------------------------------------------- waiting on in_flight

/// DESIGN.md: a caller waiting on `in_flight` gets what the holder ends with —
/// the receipt, or the rejection — and does not start a new attempt on its own.
#[test]
fn a_waiter_gets_the_holders_receipt() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    assert!(matches!(go(&h, refund("k", ARGS)), Decision::InFlight(_)));
    match await_holder(&h, "s", "k").unwrap() {
        Awaited::Pending(info) => assert_eq!(info.lease_until, e.lease_until),
        other => panic!("expected pending, got {other:?}"),
    }
    fin(&h, "k", &e.fence, success(RECEIPT));
    let Awaited::Decided(d) = await_holder(&h, "s", "k").unwrap() else {
        panic!("expected a decision")
    };
    let r = replay_of(d);
    assert_eq!((r.receipt.as_str(), r.via), (RECEIPT, Some(ReplayVia::Key)));
    assert_eq!(view(&h, "k").attempts, 1);
}

#[test]
fn a_waiter_gets_the_holders_rejection_and_starts_no_attempt() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, rejected());
    assert_eq!(
        await_holder(&h, "s", "k").unwrap(),
        Awaited::Rejected(once_guest::types::RejectedInfo {
            error: r#"{"error":"card declined"}"#.to_string(),
            attempt: 1
        })
    );
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Failed, 1), "{:?}", kinds(&v));
    // Asking is a read: nothing was written.
    assert_eq!(kinds(&v), ["begin", "finish-rejected"]);
}

#[test]
fn a_waiter_whose_holder_vanished_gets_what_reconcile_decides() {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE);
    // The lease ended without an outcome: the engine expires it and reads the provider.
    h.script_lookup(Evidence::Unknown("provider busy".to_string()));
    let Awaited::Decided(d) = await_holder(&h, "s", "k").unwrap() else {
        panic!("expected a decision")
    };
    assert_eq!(unknown_of(d).since, T0 + LEASE);
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Unknown, 1), "{:?}", kinds(&v));
    assert_eq!(await_holder(&h, "s", "nope"), Err(Error::NotFound));
}
