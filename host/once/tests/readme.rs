//! The README's Rust quick start, as a newcomer runs it: its code is `examples/quickstart.rs`, and
//! the command it prints, run twice in a fresh directory, sends the refund once and then nothing.
//! Likewise the guide's hand-driven protocol loop (docs/contract.md, `examples/driver.rs`).

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

/// The contract page's example: the typed `driver` protocol, looped by hand with generated types.
const DRIVER_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/contract.md");
const DRIVER_COMMAND: &str = "cargo run -q -p once-host --example driver";

#[test]
fn the_hand_driven_loop_sends_once_and_the_retry_replays() {
    let page = std::fs::read_to_string(DRIVER_PAGE).unwrap();
    assert!(
        page.contains(&format!("`{DRIVER_COMMAND}`")),
        "docs/contract.md no longer prints `{DRIVER_COMMAND}`"
    );
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        run_as_printed(DRIVER_COMMAND, dir.path()),
        [
            "first call: confirmed, effect happened, again replays",
            "retry: confirmed, effect happened, again replays",
            "sent 1 time(s)"
        ]
    );
}

#[test]
fn the_readme_quick_start_sends_once_and_its_second_run_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receipt = r#"{"refund_id":"r-1234","amount":200}"#;
    let first = run_as_printed(COMMAND, dir.path());
    assert_eq!(first, [receipt, receipt, "sent 1 time(s) by this run"], "the first run");
    // The ledger file outlives the process: the same refund again replays and sends nothing.
    let second = run_as_printed(COMMAND, dir.path());
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

/// `command` with `dir` as the working directory (where an example keeps `once.db`); cargo is
/// pointed at this workspace, as running it from the repository's root does. Its stdout's lines.
fn run_as_printed(command: &str, dir: &Path) -> Vec<String> {
    let mut words = command.split(' ');
    assert_eq!(words.next(), Some("cargo"));
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(words)
        .args(["--locked", "--manifest-path", manifest])
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{command} failed: {stderr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}
