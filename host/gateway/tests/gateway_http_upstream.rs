//! `once gateway --upstream-url`: the gateway (its client on stdio) in front
//! of `refund-mcp --listen` over Streamable HTTP, with real processes. A reply
//! lost after the request reached the server is UNKNOWN and reconciled; a
//! connection that could not be opened is NOT SENT; the upstream's restart
//! on the same port is a new session the gateway opens by itself. Every
//! verdict is read from the upstream's effect ledger.

mod gateway_common;

use std::time::Duration;

use gateway_common::remote::RemoteUpstream;
use gateway_common::*;
use serde_json::json;

fn assert_decision(result: &rmcp::model::CallToolResult, decision: &str, logs: &str) {
    assert_eq!(outcome(result)["decision"], decision, "{}\n{logs}", text(result));
}

/// The gateway's log line of its first dispatch.
fn first_dispatch(rig: &Rig) -> Option<String> {
    rig.logs()
        .lines()
        .find(|l| l.contains("dispatched"))
        .map(str::to_string)
}

/// The upstream's logs and the gateway's, for a failure message.
fn all_logs(rig: &Rig, upstream: &RemoteUpstream) -> String {
    format!("{}\n==== upstream ====\n{}", rig.logs(), upstream.logs())
}

/// A protected call over HTTP runs once; the same key again is answered from the ledger. The
/// record's owner is the URL, which names the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_call_runs_once_and_its_replay_comes_from_the_ledger() {
    let rig = Rig::new(&fast_config(""));
    let upstream = RemoteUpstream::start(&rig.effects_db(), "none", rig.dir.path().join("upstream"));
    let session = rig.connect_url(&upstream.url(), 0).await;
    let tools = session.client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 3, "{tools:?}");

    let first = session.refund(200.0, Some("refund-1234-http")).await;
    assert_decision(&first, "executed", &all_logs(&rig, &upstream));
    let again = session.refund(200.0, Some("refund-1234-http")).await;
    assert_decision(&again, "replayed", &all_logs(&rig, &upstream));
    assert!(text(&again).contains("Nothing was sent again"), "{}", text(&again));
    // A DIRECT read passes through too.
    let order = session.call("get_order", json!({"order_id": 1234}), None).await;
    assert_eq!(order.structured_content.as_ref().unwrap()["refunded"], json!(200.0));
    assert!(session.close().await.success(), "{}", all_logs(&rig, &upstream));
    assert_exactly_one_refund(&rig);

    let db = rig.db.clone();
    let view = tokio::task::spawn_blocking(move || {
        let once = once::Once::open(&db).unwrap().build().unwrap();
        once.inspect("default", "refund-1234-http").unwrap().unwrap()
    })
    .await
    .unwrap();
    assert!(
        view.owner.starts_with(&format!("gateway {} #", upstream.url())),
        "{}",
        view.owner
    );
}

