//! `once gateway` end to end with real processes: an rmcp client → the
//! `once gateway` binary → the `refund-mcp` example server (its own refund
//! service and SQLite effect ledger), under the demo's faults. Every verdict
//! is read from the effect ledger; every text is what a model would be shown.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use once::Once;
use refund::{EffectLedger, ORDER_ID};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, RequestMetaObject, Tool};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The shipped example config: the README's gateway.
const EXAMPLE_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/refund/once.toml");

/// A faster twin of the example config (shorter timeouts, a quicker reconciler), with room for more tables.
fn fast_config(extra: &str) -> String {
    config_with_sweep("50ms", extra)
}

fn config_with_sweep(sweep_interval: &str, extra: &str) -> String {
    format!(
        r#"sweep_interval = "{sweep_interval}"
{extra}

[tools.refund_order]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"
timeout = "1s"
max_in_flight = "1500ms"
reconcile_interval = "100ms"
reconcile = "required"
lookup = {{ tool = "find_refund_by_key", args = {{ idempotency_key = "{{key}}" }}, found = "/found", receipt = "/refund", read_position = "/read_position" }}
quota = {{ field = "/amount", ceiling = "300", window = "1d" }}
"#
    )
}

/// The `refund-mcp` binary beside `once`. `cargo test --workspace` builds it (the example package has tests); a
/// lone `cargo test -p once-host` builds it here when it is missing. A nested build of an existing one would
/// resolve features for that package alone and relink it differently from the workspace build.
fn refund_mcp() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let once = Path::new(env!("CARGO_BIN_EXE_once"));
        let exe = once.with_file_name("refund-mcp");
        if !exe.exists() {
            let release = once.parent().and_then(Path::file_name).is_some_and(|d| d == "release");
            let status = Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-p", "once-refund-example", "--bin", "refund-mcp"])
                .args(release.then_some("--release"))
                .status()
                .expect("running cargo to build refund-mcp");
            assert!(status.success(), "building refund-mcp failed");
        }
        assert!(exe.exists(), "{} is missing", exe.display());
        exe
    })
}

/// One gateway run: a temp dir with the effect ledger, the once ledger and the config.
struct Rig {
    dir: TempDir,
    config: PathBuf,
}

impl Rig {
    fn new(config_text: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("once.toml");
        std::fs::write(&config, config_text).unwrap();
        Rig { dir, config }
    }

    fn with_config_file(path: &str) -> Rig {
        let rig = Rig::new("");
        std::fs::copy(path, &rig.config).unwrap();
        rig
    }

    fn effects_db(&self) -> PathBuf {
        self.dir.path().join("effects.db")
    }

