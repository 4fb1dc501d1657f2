//! Each fault against each mode, measured from the ledger file.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{TIMEOUT, Trial};
use refund::{CallError, Client, Fault, Mode, ORDER_ID, ProxyOptions};

fn assert_ambiguous(result: Result<refund::RefundReceipt, CallError>) -> String {
    match result {
        Err(CallError::Ambiguous(why)) => why,
        other => panic!("expected ambiguous, got {other:?}"),
    }
}

#[test]
fn no_fault_passes_through() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::None);
        let receipt = t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1").unwrap();
        assert_eq!(
            (receipt.order_id, receipt.amount, receipt.idempotency_key.as_str()),
            (ORDER_ID, 200.0, "k1")
        );
        assert!(
            receipt
                .raw
                .starts_with(r#"{"refund_id":1,"order_id":1234,"amount":200.0,"idempotency_key":"k1""#)
        );
        let rows = t.refunds();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].id, rows[0].amount_cents, rows[0].created_at_ms),
            (1, 20_000, receipt.created_at)
        );
        assert!(t.proxy.wait_dispatched(Duration::ZERO));
        let order = t.client(TIMEOUT).get_order(ORDER_ID).unwrap();
        assert_eq!((order.total, order.refunded), (500.0, 200.0));
        let stats = t.proxy.stats();
        assert_eq!(
            (stats.refund_posts, stats.order_reads, stats.lookups, stats.other),
            (1, 1, 0, 0)
        );
    }
}

#[test]
fn pre_effect_disconnect_has_no_effect() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::PreEffectDisconnect);
        assert_ambiguous(t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1"));
        assert_eq!(t.count(), 0, "{mode}");
        assert!(!t.proxy.wait_dispatched(Duration::from_millis(10)));
        // Only the first POST is faulted: a retry goes through.
        t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1").unwrap();
        assert_eq!(t.count(), 1);
        assert_eq!(t.proxy.stats().refund_posts, 2);
    }
}

#[test]
fn post_commit_disconnect_commits_then_loses_the_reply() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::PostCommitDisconnect);
        assert_ambiguous(t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1"));
        assert!(t.proxy.wait_dispatched(Duration::ZERO));
        assert_eq!(t.count(), 1, "{mode}");
        // The study's "always retry": a blind retry with the same key.
        let retry = t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1").unwrap();
        match mode {
            Mode::Unsafe => {
                assert_eq!(t.count(), 2, "unsafe mode must double the refund");
                assert_eq!(t.ledger().refunded_cents(ORDER_ID).unwrap(), 40_000);
                assert_eq!(retry.refund_id, 2);
            }
            Mode::Idempotent => {
                assert_eq!(t.count(), 1, "idempotent mode must replay");
                assert_eq!(retry.refund_id, 1);
                assert_eq!(retry.created_at, t.refunds()[0].created_at_ms);
            }
        }
    }
}

#[test]
fn reject_502_has_no_effect_but_is_ambiguous() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::Reject502);
        let why = assert_ambiguous(t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1"));
        assert!(why.contains("502") && why.contains("bad gateway"), "{why}");
        assert_eq!(t.count(), 0);
        assert!(!t.proxy.wait_dispatched(Duration::from_millis(10)));
    }
}

#[test]
fn late_reply_times_out_after_commit() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::LateReply);
        let started = Instant::now();
        let why = assert_ambiguous(t.client(Duration::from_millis(150)).refund_order(ORDER_ID, 200.0, "k1"));
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(350),
            "client timeout is the whole call: {took:?}"
        );
        assert!(why.to_lowercase().contains("timeout"), "{why}");
        assert_eq!(t.count(), 1, "{mode}");
        // The delayed write lands on a socket the client closed; the proxy must shrug and keep serving.
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(t.client(TIMEOUT).get_order(ORDER_ID).unwrap().refunded, 200.0);
    }
}

#[test]
fn late_reply_arrives_for_a_patient_client() {
    let options = ProxyOptions {
        late_reply_delay: Duration::from_millis(100),
    };
    let t = Trial::with_options(Mode::Idempotent, Fault::LateReply, options);
    let started = Instant::now();
    let receipt = t.client(TIMEOUT).refund_order(ORDER_ID, 200.0, "k1").unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(receipt.refund_id, 1);
}

#[test]
fn dropping_the_proxy_cuts_a_late_reply_short() {
    let t = Trial::new(Mode::Unsafe, Fault::LateReply);
    let client = t.client(TIMEOUT);
    let call = std::thread::spawn(move || client.refund_order(ORDER_ID, 200.0, "k1"));
    assert!(t.proxy.wait_dispatched(TIMEOUT));
    let started = Instant::now();
    let Trial { proxy, service, dir } = t;
    drop(proxy);
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "drop waited out the delay"
    );
    assert_ambiguous(call.join().unwrap());
    drop((service, dir));
}

