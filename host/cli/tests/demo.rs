//! `once demo` at N = 3: the whole fault matrix with real services, real
//! proxies, real SQLite ledgers and real agent processes (SIGKILLed under
//! `crash_after_dispatch`, racing under `concurrent_duplicate`). Every verdict
//! comes from the service's effect ledger.

mod demo_common;

use demo_common::{DemoRun, cell, refused, run_demo};

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

#[test]
fn the_fault_matrix_at_three_trials_per_cell() {
    let DemoRun { report, stdout, chart } = run_demo(&["--trials", "3", "--seed", "7"]);
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
    assert!(chart.contains("post_commit_disconnect"), "the chart names every fault");
}

#[test]
fn bad_demo_arguments_are_refused() {
    refused(&["--trials", "0"]);
    assert!(refused(&["--fault", "gremlins"]).contains("gremlins"));
}
