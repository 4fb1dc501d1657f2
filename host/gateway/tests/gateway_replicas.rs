//! Gateway replicas: several `once gateway` processes with one config (so one
//! owner: the upstream's URL) on one PostgreSQL ledger, in front of one
//! `refund-mcp --listen`. A replica that dies mid-call leaves a record the
//! others' background workers settle; a dispatch owed after it is sent by
//! exactly one of them. The refund service never dedupes (`--mode unsafe`),
//! so every dispatch that reached it is a refund row: one row is one dispatch.

mod gateway_common;
#[path = "../../once/tests/postgres_common/mod.rs"]
mod postgres_common;

use std::time::{Duration, Instant};

use gateway_common::remote::RemoteUpstream;
use gateway_common::*;
use once::types::{RecordView, State};

/// Every replica's log, then the upstream's, for a failure message.
fn all_logs(replicas: &[&Rig], upstream: &RemoteUpstream) -> String {
    let mut logs: Vec<String> = replicas.iter().map(|r| r.logs()).collect();
    logs.push(upstream.logs());
    logs.join("\n==== next ====\n")
}

/// The record of `key`, read from the ledger directly.
async fn record(db: &str, key: &str) -> RecordView {
    let (db, key) = (db.to_string(), key.to_string());
    tokio::task::spawn_blocking(move || {
        let once = once::Once::open(&db).unwrap().build().unwrap();
        once.inspect("default", &key)
            .unwrap()
            .expect("the operation is in the ledger")
    })
    .await
    .unwrap()
}

/// Wait until the ledger's record of `key` is in `state`, settled by someone other than the test.
async fn wait_for_state(db: &str, key: &str, state: State, within: Duration, logs: impl Fn() -> String) -> RecordView {
    let give_up = Instant::now() + within;
    loop {
        let view = record(db, key).await;
        if view.state == state {
            return view;
        }
        assert!(Instant::now() < give_up, "{key} is still {:?}\n{}", view.state, logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Replica A is SIGKILLed after it sent a refund the upstream committed but never answered;
/// replica B's background worker expires A's lease, reads the provider and confirms the refund.
/// The same key at B is then a replay: one refund, one dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_call_is_settled_by_the_other_replicas_worker() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    let mut a = Rig::new(&fast_config(""));
    a.db = schema.location();
    let b = a.beside(&fast_config(""));
    let upstream = RemoteUpstream::start(&a.effects_db(), "crash_after_dispatch", a.dir.path().join("upstream"));
    let logs = || all_logs(&[&a, &b], &upstream);
    let url = upstream.url();
    let (left, right) = tokio::join!(a.connect_url(&url, 0), b.connect_url(&url, 0));
    left.kill_with_the_refund_open(200.0, Some("refund-1234-replica"), || a.effects().0 == 1)
        .await;

    let view = wait_for_state(
        &a.db,
        "refund-1234-replica",
        State::Confirmed,
        Duration::from_secs(30),
        logs,
    )
    .await;
    let trail: Vec<String> = view.audit.iter().map(|e| format!("{}: {}", e.kind, e.detail)).collect();
    assert!(trail.iter().any(|e| e.starts_with("lease-expired")), "{trail:#?}");
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    assert_eq!(view.attempts, 1, "settled without a second dispatch: {trail:#?}");
    assert!(
        view.owner.starts_with(&format!("gateway {} #", upstream.url())),
        "the default owner: the URL and its identity digest, the same for both replicas: {}",
        view.owner
    );

    let again = right.refund(200.0, Some("refund-1234-replica")).await;
    assert_eq!(outcome(&again)["decision"], "replayed", "{}\n{}", text(&again), logs());
    assert!(right.close().await.success(), "{}", logs());
    assert_exactly_one_refund(&a);
    drop(schema);
}

/// Replica A's refund never reached the service (the upstream dropped the connection before
/// acting): A answers UNKNOWN and is SIGKILLed. Replicas B and C, both alive, both sweep: once
/// absence is proven the owed dispatch is claimed through the ledger and sent by one of them,
/// once, with the same provider key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owed_dispatch_is_sent_by_exactly_one_of_the_live_replicas() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    let config = fast_config("in_flight_wait = \"0ms\"");
    let mut a = Rig::new(&config);
    a.db = schema.location();
    let (b, c) = (a.beside(&config), a.beside(&config));
    let mut upstream = RemoteUpstream::start(&a.effects_db(), "pre_effect_disconnect", a.dir.path().join("upstream"));
    let first = a.connect_url(&upstream.url(), 0).await;
    let lost = first.refund(200.0, Some("refund-1234-owed")).await;
    let said = all_logs(&[&a], &upstream);
    assert_eq!(outcome(&lost)["decision"], "unknown", "{}\n{said}", text(&lost));
    first.kill().await;
    assert_eq!(a.effects(), (0, 0));

    upstream.restart();
    let logs = || all_logs(&[&a, &b, &c], &upstream);
    let url = upstream.url();
    let (second, third) = tokio::join!(b.connect_url(&url, 0), c.connect_url(&url, 0));
    let view = wait_for_state(
        &a.db,
        "refund-1234-owed",
        State::Confirmed,
        Duration::from_secs(30),
        logs,
    )
    .await;
    let trail: Vec<String> = view.audit.iter().map(|e| format!("{}: {}", e.kind, e.detail)).collect();
    assert!(trail.iter().any(|e| e.starts_with("reconciled-absent")), "{trail:#?}");
    assert_eq!(view.attempts, 2, "one owed dispatch after the lost one: {trail:#?}");
    // Both replicas keep sweeping a while longer: nothing is sent again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(second.close().await.success(), "{}", logs());
    assert!(third.close().await.success(), "{}", logs());
    assert_exactly_one_refund(&a);
    let owed_sent = [&b, &c]
        .iter()
        .map(|rig| {
            std::fs::read_to_string(rig.log(0))
                .unwrap_or_default()
                .matches("owed dispatch")
                .count()
        })
        .sum::<usize>();
    assert_eq!(owed_sent, 1, "{}", logs());
    drop(schema);
}
