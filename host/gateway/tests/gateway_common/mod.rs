//! The gateway rig shared by the gateway suites: a temp dir with an effect
//! ledger, a once ledger and a config; `once gateway` in front of
//! `refund-mcp`, driven by an rmcp client; verdicts from the effect ledger.
#![allow(dead_code)]

pub mod remote;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use once::Once;
use refund::{EffectLedger, ORDER_ID};
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientRequest, JsonObject, Request, RequestMetaObject};
use rmcp::service::{Peer, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tempfile::TempDir;

/// The shipped example config: the README's gateway.
pub const EXAMPLE_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/refund/once.toml");

/// A faster twin of the example config (shorter timeouts, a quicker reconciler), with room for more tables.
pub fn fast_config(extra: &str) -> String {
    config_with_sweep("50ms", extra)
}

pub fn config_with_sweep(sweep_interval: &str, extra: &str) -> String {
    format!(
        r#"sweep_interval = "{sweep_interval}"
{extra}

[tools.refund_order]
effect_fields = ["/order_id", "/amount"]
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

/// The `once` binary these suites run. once-cli owns it, and cargo names a binary (`CARGO_BIN_EXE_once`) only
/// to its own package's tests: the once-cli suite that includes this module by path (ui_browser.rs) takes it
/// from there. Here it comes from a nested cargo build, run once per test process and always (never "only if
/// missing": a stale `once` must not be tested; cargo makes a fresh one a no-op), into the target directory
/// and profile this test binary was built in (`<target>/<profile>/deps/<test>`: `CARGO_TARGET_DIR` or
/// `--target-dir`, `--release` or `--profile`).
///
/// The build is `--workspace --bin once --example timing`, not `-p once-cli --bin once`: cargo unifies
/// features across the packages it builds, and with dev-dependencies only when a target that uses them is
/// built. `cargo test --workspace` builds `once` with every member's dependencies and dev-dependencies (more
/// features of regex, chrono, syn …); `-p once-cli` alone would build a second `once` (and a second copy of
/// its dependencies, wasmtime among them) and swap `target/<profile>/once` between the two at every run. The
/// workspace and one small example (refund's, whose only dev-dependency is tempfile) resolve as
/// `cargo test --workspace` does: the same unit, fresh after it. The path is the one cargo names for the
/// artifact; a failed build fails the test with cargo's stderr.
pub fn once_exe() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(exe) = option_env!("CARGO_BIN_EXE_once") {
            return PathBuf::from(exe);
        }
        let test = std::env::current_exe().expect("the test binary's path");
        let profile_dir = test
            .parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("{} is not in <target>/<profile>/deps", test.display()));
        let target_dir = profile_dir.parent().expect("the target directory");
        let profile = profile_dir
            .file_name()
            .and_then(|p| p.to_str())
            .expect("the profile directory");
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "build",
                "--quiet",
                "--locked",
                "--message-format=json-render-diagnostics",
            ])
            .args(["--workspace", "--bin", "once", "--example", "timing"])
            .arg("--target-dir")
            .arg(target_dir)
            .stdin(Stdio::null());
        match profile {
            "debug" => {}
            "release" => {
                cargo.arg("--release");
            }
            other => {
                cargo.args(["--profile", other]);
            }
        }
        let out = cargo.output().expect("running cargo to build once");
        assert!(
            out.status.success(),
            "building once failed ({}): {cargo:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // cargo's own account of the binary: its compiler-artifact message, fresh or just built.
        let built = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| {
                m["reason"] == "compiler-artifact" && m["target"]["kind"][0] == "bin" && m["target"]["name"] == "once"
            })
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .unwrap_or_else(|| panic!("cargo named no `once` executable: {cargo:?}"));
        let exe = profile_dir.join("once");
        assert_eq!(built, exe, "cargo built once elsewhere than beside this test binary");
        exe
    })
}

/// The `refund-mcp` binary beside `once`. `cargo test --workspace` builds it (the example package has tests); a
/// lone `cargo test -p once-gateway` builds it here when it is missing. A nested build of an existing one would
/// resolve features for that package alone and relink it differently from the workspace build.
pub fn refund_mcp() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let once = once_exe();
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
pub struct Rig {
    pub dir: TempDir,
    pub config: PathBuf,
    /// The once ledger the gateway opens (an SQLite file in `dir`, or another rig's, or a PostgreSQL URL).
    pub db: String,
    /// The upstream's effect ledger (in `dir`, or another rig's: one refund service behind two gateways).
    pub effects: PathBuf,
}

