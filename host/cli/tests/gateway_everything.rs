//! The gateway is transparent: the official MCP reference server
//! (`@modelcontextprotocol/server-everything`, pinned in
//! tests/gateway/everything/package-lock.json) behind a real `once gateway`,
//! driven by the official TypeScript SDK client and by the official Python SDK
//! client. Every feature (capabilities, prompts, resources and subscriptions,
//! completions, logging, progress, sampling, elicitation, roots, list changes,
//! cancellation) must answer through the gateway as it does directly. And a
//! pinned tool that the upstream redefines (announced with
//! `tools/list_changed`) routes BLOCK from that moment.
//!
//! Needs node with `npm ci` run in tests/gateway/everything, and for the Python
//! half `ONCE_PYTHON` pointing at a Python with mcp==2.3.0, so it is ignored by a
//! plain `cargo test`; `.ci/run` installs both and runs it with `--ignored`.

mod gateway_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gateway_common::{outcome, send_call};
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProgressToken, ServerResult};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;

fn everything_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap();
    let dir = root.join("tests/gateway/everything");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/server-everything")
            .exists(),
        "the reference server is not installed: run `npm ci` in {}",
        dir.display()
    );
    dir
}

/// Run one comparison script with `program`; its table goes to the test's output.
fn compare(program: &str, script: &str, ok: &str) {
    let dir = everything_dir();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(program)
        .arg(dir.join(script))
        .arg(env!("CARGO_BIN_EXE_once"))
        .arg(work.path())
        .env_remove("ONCE_DB")
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains(ok), "{stdout}");
    // Every row was measured on both sides; none says the gateway lost it.
    assert!(!stdout.contains("| ✗ |"), "{stdout}");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-cli --test gateway_everything -- --ignored"]
fn the_typescript_sdk_sees_the_reference_server_through_the_gateway_as_directly() {
    compare("node", "compare.mjs", "typescript compare: ok");
}

#[test]
#[ignore = "needs node, `npm ci` in tests/gateway/everything and ONCE_PYTHON with mcp==2.3.0"]
fn the_python_sdk_sees_the_reference_server_through_the_gateway_as_directly() {
    let python = std::env::var("ONCE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    compare(&python, "python_compare.py", "python compare: ok");
}

/// What the client hears: `tools/list_changed` notifications, progress under the token it sent, log messages.
#[derive(Clone, Default)]
struct Listener {
    list_changed: Arc<AtomicUsize>,
    progress: Arc<AtomicUsize>,
    token: Arc<Mutex<Option<ProgressToken>>>,
    logs: Arc<Mutex<Vec<Value>>>,
}

#[allow(deprecated)] // logging: deprecated by a newer protocol revision, which these servers do not speak
impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.fetch_add(1, Ordering::SeqCst);
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        if self.token.lock().unwrap().as_ref() == Some(&params.progress_token) {
            self.progress.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(serde_json::to_value(params).unwrap());
    }
}

/// `once gateway` pinning `transfer` to `pin`, in front of the test server, with a client that counts list changes.
async fn pinned_gateway(work: &Path, pin: &str) -> (RunningService<RoleClient, Listener>, Listener) {
    let config = format!("[tools.transfer]\npin = \"{pin}\"\n");
    gateway(work, &config, &everything_dir().join("test-server.mjs"), &[]).await
}

/// `once gateway` with `config` in front of `node SCRIPT ARGS…`, and a client that counts notifications.
async fn gateway(
    work: &Path,
    config_text: &str,
    script: &Path,
    args: &[&str],
) -> (RunningService<RoleClient, Listener>, Listener) {
    let config = work.join("once.toml");
    std::fs::write(&config, config_text).unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_once"));
    cmd.arg("gateway")
        .arg("--config")
        .arg(&config)
        .arg("--db")
        .arg(work.join("once.db"))
        .args(["--", "node"])
        .arg(script)
        .args(args)
        .env_remove("ONCE_DB")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    // The child lives as long as the test's runtime; kill_on_drop ends it with the test.
    std::mem::forget(child);
    let listener = Listener::default();
    let client = listener.clone().serve((stdout, stdin)).await.unwrap();
    (client, listener)
}

async fn call(client: &RunningService<RoleClient, Listener>, tool: &str) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()))
        .await
        .unwrap()
}

/// A gateway that protects the reference server's long-running tool (read-only by its annotations).
async fn protected_long_running(work: &Path) -> (RunningService<RoleClient, Listener>, Listener) {
    let server = everything_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let config = "[tools.trigger-long-running-operation]\nroute = \"protect\"\n";
    gateway(work, config, &server, &["stdio"]).await
}

