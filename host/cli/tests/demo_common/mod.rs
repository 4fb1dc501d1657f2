//! Shared by the demo suites: run `once demo` with a JSON report and a chart, and find a cell in the report.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

/// What one `once demo` run printed and wrote.
pub struct DemoRun {
    /// The JSON report.
    pub report: Value,
    /// The table and summary.
    pub stdout: String,
    /// The SVG chart.
    pub chart: String,
}

/// Run `once demo ARGS --json … --svg …`; it must succeed, print its cost per trial and draw an SVG.
pub fn run_demo(args: &[&str]) -> DemoRun {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("demo.json");
    let svg = dir.path().join("demo.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .arg("demo")
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("per trial"), "the cost per trial is printed: {stdout}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"), "{chart}");
    DemoRun {
        report: serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap(),
        stdout,
        chart,
    }
}

/// Run `once demo ARGS`, which must refuse them as bad input (exit code 2); its stderr.
pub fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .arg("demo")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

/// The report's cell for a policy, protection and fault.
pub fn cell<'a>(report: &'a Value, policy: &str, protected: bool, fault: &str) -> &'a Value {
    report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["policy"] == policy && c["protected"] == protected && c["fault"] == fault)
        .unwrap_or_else(|| panic!("no cell {policy} {protected} {fault}"))
}
