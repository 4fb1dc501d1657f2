//! Scope isolation through the CLI: `once ledger show` and `once ledger
//! resolve` in scope B never see or touch a record of scope A (the library's
//! side is `host/once/tests/hardening_isolation.rs`).

#[path = "../../once/tests/isolation_common/mod.rs"]
mod isolation_common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

use isolation_common::{RECEIPT_A, open, scope_a};
use once::types::State;

fn cli(db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_once"))
        .args(args)
        .env("ONCE_DB", db)
        .env_remove("ONCE_LOG")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_cli_keeps_scopes_apart() {
    static LOOKUPS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let (_, a_k, a_u) = scope_a(&open(&db, &LOOKUPS));

    // Show: B (and the default scope) see nothing of A's records.
    for scope in [vec!["--scope", "B"], vec![]] {
        for key in ["k", "u"] {
            let mut args = vec!["ledger", "show", key];
            args.extend(&scope);
            let out = cli(&db, &args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
            assert!(out.stdout.is_empty(), "{args:?} printed {}", text(&out.stdout));
            assert!(text(&out.stderr).contains("no record"), "{}", text(&out.stderr));
        }
    }
    let out = cli(&db, &["ledger", "show", "k", "--scope", "A"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(RECEIPT_A));

    // Resolve: refused in B either way, and A's unknown record is untouched.
    for how in [vec!["--confirmed", RECEIPT_A], vec!["--absent", "--force"]] {
        let mut args = vec!["ledger", "resolve", "u", "--scope", "B", "--note", "wrong scope"];
        args.extend(&how);
        let out = cli(&db, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    }
    let once = open(&db, &LOOKUPS);
    assert_eq!(once.inspect("A", "k").unwrap().unwrap(), a_k);
    assert_eq!(once.inspect("A", "u").unwrap().unwrap(), a_u);
    assert!(once.inspect("B", "u").unwrap().is_none());

    // The same command in the right scope does resolve it.
    let out = cli(
        &db,
        &[
            "ledger",
            "resolve",
            "u",
            "--scope",
            "A",
            "--confirmed",
            RECEIPT_A,
            "--note",
            "checked",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(once.inspect("A", "u").unwrap().unwrap().state, State::Confirmed);
}