fn long_running(seconds: u32) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("trigger-long-running-operation");
    params.arguments = serde_json::json!({"duration": seconds, "steps": 3})
        .as_object()
        .cloned();
    params
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-cli --test gateway_everything -- --ignored"]
async fn a_pinned_tool_that_changes_under_the_gateway_routes_block_from_then_on() {
    let work = tempfile::tempdir().unwrap();
    // A pin nobody reviewed: the engine blocks the tool and names its current fingerprint.
    let (client, _) = pinned_gateway(work.path(), &"0".repeat(64)).await;
    let refused = call(&client, "transfer").await;
    let detail = outcome(&refused)["detail"].as_str().unwrap_or_default().to_string();
    assert_eq!(outcome(&refused)["decision"], "blocked", "{refused:?}");
    let reviewed = detail
        .split("descriptor fingerprint ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("the detail names the fingerprint: {detail}"))
        .to_string();
    let _ = client.cancel().await;

    // Pinned as reviewed: protected and sent.
    let (client, listener) = pinned_gateway(work.path(), &reviewed).await;
    let sent = call(&client, "transfer").await;
    assert_eq!(outcome(&sent)["decision"], "executed", "{sent:?}");
    let heard = listener.list_changed.load(Ordering::SeqCst);

    // The upstream redefines it and says so: the client hears of it, and the next call is refused.
    let upgraded = call(&client, "upgrade").await;
    let said = upgraded
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone());
    assert_eq!(said.as_deref(), Some("upgraded"), "{upgraded:?}");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while listener.list_changed.load(Ordering::SeqCst) == heard {
        assert!(
            std::time::Instant::now() < give_up,
            "tools/list_changed was not relayed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let tools = client.list_all_tools().await.unwrap();
    let transfer = tools.iter().find(|t| t.name == "transfer").unwrap();
    assert_eq!(
        transfer.annotations.as_ref().and_then(|a| a.open_world_hint),
        Some(true)
    );
    let blocked = call(&client, "transfer").await;
    let info = outcome(&blocked);
    assert_eq!(info["decision"], "blocked", "{blocked:?}");
    assert!(
        info["detail"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("pinned {reviewed}")),
        "{info}"
    );
    let _ = client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-cli --test gateway_everything -- --ignored"]
async fn a_protected_call_relays_its_progress_under_the_clients_token() {
    let work = tempfile::tempdir().unwrap();
    let (client, listener) = protected_long_running(work.path()).await;
    // The SDK gives every request a progress token of its own: the one to hear progress under.
    let handle = send_call(client.peer(), long_running(1)).await;
    *listener.token.lock().unwrap() = Some(handle.progress_token.clone());
    let result = match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(result) => result,
        other => panic!("not a tool result: {other:?}"),
    };
    assert_eq!(outcome(&result)["decision"], "executed", "{result:?}");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while listener.progress.load(Ordering::SeqCst) < 3 {
        assert!(
            std::time::Instant::now() < give_up,
            "{} progress notifications",
            listener.progress.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-cli --test gateway_everything -- --ignored"]
async fn a_client_that_cancels_a_sent_protected_call_is_told_it_is_unknown() {
    let work = tempfile::tempdir().unwrap();
    let (client, listener) = protected_long_running(work.path()).await;
    let handle = send_call(client.peer(), long_running(3)).await;
    // Sent: the upstream reports its first step.
    *listener.token.lock().unwrap() = Some(handle.progress_token.clone());
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while listener.progress.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < give_up, "no progress from the upstream");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    handle.cancel(Some("the agent gave up".to_string())).await.unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let told = loop {
        let logs = listener.logs.lock().unwrap().clone();
        if let Some(log) = logs.into_iter().find(|l| l["logger"] == "once") {
            break log;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the client was not told what became of its call"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let text = told["data"]["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("cancelled by the client: UNKNOWN: trigger-long-running-operation"),
        "{told}"
    );
    assert_eq!(told["data"]["once/outcome"]["decision"], "unknown", "{told}");
    assert_eq!(told["level"], "warning");
    let _ = client.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-cli --test gateway_everything -- --ignored"]
async fn a_clients_cancellation_of_a_direct_call_reaches_the_upstream() {
    let work = tempfile::tempdir().unwrap();
    let (client, _) = gateway(work.path(), "", &everything_dir().join("test-server.mjs"), &[]).await;
    let handle = send_call(client.peer(), CallToolRequestParams::new("wait")).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    handle.cancel(Some("the agent gave up".to_string())).await.unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = call(&client, "was-cancelled").await;
        if answer
            .content
            .first()
            .and_then(|c| c.as_text())
            .is_some_and(|t| t.text == "true")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the upstream never saw the cancellation: {answer:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = client.cancel().await;
}
