//! The gateway in front of an upstream on the official TypeScript server SDK
//! v2 (`@modelcontextprotocol/server` 2.4.0, pinned in
//! tests/gateway/everything/package-lock.json): `sdk2-server.mjs`, which
//! speaks MCP 2026-07-28 (per-request `_meta` envelope) beside the 2025
//! revisions, as a stdio child and at a URL. Driven by an rmcp client: a
//! protected refund runs once, its replay sends nothing, a DIRECT read, a
//! prompt and a resource pass through, and a lost reply is reconciled by the
//! lookup without a second send. At a URL the gateway's own requests go in
//! 2026-07-28 with its envelope (the server records each refund's era), and a
//! 2026-07-28 client interleaved with a 2025-era one on one `--listen`
//! gateway each get their answers in their own revision: neither switches
//! the revision the other's requests are sent in. Effects are counted in the
//! server's own file.
//!
//! Needs node with `npm ci` run in tests/gateway/everything, so it is ignored
//! by a plain `cargo test`; `.ci/run` runs it with `--ignored`.

mod gateway_common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gateway_common::http::{Listening, post};
use gateway_common::{Rig, Session, outcome, settling};
use rmcp::model::{CallToolResult, GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};

/// The refund protected, its provider key an argument, the server's `find_refund` its lookup.
const CONFIG: &str = r#"
sweep_interval = "50ms"

[tools.refund]
route = "protect"
effect_fields = ["/order_id", "/amount"]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"
timeout = "1s"
max_in_flight = "500ms"
reconcile_interval = "100ms"
reconcile = "required"
lookup = { tool = "find_refund", args = { idempotency_key = "{key}" }, found = "/found", receipt = "/refund", read_position = "sent" }

[tools.refund_confirmed]
route = "protect"
effect_fields = ["/order_id", "/amount"]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"
lookup = { tool = "find_refund", args = { idempotency_key = "{key}" }, found = "/found", receipt = "/refund", read_position = "sent" }

[tools.refund_sealed]
route = "protect"
effect_fields = ["/order_id", "/amount"]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"

[tools.refund_header]
route = "protect"
effect_fields = ["/order_id", "/amount"]
provider_key = "argument:idempotency_key"
on_tool_error = "rejected"
"#;

fn server_script() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap();
    let dir = root.join("tests/gateway/everything");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/server").exists(),
        "the v2 server SDK is not installed: run `npm ci` in {}",
        dir.display()
    );
    dir.join("sdk2-server.mjs")
}

/// The server's effects file: one JSON object per refund it made.
fn effects_file(rig: &Rig) -> PathBuf {
    rig.dir.path().join("refunds.jsonl")
}

/// The refunds the server made for `order`.
fn refunds_of(rig: &Rig, order: &str) -> Vec<Value> {
    refunds(rig).into_iter().filter(|r| r["order_id"] == order).collect()
}

fn refunds(rig: &Rig) -> Vec<Value> {
    std::fs::read_to_string(effects_file(rig))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `sdk2-server.mjs --http` on a free port; killed when dropped.
struct Sdk2Http {
    child: Child,
    url: String,
}

impl Sdk2Http {
    fn start(rig: &Rig) -> Sdk2Http {
        let mut child = Command::new("node")
            .arg(server_script())
            .arg(effects_file(rig))
            .arg("--http")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(rig.dir.path().join("sdk2-server.log")).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("sdk2-server names its address first, not {line:?}"))
            .to_string();
        Sdk2Http { child, url }
    }
}

impl Drop for Sdk2Http {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `once gateway` over the server as a stdio child.
fn stdio_gateway(rig: &Rig) -> Command {
    let mut cmd = Command::new(gateway_common::once_exe());
    cmd.arg("gateway")
        .arg("--config")
        .arg(&rig.config)
        .arg("--db")
        .arg(&rig.db)
        .args(["--", "node"])
        .arg(server_script())
        .arg(effects_file(rig));
    cmd.env_remove("ONCE_DB").env("ONCE_LOG", "once=info");
    cmd
}

fn refund_args(order: &str) -> Value {
    json!({"order_id": order, "amount": 25.5})
}

/// A tool result's JSON: its structured content, else its first text that is JSON.
fn payload(result: &CallToolResult) -> Value {
    if let Some(v) = &result.structured_content {
        return v.clone();
    }
    result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .find_map(|t| serde_json::from_str(&t.text).ok())
        .unwrap_or(Value::Null)
}

/// The rows every upstream form must pass: a protected refund once, its replay, a DIRECT read, a prompt
/// and a resource. The refund is asked for in `era` (the revision the gateway speaks upstream for its own
/// requests); the DIRECT read of this 2025-era client in `legacy`.
async fn protected_once_replay_direct_prompt_resource(rig: &Rig, session: &Session, era: &str) {
    let first = session.call("refund", refund_args("A-1"), Some("op-1")).await;
    assert_eq!(outcome(&first)["decision"], "executed", "{first:?}\n{}", rig.logs());
    let made = refunds_of(rig, "A-1");
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["order_id"], "A-1");
    assert_eq!(made[0]["era"], era, "{made:?}");
    assert_eq!(payload(&first)["refund_id"], made[0]["refund_id"], "{first:?}");

