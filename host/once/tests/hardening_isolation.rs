//! Scope isolation through the library: a key of scope B can never replay,
//! conflict with, inspect, resolve, reconcile, finish or supersede a record of
//! scope A, nor share its provider key, its derived key or its quota. The
//! CLI's side (`once ledger --scope`) is `host/cli/tests/hardening_isolation.rs`.

mod isolation_common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use isolation_common::{ARGS, RECEIPT_A, TOOL, open, scope_a};
use once::types::{BlockReason, Decision, Error, Outcome, Resolution};
use once::{Called, Once, OnceError, Sent};

/// Confirmed by this call's own send (not a replay).
fn sent_now(called: &Called) -> bool {
    called.confirmed().is_some_and(|c| !c.replayed)
}

#[test]
fn the_library_keeps_scopes_apart() {
    static LOOKUPS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let once = open(&dir.path().join("once.db"), &LOOKUPS);
    let (grant_u, a_k, a_u) = scope_a(&once);
    LOOKUPS.lock().unwrap().clear();

    // Inspect, reconcile, resolve, finish: B names no record.
    assert!(once.inspect("B", "k").unwrap().is_none());
    assert!(once.inspect("B", "u").unwrap().is_none());
    assert!(matches!(
        once.transitions().reconcile("B", "u"),
        Err(OnceError::Engine(Error::NotFound))
    ));
    for resolution in [Resolution::Confirmed(RECEIPT_A.into()), Resolution::Absent] {
        let resolved = once.resolve("B", "u", &resolution, "operator note", true);
        assert!(
            matches!(resolved, Err(OnceError::Engine(Error::NotFound))),
            "{resolved:?}"
        );
    }
    let finished = once
        .transitions()
        .finish("B", "u", &grant_u.fence, &Outcome::Success("{}".into()));
    assert!(
        matches!(finished, Err(OnceError::Engine(Error::NotFound))),
        "{finished:?}"
    );
    assert!(
        LOOKUPS.lock().unwrap().is_empty(),
        "a lookup for another scope's record"
    );

    // Supersede: A's key does not exist in B.
    let mut call = Once::call_of("B", Some("k2"), TOOL, ARGS);
    call.supersedes = Some("u".to_string());
    match once.transitions().begin(&call).unwrap() {
        Decision::Blocked(b) => assert_eq!(b.reason, BlockReason::SupersedesMissing),
        other => panic!("superseding another scope's key: {other:?}"),
    }

    // A's quota is spent: one more unit is over its ceiling.
    let over = once
        .call("A", Some("k3"), TOOL, r#"{"order_id":3,"amount":1}"#, |_| {
            Sent::Success("{}".into())
        })
        .unwrap();
    assert!(
        over.blocked().is_some_and(|b| b.reason == BlockReason::Quota),
        "{over:?}"
    );

    // Same key, same args: a new operation in B (no replay of A's receipt),
    // with its own provider key and its own quota (A spent all of its own).
    let sent = AtomicU32::new(0);
    let mut provider_key = String::new();
    let called = once
        .call("B", Some("k"), TOOL, ARGS, |d| {
            sent.fetch_add(1, Ordering::SeqCst);
            provider_key = d.provider_key.to_string();
            Sent::Success(r#"{"refund_id":"r_b"}"#.into())
        })
        .unwrap();
    assert!(sent_now(&called), "{called:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_ne!(provider_key, a_k.provider_key);
    // Same key, other args: no conflict with A's record (B's own is the one that counts).
    let called = once
        .call("B", Some("u"), TOOL, r#"{"order_id":9,"amount":0}"#, |_| {
            Sent::Success("{}".into())
        })
        .unwrap();
    assert!(sent_now(&called), "{called:?}");
    // A's fence means nothing to B's record of the same name.
    let finished = once
        .transitions()
        .finish("B", "u", &grant_u.fence, &Outcome::Rejected("no".into()));
    assert!(
        matches!(finished, Err(OnceError::Engine(Error::FenceMismatch))),
        "{finished:?}"
    );

    // Derived identity (a tool without a quota, on the defaults): identical
    // args in two scopes are two operations.
    let mut derived_key = Vec::new();
    for scope in ["A", "B"] {
        let call = Once::call_of(scope, None, "refund_keyless", r#"{"order_id":5,"amount":1}"#);
        match once.transitions().begin(&call).unwrap() {
            Decision::Execute(e) => derived_key.push((e.key, e.provider_key)),
            other => panic!("{scope}: {other:?}"),
        }
    }
    assert_ne!(
        derived_key[0].1, derived_key[1].1,
        "derived operations share a provider key"
    );

    // Nothing B did touched A.
    assert_eq!(once.inspect("A", "k").unwrap().unwrap(), a_k);
    assert_eq!(once.inspect("A", "u").unwrap().unwrap(), a_u);
}
