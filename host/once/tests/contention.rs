//! Busy is never a failure: many concurrent calls on one quota bucket or one
//! operation key, through the real component, on the default ledger (an
//! SQLite file with default options) and on PostgreSQL. Every caller gets
//! the answer its call deserves — executed, replayed or over the ceiling —
//! and none is refused with `blocked(storage)` because others were writing.
//!
//! The calls share one `Once`, as a gateway's do. Each losing compare-and-swap
//! is another caller's commit; on b58a043 a caller that lost sixteen in a row
//! was refused. Calls through one `Once` take turns at a bucket, so none of
//! them loses its update to another: on 9132aac they raced, and on a slow
//! machine one of 128 lost for its whole contention window.

mod observed_common;
#[cfg(feature = "postgres")]
mod postgres_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use observed_common::Observed;
use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::storage::{CommitError, Flush, Storage};
use once::types::{Batch, BlockReason, Ending, QuotaInput, Table};
use once::{Called, Once, Sent};

const TOOL: &str = "refund_order";

/// A `Once` on `storage` whose refunds spend at most 300.00 a day.
fn with_quota(storage: impl Storage + 'static) -> Once {
    let mut policy = once::policy_input();
    policy.quota = Some(QuotaInput {
        spend_field: "/amount".to_string(),
        ceiling: "300.00".to_string(),
        decimals: None,
        window_ms: 86_400_000,
        bucket: None,
    });
    Once::builder(storage).policy(TOOL, policy).build().unwrap()
}

