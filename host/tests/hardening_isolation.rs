//! Scope isolation through the library and the CLI: a key of scope B can
//! never replay, conflict with, inspect, resolve, reconcile, finish or
//! supersede a record of scope A, nor share its provider key, its derived
//! key or its quota.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{
    BlockReason, Decision, Error, Evidence, Execute, IdentityMode, Outcome, QuotaPolicy, RecordView, Resolution, State,
};
use once::{Called, Once, OnceError, Sent};

const TOOL: &str = "refund_order";
const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;
const RECEIPT_A: &str = r#"{"refund_id":"r_a"}"#;

/// A ledger whose provider records every lookup it is asked.
fn open(path: &Path, lookups: &'static Mutex<Vec<String>>) -> Once {
    let mut policy = Once::builder(SqliteStorage::open(path, SqliteOptions::default()).unwrap())
        .build()
        .unwrap()
        .default_policy()
        .unwrap();
    policy.quota = Some(QuotaPolicy {
        spend_field: "/amount".to_string(),
        ceiling: "200".to_string(),
        decimals: 0,
        window_ms: 86_400_000,
        bucket: None,
    });
    Once::builder(SqliteStorage::open(path, SqliteOptions::default()).unwrap())
        .provider(move |_: &str, provider_key: &str, _: &str| {
            lookups.lock().unwrap().push(provider_key.to_string());
            Evidence::Unknown("cannot tell".to_string())
        })
        .policy(TOOL, policy)
        .build()
        .unwrap()
}

/// Scope A: `k` confirmed (spending the whole quota), `u` unknown.
fn scope_a(once: &Once) -> (Execute, RecordView, RecordView) {
    let called = once
        .call("A", Some("k"), TOOL, ARGS, |_| Sent::Success(RECEIPT_A.into()))
        .unwrap();
    assert!(matches!(called, Called::Confirmed { replayed: false, .. }));
    let request = once
        .request("A", Some("u"), TOOL, r#"{"order_id":7,"amount":0}"#)
        .unwrap();
    let Decision::Execute(grant) = once.begin(&request).unwrap() else {
        panic!("a fresh key executes")
    };
    once.finish("A", "u", &grant.fence, &Outcome::Ambiguous("timeout".into()))
        .unwrap();
    let k = once.inspect("A", "k").unwrap().unwrap();
    let u = once.inspect("A", "u").unwrap().unwrap();
    assert_eq!((k.state, u.state), (State::Confirmed, State::Unknown));
    (grant, k, u)
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
        once.reconcile("B", "u"),
        Err(OnceError::Engine(Error::NotFound))
    ));
    for resolution in [Resolution::Confirmed(RECEIPT_A.into()), Resolution::Absent] {
        let resolved = once.resolve("B", "u", &resolution, "operator note", true);
        assert!(
            matches!(resolved, Err(OnceError::Engine(Error::NotFound))),
            "{resolved:?}"
        );
    }
    let finished = once.finish("B", "u", &grant_u.fence, &Outcome::Success("{}".into()));
    assert!(
        matches!(finished, Err(OnceError::Engine(Error::NotFound))),
        "{finished:?}"
    );
    assert!(
        LOOKUPS.lock().unwrap().is_empty(),
        "a lookup for another scope's record"
    );

    // Supersede: A's key does not exist in B.
    let mut request = once.request("B", Some("k2"), TOOL, ARGS).unwrap();
    request.supersedes = Some("u".to_string());
    match once.begin(&request).unwrap() {
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
        matches!(&over, Called::Blocked(b) if b.reason == BlockReason::Quota),
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
    assert!(
        matches!(called, Called::Confirmed { replayed: false, .. }),
        "{called:?}"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 1);
    assert_ne!(provider_key, a_k.provider_key);
    // Same key, other args: no conflict with A's record (B's own is the one that counts).
    let called = once
        .call("B", Some("u"), TOOL, r#"{"order_id":9,"amount":0}"#, |_| {
            Sent::Success("{}".into())
        })
        .unwrap();
    assert!(
        matches!(called, Called::Confirmed { replayed: false, .. }),
        "{called:?}"
    );
    // A's fence means nothing to B's record of the same name.
    let finished = once.finish("B", "u", &grant_u.fence, &Outcome::Rejected("no".into()));
    assert!(
        matches!(finished, Err(OnceError::Engine(Error::FenceMismatch))),
        "{finished:?}"
    );

    // Derived identity: identical args in two scopes are two operations.
    let mut derived = once.policy(TOOL).unwrap();
    derived.identity = IdentityMode::Derived;
    derived.quota = None;
    let mut derived_key = Vec::new();
    for scope in ["A", "B"] {
        let mut request = once.request(scope, None, TOOL, r#"{"order_id":5,"amount":1}"#).unwrap();
        request.policy = derived.clone();
        match once.begin(&request).unwrap() {
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

fn cli(db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_once"))
        .args(args)
        .env("ONCE_DB", db)
        .env_remove("ONCE_LOG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_cli_keeps_scopes_apart() {
    static LOOKUPS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let (_, a_k, a_u) = scope_a(&open(&db, &LOOKUPS));

    // Show: B (and the default scope) see nothing of A's records.
    for scope in [vec!["--scope", "B"], vec![]] {
        for key in ["k", "u"] {
            let mut args = vec!["ledger", "show", key];
            args.extend(&scope);
            let out = cli(&db, &args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
            assert!(out.stdout.is_empty(), "{args:?} printed {}", text(&out.stdout));
            assert!(text(&out.stderr).contains("no record"), "{}", text(&out.stderr));
        }
    }
    let out = cli(&db, &["ledger", "show", "k", "--scope", "A"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(RECEIPT_A));

    // Resolve: refused in B either way, and A's unknown record is untouched.
    for how in [vec!["--confirmed", RECEIPT_A], vec!["--absent", "--force"]] {
        let mut args = vec!["ledger", "resolve", "u", "--scope", "B", "--note", "wrong scope"];
        args.extend(&how);
        let out = cli(&db, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
    let once = open(&db, &LOOKUPS);
    assert_eq!(once.inspect("A", "k").unwrap().unwrap(), a_k);
    assert_eq!(once.inspect("A", "u").unwrap().unwrap(), a_u);
    assert!(once.inspect("B", "u").unwrap().is_none());

    // The same command in the right scope does resolve it.
    let out = cli(
        &db,
        &[
            "ledger",
            "resolve",
            "u",
            "--scope",
            "A",
            "--confirmed",
            RECEIPT_A,
            "--note",
            "checked",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(once.inspect("A", "u").unwrap().unwrap().state, State::Confirmed);
}