    fn log(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("gateway-{n}.log"))
    }

    fn gateway_command(&self, fault: &str) -> Command {
        self.gateway_command_with(&[], fault)
    }

    fn gateway_command_with(&self, flags: &[&str], fault: &str) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_once"));
        cmd.arg("gateway")
            .args(flags)
            .arg("--config")
            .arg(&self.config)
            .arg("--db")
            .arg(self.dir.path().join("once.db"))
            .arg("--")
            .arg(refund_mcp())
            .arg("--db")
            .arg(self.effects_db())
            .args(["--mode", "unsafe", "--fault", fault]);
        cmd.env_remove("ONCE_DB").env("ONCE_LOG", "once=info");
        cmd
    }

    /// Start a gateway over a refund-mcp with `fault`, and connect an MCP client to it.
    async fn connect(&self, fault: &str, n: usize) -> Session {
        let log = std::fs::File::create(self.log(n)).unwrap();
        let mut cmd = tokio::process::Command::from(self.gateway_command(fault));
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log);
        let mut child = cmd.spawn().unwrap();
        let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let client = ().serve((stdout, stdin)).await.unwrap_or_else(|e| {
            panic!(
                "initialize through the gateway failed: {e}\n{}",
                std::fs::read_to_string(self.log(n)).unwrap_or_default()
            )
        });
        Session { client, child }
    }

    /// Refund rows and cents for the order, from the effect ledger itself.
    fn effects(&self) -> (u64, i64) {
        let ledger = EffectLedger::open(self.effects_db()).unwrap();
        (
            ledger.count(ORDER_ID).unwrap(),
            ledger.refunded_cents(ORDER_ID).unwrap(),
        )
    }

    /// The audit details of the operation a result names, read from the once ledger after the gateway exited.
    fn audit(&self, result: &CallToolResult) -> Vec<String> {
        let info = outcome(result);
        let (scope, key) = (info["scope"].as_str().unwrap(), info["operation"].as_str().unwrap());
        let once = Once::sqlite(self.dir.path().join("once.db")).unwrap().build().unwrap();
        let view = once
            .inspect(scope, key)
            .unwrap()
            .expect("the operation is in the ledger");
        view.audit
            .into_iter()
            .map(|e| format!("{}: {}", e.kind, e.detail))
            .collect()
    }

    fn logs(&self) -> String {
        (0..3)
            .filter_map(|n| std::fs::read_to_string(self.log(n)).ok())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

struct Session {
    client: RunningService<RoleClient, ()>,
    child: tokio::process::Child,
}

impl Session {
    async fn call(&self, tool: &str, args: Value, key: Option<&str>) -> CallToolResult {
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(object(args));
        if let Some(key) = key {
            params.meta = Some(meta(&[("once/key", key)]));
        }
        self.client.call_tool(params).await.unwrap()
    }

    async fn refund(&self, amount: f64, key: Option<&str>) -> CallToolResult {
        self.call("refund_order", json!({"order_id": ORDER_ID, "amount": amount}), key)
            .await
    }

    /// The client hangs up, as an agent that is done does; the gateway settles what it owes, then exits.
    async fn close(self) -> std::process::ExitStatus {
        let Session { client, mut child } = self;
        let _ = client.cancel().await;
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("the gateway exits after its client hangs up")
            .unwrap()
    }
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => panic!("arguments are an object"),
    }
}

fn meta(fields: &[(&str, &str)]) -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    for (k, v) in fields {
        meta.insert(k.to_string(), json!(v));
    }
    meta
}

/// The text a model reads first.
fn text(result: &CallToolResult) -> String {
    result.content[0].as_text().expect("a text block first").text.clone()
}

