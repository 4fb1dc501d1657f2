//! The `once` binary, run as a user would.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::Evidence;
use once::{Once, Sent};

fn once_cmd(args: &[&str], stdin: &[u8], db: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_once"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.env_remove("ONCE_DB");
    if let Some(db) = db {
        cmd.env("ONCE_DB", db);
    }
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn canon_prints_canonical_bytes_without_a_newline() {
    let out = once_cmd(&["canon"], br#"{"b":2,"a":1}"#, None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), r#"{"a":1,"b":2}"#);
}

#[test]
fn canon_rejects_duplicate_keys_with_exit_2_and_one_line() {
    let out = once_cmd(&["canon"], br#"{"a":1,"a":2}"#, None);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("duplicate key") && err.contains("byte"), "{err}");
}

#[test]
fn canon_names_the_pointer_of_a_nested_problem() {
    let out = once_cmd(&["canon"], br#"{"a":[1,{"b":NaN}]}"#, None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/a/1/b"), "{}", text(&out.stderr));
}

#[test]
fn fingerprint_matches_the_library() {
    let out = once_cmd(
        &["fingerprint", "--tool", "refund_order"],
        br#"{"order_id":1234,"amount":200}"#,
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout).trim().to_string();
    let once = Once::builder(once::storage::memory::MemoryStorage::new())
        .build()
        .unwrap();
    assert_eq!(
        printed,
        once.fingerprint("refund_order", r#"{"amount":200,"order_id":1234}"#)
            .unwrap()
    );
}

#[test]
fn ledger_list_show_stats_resolve_sweep_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    {
        let storage = SqliteStorage::open(&db, SqliteOptions::default()).unwrap();
        // The system clock: the CLI reads the same ledger with it.
        let once = Once::builder(storage)
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
            .call("default", Some("paid"), "refund_order", args, |_| {
                Sent::Success("{}".into())
            })
            .unwrap();
        let _ = once
            .call("default", Some("lost"), "refund_order", args, |_| {
                Sent::Ambiguous("timeout".into())
            })
            .unwrap();
    }
    let db = Some(db.as_path());
    let list = once_cmd(&["ledger", "list"], b"", db);
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
    let unknown_only = text(&once_cmd(&["ledger", "list", "--state", "unknown"], b"", db).stdout);
    assert!(
        unknown_only.contains("lost") && !unknown_only.contains("paid"),
        "{unknown_only}"
    );

    let show = text(&once_cmd(&["ledger", "show", "paid"], b"", db).stdout);
    assert!(
        show.contains("confirmed") && show.contains(r#"{"id":"r1"}"#) && show.contains("replay"),
        "{show}"
    );

    let stats = text(&once_cmd(&["ledger", "stats"], b"", db).stdout);
    assert!(stats.lines().any(|l| l.trim() == "confirmed   1"), "{stats}");
    assert!(stats.lines().any(|l| l.trim() == "replays      1"), "{stats}");
    assert!(stats.lines().any(|l| l.trim() == "unknowns     1"), "{stats}");

    // Absent before max_in_flight has passed needs --force.
    let early = once_cmd(
        &["ledger", "resolve", "lost", "--absent", "--note", "checked the bank"],
        b"",
        db,
    );
    assert_eq!(early.status.code(), Some(2), "{}", text(&early.stdout));
    assert!(text(&early.stderr).contains("force"), "{}", text(&early.stderr));
    let confirmed = once_cmd(
        &[
            "ledger",
            "resolve",
            "lost",
            "--confirmed",
            r#"{"id":"r2"}"#,
            "--note",
            "bank statement shows it",
        ],
        b"",
        db,
    );
    assert!(confirmed.status.success(), "{}", text(&confirmed.stderr));
    let show = text(&once_cmd(&["ledger", "show", "lost"], b"", db).stdout);
    assert!(
        show.contains("operator-confirmed") && show.contains("bank statement shows it"),
        "{show}"
    );

    let no_note = once_cmd(&["ledger", "resolve", "paid", "--absent"], b"", db);
    assert_eq!(no_note.status.code(), Some(2));

    let sweep = once_cmd(&["sweep"], b"", db);
    assert!(sweep.status.success(), "{}", text(&sweep.stderr));
    let prune = once_cmd(&["prune"], b"", db);
    assert!(prune.status.success(), "{}", text(&prune.stderr));
    assert!(
        text(&prune.stdout).contains("pruned 0"),
        "nothing is past retention yet"
    );
}

#[test]
fn every_command_has_help() {
    for args in [
        &["--help"][..],
        &["canon", "--help"],
        &["fingerprint", "--help"],
        &["ledger", "--help"],
        &["ledger", "list", "--help"],
        &["ledger", "show", "--help"],
        &["ledger", "resolve", "--help"],
        &["ledger", "stats", "--help"],
        &["sweep", "--help"],
        &["prune", "--help"],
    ] {
        let out = once_cmd(args, b"", None);
        assert!(out.status.success(), "{args:?}");
        assert!(text(&out.stdout).contains("Usage"), "{args:?}");
    }
}

#[test]
fn ledger_output_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    {
        let storage = SqliteStorage::open(&db, SqliteOptions::default()).unwrap();
        let once = Once::builder(storage).build().unwrap();
        let _ = once
            .call("default", Some("paid"), "refund_order", r#"{"order_id":1}"#, |_| {
                Sent::Success(r#"{"id":"r1"}"#.into())
            })
            .unwrap();
    }
    // The reader is gone before the CLI writes its first byte (`once ledger list | head` after head exits).
    for args in [
        &["ledger", "list"][..],
        &["ledger", "show", "paid"],
        &["ledger", "stats"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_once"))
            .args(args)
            .env("ONCE_DB", &db)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}, stderr: {stderr}", out.status);
        assert_eq!(stderr, "", "{args:?}: nothing on stderr");
    }
}
