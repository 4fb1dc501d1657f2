//! `once gateway` across restarts and on shared ledgers, with real processes:
//! an application key (or identical arguments) names the same operation in
//! every connection, process and restart that shares the ledger; gateways in
//! front of one upstream act as one; a gateway never settles another
//! upstream's operation. Every verdict is read from the upstream's effect ledger.

mod gateway_common;
#[path = "../../once/tests/postgres_common/mod.rs"]
mod postgres_common;

use std::time::Duration;

use gateway_common::*;
use once::types::State;

fn assert_replay(result: &rmcp::model::CallToolResult, rig: &Rig) {
    let t = text(result);
    assert_eq!(outcome(result)["decision"], "replayed", "{t}\n{}", rig.logs());
    assert!(t.contains("Nothing was sent again"), "{t}");
}

// ---- the README's config, unchanged: a restart never makes a second refund ----

/// The reply is lost after the refund committed; the host restarts the
/// gateway and calls again with its key over the new connection: a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_then_a_restart_replays_the_keyed_refund() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let first = rig.connect("post_commit_disconnect", 0).await;
    let lost = first.refund(200.0, Some("refund-1234-k")).await;
    assert!(first.close().await.success(), "{}", rig.logs());
    assert_eq!(rig.effects().0, 1, "{}\n{}", text(&lost), rig.logs());

    let second = rig.connect("post_commit_disconnect", 1).await;
    let again = second.refund(200.0, Some("refund-1234-k")).await;
    assert!(second.close().await.success());
    assert_replay(&again, &rig);
    assert!(
        text(&again).starts_with("Replay of operation refund-1234-k"),
        "{}",
        text(&again)
    );
    assert_exactly_one_refund(&rig);
}

/// The gateway is SIGKILLed while the upstream holds a committed refund's
/// reply; a new gateway on the same ledger gets the same key: it waits out
/// the dead holder's lease, reads the provider, and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_call_is_settled_by_the_next_one() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let first = rig.connect("late_reply", 0).await;
    {
        let call = first.refund(200.0, Some("refund-1234-m"));
        tokio::pin!(call);
        tokio::select! {
            result = &mut call => panic!("the upstream holds its reply, yet the call ended: {}", text(&result)),
            () = wait_for("the refund to commit", Duration::from_secs(20), || rig.effects().0 == 1) => {}
        }
    }
    first.kill().await;

    let second = rig.connect("late_reply", 1).await;
    let result = second.refund(200.0, Some("refund-1234-m")).await;
    assert!(second.close().await.success());
    assert_replay(&result, &rig);
    assert_exactly_one_refund(&rig);
}

/// No key at all: identical arguments after a restart are the same
/// (derived) operation, inside its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_call_after_a_restart_is_the_same_operation() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let first = rig.connect("post_commit_disconnect", 0).await;
    first.refund(200.0, None).await;
    assert!(first.close().await.success());

    let second = rig.connect("post_commit_disconnect", 1).await;
    let again = second.refund(200.0, None).await;
    assert!(second.close().await.success());
    assert_replay(&again, &rig);
    assert_exactly_one_refund(&rig);
}

// ---- several gateways, one ledger ----

/// Two gateways in front of the same refund service, on one SQLite ledger,
/// get the same key at the same moment: one refund, and both callers hear it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_sqlite_ledger_send_a_key_once() {
    let a = Rig::new(&fast_config(""));
    let b = a.beside(&fast_config(""));
    let (left, right) = tokio::join!(a.connect("none", 0), b.connect("none", 0));
    let (x, y) = tokio::join!(
        left.refund(200.0, Some("refund-1234-two")),
        right.refund(200.0, Some("refund-1234-two"))
    );
    let decisions = [outcome(&x)["decision"].clone(), outcome(&y)["decision"].clone()];
    assert!(
        decisions.contains(&serde_json::json!("executed")) && decisions.contains(&serde_json::json!("replayed")),
        "{decisions:?}\n{}\n{}\n{}\n{}",
        text(&x),
        text(&y),
        a.logs(),
        b.logs()
    );
    assert!(left.close().await.success());
    assert!(right.close().await.success());
    assert_exactly_one_refund(&a);
}

/// Two gateways in front of two different refund services (two accounts)
/// share one PostgreSQL ledger (B with a scope and owner of its own). Gateway A dies with an operation unknown;
/// gateway B's background worker, which could prove it absent at its own
/// provider and send it there, never touches it. Restarted, A settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_in_front_of_two_upstreams_each_settle_only_their_own() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    // The call answers at once (it does not wait out max_in_flight itself): A dies with it unknown.
    let config = config_with_sweep("50ms", "in_flight_wait = \"0ms\"")
        .replace("max_in_flight = \"1500ms\"", "max_in_flight = \"4s\"");
    let mut a = Rig::new(&config);
    a.db = schema.location();
    // A second upstream is refused on a scope the first one holds (gateway.rs tests the refusal); with a
    // scope and owner of its own, B shares the ledger and its worker still never touches A's records.
    let mut b = Rig::new(&format!("scope = \"fixed:account-b\"\nowner = \"account-b\"\n{config}"));
    b.db = schema.location();

    let first = a.connect("pre_effect_disconnect", 0).await;
    let lost = first.refund(200.0, Some("refund-1234-own")).await;
    assert_eq!(outcome(&lost)["decision"], "unknown", "{}\n{}", text(&lost), a.logs());
    first.kill().await;

    // B runs its worker well past A's max_in_flight, with a client attached.
    let other = b.connect("none", 0).await;
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    let status = other.close().await;
    assert!(status.success(), "{status}\n{}", b.logs());
    assert_eq!(
        b.effects(),
        (0, 0),
        "B sent A's operation to its own upstream\n{}",
        b.logs()
    );
    assert_eq!(a.effects(), (0, 0));
    let db = a.db.clone();
    let view = tokio::task::spawn_blocking(move || {
        let once = once::Once::open(&db).unwrap().build().unwrap();
        once.inspect("default", "refund-1234-own").unwrap().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(view.state, State::Unknown, "B left it as A left it");
    assert!(view.owner.starts_with("gateway refund-mcp #"), "{}", view.owner);

    // A, restarted with the same command, proves it absent and sends it once.
    let again = a.connect("pre_effect_disconnect", 1).await;
    wait_for("A to settle its own operation", Duration::from_secs(30), || {
        a.effects().0 == 1
    })
    .await;
    assert!(again.close().await.success());
    assert_exactly_one_refund(&a);
    assert_eq!(b.effects(), (0, 0));
    tokio::task::spawn_blocking(move || drop(schema)).await.unwrap();
}
