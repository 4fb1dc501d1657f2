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

/// The gateway is SIGKILLed while the upstream holds a committed refund's reply, its call still
/// open, so it dies with the record in flight and no outcome reported. A new gateway on the same
/// ledger gets the same call at once, over a new connection, while the dead holder's lease still
/// runs: it waits the lease out, reads the provider and replays, keyed and keyless alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_call_is_settled_by_the_next_one() {
    for key in [Some("refund-1234-m"), None] {
        let rig = Rig::with_config_file(EXAMPLE_CONFIG);
        kill_with_the_refund_open(&rig, key).await;

        let second = rig.connect("late_reply", 1).await;
        let result = second.refund(200.0, key).await;
        assert!(second.close().await.success());
        assert_settled_after_the_dead_holder(&rig, &result);
    }
}

/// The same, with the call again made just before the dead holder's lease ends, and made to a
/// gateway started only after it ended (nothing alive has settled the record yet): a replay
/// either way, never UNKNOWN, and one refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_around_a_dead_holders_lease_end_is_replayed() {
    for late_start in [false, true] {
        let rig = Rig::with_config_file(EXAMPLE_CONFIG);
        let key = "refund-1234-l";
        kill_with_the_refund_open(&rig, Some(key)).await;
        let lease_until = lease_until(&rig, key).await;
        let second = if late_start {
            wait_for("the dead holder's lease to end", Duration::from_secs(20), || {
                now_ms() > lease_until
            })
            .await;
            rig.connect("late_reply", 1).await
        } else {
            let second = rig.connect("late_reply", 1).await;
            wait_for(
                "the dead holder's lease to near its end",
                Duration::from_secs(20),
                || now_ms() + 100 >= lease_until,
            )
            .await;
            second
        };
        let result = second.refund(200.0, Some(key)).await;
        assert!(second.close().await.success());
        assert_settled_after_the_dead_holder(&rig, &result);
    }
}

/// Issue #29 item 10: a host restarted the killed gateway with its upstream's command changed (the
/// fault flag dropped, as a supervisor restarting "cleanly" might). On b58a043 the default owner was
/// the command line, so the new gateway was another owner: it expired the record at the dead holder's
/// lease end but never read or settled it, and answered the same key UNKNOWN ("lease expired without
/// a reported outcome") for ever, with the refund readable all along. Now such a gateway stops at
/// start, naming the record's owner; told that owner (the same upstream), it reads the provider when
/// the lease ends and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restarted_with_a_changed_upstream_command_names_the_owner_then_replays() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let key = "refund-1234-o";
    kill_with_the_refund_open(&rig, Some(key)).await;

    let changed = rig.gateway_command("none");
    let holder = match try_connect(&rig, changed, 1).await {
        Ok(session) => {
            let result = session.refund(200.0, Some(key)).await;
            session.kill().await;
            panic!(
                "a gateway in front of another upstream command served the operation: {} / {}\n{}",
                outcome(&result)["decision"],
                text(&result),
                rig.logs()
            );
        }
        Err(log) => {
            let (_, rest) = log
                .split_once("set owner = \"")
                .unwrap_or_else(|| panic!("the refusal names the owner to set:\n{log}"));
            rest.split('"').next().unwrap().to_string()
        }
    };
    assert!(holder.starts_with("gateway refund-mcp #"), "{holder}");
    assert_eq!(rig.effects().0, 1);

    // The same upstream and account after all: the config names the record's owner and account, as the
    // refusal says.
    let account = named_account(&rig.logs()).expect("the refusal names the account to set");
    let example = std::fs::read_to_string(EXAMPLE_CONFIG).unwrap();
    std::fs::write(
        &rig.config,
        format!("owner = \"{holder}\"\naccount = \"{account}\"\n{example}"),
    )
    .unwrap();
    let second = rig.connect("none", 2).await;
    let result = second.refund(200.0, Some(key)).await;
    assert!(second.close().await.success());
    assert_settled_after_the_dead_holder(&rig, &result);
}

