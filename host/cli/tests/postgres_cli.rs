//! The `once` binary over a PostgreSQL ledger: `--db postgres://…` (and
//! `ONCE_DB`) for the ledger commands, and `once demo --db postgres://…`
//! giving the same protected results as the SQLite ledger.

#[path = "../../once/tests/postgres_common/mod.rs"]
mod postgres_common;

use std::process::{Command, Output};

use once::types::Evidence;
use once::{Once, Sent};
use postgres_common::TestSchema;
use serde_json::Value;

fn once_cmd(args: &[&str], db_env: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_once"));
    cmd.args(args).env_remove("ONCE_DB");
    if let Some(db) = db_env {
        cmd.env("ONCE_DB", db);
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn ledger_commands_take_a_postgres_url() {
    let Some(schema) = TestSchema::new() else { return };
    let location = schema.location();
    {
        let once = Once::open(&location)
            .unwrap()
            .provider(|_: &str, _: &str, _: &str| Evidence::Unknown("down".into()))
            .build()
            .unwrap();
        let args = r#"{"order_id":1,"amount":5}"#;
        let _ = once
            .call("default", Some("paid"), "refund_order", args, |_| {
                Sent::Success(r#"{"id":"r1"}"#.into())
            })
            .unwrap();
        let _ = once
            .call("default", Some("lost"), "refund_order", args, |_| {
                Sent::Ambiguous("timeout".into())
            })
            .unwrap();
    }
    // `--db` and `ONCE_DB` both select it.
    let list = once_cmd(&["ledger", "list", "--db", &location], None);
    assert!(list.status.success(), "{}", text(&list.stderr));
    let list = text(&list.stdout);
    assert!(
        list.lines().any(|l| l.contains("paid") && l.contains("confirmed")),
        "{list}"
    );
    assert!(
        list.lines().any(|l| l.contains("lost") && l.contains("unknown")),
        "{list}"
    );
    let stats = once_cmd(&["ledger", "stats"], Some(&location));
    assert!(stats.status.success(), "{}", text(&stats.stderr));
    let stats = text(&stats.stdout);
    assert!(stats.lines().any(|l| l.trim() == "confirmed   1"), "{stats}");
    assert!(stats.lines().any(|l| l.trim() == "unknowns     1"), "{stats}");
    let show = text(&once_cmd(&["ledger", "show", "paid", "--db", &location], None).stdout);
    assert!(show.contains(r#"{"id":"r1"}"#), "{show}");
    let confirmed = once_cmd(
        &[
            "ledger",
            "resolve",
            "lost",
            "--confirmed",
            r#"{"id":"r2"}"#,
            "--note",
            "bank statement",
            "--db",
            &location,
        ],
        None,
    );
    assert!(confirmed.status.success(), "{}", text(&confirmed.stderr));
    let sweep = once_cmd(&["sweep", "--db", &location], None);
    assert!(sweep.status.success(), "{}", text(&sweep.stderr));
    let prune = once_cmd(&["prune"], Some(&location));
    assert!(text(&prune.stdout).contains("pruned 0"), "{}", text(&prune.stderr));

    // An unreachable server or a bad schema: one line, exit 1, no password echoed.
    let down = once_cmd(&["ledger", "list", "--db", "postgres://u:sekrit@127.0.0.1:1/db"], None);
    assert_eq!(down.status.code(), Some(1));
    let err = text(&down.stderr);
    assert!(err.contains("127.0.0.1:1") && !err.contains("sekrit"), "{err}");
    let bad = once_cmd(
        &["ledger", "list", "--db", &format!("{}?schema=Bad-Name", schema.url)],
        None,
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("schema name"), "{}", text(&bad.stderr));
}

#[test]
fn the_demo_on_postgres_gives_the_protected_results_of_sqlite() {
    let Some(url) = postgres_common::database_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("demo.json");
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args(["demo", "--trials", "2", "--seed", "11", "--db", &url, "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 48);
    for c in cells.iter().filter(|c| c["protected"] == true) {
        assert_eq!(c["trials"], 2, "{c}");
        assert_eq!(c["exactly_once"], 2, "protected on PostgreSQL: {c}");
        assert_eq!(c["duplicates"], 0, "{c}");
        assert_eq!(c["omissions"], 0, "{c}");
        assert_eq!(c["false_completions"], 0, "{c}");
    }
    // The unprotected control: the faults still bite without once.
    let c = cells
        .iter()
        .find(|c| c["policy"] == "always_retry" && c["protected"] == false && c["fault"] == "post_commit_disconnect")
        .unwrap();
    assert_eq!(c["duplicates"], 2, "{c}");
    // The run's schema, named on stdout, is gone afterwards.
    let stdout = text(&out.stdout);
    let schema = stdout
        .lines()
        .find_map(|l| l.strip_prefix("once ledger: PostgreSQL schema "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the demo names its schema: {stdout}"));
    assert!(schema.starts_with("once_demo_"), "{schema}");
    let mut admin = postgres_common::client(&url);
    let left: i64 = admin
        .query_one("SELECT count(*) FROM pg_namespace WHERE nspname = $1", &[&schema])
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the demo's schema {schema} was dropped");
}

#[test]
fn demo_db_must_be_a_postgres_url() {
    let out = once_cmd(&["demo", "--trials", "1", "--db", "ledger.db"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("postgres://"), "{}", text(&out.stderr));
    let out = once_cmd(
        &[
            "demo",
            "--trials",
            "1",
            "--db",
            "postgres://u@127.0.0.1:1/db?schema=mine",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("schema"), "{}", text(&out.stderr));
    // A server that is down: a runtime failure, one line, before any trial.
    let out = once_cmd(&["demo", "--trials", "1", "--db", "postgres://u@127.0.0.1:1/db"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("127.0.0.1:1"), "{}", text(&out.stderr));
}
