//! The async call loop (`Once::call_async`, feature `tokio`) end to end: a real component, real
//! SQLite files, tokio's runtime. It must answer as the blocking loop does, hold no thread while it
//! waits, stop a sender at its deadline, and keep exactly once across a restart and under contention.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{Call, Effect, Ending, Evidence, Repeat, ReplayVia, Route};
use once::{Called, Dispatch, Dispatcher, ManualClock, Once, Sent, policy_input};

const TOOL: &str = "refund_order";
const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;
const RECEIPT: &str = r#"{"refund_id":"r_1"}"#;

fn sqlite(path: &Path) -> SqliteStorage {
    SqliteStorage::open(path, SqliteOptions::default()).unwrap()
}

fn call(key: &str, tool: &str) -> Call {
    Once::call_of("t1", Some(key), tool, ARGS)
}

/// Answers every dispatch with `answer` after `delay`, counting the sends and what each was given.
struct Provider {
    sends: Arc<AtomicU32>,
    seen: Vec<(bool, String, u32)>,
    delay: Duration,
    answer: Sent,
}

impl Provider {
    fn new(sends: &Arc<AtomicU32>, delay: Duration, answer: Sent) -> Provider {
        Provider {
            sends: sends.clone(),
            seen: Vec::new(),
            delay,
            answer,
        }
    }
}

impl Dispatcher for Provider {
    async fn dispatch(&mut self, d: &Dispatch<'_>) -> Sent {
        self.sends.fetch_add(1, Ordering::SeqCst);
        self.seen.push((d.direct, d.tool.to_string(), d.attempt));
        tokio::time::sleep(self.delay).await;
        self.answer.clone()
    }
}

/// Sends, then never hears back; says when its future is dropped. With the ledger's `clock`, it
/// checks the deadlines it is handed: `send_by` and the answer's, on this host's clock, never late.
struct Hangs {
    sends: Arc<AtomicU32>,
    stopped: Arc<AtomicBool>,
    clock: Option<ManualClock>,
}

