//! Attempts that were not sent back off, and a caller that goes away spends
//! one attempt, not the key (issue "Under load and attack", item 3). b58a043
//! re-granted at once after "not sent": a hung-up client's call was marked
//! not-sent three times within ~100 ms and every retry with its key answered
//! "not sent, attempts exhausted"; a down upstream spent a key in ~200 ms.
//! Real guest, real wasmtime, a real SQLite file, two handles for a restart.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use once::types::{Ending, PolicyInput, Repeat};
use once::{Called, Once, Sent};

const INTERVAL_MS: u64 = 200;

fn handle(path: &std::path::Path) -> Once {
    let policy = PolicyInput {
        reconcile_interval_ms: Some(INTERVAL_MS),
        ..once::policy_input()
    };
    Once::sqlite(path)
        .unwrap()
        .policy("refund", policy)
        .wait_up_to(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn account(called: Called) -> once::types::Account {
    match called {
        Called::Done(account) => account,
        other => panic!("expected an account, got {other:?}"),
    }
}

#[test]
fn a_caller_that_hangs_up_spends_one_attempt_and_its_retry_after_a_restart_sends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let gone = Cell::new(false);
    let sends = Cell::new(0);
    let first = handle(&path);
    let called = first
        .call_while(
            &Once::call_of("s", Some("refund-1"), "refund", r#"{"order":1,"amount":"10.00"}"#),
            || !gone.get(),
            |_| {
                // The client hung up before the request left: nothing was sent.
                sends.set(sends.get() + 1);
                gone.set(true);
                Sent::NotSent
            },
        )
        .unwrap();
    let a = account(called);
    assert_eq!(
        sends.get(),
        1,
        "the call stopped at the back-off once its caller was gone"
    );
    assert!(matches!(a.ending, Ending::NotSent(ref n) if n.attempts == 1), "{a:?}");
    assert_eq!(a.repeat, Repeat::Retries, "the same call again tries again");
    drop(first);

    // The client's retry, through a new handle on the same ledger: it is sent and confirmed.
    let second = handle(&path);
    let called = second
        .call(
            "s",
            Some("refund-1"),
            "refund",
            r#"{"order":1,"amount":"10.00"}"#,
            |d| {
                assert_eq!(d.attempt, 2);
                Sent::Success(r#"{"refund_id":"r-1"}"#.into())
            },
        )
        .unwrap();
    assert_eq!(called.receipt(), Some(r#"{"refund_id":"r-1"}"#));
}

#[test]
fn a_down_upstream_is_retried_with_a_growing_back_off_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let once = handle(&dir.path().join("ledger.db"));
    let sent_at = RefCell::new(Vec::new());
    let called = once
        .call(
            "s",
            Some("refund-2"),
            "refund",
            r#"{"order":2,"amount":"10.00"}"#,
            |_| {
                sent_at.borrow_mut().push(once.now());
                Sent::NotSent
            },
        )
        .unwrap();
    let a = account(called);
    assert!(matches!(a.ending, Ending::NotSent(ref n) if n.attempts == 3), "{a:?}");
    assert_eq!(a.repeat, Repeat::Refused);
    let at = sent_at.into_inner();
    assert_eq!(at.len(), 3, "the attempt budget, each attempt once");
    // Ledger-clock gaps: at least the interval, then twice it (lower bounds only).
    assert!(at[1] - at[0] >= INTERVAL_MS, "{at:?}");
    assert!(at[2] - at[1] >= 2 * INTERVAL_MS, "{at:?}");
}