    let again = session.call("refund", refund_args("A-1"), Some("op-1")).await;
    assert_eq!(outcome(&again)["decision"], "replayed", "{again:?}");
    assert_eq!(payload(&again)["refund_id"], made[0]["refund_id"], "{again:?}");
    assert_eq!(refunds_of(rig, "A-1").len(), 1, "a replay sends nothing");

    let count = session.call("refund_count", json!({}), None).await;
    // DIRECT: the upstream's own answer, nothing of once's added.
    assert_eq!(outcome(&count), Value::Null, "{count:?}");
    assert_eq!(payload(&count)["refunds"], 1, "{count:?}");
    assert_eq!(payload(&count)["era"], "legacy", "{count:?}");

    let prompt = session
        .client
        .get_prompt(GetPromptRequestParams::new("refund-note"))
        .await
        .unwrap();
    let said = serde_json::to_value(&prompt.messages[0].content).unwrap();
    assert_eq!(
        said["text"], "Tell the customer the refund is on its way.",
        "{prompt:?}"
    );
    let resource = session
        .client
        .read_resource(ReadResourceRequestParams::new("refunds://policy"))
        .await
        .unwrap();
    let contents = serde_json::to_value(&resource.contents[0]).unwrap();
    assert_eq!(contents["text"], "Refunds within 30 days.", "{resource:?}");
}