/// The cases "credential rotation while unknown" and "wrong provider account" (issue "Authority"): a gateway dies
/// with a refund's outcome unknown (committed at the provider, its reply never seen); the upstream is restarted
/// with a rotated credential (another `API_KEY`), whose account cannot see the old refunds (another effect ledger).
/// Told the old owner (as the refusal at start says), the new gateway still neither sends the operation through the
/// new account nor reads the new account's "no such refund" as proof: the same call is refused (`other-account`,
/// effect unknown) before and after the dead holder's lease ends, and nothing is refunded through the new account.
/// Back on the old credential, the read finds the refund: a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_credential_never_sends_or_reads_absent_an_operation_of_the_old_account() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let example = std::fs::read_to_string(EXAMPLE_CONFIG).unwrap();
    let key = "refund-1234-rotated";
    let old_key = ["env", "API_KEY=sk-2026-11"];
    let first = rig
        .connect_command(rig.gateway_command_wrapped(&[], &old_key, "late_reply"), 0)
        .await;
    first
        .kill_with_the_refund_open(200.0, Some(key), || rig.effects().0 == 1)
        .await;
    let lease_until = lease_until(&rig, key).await;

    // The new credential's account: its own effect ledger, where the old refund does not show.
    let mut rotated = rig.beside(&example);
    rotated.effects = rotated.dir.path().join("effects.db");
    let new_key = ["env", "API_KEY=sk-2026-12"];
    let holder = match try_connect(&rotated, rotated.gateway_command_wrapped(&[], &new_key, "none"), 0).await {
        Ok(session) => {
            session.kill().await;
            panic!(
                "a gateway with a changed credential served the old owner's scope\n{}",
                rotated.logs()
            );
        }
        Err(log) => {
            let (_, rest) = log.split_once("set owner = \"").unwrap_or_else(|| panic!("{log}"));
            rest.split('"').next().unwrap().to_string()
        }
    };
    std::fs::write(&rotated.config, format!("owner = \"{holder}\"\n{example}")).unwrap();
    let session = rotated
        .connect_command(rotated.gateway_command_wrapped(&[], &new_key, "none"), 1)
        .await;
    let refused_for = |result: &rmcp::model::CallToolResult| {
        let info = outcome(result);
        assert_eq!(info["reason"], "other-account", "{}\n{}", text(result), rotated.logs());
        assert_eq!(info["effect"], "unknown", "{}", text(result));
        assert!(text(result).contains("another provider account"), "{}", text(result));
    };
    refused_for(&session.refund(200.0, Some(key)).await);
    wait_for("the dead holder's lease to end", Duration::from_secs(20), || {
        now_ms() > lease_until + 1_000
    })
    .await;
    // The new gateway's worker has expired the lease and read the new account (no such refund) by now.
    refused_for(&session.refund(200.0, Some(key)).await);
    assert!(session.close().await.success());
    assert_eq!(
        rotated.effects().0,
        0,
        "nothing refunded through the new account\n{}",
        rotated.logs()
    );
    assert_eq!(rig.effects().0, 1);
    let view = tokio::task::spawn_blocking({
        let db = rig.db.clone();
        move || {
            once::Once::open(&db)
                .unwrap()
                .build()
                .unwrap()
                .inspect("default", key)
                .unwrap()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(view.state, State::Unknown, "never absent on the new account's word");
    assert!(
        view.audit.iter().any(|e| e.kind == "lease-expired")
            && view
                .audit
                .iter()
                .filter(|e| e.kind.starts_with("reconcile"))
                .all(|e| e.detail.contains("not read through provider account")),
        "expired by the new gateway's worker, never read through its account: {:#?}",
        view.audit
    );

    // The old credential again (the first gateway's command, so its owner and account): its read finds the refund.
    let back = rig
        .connect_command(rig.gateway_command_wrapped(&[], &old_key, "late_reply"), 2)
        .await;
    let replayed = back.refund(200.0, Some(key)).await;
    assert!(back.close().await.success());
    assert_replay(&replayed, &rig);
    assert_exactly_one_refund(&rig);
}

/// Start the gateway `command` (its stderr to log `n`) and initialize a client: the session, or the
/// gateway's log when it stopped before serving.
async fn try_connect(rig: &Rig, command: std::process::Command, n: usize) -> Result<Session, String> {
    let log = std::fs::File::create(rig.log(n)).unwrap();
    let mut cmd = tokio::process::Command::from(command);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(log);
    let mut child = cmd.spawn().unwrap();
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    match rmcp::ServiceExt::serve((), (stdout, stdin)).await {
        Ok(client) => Ok(Session { client, child }),
        Err(_) => {
            let status = child.wait().await.unwrap();
            assert_eq!(status.code(), Some(2), "refused as a configuration error");
            Err(std::fs::read_to_string(rig.log(n)).unwrap())
        }
    }
}

/// Send a refund through a gateway over `late_reply` and SIGKILL the gateway once the upstream has
/// committed it, with the call still open.
async fn kill_with_the_refund_open(rig: &Rig, key: Option<&str>) {
    let first = rig.connect("late_reply", 0).await;
    first
        .kill_with_the_refund_open(200.0, key, || rig.effects().0 == 1)
        .await;
}

/// The end of the lease the killed gateway's attempt holds, on the ledger's clock (SQLite: this host's).
async fn lease_until(rig: &Rig, key: &str) -> u64 {
    let (db, key) = (rig.db.clone(), key.to_string());
    let view = tokio::task::spawn_blocking(move || {
        let once = once::Once::open(&db).unwrap().build().unwrap();
        once.inspect("default", &key)
            .unwrap()
            .expect("the claim is in the ledger")
    })
    .await
    .unwrap();
    assert_eq!(view.state, State::InFlight, "the killed gateway reported nothing");
    let body: serde_json::Value = serde_json::from_str(&view.body).unwrap();
    body["attempts"][0]["lease_until"]
        .as_u64()
        .expect("the attempt's lease")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A replay, read from the provider after the dead holder's lease expired with no outcome reported;
/// exactly one refund.
fn assert_settled_after_the_dead_holder(rig: &Rig, result: &rmcp::model::CallToolResult) {
    assert_replay(result, rig);
    let trail = rig.audit(result);
    assert!(
        trail.iter().any(|e| e.starts_with("lease-expired")),
        "the first gateway left the record in flight: {trail:#?}"
    );
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    assert_exactly_one_refund(rig);
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

// ---- older history: a ledger restored from a backup ----

/// The case "older history": the README's gateway refunds with and without a key; its ledger file
/// is then put back to a copy taken before (the gateway stopped, as a file-level backup is
/// restored), and the same call is made again to a new gateway. The witness beside the ledger
/// (`once.db.witness`, which the restore leaves alone) gives back the attempt the older file lacks:
/// read through `find_refund_by_key` and replayed, never sent again. One refund each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_restored_from_an_older_backup_never_refunds_again() {
    for key in [Some("refund-1234-r"), None] {
        let rig = Rig::with_config_file(EXAMPLE_CONFIG);
        let started = rig.connect("none", 0).await;
        assert!(started.close().await.success(), "{}", rig.logs());
        let backup = rig.dir.path().join("backup");
        std::fs::create_dir(&backup).unwrap();
        let files = ["once.db", "once.db-wal"];
        for file in files {
            let _ = std::fs::copy(rig.dir.path().join(file), backup.join(file));
        }

        let first = rig.connect("none", 1).await;
        let sent = first.refund(200.0, key).await;
        assert!(first.close().await.success(), "{}", rig.logs());
        assert_eq!(outcome(&sent)["decision"], "executed", "{}", text(&sent));
        assert_exactly_one_refund(&rig);

        for file in ["once.db", "once.db-wal", "once.db-shm"] {
            let _ = std::fs::remove_file(rig.dir.path().join(file));
        }
        for file in files {
            let _ = std::fs::copy(backup.join(file), rig.dir.path().join(file));
        }
        assert!(rig.dir.path().join("once.db.witness").exists());

        let second = rig.connect("none", 2).await;
        let again = second.refund(200.0, key).await;
        assert!(second.close().await.success(), "{}", rig.logs());
        assert_replay(&again, &rig);
        let trail = rig.audit(&again);
        assert!(
            trail[0].starts_with("restored-from-witness") && trail[0].contains("no record"),
            "the restored ledger had no record of it: {trail:#?}"
        );
        assert!(
            trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
            "{trail:#?}"
        );
        assert_exactly_one_refund(&rig);
    }
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

/// The case "wrong provider account" (issue "Authority"): two gateways told they are one upstream (one `owner`)
/// share a ledger, but their upstreams run with different credentials (`API_KEY`). A refund made through A's is
/// asked for through B's: B neither replays A's receipt nor sends it through its own account; its caller is told
/// the refund happened. A's caller gets the replay. One refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_another_provider_account_is_neither_replayed_nor_sent() {
    let config = fast_config("owner = \"refunds\"");
    let a = Rig::new(&config);
    let b = a.beside(&config);
    let left = a
        .connect_command(a.gateway_command_wrapped(&[], &["env", "API_KEY=acct-a"], "none"), 0)
        .await;
    let made = left.refund(200.0, Some("refund-1234-acct")).await;
    assert_eq!(outcome(&made)["decision"], "executed", "{}", text(&made));
    let right = b
        .connect_command(b.gateway_command_wrapped(&[], &["env", "API_KEY=acct-b"], "none"), 0)
        .await;
    let other = right.refund(200.0, Some("refund-1234-acct")).await;
    let info = outcome(&other);
    assert_eq!(info["reason"], "other-account", "{}\n{}", text(&other), b.logs());
    assert_eq!(info["effect"], "happened", "{}", text(&other));
    assert!(
        !text(&other).contains(r#""refund_id""#),
        "another account is not shown the receipt: {}",
        text(&other)
    );
    let again = left.refund(200.0, Some("refund-1234-acct")).await;
    assert_replay(&again, &a);
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
    drop(schema);
}
