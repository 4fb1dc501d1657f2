//! The gateway is transparent: the official MCP reference server
//! (`@modelcontextprotocol/server-everything`, pinned in
//! tests/gateway/everything/package-lock.json) behind a real `once gateway`,
//! driven by the official TypeScript SDK client and by the official Python SDK
//! client, over stdio and over Streamable HTTP (`--listen`). Every feature
//! (capabilities, prompts, resources and subscriptions, completions, logging,
//! progress, sampling, elicitation, roots, list changes, cancellation, MCP
//! 2025-11-25 tasks) must answer through the gateway as it does directly, but
//! for what stateless HTTP cannot carry, which must differ exactly as
//! documented. A pinned tool that the upstream redefines (announced with
//! `tools/list_changed`) routes BLOCK from that moment. A protected tool is
//! never run as the client's task: a call that asks for one is refused and
//! nothing is claimed or sent; a protected tool the upstream runs only as a
//! task runs as the gateway's own task, its result the recorded outcome; when
//! that task outlives the wait and the tool's `max_in_flight`, the operation
//! stays UNKNOWN while it works and is never started twice
//! (`task-server.mjs`, whose task cannot be stopped, counts the starts).
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

/// Run one comparison script with `program` over `mode` (stdio or http); its table goes to the test's output.
fn compare(program: &str, script: &str, mode: &str, ok: &str) {
    let dir = everything_dir();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(program)
        .arg(dir.join(script))
        .arg(gateway_common::once_exe())
        .arg(work.path())
        .arg(mode)
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
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
fn the_typescript_sdk_sees_the_reference_server_through_the_gateway_as_directly() {
    compare("node", "compare.mjs", "stdio", "typescript compare (stdio): ok");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
fn the_typescript_sdk_over_streamable_http_sees_what_the_docs_say() {
    compare("node", "compare.mjs", "http", "typescript compare (http): ok");
}

fn python() -> String {
    std::env::var("ONCE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

#[test]
#[ignore = "needs node, `npm ci` in tests/gateway/everything and ONCE_PYTHON with mcp==2.3.0"]
fn the_python_sdk_sees_the_reference_server_through_the_gateway_as_directly() {
    compare(&python(), "python_compare.py", "stdio", "python compare (stdio): ok");
}

#[test]
#[ignore = "needs node, `npm ci` in tests/gateway/everything and ONCE_PYTHON with mcp==2.3.0"]
fn the_python_sdk_over_streamable_http_sees_what_the_docs_say() {
    compare(&python(), "python_compare.py", "http", "python compare (http): ok");
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
    let mut cmd = tokio::process::Command::new(gateway_common::once_exe());
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
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
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
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
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
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
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
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
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

/// A client that speaks JSON-RPC lines to `once gateway` itself, to see what an SDK's typed model would
/// hide (a tool's `execution`, a task's notifications, error codes). It answers `roots/list` itself.
struct RawClient {
    stdin: tokio::process::ChildStdin,
    messages: tokio::sync::mpsc::UnboundedReceiver<Value>,
    /// Every notification heard so far.
    notifications: Vec<Value>,
    next: u64,
    _child: tokio::process::Child,
}

impl RawClient {
    /// `once gateway --config CONFIG --db WORK/once.db -- node <server-everything> stdio`, initialized.
    async fn start(work: &Path, config_text: &str) -> (RawClient, Value) {
        use tokio::io::AsyncBufReadExt;
        let config = work.join("once.toml");
        std::fs::write(&config, config_text).unwrap();
        let server = everything_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        let mut child = tokio::process::Command::new(gateway_common::once_exe())
            .arg("gateway")
            .arg("--config")
            .arg(&config)
            .arg("--db")
            .arg(work.join("once.db"))
            .args(["--", "node"])
            .arg(server)
            .arg("stdio")
            .env_remove("ONCE_DB")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let (sender, messages) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("a JSON-RPC message per line");
                if sender.send(message).is_err() {
                    break;
                }
            }
        });
        let mut client = RawClient {
            stdin,
            messages,
            notifications: Vec::new(),
            next: 1,
            _child: child,
        };
        let init = client
            .request(
                "initialize",
                serde_json::json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}},
                    "clientInfo": {"name": "raw", "version": "1"}}),
            )
            .await;
        client
            .send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        (client, init)
    }

    async fn send(&mut self, message: Value) {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The whole response to `method` (its `result` or its `error`), hearing notifications on the way.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(request).await;
        loop {
            let message = tokio::time::timeout(std::time::Duration::from_secs(30), self.messages.recv())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method}"))
                .unwrap_or_else(|| panic!("the gateway closed its stdout before answering {method}"));
            match (message.get("id"), message.get("method")) {
                (Some(i), None) if *i == serde_json::json!(id) => return message,
                (Some(i), Some(m)) if m == "roots/list" => {
                    let answer = serde_json::json!({"jsonrpc": "2.0", "id": i, "result": {"roots": []}});
                    self.send(answer).await;
                }
                (None, Some(_)) => self.notifications.push(message),
                _ => {}
            }
        }
    }

    /// Whether a notification `method` has been heard so far.
    fn heard(&self, method: &str) -> bool {
        self.notifications.iter().any(|n| n["method"] == method)
    }

    /// The `execution` the client sees for `tool`.
    async fn execution(&mut self, tool: &str) -> Value {
        let listed = self.request("tools/list", serde_json::json!({})).await;
        listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == tool)
            .unwrap_or_else(|| panic!("{tool} is not listed: {listed}"))["execution"]
            .clone()
    }
}

