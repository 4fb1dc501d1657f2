//! Shared by the scope-isolation tests of the library
//! (`host/once/tests/hardening_isolation.rs`) and of the CLI
//! (`host/cli/tests/hardening_isolation.rs`, which includes this file by path):
//! a ledger and scope A's records.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Mutex;

use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{Decision, Evidence, Grant, Outcome, QuotaInput, RecordView, State};
use once::{Once, Sent};

pub const TOOL: &str = "refund_order";
pub const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;
pub const RECEIPT_A: &str = r#"{"refund_id":"r_a"}"#;

/// A ledger whose provider records every lookup it is asked.
pub fn open(path: &Path, lookups: &'static Mutex<Vec<String>>) -> Once {
    let mut policy = once::policy_input();
    policy.quota = Some(QuotaInput {
        spend_field: "/amount".to_string(),
        ceiling: "200".to_string(),
        decimals: Some(0),
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
pub fn scope_a(once: &Once) -> (Grant, RecordView, RecordView) {
    let called = once
        .call("A", Some("k"), TOOL, ARGS, |_| Sent::Success(RECEIPT_A.into()))
        .unwrap();
    assert!(called.confirmed().is_some_and(|c| !c.replayed), "{called:?}");
    let call = Once::call_of("A", Some("u"), TOOL, r#"{"order_id":7,"amount":0}"#);
    let Decision::Execute(grant) = once.transitions().begin(&call).unwrap() else {
        panic!("a fresh key executes")
    };
    once.transitions()
        .finish("A", "u", &grant.fence, &Outcome::Ambiguous("timeout".into()))
        .unwrap();
    let k = once.inspect("A", "k").unwrap().unwrap();
    let u = once.inspect("A", "u").unwrap().unwrap();
    assert_eq!((k.state, u.state), (State::Confirmed, State::Unknown));
    (grant, k, u)
}