/// Run `callers` threads released together; thread `i` makes call `i` (key, args). Each send counts
/// one effect, holds the provider for `hold`, and succeeds.
fn race(once: &Arc<Once>, effects: &Arc<AtomicU32>, calls: Vec<(String, String)>, hold: Duration) -> Vec<Called> {
    let barrier = Arc::new(Barrier::new(calls.len()));
    let threads: Vec<_> = calls
        .into_iter()
        .map(|(key, args)| {
            let (once, effects, barrier) = (once.clone(), effects.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                once.call("acme", Some(&key), TOOL, &args, |d| {
                    let n = effects.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(hold);
                    Sent::Success(format!(r#"{{"refund_id":"r_{n}","key":"{}"}}"#, d.provider_key))
                })
                .unwrap()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// How each call ended: (sent now, replayed, over the ceiling); anything else fails the test.
fn tally(called: &[Called]) -> (usize, usize, usize) {
    let (mut sent, mut replayed, mut over) = (0, 0, 0);
    for c in called {
        match c.ending() {
            Some(Ending::Confirmed(info)) if info.replayed => replayed += 1,
            Some(Ending::Confirmed(_)) => sent += 1,
            Some(Ending::Blocked(b)) if b.reason == BlockReason::Quota => over += 1,
            _ => panic!("a call under contention ended otherwise: {c:?}"),
        }
    }
    (sent, replayed, over)
}

/// 64 refunds of 10.00 under their own keys at once, against a 300.00 ceiling: exactly 30 are
/// sent, 34 are over the ceiling, and none is refused for the bucket being busy. The callers take
/// turns at the bucket: none loses its update to another.
fn sixty_four_calls_on_one_bucket(storage: impl Storage + 'static) {
    let lost = Arc::new(AtomicU32::new(0));
    let counted = lost.clone();
    let once = Arc::new(with_quota(Observed {
        store: storage,
        seen: move |batch: &Batch, _: Flush, result: &Result<(), CommitError>| {
            // The ledger's provider-key secret is in the quota table too, under the empty scope:
            // new instances race to create it, and that race is not a bucket's.
            let bucket = batch
                .puts
                .iter()
                .any(|p| p.table == Table::Quota && !p.scope.is_empty());
            if *result == Err(CommitError::Conflict) && bucket {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        },
    }));
    let effects = Arc::new(AtomicU32::new(0));
    let calls = (0..64)
        .map(|i| (format!("bucket-{i}"), format!(r#"{{"order_id":{i},"amount":10}}"#)))
        .collect();
    let called = race(&once, &effects, calls, Duration::ZERO);
    assert_eq!(tally(&called), (30, 0, 34));
    assert_eq!(effects.load(Ordering::SeqCst), 30, "the ceiling is never passed");
    assert_eq!(lost.load(Ordering::SeqCst), 0, "bucket updates lost to another caller");
}

/// 128 calls of one refund under one key at once: one is sent, 127 replay its receipt.
fn one_hundred_twenty_eight_calls_on_one_key(storage: impl Storage + 'static) {
    let once = Arc::new(with_quota(storage));
    let effects = Arc::new(AtomicU32::new(0));
    let args = r#"{"order_id":1234,"amount":10}"#.to_string();
    let calls = (0..128).map(|_| ("one-key".to_string(), args.clone())).collect();
    let called = race(&once, &effects, calls, Duration::from_millis(50));
    assert_eq!(tally(&called), (1, 127, 0));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let receipts: std::collections::BTreeSet<_> = called.iter().filter_map(Called::receipt).collect();
    assert_eq!(receipts.len(), 1, "every repeat replays the one receipt: {receipts:?}");
}

fn sqlite_file() -> (tempfile::TempDir, SqliteStorage) {
    let dir = tempfile::tempdir().unwrap();
    let storage = SqliteStorage::open(dir.path().join("once.db"), SqliteOptions::default()).unwrap();
    (dir, storage)
}

#[test]
fn sqlite_sixty_four_calls_on_one_bucket_are_never_refused_as_busy() {
    let (_dir, storage) = sqlite_file();
    sixty_four_calls_on_one_bucket(storage);
}

#[test]
fn sqlite_one_hundred_twenty_eight_calls_on_one_key_send_once_and_replay() {
    let (_dir, storage) = sqlite_file();
    one_hundred_twenty_eight_calls_on_one_key(storage);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_sixty_four_calls_on_one_bucket_are_never_refused_as_busy() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    sixty_four_calls_on_one_bucket(schema.open());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_one_hundred_twenty_eight_calls_on_one_key_send_once_and_replay() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    one_hundred_twenty_eight_calls_on_one_key(schema.open());
}

/// A lost update of a quota bucket on PostgreSQL waits before it answers (so the bucket's losers
/// come back spread out, not all at once to lose again), unless its batch is deferrable. A lost
/// update of an operation record alone answers at once: a lease renewal is not tried again and its
/// grant must go out before its send-by. On 9fe6a6c no loser waited, and the gateway's 128-client
/// load test saw callers lose every race for their contention window and be refused as busy.
#[cfg(feature = "postgres")]
#[test]
fn postgres_a_lost_bucket_update_backs_off_unless_deferrable() {
    use once::types::{Put, Row};
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    let store = schema.open();
    let batch = |table: Table, expected: Option<u64>, deferrable: bool| {
        let version = expected.map_or(1, |v| v + 1);
        let row = Row {
            table,
            scope: "s".into(),
            key: "row".into(),
            version,
            state: None,
            due_at: None,
            owner: None,
            body: format!("version {version}"),
        };
        Batch {
            puts: vec![Put {
                table,
                scope: row.scope.clone(),
                key: row.key.clone(),
                expected,
                row: Some(row),
            }],
            events: vec![],
            deferrable,
        }
    };
    let conflict = Err(CommitError::Conflict);
    for table in [Table::Quota, Table::Operation] {
        store.commit(&batch(table, None, false)).unwrap();
        store.commit(&batch(table, Some(1), false)).unwrap();
    }
    assert_eq!(store.pacing().backed_off, 0, "a commit that applies does not wait");

    // Another writer moved the bucket from 1 to 2: this caller read 1 and loses.
    assert_eq!(store.commit(&batch(Table::Quota, Some(1), false)), conflict);
    let paced = store.pacing();
    assert_eq!(paced.backed_off, 1, "the bucket's loser waited before it answered");
    assert!(paced.drawn > Duration::ZERO, "{paced:?}");
    assert!(paced.slept >= paced.drawn, "it slept the wait it drew: {paced:?}");

    assert_eq!(store.commit(&batch(Table::Quota, Some(1), true)), conflict);
    assert_eq!(store.pacing(), paced, "a deferrable loser answers at once");
    assert_eq!(store.commit(&batch(Table::Operation, Some(1), false)), conflict);
    assert_eq!(
        store.pacing(),
        paced,
        "a record's loser (a lease renewal) answers at once"
    );
    assert_eq!(store.commit(&batch(Table::Operation, None, false)), conflict);
    assert_eq!(
        store.pacing(),
        paced,
        "a blind claim of a key that exists answers at once"
    );
}