fn outcome(result: &CallToolResult) -> Value {
    result
        .meta
        .as_ref()
        .and_then(|m| m.get("once/outcome"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Wait for a condition on the effect ledger (the truth) instead of a fixed sleep.
async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_exactly_one_refund(rig: &Rig) {
    assert_eq!(rig.effects(), (1, 20_000), "exactly one $200 refund\n{}", rig.logs());
}

/// A never-retry agent: one call, read the text, hang up. The effect ledger must still end with one refund.
async fn never_retry(rig: &Rig, fault: &str) -> CallToolResult {
    let session = rig.connect(fault, 0).await;
    let result = session.refund(200.0, None).await;
    let status = session.close().await;
    assert!(status.success(), "gateway exit {status}\n{}", rig.logs());
    result
}

fn assert_unknown_text(result: &CallToolResult, reason: &str) {
    let t = text(result);
    assert_eq!(result.is_error, Some(true), "{t}");
    assert!(t.starts_with("UNKNOWN: refund_order (operation derived:"), "{t}");
    assert!(t.contains("may or may not have happened"), "{t}");
    assert!(t.contains(reason), "{t}");
    assert!(
        t.contains("Calling refund_order again with the same arguments will not send it again"),
        "{t}"
    );
    assert!(
        t.contains("once is checking with find_refund_by_key in the background")
            && t.contains("once sends it itself, exactly once, with the same idempotency key"),
        "{t}"
    );
    assert_eq!(outcome(result)["decision"], "unknown");
    assert_eq!(
        result.structured_content.as_ref().unwrap()["once"]["decision"],
        "unknown"
    );
}

/// The model is told the refund happened and how once knows; the ledger's audit trail says the same.
fn assert_confirmed_by_lookup(rig: &Rig, result: &CallToolResult) {
    let t = text(result);
    assert_ne!(result.is_error, Some(true), "{t}");
    assert!(t.starts_with("Replay of operation derived:"), "{t}");
    assert!(
        t.contains("did happen, but its reply was lost; once confirmed it by reading find_refund_by_key"),
        "{t}"
    );
    assert!(t.contains("Nothing was sent again"), "{t}");
    let trail = rig.audit(result);
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    let receipt = result
        .structured_content
        .as_ref()
        .expect("the receipt as structured content");
    assert_eq!(receipt["order_id"], json!(ORDER_ID));
    assert_eq!(receipt["amount"].as_f64(), Some(200.0), "{receipt}");
}

// ---- acceptance: a never-retry agent behind the shipped config gets exactly one refund ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_pre_effect_disconnect() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let result = never_retry(&rig, "pre_effect_disconnect").await;
    assert_unknown_text(&result, "the upstream closed the connection before replying");
    // The agent never called again: the gateway proved the refund absent and sent it itself, with the same key.
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_post_commit_disconnect() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let result = never_retry(&rig, "post_commit_disconnect").await;
    assert_confirmed_by_lookup(&rig, &result);
    assert_exactly_one_refund(&rig);
}

// ---- the rest of the demo's faults ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_without_a_fault_sees_the_upstream_result() {
    let rig = Rig::new(&fast_config(""));
    let result = never_retry(&rig, "none").await;
    assert_ne!(result.is_error, Some(true));
    // The upstream's own result, untouched, with once's account in _meta.
    let receipt: Value = serde_json::from_str(&text(&result)).unwrap();
    assert_eq!(receipt["amount"], json!(200.0));
    assert!(
        receipt["idempotency_key"].as_str().unwrap().starts_with("once-"),
        "{receipt}"
    );
    assert_eq!(result.structured_content.as_ref().unwrap(), &receipt);
    assert_eq!(outcome(&result)["decision"], "executed");
    assert_eq!(outcome(&result)["attempt"], 1);
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_reject_502() {
    let rig = Rig::new(&fast_config(""));
    let result = never_retry(&rig, "reject_502").await;
    assert_unknown_text(&result, "the upstream answered a protocol error");
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_under_a_key_from_meta_says_to_call_again_with_that_key() {
    // With the key in _meta, the same arguments without it would be a different (derived) operation:
    // the model must be told to reuse the key, not the arguments.
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("reject_502", 0).await;
    let result = session.refund(200.0, Some("refund-1234-u")).await;
    assert!(session.close().await.success());
    let t = text(&result);
    assert!(t.starts_with("UNKNOWN: refund_order (operation refund-1234-u)"), "{t}");
    assert!(
        t.contains(
            r#"Calling refund_order again with operation key refund-1234-u in _meta "once/key" will not send it again"#
        ),
        "{t}"
    );
    assert!(!t.contains("same arguments"), "{t}");
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_params_from_the_upstream_is_a_rejection() {
    // JSON-RPC's "invalid params" is answered before the tool runs: nothing happened, so the record is
    // failed (not unknown) and nothing is reconciled or redispatched.
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let result = session
        .call(
            "refund_order",
            json!({"order_id": [ORDER_ID], "amount": 50}),
            Some("refund-bad-args"),
        )
        .await;
    assert!(session.close().await.success());
    let t = text(&result);
    assert_eq!(result.is_error, Some(true), "{t}");
    assert!(
        t.starts_with("Rejected: the upstream refused refund_order (operation refund-bad-args) and did nothing."),
        "{t}"
    );
    assert!(t.contains("The upstream said: bad arguments"), "{t}");
    assert_eq!(outcome(&result)["decision"], "rejected");
    let trail = rig.audit(&result);
    assert!(trail.iter().any(|e| e.starts_with("finish-rejected")), "{trail:#?}");
    assert_eq!(rig.effects(), (0, 0), "no refund\n{}", rig.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_late_reply() {
    let rig = Rig::new(&fast_config(""));
    let result = never_retry(&rig, "late_reply").await;
    // The 1 s timeout ends the wait; the lookup finds the committed refund.
    assert_confirmed_by_lookup(&rig, &result);
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_retry_gets_one_refund_under_stale_read() {
    // The background reconciler stays out of the way, so the call's own reads are the ones in the trail (a
    // concurrent read could win the ledger's compare-and-swap and leave the stale one unrecorded).
    let rig = Rig::new(&config_with_sweep("3s", ""));
    let result = never_retry(&rig, "stale_read").await;
    // The reply is lost and the call's one read comes from before the write: it must not count as absent, so
    // the model is told UNKNOWN; the gateway's next read, in the background, finds the refund.
    assert_unknown_text(&result, "the upstream answered a protocol error");
    let trail = rig.audit(&result);
    assert!(
        trail.iter().any(|d| d.contains("not after the last dispatch")),
        "the stale read is in the audit trail and did not count: {trail:#?}\n{}",
        rig.logs()
    );
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_after_dispatch_is_finished_by_the_next_one() {
    // A fixed scope: the restarted agent and gateway continue the same operation.
    let rig = Rig::new(&fast_config(r#"scope = "fixed:desk-7""#));
    let mut first = rig.connect("crash_after_dispatch", 0).await;
    let pid = first.child.id().unwrap();
    {
        let call = first.refund(200.0, Some("refund-1234-a"));
        tokio::pin!(call);
        tokio::select! {
            result = &mut call => panic!("the upstream holds its reply, yet the call ended: {}", text(&result)),
            () = wait_for("the refund to commit", Duration::from_secs(20), || rig.effects().0 == 1) => {}
        }
        // SIGKILL: the gateway sent the refund and dies before it hears back.
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        assert!(killed.success());
    }
    let status = first.child.wait().await.unwrap();
    assert!(!status.success(), "the first gateway was killed");
    drop(first);

    let second = rig.connect("none", 1).await;
    let result = second.refund(200.0, Some("refund-1234-a")).await;
    let t = text(&result);
    assert!(
        t.starts_with("Replay of operation refund-1234-a:"),
        "{t}\n{}",
        rig.logs()
    );
    assert!(t.contains("Nothing was sent again"), "{t}");
    assert!(second.close().await.success());
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_make_one_refund() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("concurrent_duplicate", 0).await;
    let (a, b) = tokio::join!(
        session.refund(200.0, Some("refund-1234-c")),
        session.refund(200.0, Some("refund-1234-c"))
    );
    let decisions = [outcome(&a)["decision"].clone(), outcome(&b)["decision"].clone()];
    assert!(
        decisions.contains(&json!("executed")) && decisions.contains(&json!("replayed")),
        "{decisions:?}\n{}\n{}",
        text(&a),
        text(&b)
    );
    let replay = if outcome(&a)["decision"] == "replayed" { &a } else { &b };
    assert!(
        text(replay).starts_with("Replay of operation refund-1234-c:"),
        "{}",
        text(replay)
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

// ---- what the model is shown ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_conflict_and_two_disagreeing_keys() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let first = session.refund(200.0, Some("refund-1234-r")).await;
    assert_eq!(outcome(&first)["decision"], "executed", "{}", text(&first));

    let again = session.refund(200.0, Some("refund-1234-r")).await;
    let t = text(&again);
    assert!(
        t.starts_with(
            "Replay of operation refund-1234-r: refund_order already ran under this operation key; below is its \
             stored result. Nothing was sent again."
        ),
        "{t}"
    );
    assert_eq!(again.is_error, Some(false));
    // The stored result follows the note, with its structured content.
    assert_eq!(again.content.len(), 2);
    assert_eq!(again.structured_content.as_ref().unwrap()["refund_id"], json!(1));
    assert_eq!(outcome(&again)["via"], "key");

    let changed = session.refund(250.0, Some("refund-1234-r")).await;
    let t = text(&changed);
    assert_eq!(changed.is_error, Some(true));
    assert!(
        t.starts_with("CONFLICT: operation key refund-1234-r was already used for a different call"),
        "{t}"
    );
    assert!(
        t.contains(r#"refund_order({"amount":200,"#) && t.contains("state confirmed"),
        "{t}"
    );
    assert!(t.contains("This refund_order call was NOT sent"), "{t}");
    let stored = &changed.structured_content.as_ref().unwrap()["once"]["stored"];
    assert_eq!(stored["args"]["amount"], json!(200));

    // Two application carriers that disagree: blocked, never a guess.
    let mut params =
        CallToolRequestParams::new("refund_order").with_arguments(object(json!({"order_id": ORDER_ID, "amount": 5})));
    params.meta = Some(meta(&[("once/key", "refund-a"), ("idempotencyKey", "refund-b")]));
    let conflicted = session.client.call_tool(params).await.unwrap();
    let t = text(&conflicted);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: the call carries two different operation keys"),
        "{t}"
    );
    assert!(t.contains("identity-conflict"), "{t}");

    // Without a key, the same arguments twice are one operation (derived from the arguments), and say so.
    let derived = session.refund(20.0, None).await;
    assert_eq!(outcome(&derived)["decision"], "executed");
    let derived_again = session.refund(20.0, None).await;
    let t = text(&derived_again);
    assert!(t.starts_with("Replay of operation derived:"), "{t}");
    assert!(
        t.contains("an identical refund_order call (same arguments, same session) already ran"),
        "{t}"
    );
    assert!(session.close().await.success());
    assert_eq!(
        rig.effects(),
        (2, 22_000),
        "one $200 and one $20 refund\n{}",
        rig.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_agent_is_told_unknown_then_gets_the_replay() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("reject_502", 0).await;
    let first = session.refund(200.0, Some("refund-1234-t")).await;
    assert!(
        text(&first).starts_with("UNKNOWN: refund_order (operation refund-1234-t)"),
        "{}",
        text(&first)
    );
    let give_up = Instant::now() + Duration::from_secs(20);
    let last = loop {
        let result = session.refund(200.0, Some("refund-1234-t")).await;
        if outcome(&result)["decision"] != "unknown" || Instant::now() > give_up {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Either the background reconciler sent the owed refund first (this call replays it), or this call found
    // the dispatch owed and sent it itself: attempt 2 of the same operation, with the same provider key.
    let t = text(&last);
    match outcome(&last)["decision"].as_str() {
        Some("replayed") => assert!(t.starts_with("Replay of operation refund-1234-t:"), "{t}"),
        Some("executed") => {
            assert_eq!(outcome(&last)["attempt"], 2, "{t}");
            assert_eq!(
                t,
                "Sent now as attempt 2 of operation refund-1234-t; no earlier attempt had an effect."
            );
        }
        other => panic!("the retry ended {other:?}: {t}\n{}", rig.logs()),
    }
    assert_eq!(
        last.structured_content.as_ref().unwrap()["amount"].as_f64(),
        Some(200.0)
    );
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_block_come_from_the_config() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let first = session.refund(200.0, Some("refund-q1")).await;
    assert_eq!(outcome(&first)["decision"], "executed");
    let over = session.refund(150.0, Some("refund-q2")).await;
    let t = text(&over);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: it would pass the spend ceiling for this scope and window"),
        "{t}"
    );
    assert_eq!(over.structured_content.as_ref().unwrap()["once"]["reason"], "quota");
    assert!(session.close().await.success());
    assert_exactly_one_refund(&rig);

    // A tool the config blocks is answered and never forwarded.
    let rig = Rig::new(&format!("{}route = \"block\"\n", fast_config("")));
    let session = rig.connect("none", 0).await;
    let blocked = session.refund(200.0, Some("refund-b")).await;
    let t = text(&blocked);
    assert!(
        t.starts_with("BLOCKED: refund_order was not sent: the gateway's policy does not allow this tool"),
        "{t}"
    );
    let read = session.call("get_order", json!({"order_id": ORDER_ID}), None).await;
    let order: Value = serde_json::from_str(&text(&read)).unwrap();
    assert_eq!(order["refunded"].as_f64(), Some(0.0), "DIRECT passes through: {order}");
    assert!(session.close().await.success());
    assert_eq!(rig.effects(), (0, 0));
}

// ---- tools/list, --check-config and bad config ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_passes_through_unchanged() {
    let rig = Rig::new(&fast_config(""));
    let session = rig.connect("none", 0).await;
    let through_gateway: Vec<Tool> = session.client.list_all_tools().await.unwrap();
    assert!(session.close().await.success());

    let mut direct = tokio::process::Command::new(refund_mcp());
    direct.arg("--db").arg(rig.dir.path().join("direct.db"));
    let upstream = ().serve(rmcp::transport::TokioChildProcess::new(direct).unwrap()).await.unwrap();
    let from_upstream = upstream.list_all_tools().await.unwrap();
    let _ = upstream.cancel().await;
    assert_eq!(through_gateway, from_upstream);
    let annotations: Vec<_> = through_gateway
        .iter()
        .map(|t| (t.name.to_string(), t.annotations.clone()))
        .collect();
    assert!(annotations.iter().all(|(_, a)| a.is_some()), "{annotations:?}");
}

/// Run a gateway with extra flags until it exits by itself. Its stdin stays open and silent, so one that got
/// as far as serving would wait on it instead of exiting: a bad config must stop it before that.
fn run_gateway_to_exit(rig: &Rig, flags: &[&str]) -> std::process::Output {
    use std::io::Read;
    let mut cmd = rig.gateway_command_with(flags, "none");
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let _stdin = child.stdin.take();
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!("the gateway did not exit by itself\n{}", rig.logs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
    std::process::Output { status, stdout, stderr }
}

#[test]
fn check_config_prints_each_tool_route() {
    let rig = Rig::with_config_file(EXAMPLE_CONFIG);
    let out = run_gateway_to_exit(&rig, &["--check-config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = |tool: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(tool))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("get_order ").contains(" DIRECT "), "{stdout}");
    assert!(line("find_refund_by_key ").contains(" DIRECT "), "{stdout}");
    let refund = line("refund_order ");
    assert!(refund.contains(" PROTECT "), "{stdout}");
    assert!(refund.contains("provider key -> argument idempotency_key"), "{refund}");
    assert!(refund.contains("reconciles via find_refund_by_key"), "{refund}");
    assert!(refund.contains("quota 500.00"), "{refund}");
}

#[test]
fn check_config_without_an_upstream_checks_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let path = dir.path().join("once.toml");
        std::fs::write(&path, text).unwrap();
        Command::new(env!("CARGO_BIN_EXE_once"))
            .args(["gateway", "--check-config", "--config"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = check(&fast_config(""));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(": ok (give the upstream command after `--`"),
        "{stdout}"
    );
    assert!(
        stdout.contains("refund_order: route from the upstream's annotations"),
        "{stdout}"
    );
    // The policy goes through the component's own check even without an upstream.
    let out = check("[tools.refund_order]\ntimeout = \"10s\"\nlease = \"5s\"\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("lease_ms 5000 is below dispatch_timeout_ms 10000"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn bad_config_is_a_clear_error_at_start() {
    let lookup = r#"lookup = { tool = "find_refund_by_key", args = { idempotency_key = "{key}" }, found = "/found", read_position = "/read_position" }"#;
    let cases = [
        (
            "[tools.refund_ordr]\nroute = \"protect\"\n".to_string(),
            "[tools.refund_ordr]: the upstream has no tool named \"refund_ordr\" (it has: get_order, refund_order, find_refund_by_key)",
        ),
        (
            format!(
                "[tools.refund_order]\nprovider_key = \"argument:idempotency_key\"\n{}\n",
                lookup.replace("\"/found\"", "\"found\"")
            ),
            "[tools.refund_order]: lookup: found: \"found\" is not a JSON pointer: it must start with \"/\"",
        ),
        (
            "[tools.refund_order]\nreconcile = \"required\"\n".to_string(),
            "[tools.refund_order]: reconcile = \"required\" but no lookup is configured",
        ),
        (
            format!(
                "[tools.refund_order]\nprovider_key = \"argument:idempotency_key\"\n{}\n",
                lookup.replace("find_refund_by_key\"", "find_refund\"")
            ),
            "[tools.refund_order]: lookup.tool \"find_refund\" is not a tool of the upstream",
        ),
        (
            format!("[tools.refund_order]\n{lookup}\n"),
            "the lookup reads by {key}, but the provider key never travels to the upstream",
        ),
        (
            "[tools.refund_order]\ntimeout = \"10s\"\nlease = \"5s\"\n".to_string(),
            "[tools.refund_order]: invalid policy: tool refund_order: lease_ms 5000 is below dispatch_timeout_ms 10000",
        ),
    ];
    for (config, expected) in cases {
        let rig = Rig::new(&config);
        let out = run_gateway_to_exit(&rig, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{config}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{config}\nexpected {expected:?} in:\n{stderr}"
        );
        // Nothing was served: the error comes before the client's first byte.
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}
