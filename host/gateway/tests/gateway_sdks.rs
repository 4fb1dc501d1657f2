//! The official MCP SDK clients, as a user installs them, drive `once gateway` end to end: the
//! TypeScript client `@modelcontextprotocol/client` 2.4.0 as constructed without options (2.4.0's
//! default negotiation is `'legacy'`, the initialize handshake), with `versionNegotiation: { mode:
//! 'auto' }` (server/discover, 2026-07-28) and with `mode: 'legacy'` spelled out; the v1 TypeScript SDK
//! `@modelcontextprotocol/sdk` 1.32.2; the Python SDK `mcp` 2.3.0's `Client` in its default mode
//! (`"auto"`: server/discover, 2026-07-28) and in `mode="legacy"`. Each against the README's config
//! (examples/refund/once.toml) in front of `refund-mcp --mode unsafe`, on stdio and on `--listen`.
//!
//! For every client and transport it proves that: the connection is negotiated as the SDK's mode says;
//! tools/list and a DIRECT call pass; a protected call with a key in `_meta` runs once, its repeat is a
//! replay with the same receipt, the same key with other arguments is a conflict, a keyless call and its
//! repeat are one operation under a derived key; a call over the quota is blocked; an answer once writes
//! itself after a lost reply (UNKNOWN) and the replay once settles it into; over HTTP, a call whose answer
//! was lost on a broken connection and that the client re-issues with a new request id (MCP's own retry),
//! with the key in `_meta` and with a derived key. Every one of these answers must be one the SDK
//! accepted (a result it rejects throws in the driver script), a client that connected with initialize
//! gets no `resultType` its revision does not know (seen where the SDK keeps it: TypeScript v1, Python),
//! and the refunds counted in the upstream's own effect table are exactly one per operation.
//!
//! The drivers are tests/gateway/everything/sdk-client.mjs (TypeScript) and tests/gateway/python_modern.py
//! (Python); each checks that the installed SDK is the pinned one. Needs node with `npm ci` run in
//! tests/gateway/everything and `ONCE_PYTHON` pointing at a Python with mcp==2.3.0, so it is ignored by a
//! plain `cargo test`; `.ci/run` installs both and runs it with `--ignored`.

mod gateway_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use refund::{EffectLedger, ORDER_ID};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap()
}

/// Runs one driver for one client and transport, then counts each scenario's refunds.
fn drive(program: &str, script: PathBuf, client: &[&str], transport: &str) {
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(program)
        .arg(&script)
        .arg(gateway_common::once_exe())
        .arg(gateway_common::refund_mcp())
        .arg(work.path())
        .arg(gateway_common::EXAMPLE_CONFIG)
        .args(client)
        .arg(transport)
        .env_remove("ONCE_DB")
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{} {client:?} {transport} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    assert!(stdout.contains(": ok"), "{stdout}\n{stderr}");
    // rows: the keyed operation and the keyless one; the conflict and the blocked call sent nothing.
    let mut expected = vec![("rows", 2), ("unknown", 1)];
    if transport == "http" {
        expected.extend([("retry-keyed", 1), ("retry-derived", 1)]);
    }
    for (scenario, refunds) in expected {
        let effects = work.path().join(scenario).join("effects.db");
        let counted = EffectLedger::open(&effects).unwrap().count(ORDER_ID).unwrap();
        assert_eq!(
            counted, refunds,
            "{scenario}: {refunds} refund(s) expected in the upstream's table\n{stdout}\n{stderr}"
        );
    }
}

fn typescript(client: &str, transport: &str) {
    let dir = root().join("tests/gateway/everything");
    assert!(
        dir.join("node_modules/@modelcontextprotocol/client").exists(),
        "the SDKs are not installed: run `npm ci` in {}",
        dir.display()
    );
    drive("node", dir.join("sdk-client.mjs"), &[client], transport);
}

fn python(mode: &str, transport: &str) {
    let python = std::env::var("ONCE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    drive(
        &python,
        root().join("tests/gateway/python_modern.py"),
        &[mode],
        transport,
    );
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_default_over_stdio() {
    typescript("ts2", "stdio");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_default_over_http() {
    typescript("ts2", "http");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_auto_2026_07_28_over_stdio() {
    typescript("ts2-auto", "stdio");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_auto_2026_07_28_over_http() {
    typescript("ts2-auto", "http");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_legacy_over_stdio() {
    typescript("ts2-legacy", "stdio");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v2_legacy_over_http() {
    typescript("ts2-legacy", "http");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v1_over_stdio() {
    typescript("ts1", "stdio");
}

#[test]
#[ignore = "needs node and `npm ci` in tests/gateway/everything: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn typescript_v1_over_http() {
    typescript("ts1", "http");
}

#[test]
#[ignore = "needs ONCE_PYTHON with mcp==2.3.0: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn python_default_2026_07_28_over_stdio() {
    python("auto", "stdio");
}

#[test]
#[ignore = "needs ONCE_PYTHON with mcp==2.3.0: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn python_default_2026_07_28_over_http() {
    python("auto", "http");
}

#[test]
#[ignore = "needs ONCE_PYTHON with mcp==2.3.0: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn python_legacy_over_stdio() {
    python("legacy", "stdio");
}

#[test]
#[ignore = "needs ONCE_PYTHON with mcp==2.3.0: cargo test -p once-gateway --test gateway_sdks -- --ignored"]
fn python_legacy_over_http() {
    python("legacy", "http");
}