/// The same call until the engine no longer answers it as unsettled.
async fn settled(rig: &Rig, session: &Session, order: &str, key: &str) -> CallToolResult {
    let mut result = session.call("refund", refund_args(order), Some(key)).await;
    let give_up = Instant::now() + Duration::from_secs(20);
    while settling(&result) {
        assert!(Instant::now() < give_up, "never settled: {result:?}\n{}", rig.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
        result = session.call("refund", refund_args(order), Some(key)).await;
    }
    result
}

/// The first refund's reply is lost (the server made it and never answers): the attempt is ambiguous, the
/// lookup confirms the refund (within the call, or in the background while the same call again waits),
/// and the call is answered from what the lookup read. The server made exactly one refund.
async fn a_lost_reply_is_reconciled_by_the_lookup(rig: &Rig, session: &Session) {
    let settled = settled(rig, session, "lose-reply-1", "op-lost").await;
    assert_eq!(outcome(&settled)["decision"], "replayed", "{settled:?}\n{}", rig.logs());
    assert_eq!(outcome(&settled)["confirmed_by"], "provider", "{settled:?}");
    // Which of the two the answer came from is in `via`, and the text says it in that path's words: the
    // provider's read answered this very call (`provider`), or the background read had confirmed the record
    // before the call came again, which then replays it under its key (`key`).
    let said = gateway_common::text(&settled);
    let via = outcome(&settled)["via"].clone();
    let expected = match via.as_str() {
        Some("provider") => "its reply was lost; once confirmed it by reading find_refund,",
        Some("key") => {
            "already ran under this operation key (once confirmed it by reading find_refund after its reply was lost)"
        }
        _ => panic!("a lost reply confirmed by the lookup replays via provider or key, not {via}: {settled:?}"),
    };
    assert!(said.contains(expected), "via {via}: {said}");
    let trail = rig.audit(&settled);
    assert!(
        trail.iter().any(|e| e.starts_with("reconciled-confirmed")),
        "{trail:#?}"
    );
    let made = refunds_of(rig, "lose-reply-1");
    assert_eq!(made.len(), 1, "sent once, never again: {made:?}");
    assert_eq!(payload(&settled)["refund_id"], made[0]["refund_id"], "{settled:?}");
}

/// The first refund is lost before it acted (no effect, no answer): the lookup finds nothing once the
/// attempt can no longer commit, and the owed dispatch (the gateway's own request, in `era`) makes the
/// refund, exactly once.
async fn an_owed_dispatch_is_sent_once_when_the_lookup_finds_nothing(rig: &Rig, session: &Session, era: &str) {
    let settled = settled(rig, session, "drop-1", "op-owed").await;
    let decision = outcome(&settled)["decision"].clone();
    assert!(
        decision == "executed" || decision == "replayed",
        "{settled:?}\n{}",
        rig.logs()
    );
    let trail = rig.audit(&settled);
    assert!(trail.iter().any(|e| e.starts_with("reconciled-absent")), "{trail:#?}");
    let made = refunds_of(rig, "drop-1");
    assert_eq!(made.len(), 1, "the owed dispatch made it, once: {made:?}");
    assert_eq!(made[0]["era"], era, "{made:?}");
    assert_eq!(payload(&settled)["refund_id"], made[0]["refund_id"], "{settled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdk2_upstream -- --ignored"]
async fn a_v2_sdk_server_as_a_stdio_child_is_protected_and_passed_through() {
    let rig = Rig::new(CONFIG);
    let session = rig.connect_command(stdio_gateway(&rig), 0).await;
    // A stdio connection is pinned to the revision it opened with: 2025-11-25, the gateway's requests too.
    protected_once_replay_direct_prompt_resource(&rig, &session, "legacy").await;
    a_lost_reply_is_reconciled_by_the_lookup(&rig, &session).await;
    an_owed_dispatch_is_sent_once_when_the_lookup_finds_nothing(&rig, &session, "legacy").await;
    assert!(session.close().await.success(), "{}", rig.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdk2_upstream -- --ignored"]
async fn a_v2_sdk_server_at_a_url_gets_the_gateways_requests_in_2026_07_28() {
    let rig = Rig::new(CONFIG);
    let server = Sdk2Http::start(&rig);
    let session = rig.connect_url(&server.url, 0).await;
    // The gateway's own request carries its envelope: the server took the refund as a 2026-07-28 request
    // (it refuses one that names no envelope under that revision), while this 2025-era client's DIRECT
    // read stays in its own revision.
    protected_once_replay_direct_prompt_resource(&rig, &session, "modern").await;
    // The lookup is the gateway's request too: it reads in 2026-07-28 and confirms the lost reply.
    a_lost_reply_is_reconciled_by_the_lookup(&rig, &session).await;
    assert_eq!(refunds_of(&rig, "lose-reply-1")[0]["era"], "modern");
    an_owed_dispatch_is_sent_once_when_the_lookup_finds_nothing(&rig, &session, "modern").await;
    assert!(session.close().await.success(), "{}", rig.logs());
}

/// `once gateway --listen` in front of `url`; killed when dropped.
fn listen_in_front_of(rig: &Rig, upstream: &str) -> Listening {
    let mut cmd = rig.url_gateway_command(upstream);
    cmd.args(["--listen", "127.0.0.1:0"]);
    rig.spawn_listening(cmd, 0)
}

/// Two clients of one `--listen` gateway: one speaks 2026-07-28 (every request carries the envelope and
/// names its revision in `MCP-Protocol-Version`), the other a 2025 revision (neither).
struct Client<'a> {
    gateway: &'a Listening,
    modern: bool,
    next: u64,
}

impl Client<'_> {
    fn request(&mut self, method: &str, name: Option<&str>, mut params: Value) -> Value {
        self.next += 1;
        let mut headers = Vec::new();
        if self.modern {
            params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
            params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
            params["_meta"]["io.modelcontextprotocol/clientInfo"] = json!({"name": "modern", "version": "1"});
            headers.push(("MCP-Protocol-Version", "2026-07-28"));
            headers.push(("Mcp-Method", method));
            if let Some(name) = name {
                headers.push(("Mcp-Name", name));
            }
        }
        let body = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        let answer = post(&self.gateway.url, None, &headers, &body.to_string());
        let message = answer
            .message
            .unwrap_or_else(|| panic!("no answer to {method} ({}): {}", answer.status, answer.body));
        let result = message
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method} failed for the {} client: {message}", self.era()));
        // Each answer in its client's revision: 2026-07-28 names the result's type, the 2025 ones do not know it.
        let expected = if self.modern { json!("complete") } else { Value::Null };
        assert_eq!(
            result["resultType"],
            expected,
            "{method} to the {} client: {result}",
            self.era()
        );
        result
    }

    fn era(&self) -> &'static str {
        if self.modern { "modern" } else { "legacy" }
    }

    fn call(&mut self, tool: &str, args: Value, key: Option<&str>) -> Value {
        let mut params = json!({"name": tool, "arguments": args});
        if let Some(key) = key {
            params["_meta"] = json!({"once/key": key});
        }
        self.request("tools/call", Some(tool), params)
    }

    /// A DIRECT read: the server says which revision the request came in.
    fn count(&mut self) -> Value {
        let result = self.call("refund_count", json!({}), None);
        let payload = result["structuredContent"].clone();
        assert_eq!(payload["era"], self.era(), "{result}");
        payload
    }
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdk2_upstream -- --ignored"]
fn a_modern_and_a_legacy_client_interleaved_on_one_url_upstream_each_keep_their_revision() {
    let rig = Rig::new(CONFIG);
    let server = Sdk2Http::start(&rig);
    let gateway = listen_in_front_of(&rig, &server.url);
    let mut modern = Client {
        gateway: &gateway,
        modern: true,
        next: 0,
    };
    let mut legacy = Client {
        gateway: &gateway,
        modern: false,
        next: 100,
    };
    // Each DIRECT read reaches the server in its client's revision, whatever the other sent just before.
    assert_eq!(legacy.count()["refunds"], 0);
    assert_eq!(modern.count()["refunds"], 0);
    assert_eq!(legacy.count()["refunds"], 0);
    let prompt = legacy.request("prompts/get", Some("refund-note"), json!({"name": "refund-note"}));
    assert_eq!(
        prompt["messages"][0]["content"]["text"],
        "Tell the customer the refund is on its way."
    );
    let resource = modern.request(
        "resources/read",
        Some("refunds://policy"),
        json!({"uri": "refunds://policy"}),
    );
    assert_eq!(resource["contents"][0]["text"], "Refunds within 30 days.", "{resource}");
    let resource = legacy.request("resources/read", None, json!({"uri": "refunds://policy"}));
    assert_eq!(resource["contents"][0]["text"], "Refunds within 30 days.", "{resource}");

    // Protected refunds are the gateway's requests: in 2026-07-28 with its envelope, whichever client asked.
    let by_modern = modern.call("refund", refund_args("M-1"), Some("op-modern"));
    assert_eq!(
        by_modern["_meta"]["once/outcome"]["decision"],
        "executed",
        "{by_modern}\n{}",
        rig.logs()
    );
    let by_legacy = legacy.call("refund", refund_args("L-1"), Some("op-legacy"));
    assert_eq!(
        by_legacy["_meta"]["once/outcome"]["decision"],
        "executed",
        "{by_legacy}\n{}",
        rig.logs()
    );
    assert_eq!(modern.count()["refunds"], 2);
    assert_eq!(legacy.count()["refunds"], 2);
    // The same calls again replay: nothing more is sent.
    let replayed = legacy.call("refund", refund_args("M-1"), Some("op-modern"));
    assert_eq!(replayed["_meta"]["once/outcome"]["decision"], "replayed", "{replayed}");
    let replayed = modern.call("refund", refund_args("L-1"), Some("op-legacy"));
    assert_eq!(replayed["_meta"]["once/outcome"]["decision"], "replayed", "{replayed}");

    let made = refunds(&rig);
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made.iter().all(|r| r["era"] == "modern"), "{made:?}");
    let orders: Vec<&str> = made.iter().map(|r| r["order_id"].as_str().unwrap()).collect();
    assert_eq!(orders, ["M-1", "L-1"]);
}