/// The upstream is SIGKILLed while it holds a committed refund's reply: the call is UNKNOWN
/// (never failed). Started again on the same port, it is read by the gateway's worker over a
/// new session: the refund is confirmed, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_killed_mid_call_is_unknown_then_reconciled_to_one_refund() {
    let rig = Rig::new(&fast_config("in_flight_wait = \"0ms\""));
    let mut upstream = RemoteUpstream::start(
        &rig.effects_db(),
        "crash_after_dispatch",
        rig.dir.path().join("upstream"),
    );
    let session = rig.connect_url(&upstream.url(), 0).await;
    let lost = {
        let call = session.refund(200.0, Some("refund-1234-cut"));
        tokio::pin!(call);
        tokio::select! {
            result = &mut call => panic!("the upstream holds its reply, yet the call ended: {}", text(&result)),
            () = wait_for("the refund to commit", Duration::from_secs(20), || rig.effects().0 == 1) => {}
        }
        upstream.kill();
        call.await
    };
    assert_decision(&lost, "unknown", &all_logs(&rig, &upstream));
    let first = first_dispatch(&rig);
    assert!(first.as_deref().is_some_and(|l| l.contains("ambiguous")), "{first:?}");
    assert_eq!(lost.is_error, Some(true));
    assert!(
        text(&lost).starts_with("UNKNOWN: refund_order (operation refund-1234-cut"),
        "{}",
        text(&lost)
    );

    upstream.restart();
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let again = session.refund(200.0, Some("refund-1234-cut")).await;
        if !settling(&again) {
            break again;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "never settled\n{}",
            all_logs(&rig, &upstream)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_decision(&settled, "replayed", &all_logs(&rig, &upstream));
    let trail = rig.audit(&settled);
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

/// The upstream is down when a call comes: the connection is refused before anything is sent,
/// so the call is NOT SENT (its attempts spent without an effect), never UNKNOWN. Once the
/// upstream is back on its port, a retry (with the new key the answer asks for) dispatches once;
/// the old key is refused, never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_not_sent_and_a_retry_later_dispatches_once() {
    let rig = Rig::new(&fast_config(""));
    let mut upstream = RemoteUpstream::start(&rig.effects_db(), "none", rig.dir.path().join("upstream"));
    let session = rig.connect_url(&upstream.url(), 0).await;
    upstream.kill();

    let refused = session.refund(200.0, Some("refund-1234-down")).await;
    assert_decision(&refused, "not-sent", &all_logs(&rig, &upstream));
    assert!(
        text(&refused).starts_with("NOT SENT: refund_order"),
        "{}",
        text(&refused)
    );
    assert_eq!(outcome(&refused)["effect"], "none");
    assert_eq!(rig.effects(), (0, 0));
    let trail = rig.audit(&refused);
    assert!(!trail.iter().any(|e| e.contains("ambiguous")), "{trail:#?}");
    // The first attempt found the session it held gone: its own send was refused, before any byte left.
    let first = first_dispatch(&rig);
    assert!(
        first
            .as_deref()
            .is_some_and(|l| l.contains("not-sent") && l.contains("could not be reached")),
        "{first:?}\n{}",
        all_logs(&rig, &upstream)
    );

    upstream.restart();
    let retry = session.refund(200.0, Some("refund-1234-back")).await;
    assert_decision(&retry, "executed", &all_logs(&rig, &upstream));
    let old = session.refund(200.0, Some("refund-1234-down")).await;
    assert_decision(&old, "not-sent", &all_logs(&rig, &upstream));
    assert_eq!(outcome(&old)["repeat"], "refused");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

/// `--check-config` reaches a URL upstream too; neither it nor an error ever shows the URL's
/// credentials (nor once's own output its query), and the default owner is the URL without them.
#[test]
fn check_config_takes_a_url_and_never_shows_its_credentials() {
    let rig = Rig::new(&fast_config(""));
    let upstream = RemoteUpstream::start(&rig.effects_db(), "none", rig.dir.path().join("upstream"));
    let url = format!(
        "http://operator:s3cret-pw@127.0.0.1:{}/mcp?token=t0ken-q",
        upstream.port()
    );
    let out = std::process::Command::new(gateway_common::once_exe())
        .args(["gateway", "--check-config", "--config"])
        .arg(&rig.config)
        .args(["--upstream-url", &url])
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown = format!("http://127.0.0.1:{}/mcp", upstream.port());
    assert!(stdout.contains(&format!("owner \"gateway {shown} #")), "{stdout}");
    let refund = stdout
        .lines()
        .find(|l| l.starts_with("refund_order"))
        .unwrap_or_default();
    assert!(refund.contains(" PROTECT "), "{stdout}");
    for secret in ["s3cret-pw", "t0ken-q", "operator"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret}: {stdout}\n{stderr}"
        );
    }

    // Nothing listens there: the error says so, without the credentials either.
    drop(upstream);
    let out = std::process::Command::new(gateway_common::once_exe())
        .args(["gateway", "--check-config", "--config"])
        .arg(&rig.config)
        .args(["--upstream-url", &url])
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&shown) && stderr.contains("did not initialize"),
        "{stderr}"
    );
    // The message is once's own (no query either); the SDK's transport log may name the query, never the credentials.
    let message = stderr.lines().find(|l| l.starts_with("once: ")).unwrap_or_default();
    assert!(!message.contains("t0ken-q"), "{stderr}");
    for secret in ["s3cret-pw", "operator"] {
        assert!(!stderr.contains(secret), "{secret}: {stderr}");
    }
}

/// A command and a URL at once, or a URL the gateway cannot use, is a config error (exit 2)
/// that names what is wrong, before anything is started.
#[test]
fn a_command_and_a_url_or_a_bad_url_is_a_config_error() {
    let rig = Rig::new(&fast_config(""));
    let run = |args: &[&str]| {
        let out = std::process::Command::new(gateway_common::once_exe())
            .arg("gateway")
            .arg("--config")
            .arg(&rig.config)
            .args(args)
            .env_remove("ONCE_DB")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, stderr) = run(&["--upstream-url", "http://127.0.0.1:9/mcp", "--", "refund-mcp"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("both an upstream command") && stderr.contains("--upstream-url"),
        "{stderr}"
    );
    let (code, stderr) = run(&["--upstream-url", "https://user:pw@example.com/mcp"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("https is not supported"), "{stderr}");
    assert!(!stderr.contains("pw@"), "{stderr}");
    let (code, stderr) = run(&["--upstream-url", "not a url"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream-url: upstream URL"), "{stderr}");

    let with_url = Rig::new(&fast_config("upstream_url = \"http://127.0.0.1:9/mcp\""));
    let out = std::process::Command::new(gateway_common::once_exe())
        .args(["gateway", "--config"])
        .arg(&with_url.config)
        .args(["--", "refund-mcp"])
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("upstream_url in"), "{stderr}");
}