/// Marks its sender stopped when the sender's future is dropped.
struct Stopped(Arc<AtomicBool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Dispatcher for Hangs {
    async fn dispatch(&mut self, d: &Dispatch<'_>) -> Sent {
        let (Some(send_before), Some(answer_by)) = (d.send_before, d.answer_by) else {
            panic!("a granted dispatch has its deadlines: {d:?}")
        };
        assert_eq!(
            answer_by - send_before,
            d.timeout,
            "the answer is due a timeout after send-by"
        );
        if let Some(clock) = &self.clock {
            use once::Clock;
            let left = Duration::from_millis(d.send_by - clock.now());
            assert!(
                send_before <= std::time::Instant::now() + left,
                "send-by handed over late"
            );
        }
        self.sends.fetch_add(1, Ordering::SeqCst);
        let _stopped = Stopped(self.stopped.clone());
        std::future::pending::<()>().await;
        Sent::Success("{}".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_loop_answers_as_the_blocking_one() {
    let dir = tempfile::tempdir().unwrap();
    let direct = once::types::PolicyInput {
        route: Some(Route::Direct),
        ..policy_input()
    };
    let once = Arc::new(
        Once::builder(sqlite(&dir.path().join("once.db")))
            .tool("search", direct, None)
            .build()
            .unwrap(),
    );
    let sends = Arc::new(AtomicU32::new(0));
    let mut provider = Provider::new(&sends, Duration::ZERO, Sent::Success(RECEIPT.into()));
    let first = once.call_async(&call("refund-1", TOOL), &mut provider).await.unwrap();
    assert_eq!(
        first.confirmed().map(|c| c.receipt.as_str()),
        Some(RECEIPT),
        "{first:?}"
    );
    let again = once.call_async(&call("refund-1", TOOL), &mut provider).await.unwrap();
    let replayed = again.confirmed().expect("a replay");
    assert_eq!((replayed.replayed, replayed.via), (true, Some(ReplayVia::Key)));
    // The blocking loop over the same ledger sees the same record.
    let blocking = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |_| panic!("sent twice"))
        .unwrap();
    assert_eq!(blocking, again);
    let direct = once.call_async(&call("q", "search"), &mut provider).await.unwrap();
    assert!(matches!(direct, Called::Direct(Sent::Success(_))), "{direct:?}");
    assert_eq!(
        provider.seen,
        [(false, TOOL.to_string(), 1), (true, "search".to_string(), 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_past_its_deadline_is_stopped_and_the_reply_is_lost_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let clock = ManualClock::new(1_000_000);
    let fast = once::types::PolicyInput {
        dispatch_timeout_ms: Some(100),
        ..policy_input()
    };
    let at_provider = Arc::new(Mutex::new(None::<String>));
    let build = |seen: Arc<Mutex<Option<String>>>| {
        Arc::new(
            Once::builder(sqlite(&db))
                .clock(clock.clone())
                .wait_up_to(Duration::ZERO)
                .policy(TOOL, fast.clone())
                .provider(move |_: &str, _: &str, _: &str| match seen.lock().unwrap().clone() {
                    Some(receipt) => Evidence::Confirmed(receipt),
                    None => Evidence::Unknown("the provider cannot be read yet".into()),
                })
                .build()
                .unwrap(),
        )
    };
    let sends = Arc::new(AtomicU32::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    let next_read = {
        let once = build(at_provider.clone());
        let mut hangs = Hangs {
            sends: sends.clone(),
            stopped: stopped.clone(),
            clock: Some(clock.clone()),
        };
        // A loop that did not stop it would wait for ever: a minute is far past any deadline here.
        let began = std::time::Instant::now();
        let lost = tokio::time::timeout(
            Duration::from_secs(60),
            once.call_async(&call("refund-1", TOOL), &mut hangs),
        )
        .await
        .expect("the sender was not stopped at its deadline")
        .unwrap();
        // Stopped, not waited on for ever; and its attempt is unknown, never failed.
        assert!(stopped.load(Ordering::SeqCst), "the sender was not stopped");
        assert!(
            began.elapsed() >= Duration::from_millis(100),
            "stopped before its timeout"
        );
        let Some(Ending::Unknown(unknown)) = lost.ending() else {
            panic!("{lost:?}")
        };
        assert!(unknown.reason.contains("the sender was stopped"), "{unknown:?}");
        assert_eq!(
            (lost.effect(), lost.account().unwrap().repeat),
            (Effect::Unknown, Repeat::Waits)
        );
        unknown.next_read.expect("the tool has a lookup")
    };
    // The stopped request did reach the provider. A new process, a new handle: the retry reads it
    // and replays it; nothing is sent again.
    *at_provider.lock().unwrap() = Some(RECEIPT.into());
    clock.set(next_read);
    let once = build(at_provider.clone());
    let mut provider = Provider::new(&sends, Duration::ZERO, Sent::Success("{}".into()));
    let settled = once.call_async(&call("refund-1", TOOL), &mut provider).await.unwrap();
    let confirmed = settled.confirmed().expect("confirmed by the read");
    assert_eq!(
        (confirmed.receipt.as_str(), confirmed.via),
        (RECEIPT, Some(ReplayVia::Provider))
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_async_callers_on_one_key_send_once_and_share_the_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap());
    let sends = Arc::new(AtomicU32::new(0));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (once, sends) = (once.clone(), sends.clone());
            tokio::spawn(async move {
                let mut provider = Provider::new(&sends, Duration::from_millis(200), Sent::Success(RECEIPT.into()));
                once.call_async(&call("refund-1", TOOL), &mut provider).await.unwrap()
            })
        })
        .collect();
    for caller in callers {
        let called = caller.await.unwrap();
        assert_eq!(
            called.confirmed().map(|c| c.receipt.as_str()),
            Some(RECEIPT),
            "{called:?}"
        );
    }
    assert_eq!(sends.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_a_lost_reply_that_settle_async_resolves_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let clock = ManualClock::new(1_000_000);
    let build = || {
        Arc::new(
            Once::builder(sqlite(&db))
                .clock(clock.clone())
                .wait_up_to(Duration::ZERO)
                .provider(|_: &str, _: &str, _: &str| Evidence::Absent(u64::MAX / 2))
                .build()
                .unwrap(),
        )
    };
    let sends = Arc::new(AtomicU32::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    {
        // The caller goes away mid-send: its future is dropped, the attempt never reported.
        let once = build();
        let (s, d) = (sends.clone(), stopped.clone());
        let caller = tokio::spawn(async move {
            let mut hangs = Hangs {
                sends: s,
                stopped: d,
                clock: None,
            };
            once.call_async(&call("refund-1", TOOL), &mut hangs).await
        });
        while sends.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        assert!(stopped.load(Ordering::SeqCst));
    }
    let once = build();
    let policy = once.policy(TOOL);
    // Within the lease nothing is owed; past it and past max-in-flight, the read proves absence and
    // the owed dispatch is sent once, with attempt 2.
    let mut provider = Provider::new(&sends, Duration::ZERO, Sent::Success(RECEIPT.into()));
    assert!(once.settle_async(10, &mut provider).await.unwrap().sent.is_empty());
    clock.advance(policy.lease_ms + policy.max_in_flight_ms + 1);
    let mut sent = Vec::new();
    for _ in 0..3 {
        sent.extend(once.settle_async(10, &mut provider).await.unwrap().sent);
        if !sent.is_empty() {
            break;
        }
        clock.advance(policy.reconcile_interval_ms);
    }
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].confirmed().map(|c| c.receipt.as_str()), Some(RECEIPT));
    assert_eq!(provider.seen, [(false, TOOL.to_string(), 2)]);
    assert!(once.settle_async(10, &mut provider).await.unwrap().sent.is_empty());
    let again = once.call_async(&call("refund-1", TOOL), &mut provider).await.unwrap();
    assert_eq!(again.confirmed().map(|c| c.replayed), Some(true));
    assert_eq!(sends.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_goes_away_is_let_go_at_the_next_wait_and_keeps_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap());
    let sends = Arc::new(AtomicU32::new(0));
    // Nothing leaves (the provider is down): the engine waits before the next attempt, and the caller
    // is gone by then.
    let mut down = Provider::new(&sends, Duration::ZERO, Sent::NotSent);
    let gone = AtomicBool::new(false);
    let keep_going = || !gone.swap(true, Ordering::SeqCst);
    let called = once
        .call_async_while(&call("refund-1", TOOL), &keep_going, &mut down)
        .await
        .unwrap();
    let account = called.account().expect("the wait's account");
    assert_eq!(
        (called.effect(), account.repeat),
        (Effect::None, Repeat::Retries),
        "{called:?}"
    );
    assert_eq!(sends.load(Ordering::SeqCst), 1);
    // The caller's retry is the operation's next attempt.
    let mut up = Provider::new(&sends, Duration::ZERO, Sent::Success(RECEIPT.into()));
    let mut retried = once.call_async(&call("refund-1", TOOL), &mut up).await.unwrap();
    for _ in 0..100 {
        if retried.confirmed().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        retried = once.call_async(&call("refund-1", TOOL), &mut up).await.unwrap();
    }
    assert_eq!(retried.confirmed().map(|c| c.attempt), Some(Some(2)), "{retried:?}");
}

/// A ledger clock whose every read stalls (a slow database query) and then answers the time it read
/// before the stall: the ledger clock alone says the send window is still open.
struct Stalls {
    clock: ManualClock,
    stall: Duration,
}

impl once::Clock for Stalls {
    fn now(&self) -> u64 {
        let read = once::Clock::now(&self.clock);
        std::thread::sleep(self.stall);
        read
    }
}

/// Send-by is checked on this host's clock too, just before the hand-over, by both loops: a ledger
/// clock read that stalls past send-by (here the default lease leaves 200 ms between the grant and
/// send-by; each read takes 300 ms) leaves the attempt not sent, never sent late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_clock_that_stalls_past_send_by_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(
        Once::builder(sqlite(&dir.path().join("once.db")))
            .clock(Stalls {
                clock: ManualClock::new(1_000_000),
                stall: Duration::from_millis(300),
            })
            .wait_up_to(Duration::ZERO)
            .policy(
                TOOL,
                once::types::PolicyInput {
                    dispatch_timeout_ms: Some(1_000),
                    ..policy_input()
                },
            )
            .build()
            .unwrap(),
    );
    assert_eq!(
        once.plan(TOOL).policy.lease_ms,
        1_200,
        "send-by is 200 ms after the grant"
    );
    let sends = Arc::new(AtomicU32::new(0));
    let mut provider = Provider::new(&sends, Duration::ZERO, Sent::Success(RECEIPT.into()));
    let not_sent = |called: &Called| matches!(called.ending(), Some(Ending::NotSent(n)) if n.attempts == 1);
    let by_async = once.call_async(&call("async", TOOL), &mut provider).await.unwrap();
    assert!(not_sent(&by_async), "{by_async:?}");
    let blocking = once.clone();
    let by_blocking = tokio::task::spawn_blocking(move || {
        blocking.call("t1", Some("blocking"), TOOL, ARGS, |_| Sent::Success(RECEIPT.into()))
    })
    .await
    .unwrap()
    .unwrap();
    assert!(not_sent(&by_blocking), "{by_blocking:?}");
    assert_eq!(sends.load(Ordering::SeqCst), 0);
}

/// The call's sender: its first attempt's reply is lost; its read waits at `gate` (telling
/// `reading` it got there) and finds nothing; its next attempt succeeds.
struct LostThenAbsent {
    sends: Arc<AtomicU32>,
    reading: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Notify>,
}

impl Dispatcher for LostThenAbsent {
    async fn dispatch(&mut self, _: &Dispatch<'_>) -> Sent {
        match self.sends.fetch_add(1, Ordering::SeqCst) {
            0 => Sent::Ambiguous("the connection dropped before the reply".into()),
            _ => Sent::Success(RECEIPT.into()),
        }
    }

    async fn read(&mut self, _: &once::types::Reading) -> Option<Evidence> {
        self.reading.notify_one();
        self.gate.notified().await;
        Some(Evidence::Absent(u64::MAX / 2))
    }
}

/// The call "refund-1" with a [`LostThenAbsent`] sender, to spawn.
fn lost_then_absent(
    once: &Arc<Once>,
    sends: &Arc<AtomicU32>,
    reading: &Arc<tokio::sync::Notify>,
    gate: &Arc<tokio::sync::Notify>,
) -> impl Future<Output = Result<Called, once::OnceError>> + Send + 'static {
    let once = once.clone();
    let mut sender = LostThenAbsent {
        sends: sends.clone(),
        reading: reading.clone(),
        gate: gate.clone(),
    };
    async move { once.call_async(&call("refund-1", TOOL), &mut sender).await }
}

/// A handle whose provider is read by its dispatchers, for a tool read as soon as its reply is lost.
fn read_by_its_dispatcher(dir: &Path) -> Arc<Once> {
    Arc::new(
        Once::builder(sqlite(&dir.join("once.db")))
            .reads_in_dispatcher()
            .policy(
                TOOL,
                once::types::PolicyInput {
                    lookup: Some(true),
                    max_in_flight_ms: Some(1),
                    ..policy_input()
                },
            )
            .build()
            .unwrap(),
    )
}

/// A background round's sender: whatever it is asked to read is absent, and it counts what it does.
#[derive(Default)]
struct Background {
    sends: u32,
    reads: u32,
}

impl Dispatcher for Background {
    async fn dispatch(&mut self, _: &Dispatch<'_>) -> Sent {
        self.sends += 1;
        Sent::Success(RECEIPT.into())
    }

    async fn read(&mut self, _: &once::types::Reading) -> Option<Evidence> {
        self.reads += 1;
        Some(Evidence::Absent(u64::MAX / 2))
    }
}

/// A settle round beside a call whose reply was lost (a gateway's worker beside a client's call)
/// leaves the operation to the call: the call reads, sends attempt 2 and answers that it sent it.
/// The round used to read and send it whenever it came first (both wake when the read comes due),
/// and the caller, who made one call, was told its operation had already run: a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_round_leaves_a_call_its_own_lost_reply() {
    let dir = tempfile::tempdir().unwrap();
    let once = read_by_its_dispatcher(dir.path());
    let sends = Arc::new(AtomicU32::new(0));
    let (reading, gate) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let caller = tokio::spawn(lost_then_absent(&once, &sends, &reading, &gate));
    reading.notified().await;
    // The call is reading: past max-in-flight, the round would prove the same absence and send.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut background = Background::default();
    let round = once.settle_async(10, &mut background).await.unwrap();
    assert_eq!(
        round.sweep.reads,
        [("t1".to_string(), "refund-1".to_string())],
        "the round found the call's read due: {round:?}"
    );
    assert!(round.sent.is_empty() && round.read.is_empty(), "{round:?}");
    assert_eq!((background.reads, background.sends), (0, 0));
    gate.notify_one();
    let called = caller.await.unwrap().unwrap();
    let confirmed = called.confirmed().expect("sent and confirmed");
    assert_eq!(
        (confirmed.replayed, confirmed.attempt),
        (false, Some(2)),
        "the call sent its operation's next attempt: {called:?}"
    );
    assert_eq!(sends.load(Ordering::SeqCst), 2);
    // Once the call is over, a round takes what is due again: nothing is, and nothing is sent.
    let after = once.settle_async(10, &mut background).await.unwrap();
    assert!(after.sent.is_empty(), "{after:?}");
    assert_eq!(background.sends, 0);
}

/// A call that goes away while it drives its operation (its future dropped mid-read) leaves it to the
/// next round of the same handle, which reads and sends it: nothing stays held by a call that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_goes_away_leaves_its_operation_to_the_next_round() {
    let dir = tempfile::tempdir().unwrap();
    let once = read_by_its_dispatcher(dir.path());
    let sends = Arc::new(AtomicU32::new(0));
    let reading = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let caller = tokio::spawn(lost_then_absent(&once, &sends, &reading, &gate));
    reading.notified().await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut background = Background::default();
    let round = once.settle_async(10, &mut background).await.unwrap();
    assert_eq!(round.sent.len(), 1, "{round:?}");
    assert_eq!(round.sent[0].confirmed().map(|c| c.attempt), Some(Some(2)), "{round:?}");
    assert_eq!((background.reads, background.sends), (1, 1));
    assert_eq!(sends.load(Ordering::SeqCst), 1, "the call's one attempt, lost");
}