/// The questions `refund_confirmed` asked (sdk2-server.mjs writes one line to EFFECTS.asked for each).
fn questions(rig: &Rig) -> usize {
    std::fs::read_to_string(rig.dir.path().join("refunds.jsonl.asked"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Run the client script `script` (beside sdk2-server.mjs) as `node SCRIPT ONCE CONFIG DB ARGS…`: the JSON
/// line it prints of what its SDK accepted (a result the SDK rejects fails the script, and so the test).
fn node_client(rig: &Rig, script: &str, args: &[&str]) -> Value {
    let out = Command::new("node")
        .arg(server_script().with_file_name(script))
        .arg(gateway_common::once_exe())
        .arg(&rig.config)
        .arg(&rig.db)
        .args(args)
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{script} {args:?} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{script} printed {stdout:?}: {e}\n{stderr}"))
}

/// `rounds-client.mjs` (the TypeScript client 2.4.0 in `era`) through a stdio gateway on `url`: its answers.
fn rounds_client(rig: &Rig, url: &str, era: &str) -> Value {
    node_client(rig, "rounds-client.mjs", &[url, era])
}

/// A protected tool that asks its client first, asked through a stdio gateway of a client in `era`: the
/// question reached the client once, the answered round ran exactly once under the same operation (its
/// answers are not part of the operation) as the second attempt, the asking round is recorded as a
/// rejection that did nothing, never as unknown, and the same call again replays.
fn asked_once_then_run_once(era: &str) {
    let rig = Rig::new(CONFIG);
    let upstream = Sdk2Http::start(&rig);
    let answers = rounds_client(&rig, &upstream.url, era);
    assert_eq!(answers["asked"], 1, "the client was asked once: {answers}");
    let first = &answers["first"];
    assert_eq!(first["_meta"]["once/outcome"]["decision"], "executed", "{first}");
    assert_eq!(
        first["_meta"]["once/outcome"]["attempt"], 2,
        "the answered round is the second attempt: {first}"
    );
    assert_eq!(first["structuredContent"]["refund_id"], "re_1", "{first}");
    let again = &answers["again"];
    assert_eq!(again["_meta"]["once/outcome"]["decision"], "replayed", "{again}");
    assert_eq!(again["structuredContent"]["refund_id"], "re_1", "{again}");
    let made = refunds(&rig);
    assert_eq!(made.len(), 1, "exactly one refund: {made:?}");
    assert_eq!(
        made[0]["era"], "modern",
        "the gateway's requests go in 2026-07-28: {made:?}"
    );
    assert_eq!(questions(&rig), 1, "one question, never asked again by a resend");
    let ledger = Command::new(gateway_common::once_exe())
        .args(["ledger", "show", "confirm-77", "--db", &rig.db])
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&ledger.stdout);
    assert!(
        shown.contains("finish-rejected"),
        "the asking round is a rejection:\n{shown}"
    );
    assert!(!shown.contains("unknown"), "nothing was recorded as unknown:\n{shown}");
}

/// MCP 2026-07-28's multi-round-trip input through a protected tool, to a client on 2026-07-28 (the
/// TypeScript SDK in its discover mode): the question is relayed as the upstream wrote it, and the client
/// calls again with its answer.
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn a_protected_tool_that_asks_a_2026_07_28_client_first_runs_once_after_the_answer() {
    asked_once_then_run_once("modern");
}

/// The same to a client on 2025-11-25 (the TypeScript SDK in legacy mode, with the elicitation
/// capability): it cannot take the question as a result, so the gateway asks it as `elicitation/create`
/// and runs the answering round itself.
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn a_protected_tool_that_asks_a_legacy_client_first_is_asked_by_the_gateway_and_runs_once() {
    asked_once_then_run_once("legacy");
}

/// A tool that would ask for input, called for clients that declared no capability for the question: a
/// 2025-11-25 client on stdio without elicitation (the gateway's envelope upstream is its capabilities),
/// and over `--listen` a 2025-era client (the gateway declares none there) and a 2026-07-28 client that
/// declared none. The server refuses before running anything (MCP 2026-07-28's -32021, missing client
/// capability), so each call is a rejection that did nothing: never unknown, no operator, no lookup, no
/// owed dispatch, no refund.
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn a_tool_refused_for_a_missing_client_capability_did_nothing_and_is_not_unknown() {
    let rig = Rig::new(CONFIG);
    let upstream = Sdk2Http::start(&rig);
    let answers = rounds_client(&rig, &upstream.url, "mute");
    let gateway = listen_in_front_of(&rig, &upstream.url);
    let mut legacy = Client {
        gateway: &gateway,
        modern: false,
        next: 100,
    };
    let mut modern = Client {
        gateway: &gateway,
        modern: true,
        next: 0,
    };
    let over_http = [
        (
            legacy.call("refund_confirmed", refund_args("L-1"), Some("ask-legacy")),
            "ask-legacy",
        ),
        (
            modern.call("refund_confirmed", refund_args("M-1"), Some("ask-modern")),
            "ask-modern",
        ),
    ];
    let on_stdio = [
        (answers["first"].clone(), "confirm-77"),
        (answers["again"].clone(), "confirm-77"),
    ];
    for (answer, key) in on_stdio.iter().chain(&over_http) {
        let outcome = &answer["_meta"]["once/outcome"];
        assert_eq!(outcome["decision"], "rejected", "{answer}\n{}", rig.logs());
        assert_eq!(outcome["effect"], "none", "nothing was done: {answer}");
        let ledger = Command::new(gateway_common::once_exe())
            .args(["ledger", "show", key, "--db", &rig.db])
            .env_remove("ONCE_DB")
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&ledger.stdout);
        assert!(!shown.contains("unknown"), "nothing was recorded as unknown:\n{shown}");
    }
    assert_eq!(answers["asked"], 0, "{answers}");
    assert!(refunds(&rig).is_empty(), "no refund: {:?}", refunds(&rig));
}

/// One `tools/call` of `tool` for `order` on 2026-07-28 (with the elicitation capability), raw over
/// HTTP to `gateway`, with `extra` params (answers): the JSON-RPC message it got.
fn asking_call(gateway: &Listening, id: u64, tool: &str, order: &str, extra: Value) -> Value {
    let mut params = json!({"name": tool, "arguments": refund_args(order), "_meta": {
        "once/key": format!("op-{order}"),
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "asked", "version": "1"},
    }});
    if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let headers = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", tool),
    ];
    let answer = post(&gateway.url, None, &headers, &body.to_string());
    answer
        .message
        .unwrap_or_else(|| panic!("{}: {}", answer.status, answer.body))
}

