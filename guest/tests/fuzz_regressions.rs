//! Inputs found by the fuzz targets (`fuzz/`), kept as plain tests.
//!
//! `machine` 2026-11-30, `crash-efcb63c0…`: a key confirmed, pruned after
//! its retention, its tombstone removed after the tombstone's retention
//! (fifteen weekly clock jumps), then begun again. The engine answered
//! `execute` attempt 1: right by DESIGN.md (the key is forgotten, a new
//! operation continues the old audit trail). The finding was in the test
//! model, which assumed one record per key for ever (attempts strictly
//! increasing across records); the fuzz model and this test now pin the
//! engine's behaviour down.

use once_guest::engine::BeginRequest;
use once_guest::engine::{begin, finish, inspect, prune, reconcile, sweep};
use once_guest::host::Host;
use once_guest::policy::Policy;
use once_guest::policy::Quota;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{Decision, Error, FinishAck, Grant, Outcome, State, Table};

const SECOND: u64 = 1_000;
const DAY: u64 = 24 * 3_600 * SECOND;

fn policy() -> Policy {
    let mut p = default_policy();
    p.attempt_budget = 1;
    p.quota = Some(Quota {
        spend_field: "/amount".to_string(),
        ceiling: "10.00".to_string(),
        decimals: 2,
        window_ms: DAY,
        bucket: None,
    });
    p
}

fn request() -> BeginRequest {
    BeginRequest {
        scope: "a".to_string(),
        keys: vec![("api".to_string(), "k0".to_string())],
        tool: "pay".to_string(),
        args: r#"{"amount":3.00,"to":"acct-0"}"#.to_string(),
        policy: policy(),
        descriptor: None,
        supersedes: None,
        acknowledge_confirmed: false,
    }
}

fn execute(h: &MemoryHost) -> Grant {
    match begin(h, request()).unwrap() {
        Decision::Execute(e) => e,
        other => panic!("expected execute, got {other:?}"),
    }
}

#[test]
fn a_key_forgotten_after_its_tombstone_begins_again_as_a_new_operation() {
    let h = MemoryHost::new();
    let first = execute(&h);
    assert!(matches!(begin(&h, request()).unwrap(), Decision::InFlight(_)));
    h.advance(DAY);
    let ack = finish(
        &h,
        "a",
        "k0",
        &first.fence,
        Outcome::Success(r#"{"holder_receipt":0}"#.into()),
    );
    assert_eq!(ack.unwrap(), FinishAck::Recorded(State::Confirmed));
    assert!(matches!(reconcile(&h, "a", "k0").unwrap(), Decision::Replay(_)));
    sweep(&h, 16).unwrap();
    h.advance(900_000);
    assert_eq!(reconcile(&h, "a", "k1"), Err(Error::NotFound));
    let old_version = inspect(&h, "a", "k0").unwrap().unwrap().version;

    // Weekly jumps: the record is pruned to a tombstone, then the tombstone goes.
    let (mut pruned, mut removed) = (0, 0);
    for _ in 0..15 {
        h.advance(7 * DAY + 1);
        let report = prune(&h, 16).unwrap();
        pruned += report.pruned;
        removed += report.tombstones_removed;
    }
    assert_eq!((pruned, removed), (1, 1));
    assert!(inspect(&h, "a", "k0").unwrap().is_none());
    assert!(h.get(Table::Tombstone, "a", "k0").unwrap().is_none());

    // A new operation: attempt 1 again, a new fence, and a provider key of its own, so the
    // provider's dedupe (if it still remembers the old key) cannot answer it with the old effect.
    let again = execute(&h);
    assert_eq!(again.attempt, 1);
    assert_ne!(again.fence, first.fence);
    assert_ne!(again.provider_key, first.provider_key);
    // The forgotten record's fence means nothing to the new one.
    let stale = finish(&h, "a", "k0", &first.fence, Outcome::Rejected("late".into()));
    assert_eq!(stale, Err(Error::FenceMismatch));
    // Its audit trail continues the old one, whole: versions 1..=version, never rewritten.
    let view = inspect(&h, "a", "k0").unwrap().unwrap();
    assert_eq!(view.state, State::InFlight);
    assert!(
        view.version > old_version + 1,
        "the new record continues after the pruning event"
    );
    let versions: Vec<u64> = view.audit.iter().map(|e| e.version).collect();
    assert_eq!(versions, (1..=view.version).collect::<Vec<_>>());
}
