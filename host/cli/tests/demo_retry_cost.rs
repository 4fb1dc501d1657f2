//! `once demo --study retry-cost` at N = 3: the second study's 26 cells against real tool servers (HTTP on
//! 127.0.0.1, SQLite effects and responses tables, real client timeouts), every count read from the server's
//! tables.

mod demo_common;

use demo_common::{DemoRun, cell, refused, run_demo};
use serde_json::Value;

const N: u64 = 3;
const POLICIES: [&str; 4] = ["A", "B", "C", "D"];
const FAULTS: [&str; 3] = ["pre_commit_stall", "post_commit_stall", "reject_502"];

fn num(c: &Value, field: &str) -> f64 {
    c[field].as_f64().unwrap_or_else(|| panic!("{field} in {c}"))
}

#[test]
fn the_retry_cost_study_at_three_trials_per_cell() {
    let DemoRun { report, stdout, chart } =
        run_demo(&["--study", "retry-cost", "--trials", &N.to_string(), "--seed", "7"]);
    assert_eq!(report["study"], "retry-cost");
    assert_eq!(report["trials_per_cell"], N);
    assert_eq!(report["cells"].as_array().unwrap().len(), 26);
    let payload = num(&report, "payload_chars");
    let retry = payload + num(&report, "transcript_chars");

    // The controls: no fault commits exactly one effect per trial; the pre-commit stall duplicates nothing.
    for protected in [false, true] {
        let c = cell(&report, "A", protected, "none");
        assert_eq!(
            (c["exactly_once"].as_u64(), num(c, "effects_per_trial")),
            (Some(N), 1.0),
            "{c}"
        );
        assert_eq!(num(c, "attempts_per_trial"), 1.0, "{c}");
        for policy in POLICIES {
            let c = cell(&report, policy, protected, "pre_commit_stall");
            assert_eq!(
                (c["duplicates"].as_u64(), num(c, "effects_per_trial")),
                (Some(0), 0.0),
                "{c}"
            );
        }
    }

    // Unprotected: the published shape.
    let a = cell(&report, "A", false, "post_commit_stall");
    assert_eq!(a["duplicates"], N, "A duplicates every post-commit trial: {a}");
    assert_eq!(a["false_knowledge"], N, "and reports one effect: {a}");
    assert_eq!(num(a, "chars_per_trial"), payload + retry, "two executions' text: {a}");
    for policy in ["B", "C", "D"] {
        let c = cell(&report, policy, false, "post_commit_stall");
        assert_eq!(
            (c["duplicates"].as_u64(), c["exactly_once"].as_u64()),
            (Some(0), Some(N)),
            "{c}"
        );
    }
    for fault in FAULTS {
        let d = cell(&report, "D", false, fault);
        assert_eq!(d["unknown"], N, "a fail-closed client never knows: {d}");
        assert_eq!(num(d, "attempts_per_trial"), 1.0, "{d}");
    }
    for policy in ["A", "B", "C"] {
        for fault in ["pre_commit_stall", "reject_502"] {
            let c = cell(&report, policy, false, fault);
            assert_eq!(num(c, "attempts_per_trial"), 4.0, "{c}");
            assert_eq!(
                num(c, "chars_per_trial"),
                payload + 3.0 * retry,
                "a fault that never clears: {c}"
            );
            assert_eq!(c["unknown"], N, "{c}");
        }
    }
    for fault in FAULTS {
        assert_eq!(cell(&report, "A", false, fault)["call_id_changed"], N);
        assert_eq!(cell(&report, "C", false, fault)["key_changed"], N);
        for policy in ["B", "C"] {
            assert_eq!(cell(&report, policy, false, fault)["call_id_changed"], 0);
        }
    }

    // Through once: every cell exactly-once, with a known outcome the effects table agrees with.
    for policy in POLICIES {
        for fault in FAULTS {
            let c = cell(&report, policy, true, fault);
            assert_eq!(c["exactly_once"], N, "protected {policy} under {fault}: {c}");
            assert_eq!(
                (c["duplicates"].as_u64(), c["unknown"].as_u64()),
                (Some(0), Some(0)),
                "{c}"
            );
            assert_eq!(c["false_knowledge"], 0, "{c}");
            assert_eq!(c["key_changed"], 0, "one operation, one key on the wire: {c}");
            let unprotected = cell(&report, policy, false, fault);
            if fault == "post_commit_stall" {
                assert_eq!(c["known_effect"], N, "{c}");
                assert_eq!(
                    num(c, "attempts_per_trial"),
                    1.0,
                    "the lost reply is read, not re-sent: {c}"
                );
            } else {
                assert_eq!(c["known_absence"], N, "{c}");
                assert!(num(c, "attempts_per_trial") <= 3.0, "the attempt budget: {c}");
                if policy != "D" {
                    assert!(
                        num(c, "chars_per_trial") < num(unprotected, "chars_per_trial"),
                        "the budget ends the loop early: {c} vs {unprotected}"
                    );
                }
            }
        }
    }

    assert!(
        stdout.contains("exactly-once") && stdout.contains("post_commit_stall"),
        "{stdout}"
    );
    assert!(chart.contains("reject_502"), "the chart names every fault");
}

#[test]
fn retry_cost_refuses_the_lost_reply_options() {
    for extra in [
        ["--fault", "none"],
        ["--policy", "always_retry"],
        ["--db", "postgres://x@127.0.0.1/db"],
    ] {
        let stderr = refused(&["--study", "retry-cost", extra[0], extra[1]]);
        assert!(stderr.contains("lost-reply"), "{extra:?}: {stderr}");
    }
    refused(&["--study", "third"]);
    refused(&["--study", "retry-cost", "--trials", "0"]);
}