/// An answer belongs to the call it answers. The upstream keeps the refund it will make in its
/// `requestState`; a client that mixes up two pending calls' states must not make operation A refund B's
/// order (A recorded executed with B's refund, then B refunded again: two refunds of B). The gateway
/// relays each state sealed to its call and refuses an answer sealed for another, before anything is sent;
/// so it does a state it never relayed. Each call answered with its own state refunds its own order once.
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn an_answer_carries_only_the_request_state_relayed_for_its_own_call() {
    let rig = Rig::new(CONFIG);
    let upstream = Sdk2Http::start(&rig);
    let gateway = listen_in_front_of(&rig, &upstream.url);
    let asked_a = asking_call(&gateway, 1, "refund_sealed", "A", json!({}))["result"].clone();
    let asked_b = asking_call(&gateway, 2, "refund_sealed", "B", json!({}))["result"].clone();
    for asked in [&asked_a, &asked_b] {
        assert_eq!(asked["resultType"], "input_required", "{asked}\n{}", rig.logs());
        let state = asked["requestState"].as_str().unwrap();
        assert!(
            state.starts_with("once1.") && state.contains("pending:"),
            "sealed: {asked}"
        );
    }
    let yes = json!({"confirm": {"action": "accept", "content": {"confirm": true}}});
    let mixed = asking_call(
        &gateway,
        3,
        "refund_sealed",
        "A",
        json!({"inputResponses": yes, "requestState": asked_b["requestState"]}),
    );
    assert_eq!(
        mixed["error"]["code"], -32602,
        "another call's state is refused: {mixed}"
    );
    let raw = asked_b["requestState"]
        .as_str()
        .unwrap()
        .split_once(".pending:")
        .map(|(_, s)| format!("pending:{s}"));
    let unsealed = asking_call(
        &gateway,
        4,
        "refund_sealed",
        "B",
        json!({"inputResponses": yes, "requestState": raw}),
    );
    assert_eq!(
        unsealed["error"]["code"], -32602,
        "a state the gateway never relayed is refused: {unsealed}"
    );
    assert!(refunds(&rig).is_empty(), "nothing was sent: {:?}", refunds(&rig));

    let a = asking_call(
        &gateway,
        5,
        "refund_sealed",
        "A",
        json!({"inputResponses": yes, "requestState": asked_a["requestState"]}),
    );
    let b = asking_call(
        &gateway,
        6,
        "refund_sealed",
        "B",
        json!({"inputResponses": yes, "requestState": asked_b["requestState"]}),
    );
    for (answer, order) in [(&a, "A"), (&b, "B")] {
        let result = &answer["result"];
        assert_eq!(
            result["_meta"]["once/outcome"]["decision"],
            "executed",
            "{answer}\n{}",
            rig.logs()
        );
        assert_eq!(result["structuredContent"]["order_id"], order, "{answer}");
        assert_eq!(
            refunds_of(&rig, order).len(),
            1,
            "one refund of {order}: {:?}",
            refunds(&rig)
        );
    }
    assert_eq!(refunds(&rig).len(), 2);
}