#[test]
fn crash_after_dispatch_holds_the_client_until_release() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::CrashAfterDispatch);
        let client = t.client(Duration::from_secs(5));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(client.refund_order(ORDER_ID, 200.0, "k1")));
        assert!(t.proxy.wait_dispatched(TIMEOUT));
        assert_eq!(t.count(), 1, "{mode}");
        // Held: the agent would be SIGKILLed here, with the effect committed and no reply.
        assert!(
            rx.recv_timeout(Duration::from_millis(150)).is_err(),
            "client got an answer while held"
        );
        // Other traffic still flows while one worker holds the connection.
        assert_eq!(t.client(TIMEOUT).get_order(ORDER_ID).unwrap().refunded, 200.0);
        t.proxy.release();
        assert_ambiguous(rx.recv_timeout(TIMEOUT).unwrap());
    }
}

#[test]
fn crash_after_dispatch_is_released_by_drop() {
    let t = Trial::new(Mode::Idempotent, Fault::CrashAfterDispatch);
    let client = t.client(Duration::from_secs(5));
    let call = std::thread::spawn(move || client.refund_order(ORDER_ID, 200.0, "k1"));
    assert!(t.proxy.wait_dispatched(TIMEOUT));
    let Trial { proxy, service, dir } = t;
    let started = Instant::now();
    drop(proxy);
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_ambiguous(call.join().unwrap());
    drop((service, dir));
}

#[test]
fn stale_read_serves_one_old_snapshot() {
    for mode in Mode::ALL {
        let t = Trial::new(mode, Fault::StaleRead);
        let client = t.client(TIMEOUT);
        // A read before the write is not the one that goes stale.
        assert_eq!(client.get_order(ORDER_ID).unwrap().refunded, 0.0);
        assert_ambiguous(client.refund_order(ORDER_ID, 200.0, "k1"));
        assert_eq!(t.count(), 1);
        let created = t.refunds()[0].created_at_ms;

        let stale = client.find_refund_by_key("k1").unwrap();
        assert!(!stale.found && stale.refund.is_none(), "{stale:?}");
        assert!(
            stale.read_position < created,
            "a stale read must say it is older than the write: {stale:?}"
        );
        assert_eq!(
            stale.raw,
            format!(r#"{{"found":false,"read_position":{}}}"#, stale.read_position)
        );

        let fresh = client.find_refund_by_key("k1").unwrap();
        assert!(fresh.found);
        assert!(fresh.read_position >= created);
        let refund = fresh.refund.unwrap();
        assert_eq!(
            (refund.refund_id, refund.amount, refund.created_at),
            (1, 200.0, created)
        );
        assert!(refund.raw.starts_with(r#"{"refund_id":1,"#), "{}", refund.raw);
        assert_eq!(t.proxy.stats().lookups, 2);
    }
}

#[test]
fn stale_read_applies_to_an_order_read_too() {
    let t = Trial::new(Mode::Idempotent, Fault::StaleRead);
    let client = t.client(TIMEOUT);
    assert_ambiguous(client.refund_order(ORDER_ID, 200.0, "k1"));
    let stale = client.get_order(ORDER_ID).unwrap();
    assert_eq!(stale.refunded, 0.0);
    assert!(stale.read_position < t.refunds()[0].created_at_ms);
    assert_eq!(client.get_order(ORDER_ID).unwrap().refunded, 200.0);
    // The lookup after it is fresh: only one read goes stale.
    assert!(client.find_refund_by_key("k1").unwrap().found);
}

#[test]
fn unsafe_mode_inserts_every_time_and_idempotent_once() {
    for (mode, rows) in [(Mode::Unsafe, 2), (Mode::Idempotent, 1)] {
        let t = Trial::new(mode, Fault::None);
        let client = t.direct();
        let a = client.refund_order(ORDER_ID, 200.0, "same").unwrap();
        let b = client.refund_order(ORDER_ID, 200.0, "same").unwrap();
        assert_eq!(t.count(), rows, "{mode}");
        assert_eq!(a.refund_id == b.refund_id, mode == Mode::Idempotent);
        assert!(t.refunds().iter().all(|r| r.op_key == "same"));
        // The lookup returns the first refund under the key either way.
        assert_eq!(
            client.find_refund_by_key("same").unwrap().refund.unwrap().refund_id,
            a.refund_id
        );
    }
}

fn concurrent_posts(client: &Client, amount: f64) -> Vec<Result<refund::RefundReceipt, CallError>> {
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        let calls: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    client.refund_order(ORDER_ID, amount, "dup")
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

#[test]
fn concurrent_duplicates_insert_once_when_idempotent() {
    for direct in [true, false] {
        let t = Trial::new(Mode::Idempotent, Fault::ConcurrentDuplicate);
        let client = if direct {
            t.direct()
        } else {
            t.client(Duration::from_secs(5))
        };
        let results = concurrent_posts(&client, 200.0);
        assert_eq!(t.count(), 1);
        let ids: Vec<i64> = results.into_iter().map(|r| r.unwrap().refund_id).collect();
        assert!(ids.iter().all(|&id| id == 1), "{ids:?}");
    }
}

#[test]
fn concurrent_duplicates_all_insert_when_unsafe() {
    let t = Trial::new(Mode::Unsafe, Fault::ConcurrentDuplicate);
    let results = concurrent_posts(&t.client(Duration::from_secs(5)), 10.0);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(t.count(), 8);
    assert_eq!(t.ledger().refunded_cents(ORDER_ID).unwrap(), 8_000);
    assert_eq!(t.proxy.stats().refund_posts, 8);
}