/// The `account = "…"` a gateway's refusal at start says to set, if it names one.
pub fn named_account(log: &str) -> Option<String> {
    let (_, rest) = log.split_once("set account = \"")?;
    Some(rest.split('"').next()?.to_string())
}

impl Rig {
    pub fn new(config_text: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("once.toml");
        std::fs::write(&config, config_text).unwrap();
        let db = dir.path().join("once.db").display().to_string();
        let effects = dir.path().join("effects.db");
        Rig {
            dir,
            config,
            db,
            effects,
        }
    }

    /// A second rig (its own config and logs) on this rig's once ledger and effect ledger:
    /// another gateway in front of the same refund service.
    pub fn beside(&self, config_text: &str) -> Rig {
        let mut rig = Rig::new(config_text);
        rig.db = self.db.clone();
        rig.effects = self.effects.clone();
        rig
    }

    pub fn with_config_file(path: &str) -> Rig {
        let rig = Rig::new("");
        std::fs::copy(path, &rig.config).unwrap();
        rig
    }

    pub fn effects_db(&self) -> PathBuf {
        self.effects.clone()
    }

    pub fn log(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("gateway-{n}.log"))
    }

    pub fn gateway_command(&self, fault: &str) -> Command {
        self.gateway_command_with(&[], fault)
    }

    pub fn gateway_command_with(&self, flags: &[&str], fault: &str) -> Command {
        self.gateway_command_wrapped(flags, &[], fault)
    }

    /// [`Rig::gateway_command_with`], the upstream started through `wrapper` (`env API_KEY=…`).
    pub fn gateway_command_wrapped(&self, flags: &[&str], wrapper: &[&str], fault: &str) -> Command {
        let mut cmd = Command::new(once_exe());
        cmd.arg("gateway")
            .args(flags)
            .arg("--config")
            .arg(&self.config)
            .arg("--db")
            .arg(&self.db)
            .arg("--")
            .args(wrapper)
            .arg(refund_mcp())
            .arg("--db")
            .arg(self.effects_db())
            .args(["--mode", "unsafe", "--fault", fault]);
        cmd.env_remove("ONCE_DB").env("ONCE_LOG", "once=info");
        cmd
    }

    /// Start a gateway over a refund-mcp with `fault`, and connect an MCP client to it.
    pub async fn connect(&self, fault: &str, n: usize) -> Session {
        self.connect_command(self.gateway_command(fault), n).await
    }

    /// Start the gateway `command` (its stderr to log `n`), and connect an MCP client to it over stdio.
    pub async fn connect_command(&self, command: Command, n: usize) -> Session {
        let log = std::fs::File::create(self.log(n)).unwrap();
        let mut cmd = tokio::process::Command::from(command);
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
    pub fn effects(&self) -> (u64, i64) {
        let ledger = EffectLedger::open(self.effects_db()).unwrap();
        (
            ledger.count(ORDER_ID).unwrap(),
            ledger.refunded_cents(ORDER_ID).unwrap(),
        )
    }

    /// The audit details of the operation a result names, read from the once ledger after the gateway exited.
    pub fn audit(&self, result: &CallToolResult) -> Vec<String> {
        let info = outcome(result);
        let (scope, key) = (info["scope"].as_str().unwrap(), info["operation"].as_str().unwrap());
        let once = Once::open(&self.db).unwrap().build().unwrap();
        let view = once
            .inspect(scope, key)
            .unwrap()
            .expect("the operation is in the ledger");
        view.audit
            .into_iter()
            .map(|e| format!("{}: {}", e.kind, e.detail))
            .collect()
    }

    pub fn logs(&self) -> String {
        (0..3)
            .filter_map(|n| std::fs::read_to_string(self.log(n)).ok())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

pub struct Session {
    pub client: RunningService<RoleClient, ()>,
    pub child: tokio::process::Child,
}

impl Session {
    pub async fn call(&self, tool: &str, args: Value, key: Option<&str>) -> CallToolResult {
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(object(args));
        if let Some(key) = key {
            params.meta = Some(meta(&[("once/key", key)]));
        }
        self.client.call_tool(params).await.unwrap()
    }

    pub async fn refund(&self, amount: f64, key: Option<&str>) -> CallToolResult {
        self.call("refund_order", json!({"order_id": ORDER_ID, "amount": amount}), key)
            .await
    }

    /// SIGKILL the gateway: it dies without settling anything.
    pub async fn kill(self) {
        let Session { client, mut child } = self;
        let pid = child.id().expect("the gateway is running");
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        assert!(killed.success());
        let status = child.wait().await.unwrap();
        assert!(!status.success(), "the gateway was killed");
        drop(client);
    }

    /// Send a refund of `amount` and SIGKILL the gateway once `committed` holds, with the call
    /// still open: a client that hung up first would make the gateway record the call as ambiguous
    /// itself, and whoever comes next would find it settled already, nothing left in flight.
    pub async fn kill_with_the_refund_open(self, amount: f64, key: Option<&str>, committed: impl Fn() -> bool) {
        let mut params = CallToolRequestParams::new("refund_order")
            .with_arguments(object(json!({"order_id": ORDER_ID, "amount": amount})));
        if let Some(key) = key {
            params.meta = Some(meta(&[("once/key", key)]));
        }
        let open = send_call(self.client.peer(), params).await;
        wait_for("the refund to commit", Duration::from_secs(20), committed).await;
        self.kill().await;
        drop(open);
    }

    /// The client hangs up, as an agent that is done does; the gateway settles what it owes, then exits.
    pub async fn close(self) -> std::process::ExitStatus {
        let Session { client, mut child } = self;
        let _ = client.cancel().await;
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("the gateway exits after its client hangs up")
            .unwrap()
    }
}

/// Send a `tools/call` and return its handle: to cancel it, or to hear progress under its token.
pub async fn send_call(client: &Peer<RoleClient>, params: CallToolRequestParams) -> RequestHandle<RoleClient> {
    client
        .send_request_with_option(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("the request reaches the gateway")
}

pub fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => panic!("arguments are an object"),
    }
}

pub fn meta(fields: &[(&str, &str)]) -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    for (k, v) in fields {
        meta.insert(k.to_string(), json!(v));
    }
    meta
}