/// The records of a ledger, one `(key, state)` each, as `once ledger list` prints them.
fn records(db: &Path) -> Vec<(String, String)> {
    let out = Command::new(gateway_common::once_exe())
        .args(["ledger", "list", "--db"])
        .arg(db)
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields[1].to_string(), fields[2].to_string())
        })
        .collect()
}

/// The reference server's tool that runs only as a task; by its annotations (not read-only) once protects it.
const TASK_TOOL: &str = "simulate-research-query";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
async fn a_protected_tool_called_as_a_task_is_refused_and_nothing_is_claimed_or_sent() {
    let work = tempfile::tempdir().unwrap();
    let (mut client, init) = RawClient::start(work.path(), "").await;
    // The gateway declares the upstream's tasks: DIRECT tools may be called as tasks.
    assert_eq!(
        init["result"]["capabilities"]["tasks"],
        serde_json::json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "{init}"
    );
    // A tool once protects is offered without tasks.
    assert_eq!(
        client.execution(TASK_TOOL).await,
        serde_json::json!({"taskSupport": "forbidden"})
    );

    let params = serde_json::json!({"name": TASK_TOOL, "arguments": {"topic": "python"}, "task": {"ttl": 60000}});
    let refused = client.request("tools/call", params).await;
    assert_eq!(refused["error"]["code"], -32601, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("{TASK_TOOL} is protected by once (routed PROTECT)"))
            && message.contains("Nothing was sent")
            && message.contains(&format!("Call {TASK_TOOL} without `task`")),
        "{refused}"
    );
    // Never forwarded: the upstream holds no task and heard of none; once claimed nothing.
    let listed = client.request("tasks/list", serde_json::json!({})).await;
    assert_eq!(listed["result"]["tasks"], serde_json::json!([]), "{listed}");
    assert!(
        !client.heard("notifications/tasks/status"),
        "{:?}",
        client.notifications
    );
    assert_eq!(records(&work.path().join("once.db")), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
async fn a_protected_tool_the_upstream_runs_only_as_a_task_runs_as_the_gateways_own_task() {
    let work = tempfile::tempdir().unwrap();
    let (mut client, _) = RawClient::start(work.path(), "").await;
    let params = serde_json::json!({"name": TASK_TOOL, "arguments": {"topic": "python"}});
    // Called without a task (the upstream alone would refuse that): the gateway records the intent, creates
    // the upstream's task, waits for its result, and that result is the outcome.
    let ran = client.request("tools/call", params.clone()).await;
    let result = &ran["result"];
    assert!(
        result["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("# Research Report: python")),
        "{ran}"
    );
    assert_eq!(result["_meta"]["once/outcome"]["decision"], "executed", "{ran}");
    let key = result["_meta"]["once/outcome"]["operation"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        records(&work.path().join("once.db")),
        vec![(key, "confirmed".to_string())]
    );
    // The task is the gateway's: the client hears no status of it and does not find it listed.
    assert!(
        !client.heard("notifications/tasks/status"),
        "{:?}",
        client.notifications
    );
    let listed = client.request("tasks/list", serde_json::json!({})).await;
    assert_eq!(listed["result"]["tasks"], serde_json::json!([]), "{listed}");
    // The same call again is the same operation: answered from the ledger, no second task.
    let again = client.request("tools/call", params).await;
    assert_eq!(
        again["result"]["_meta"]["once/outcome"]["decision"], "replayed",
        "{again}"
    );
}

/// How long the test server's refund task works before it makes its effect.
const TASK_MS: u64 = 6_000;

/// `refund` of `task-server.mjs` runs only as a task, for longer (6 s) than the gateway waits for it (1 s) plus
/// its `max_in_flight` (1 s), and cannot be stopped (`tasks/cancel` is refused). A read of the provider while it
/// works finds no refund: were that read as absent, the owed dispatch would start a second task and make a
/// second refund. The operation must stay UNKNOWN while the task works and end as the one refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
async fn a_protected_task_that_outlives_max_in_flight_is_unknown_while_it_works_and_never_started_twice() {
    let work = tempfile::tempdir().unwrap();
    let config = "in_flight_wait = \"500ms\"\n[tools.refund]\ntimeout = \"1s\"\nmax_in_flight = \"1s\"\nreconcile_interval = \"100ms\"\n\
                  provider_key = \"argument:idempotency_key\"\neffect_fields = [\"/order_id\"]\n\
                  lookup = { tool = \"find_refund\", args = { idempotency_key = \"{key}\" }, found = \"/found\", \
                  receipt = \"/refund\", read_position = \"sent\" }\n";
    let script = everything_dir().join("task-server.mjs");
    let (client, _) = gateway(work.path(), config, &script, &[&TASK_MS.to_string()]).await;
    let started = std::time::Instant::now();
    let mut params = CallToolRequestParams::new("refund");
    params.arguments = serde_json::json!({"order_id": "o-1"}).as_object().cloned();

    // The call, and the same call again until it settles: UNKNOWN (or in flight) while the task works, never
    // a new effect. A call waits at most `in_flight_wait` (0.5 s) for the outcome, so the task outlives it.
    let mut unsettled = 0;
    let last = loop {
        let again = client.call_tool(params.clone()).await.unwrap();
        if !gateway_common::settling(&again) {
            break again;
        }
        unsettled += 1;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            started.elapsed() < std::time::Duration::from_millis(TASK_MS * 4),
            "never settled: {again:?}"
        );
    };
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(TASK_MS),
        "settled before the task ended: {last:?}"
    );
    assert!(unsettled > 0, "the call answered UNKNOWN while the task worked");
    assert_eq!(outcome(&last)["decision"], "replayed", "{last:?}");
    let text: String = last
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.as_str())
        .collect();
    assert!(text.contains("re_1"), "the one refund: {last:?}");
    // Long enough for a second task, had one been started when the first was read as absent, to act.
    tokio::time::sleep(std::time::Duration::from_millis(TASK_MS * 2).saturating_sub(started.elapsed())).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
    let effects = call(&client, "effects").await;
    let counted: Value = serde_json::from_str(&effects.content[0].as_text().unwrap().text).unwrap();
    assert_eq!(
        counted,
        serde_json::json!({"starts": 1, "refunds": 1}),
        "one task, one refund"
    );
    let _ = client.cancel().await;
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_everything -- --ignored"]
fn over_http_no_tasks_are_declared_and_a_tool_that_runs_only_as_one_is_run_to_its_end() {
    use std::io::BufRead;
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("once.toml");
    std::fs::write(&config, format!("[tools.{TASK_TOOL}]\nroute = \"direct\"\n")).unwrap();
    let server = everything_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let mut gateway = Command::new(gateway_common::once_exe())
        .args(["gateway", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--db")
        .arg(work.path().join("once.db"))
        .args(["--", "node"])
        .arg(server)
        .arg("stdio")
        .env_remove("ONCE_DB")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(gateway.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .rsplit(' ')
        .next()
        .filter(|u| u.starts_with("http://"))
        .unwrap_or_else(|| panic!("first line: {first:?}"))
        .to_string();
    let post = |body: Value| gateway_common::http::post(&url, None, &[], &body.to_string());

    let init = post(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    assert!(
        init.result()["capabilities"].get("tasks").is_none(),
        "{:?}",
        init.result()
    );
    let listed = post(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {}}));
    let refused = listed.message.clone().unwrap_or_default();
    assert_eq!(refused["error"]["code"], -32601, "{refused}");
    // A `task` is ignored (none is declared); the tool, which the upstream runs only as a task, runs as the
    // gateway's own and its result is the answer.
    let called = post(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": TASK_TOOL, "arguments": {"topic": "python"}, "task": {"ttl": 60000}}}),
    );
    assert!(
        called.text().starts_with("# Research Report: python"),
        "{:?}",
        called.message
    );
    let _ = Command::new("kill").arg(gateway.id().to_string()).status();
    assert!(gateway.wait().unwrap().success(), "SIGTERM ends the gateway cleanly");
}