/// A tool whose argument the client mirrors into an `Mcp-Param-*` header (2026-07-28 `x-mcp-header`):
/// the gateway's protected dispatch on the 2026-07-28 connection carries it from the start, whoever
/// listed tools through the gateway (here nobody on 2026-07-28: a 2025-era client calls).
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn a_protected_dispatch_carries_its_tools_param_headers_whoever_listed_tools() {
    let rig = Rig::new(CONFIG);
    let upstream = Sdk2Http::start(&rig);
    let gateway = listen_in_front_of(&rig, &upstream.url);
    let mut legacy = Client {
        gateway: &gateway,
        modern: false,
        next: 0,
    };
    let answer = legacy.call("refund_header", refund_args("H-1"), Some("op-h1"));
    assert_eq!(
        answer["_meta"]["once/outcome"]["decision"],
        "executed",
        "{answer}\n{}",
        rig.logs()
    );
    let made = refunds_of(&rig, "H-1");
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["era"], "modern", "{made:?}");
}

/// `relay-client.mjs` (the TypeScript client 2.4.0 on 2026-07-28) through a stdio gateway whose upstream is
/// `upstream` (`once gateway` arguments): what its SDK accepted.
fn relay_client(rig: &Rig, upstream: &[&str]) -> Value {
    let args: Vec<&str> = std::iter::once("--").chain(upstream.iter().copied()).collect();
    node_client(rig, "relay-client.mjs", &args)
}