/// The text a model reads first.
pub fn text(result: &CallToolResult) -> String {
    result.content[0].as_text().expect("a text block first").text.clone()
}

pub fn outcome(result: &CallToolResult) -> Value {
    result
        .meta
        .as_ref()
        .and_then(|m| m.get("once/outcome"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether a retry should ask again: the operation is unknown, or in flight (the background
/// reconciler may be sending the owed dispatch, or reading the provider, at that moment).
pub fn settling(result: &CallToolResult) -> bool {
    matches!(outcome(result)["decision"].as_str(), Some("unknown" | "in-flight"))
}

/// Wait for a condition on the effect ledger (the truth) instead of a fixed sleep.
pub async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn assert_exactly_one_refund(rig: &Rig) {
    assert_eq!(rig.effects(), (1, 20_000), "exactly one $200 refund\n{}", rig.logs());
}

/// A never-retry agent: one call, read the text, hang up. The effect ledger must still end with one refund.
pub async fn never_retry(rig: &Rig, fault: &str) -> CallToolResult {
    let session = rig.connect(fault, 0).await;
    let result = session.refund(200.0, None).await;
    let status = session.close().await;
    assert!(status.success(), "gateway exit {status}\n{}", rig.logs());
    result
}

pub fn assert_unknown_text(result: &CallToolResult, reason: &str) {
    let t = text(result);
    assert_eq!(result.is_error, Some(true), "{t}");
    assert!(t.starts_with("UNKNOWN: refund_order (operation derived:"), "{t}");
    assert!(t.contains("may or may not have happened"), "{t}");
    assert!(t.contains(reason), "{t}");
    assert!(
        t.contains("Calling refund_order again with the same order_id and amount will not send it again"),
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

/// The call itself sent the owed refund as attempt `n`, after proving no earlier attempt had an effect.
pub fn assert_sent_again(rig: &Rig, result: &CallToolResult, n: u32) {
    let t = text(result);
    assert_ne!(result.is_error, Some(true), "{t}\n{}", rig.logs());
    assert!(t.starts_with(&format!("Sent now as attempt {n} of operation ")), "{t}");
    assert!(t.ends_with("; no earlier attempt had an effect."), "{t}");
    assert_eq!(outcome(result)["decision"], "executed");
    assert_eq!(outcome(result)["attempt"], n);
    assert_eq!(outcome(result)["effect"], "happened");
    let trail = rig.audit(result);
    assert!(trail.iter().any(|e| e.starts_with("reconciled-absent")), "{trail:#?}");
}

/// The model is told the refund happened and how once knows; the ledger's audit trail says the same.
pub fn assert_confirmed_by_lookup(rig: &Rig, result: &CallToolResult) {
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
pub mod http;
