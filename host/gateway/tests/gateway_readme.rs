//! The README's gateway quick start, as printed. Its `sh` blocks run, line by line, in a directory laid
//! out as the repository (`examples/`, and the `once` and `refund-mcp` this test built where the printed
//! `cargo build --release` puts them, `target/release/`); over stdio an MCP client sends a refund and its
//! retry, and over `--listen` a tenant (the README's `acme-token`) does the same. Each ends with one refund
//! in the service's own table and a replay. The one change to a printed line: `--listen` on port 0, since
//! 8080 may be taken. The config they print is the shipped `examples/refund/once.toml`.

mod gateway_common;

use std::path::Path;
use std::process::Command;

use gateway_common::*;
use refund::{EffectLedger, ORDER_ID};
use serde_json::json;

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");

/// The lines of each ```sh block under "### The MCP gateway".
fn readme_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(README).unwrap();
    let (_, section) = readme
        .split_once("\n### The MCP gateway\n")
        .expect("README.md has a \"### The MCP gateway\" quick start");
    let section = section.split("\n## ").next().unwrap();
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line == "```sh" {
            blocks.push(lines.by_ref().take_while(|l| *l != "```").map(str::to_owned).collect());
        }
    }
    blocks
}

/// A directory laid out as a checkout after the printed build: `examples/` and `target/release/{once,refund-mcp}`.
fn checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    std::os::unix::fs::symlink(repo.join("examples"), dir.path().join("examples")).unwrap();
    let release = dir.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::os::unix::fs::symlink(once_exe(), release.join("once")).unwrap();
    std::os::unix::fs::symlink(refund_mcp(), release.join("refund-mcp")).unwrap();
    dir
}

/// `line` as a shell runs it in `dir` (the last command replacing the shell, so a signal reaches it).
fn shell(dir: &Path, line: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("exec {line}")).current_dir(dir);
    cmd.env_remove("ONCE_DB");
    cmd
}

fn refunds(dir: &Path) -> u64 {
    EffectLedger::open(dir.join("refunds.db"))
        .unwrap()
        .count(ORDER_ID)
        .unwrap()
}

#[test]
fn the_printed_build_makes_the_binaries_this_test_runs() {
    let blocks = readme_blocks();
    assert_eq!(blocks.len(), 2, "a stdio block and an HTTP block: {blocks:?}");
    // once_exe() is once-cli's `once`, refund_mcp() once-refund-example's `refund-mcp`.
    assert_eq!(
        blocks[0][0],
        "cargo build --release --locked -p once-cli -p once-refund-example"
    );
}

#[test]
fn the_printed_config_is_the_shipped_one() {
    // The config the README and the guide print is the file the printed command loads, and every gateway suite's.
    let shipped = std::fs::read_to_string(EXAMPLE_CONFIG).unwrap();
    for page in ["README.md", "docs/gateway-tour.md"] {
        let text = std::fs::read_to_string(format!("{}/../../{page}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let (_, rest) = text
            .split_once("```toml\n")
            .unwrap_or_else(|| panic!("{page} prints a config"));
        let printed = rest.split_once("```").unwrap().0;
        assert_eq!(printed, shipped, "{page}'s config is not examples/refund/once.toml");
    }
}

#[tokio::test]
async fn over_stdio_the_printed_command_refunds_once() {
    let blocks = readme_blocks();
    let [_, gateway] = blocks[0].as_slice() else {
        panic!("the stdio block is a build and one gateway command: {:?}", blocks[0]);
    };
    let dir = checkout();
    let rig = Rig::new("");
    let session = rig.connect_command(shell(dir.path(), gateway), 0).await;
    let first = session.refund(200.0, Some("readme-refund-1")).await;
    let again = session.refund(200.0, Some("readme-refund-1")).await;
    session.close().await;
    assert_eq!(
        outcome(&first)["decision"],
        "executed",
        "{}\n{}",
        text(&first),
        rig.logs()
    );
    assert!(text(&again).starts_with("Replay of operation"), "{}", text(&again));
    assert_eq!(refunds(dir.path()), 1, "one refund in the service's table");
    assert!(
        dir.path().join("once.db").is_file(),
        "the config's ledger, once.db, beside it"
    );
}

#[test]
fn over_http_the_printed_tenant_config_and_command_refund_once() {
    let blocks = readme_blocks();
    let (listen, setup) = blocks[1].split_last().expect("the HTTP block");
    let dir = checkout();
    let made = Command::new("sh")
        .arg("-c")
        .arg(setup.join("\n"))
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(made.success(), "the printed lines that write once-http.toml");
    assert!(listen.contains("--listen 127.0.0.1:8080 "), "{listen}");
    let rig = Rig::new("");
    let mut gateway = rig.spawn_listening(shell(dir.path(), &listen.replace("127.0.0.1:8080", "127.0.0.1:0")), 0);
    let args = json!({"order_id": ORDER_ID, "amount": 200});
    assert_eq!(gateway.call(None, Some("readme-refund-2"), args.clone()).status, 401);
    let first = gateway.call(Some("acme-token"), Some("readme-refund-2"), args.clone());
    let again = gateway.call(Some("acme-token"), Some("readme-refund-2"), args);
    assert_eq!(
        first.outcome()["decision"],
        "executed",
        "{}\n{}",
        first.text(),
        rig.logs()
    );
    assert_eq!(first.outcome()["scope"], "acme", "the tenant is the scope");
    assert!(again.text().starts_with("Replay of operation"), "{}", again.text());
    assert!(gateway.terminate().success(), "SIGTERM ends the gateway cleanly");
    assert_eq!(refunds(dir.path()), 1, "one refund in the service's table");
}
