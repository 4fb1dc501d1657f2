//! The Rust host reads the provider between two steps of the component
//! (configuration `reads: steps`), so other callers' steps run while a read
//! is out: what the loop brings back must be decided from the record as it
//! is then, and only a `start`'s read goes back with its call.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{Ending, Evidence, Repeat};
use once::{Called, Clock, Dispatch, Dispatcher, ManualClock, Once, Sent};

const TOOL: &str = "refund_order";
const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;

fn sqlite(path: &Path) -> SqliteStorage {
    SqliteStorage::open(path, SqliteOptions::default()).unwrap()
}

/// A handle whose read is out while another host's settling round reads first, finds nothing,
/// sends the owed attempt, and the provider refuses it; the handle's own read then finds nothing
/// too. `other_sends` counts the other host's sends.
fn racing(db: &Path, clock: &ManualClock, other_sends: &Arc<AtomicU32>) -> Arc<Once> {
    let other_clock = clock.clone();
    let other = Once::builder(sqlite(db))
        .clock(clock.clone())
        .provider(move |_: &str, _: &str, _: &str| Evidence::Absent(other_clock.now()))
        .wait_up_to(Duration::ZERO)
        .build()
        .unwrap();
    let reads = Arc::new(Mutex::new(0u32));
    let (read_clock, counted) = (clock.clone(), other_sends.clone());
    let once = Once::builder(sqlite(db))
        .clock(clock.clone())
        .provider(move |_: &str, _: &str, _: &str| {
            let mut reads = reads.lock().unwrap();
            *reads += 1;
            assert_eq!(*reads, 1, "one read: the operation is settled after it");
            // While this read is out: time passes beyond max_in_flight, and the other host settles.
            read_clock.advance(5 * 60 * 1_000);
            let settled = other
                .settle(10, |_| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Sent::Rejected("declined".into())
                })
                .unwrap();
            assert_eq!(settled.sent.len(), 1, "{settled:?}");
            Evidence::Absent(read_clock.now())
        })
        .wait_up_to(Duration::ZERO)
        .build()
        .unwrap();
    Arc::new(once)
}

/// The call's answer after the race: refused, the same call retries, and it sent once.
#[track_caller]
fn refused_after_one_send(called: &Called, sends: u32, other_sends: &AtomicU32) {
    assert_eq!(other_sends.load(Ordering::SeqCst), 1);
    assert_eq!(sends, 1, "the call sent again: {called:?}");
    assert!(matches!(called.ending(), Some(Ending::Rejected(_))), "{called:?}");
    assert_eq!(called.account().map(|a| a.repeat), Some(Repeat::Retries));
}

/// A call's reply is lost; while its loop reads the provider, another host's settling round reads
/// first, finds nothing, sends the owed attempt, and the provider refuses it. The call's own read
/// then comes back: the operation was refused, and the call says so. Bringing the read back with
/// the call (as if it answered a `start`) would have begun the operation again and sent a third
/// attempt of a refused refund.
#[test]
fn a_read_that_comes_back_after_the_record_moved_on_is_answered_from_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let other_sends = Arc::new(AtomicU32::new(0));
    let once = racing(&dir.path().join("once.db"), &clock, &other_sends);
    let sends = AtomicU32::new(0);
    let called = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |_| {
            sends.fetch_add(1, Ordering::SeqCst);
            Sent::Ambiguous("connection reset".into())
        })
        .unwrap();
    refused_after_one_send(&called, sends.load(Ordering::SeqCst), &other_sends);
}

/// Sends, and loses every reply.
struct LosesReplies(u32);

impl Dispatcher for LosesReplies {
    async fn dispatch(&mut self, _: &Dispatch<'_>) -> Sent {
        self.0 += 1;
        Sent::Ambiguous("connection reset".into())
    }
}

/// The same race on the async loop (its reads on the blocking pool, through the `Provider`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_read_that_comes_back_after_the_record_moved_on_is_answered_from_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let other_sends = Arc::new(AtomicU32::new(0));
    let once = racing(&dir.path().join("once.db"), &clock, &other_sends);
    let mut sender = LosesReplies(0);
    let call = Once::call_of("t1", Some("refund-1"), TOOL, ARGS);
    let called = once.call_async(&call, &mut sender).await.unwrap();
    refused_after_one_send(&called, sender.0, &other_sends);
}
