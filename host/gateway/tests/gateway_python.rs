//! Interoperability: the official Python MCP SDK (`mcp==2.3.0`) drives `once
//! gateway` through initialize, tools/list and a protected tools/call, and
//! restarts it between two calls of the same operation.
//!
//! Needs a Python with that SDK, so it is ignored by a plain `cargo test`;
//! `.ci/run` installs the pinned SDK in a venv and runs it with `--ignored`,
//! pointing `ONCE_PYTHON` at the venv's interpreter.

mod gateway_common;

use std::path::Path;
use std::process::Command;

use refund::{EffectLedger, ORDER_ID};

/// Runs `script` with the pinned SDK's Python: (once, refund-mcp, a temp dir, the README's config).
fn run_python(script: &str) -> (tempfile::TempDir, String) {
    let once = gateway_common::once_exe();
    let refund_mcp = gateway_common::refund_mcp();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let python = std::env::var("ONCE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .arg(root.join("tests/gateway").join(script))
        .arg(once)
        .arg(refund_mcp)
        .arg(dir.path())
        .arg(root.join("examples/refund/once.toml"))
        .env_remove("ONCE_DB")
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{python} {script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    (dir, stdout)
}

fn refunds(effects: &Path) -> u64 {
    EffectLedger::open(effects).unwrap().count(ORDER_ID).unwrap()
}

#[test]
#[ignore = "needs python3 with mcp==2.3.0: ONCE_PYTHON=… cargo test -p once-gateway --test gateway_python -- --ignored"]
fn the_python_sdk_drives_the_gateway() {
    let (dir, stdout) = run_python("python_client.py");
    assert!(stdout.contains("python interop: ok"), "{stdout}");
    assert_eq!(refunds(&dir.path().join("effects.db")), 1, "exactly one refund");
}

/// The README's gateway restarted by a host on the official Python SDK:
/// a lost reply, a new gateway, the same call again (keyed, then keyless) -> one refund each.
#[test]
#[ignore = "needs python3 with mcp==2.3.0: ONCE_PYTHON=… cargo test -p once-gateway --test gateway_python -- --ignored"]
fn the_python_sdk_restarting_the_gateway_gets_one_refund() {
    let (dir, stdout) = run_python("python_restart.py");
    assert!(stdout.contains("python restart: ok"), "{stdout}");
    for run in ["keyed", "keyless"] {
        assert_eq!(
            refunds(&dir.path().join(run).join("effects.db")),
            1,
            "{run}: exactly one refund\n{stdout}"
        );
    }
}

/// The official SDK's Streamable HTTP client against `once gateway --listen`: with a tenant's bearer
/// token, list, a protected call, its replay, a conflict; then a never-retry agent under
/// pre_effect_disconnect and post_commit_disconnect. One refund in each run's effect ledger.
#[test]
#[ignore = "needs python3 with mcp==2.3.0: ONCE_PYTHON=… cargo test -p once-gateway --test gateway_python -- --ignored"]
fn the_python_sdk_drives_the_gateway_over_streamable_http() {
    let (dir, stdout) = run_python("python_http.py");
    assert!(stdout.contains("python http: ok"), "{stdout}");
    for run in ["main", "pre", "post"] {
        assert_eq!(
            refunds(&dir.path().join(run).join("effects.db")),
            1,
            "{run}: exactly one refund\n{stdout}"
        );
    }
}