/// What a 2026-07-28 client must see of the v2 server, whichever revision the gateway spoke to it in
/// (`era`): every answer accepted by its SDK, one refund, its replay.
fn assert_relayed(rig: &Rig, seen: &Value, era: &str) {
    assert_eq!(seen["revision"], "2026-07-28", "{seen}");
    assert_eq!(
        seen["tools"],
        json!([
            "find_refund",
            "refund",
            "refund_confirmed",
            "refund_count",
            "refund_header",
            "refund_sealed"
        ]),
        "{seen}"
    );
    assert_eq!(seen["prompts"], json!(["refund-note"]), "{seen}");
    assert_eq!(
        seen["prompt"]["messages"][0]["content"]["text"], "Tell the customer the refund is on its way.",
        "{seen}"
    );
    assert_eq!(seen["resources"], json!(["refunds://policy"]), "{seen}");
    assert_eq!(
        seen["resource"]["contents"][0]["text"], "Refunds within 30 days.",
        "{seen}"
    );
    assert_eq!(seen["direct"]["structuredContent"]["refunds"], 0, "{seen}");
    assert_eq!(seen["first"]["_meta"]["once/outcome"]["decision"], "executed", "{seen}");
    assert_eq!(seen["again"]["_meta"]["once/outcome"]["decision"], "replayed", "{seen}");
    let made = refunds_of(rig, "M-1");
    assert_eq!(made.len(), 1, "exactly one refund: {made:?}");
    assert_eq!(made[0]["era"], era, "{made:?}");
    assert_eq!(
        seen["first"]["structuredContent"]["refund_id"], made[0]["refund_id"],
        "{seen}"
    );
    assert_eq!(
        seen["again"]["structuredContent"]["refund_id"], made[0]["refund_id"],
        "{seen}"
    );
}

/// A client on MCP 2026-07-28 (TypeScript 2.4.0, discover mode) gets every answer of a v2 server in a shape
/// its SDK accepts — tools/list, prompts, resources, a DIRECT call, a protected call and its replay —
/// from the server as a stdio child (spoken to in 2025-11-25, whose answers carry no `resultType`) and at
/// a URL (its protected call sent in 2026-07-28).
#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything"]
fn a_2026_07_28_client_gets_every_answer_of_a_v2_server_as_a_child_and_at_a_url() {
    let child = Rig::new(CONFIG);
    let server = server_script().display().to_string();
    let effects = effects_file(&child).display().to_string();
    let seen = relay_client(&child, &["node", &server, &effects]);
    assert_relayed(&child, &seen, "legacy");

    let remote = Rig::new(CONFIG);
    let upstream = Sdk2Http::start(&remote);
    let seen = relay_client(&remote, &["--upstream-url", &upstream.url]);
    assert_relayed(&remote, &seen, "modern");
}
