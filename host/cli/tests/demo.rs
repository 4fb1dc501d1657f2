//! `once demo` at N = 3: the whole fault matrix with real services, real
//! proxies, real SQLite ledgers and real agent processes (SIGKILLed under
//! `crash_after_dispatch`, racing under `concurrent_duplicate`). Every verdict
//! comes from the service's effect ledger.

use std::process::Command;

use serde_json::Value;

const FAULTS: [&str; 8] = [
    "none",
    "pre_effect_disconnect",
    "post_commit_disconnect",
    "reject_502",
    "late_reply",
    "crash_after_dispatch",
    "concurrent_duplicate",
    "stale_read",
];
const POLICIES: [&str; 3] = ["always_retry", "never_retry", "read_then_decide"];

fn cell<'a>(report: &'a Value, policy: &str, protected: bool, fault: &str) -> &'a Value {
    report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["policy"] == policy && c["protected"] == protected && c["fault"] == fault)
        .unwrap_or_else(|| panic!("no cell {policy} {protected} {fault}"))
}

#[test]
fn the_fault_matrix_at_three_trials_per_cell() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("demo.json");
    let svg = dir.path().join("demo.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args(["demo", "--trials", "3", "--seed", "7", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["trials_per_cell"], 3);
    assert_eq!(report["cells"].as_array().unwrap().len(), 48);

    // Protected: exactly one refund in every trial, and no report contradicts the ledger.
    for policy in POLICIES {
        for fault in FAULTS {
            let c = cell(&report, policy, true, fault);
            assert_eq!(c["trials"], 3, "{c}");
            assert_eq!(c["exactly_once"], 3, "protected {policy} under {fault}: {c}");
            assert_eq!(c["duplicates"], 0, "{c}");
            assert_eq!(c["omissions"], 0, "{c}");
            assert_eq!(c["false_completions"], 0, "{c}");
        }
    }
    // Unprotected: the studies' shape.
    let c = cell(&report, "always_retry", false, "post_commit_disconnect");
    assert_eq!(
        (c["exactly_once"].as_u64(), c["duplicates"].as_u64()),
        (Some(0), Some(3)),
        "{c}"
    );
    assert_eq!(
        c["false_completions"], 3,
        "every double refund is reported as one success: {c}"
    );
    let c = cell(&report, "always_retry", false, "pre_effect_disconnect");
    assert_eq!(
        c["exactly_once"], 3,
        "retrying is right when the request never arrived: {c}"
    );
    let c = cell(&report, "never_retry", false, "pre_effect_disconnect");
    assert_eq!(
        (c["exactly_once"].as_u64(), c["omissions"].as_u64()),
        (Some(0), Some(3)),
        "{c}"
    );
    for policy in POLICIES {
        let c = cell(&report, policy, false, "none");
        assert_eq!(c["exactly_once"], 3, "the control cell: {c}");
        let c = cell(&report, policy, false, "concurrent_duplicate");
        assert_eq!(c["duplicates"], 3, "two unprotected processes refund twice: {c}");
        let c = cell(&report, policy, false, "crash_after_dispatch");
        assert_eq!(c["duplicates"], 3, "a restarted unprotected agent refunds again: {c}");
    }

    assert!(
        stdout.contains("always_retry (unprotected)") && stdout.contains("stale_read"),
        "{stdout}"
    );
    assert!(stdout.contains("per trial"), "the cost per trial is printed: {stdout}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("post_commit_disconnect"));
}

#[test]
fn bad_demo_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args(["demo", "--trials", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args(["demo", "--fault", "gremlins"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gremlins"));
}
