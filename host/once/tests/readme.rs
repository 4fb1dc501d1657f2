//! The README's Rust quick start, as a newcomer runs it: its code is `examples/quickstart.rs`, and
//! the command it prints, run twice in a fresh directory, sends the refund once and then nothing.

use std::path::Path;
use std::process::Command;

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.rs");
/// The command the README prints, from the repository's root.
const COMMAND: &str = "cargo run -q -p once-host --example quickstart";

#[test]
fn the_readme_quick_start_is_the_compiled_example() {
    let readme = std::fs::read_to_string(README).unwrap();
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let code = example.split_once("\n\n").unwrap().1;
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md's Rust quick start and host/once/examples/quickstart.rs differ"
    );
    let rust = readme
        .split_once("\n### Rust\n")
        .and_then(|(_, rest)| rest.split("\n#").next())
        .expect("README.md has a \"### Rust\" quick start");
    assert!(
        rust.contains(&format!("`{COMMAND}`")),
        "README.md's Rust quick start no longer prints `{COMMAND}`"
    );
}

#[test]
fn the_readme_quick_start_sends_once_and_its_second_run_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receipt = r#"{"refund_id":"r-1234","amount":200}"#;
    let first = run_as_printed(dir.path());
    assert_eq!(first, [receipt, receipt, "sent 1 time(s) by this run"], "the first run");
    // The ledger file outlives the process: the same refund again replays and sends nothing.
    let second = run_as_printed(dir.path());
    assert_eq!(
        second,
        [receipt, receipt, "sent 0 time(s) by this run"],
        "the second run"
    );
    assert!(
        dir.path().join("once.db").is_file(),
        "the quick start keeps its ledger in ./once.db"
    );
}

/// `COMMAND` with `dir` as the working directory (where the example keeps `once.db`); cargo is
/// pointed at this workspace, as running it from the repository's root does. Its stdout's lines.
fn run_as_printed(dir: &Path) -> Vec<String> {
    let mut words = COMMAND.split(' ');
    assert_eq!(words.next(), Some("cargo"));
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(words)
        .args(["--locked", "--manifest-path", manifest])
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{COMMAND} failed: {stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}
