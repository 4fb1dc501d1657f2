//! SQLite: intent-only durability and group commit, on real files.
//!
//! Intent-only mode must commit `begin` (and everything but `finish`) at
//! `synchronous=FULL` and `finish` at `NORMAL`, without changing any
//! decision. Group commit must give every concurrent caller its own,
//! correct compare-and-swap result: one winner per contested version, no
//! lost write, and an error (never a success) for every batch of a group
//! whose transaction fails. The commit delay (a leader waiting for company)
//! must never report `Ok` before the group's `COMMIT`: every acknowledged
//! batch is visible to another connection at once and survives a SIGKILL.

mod observed_common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use observed_common::Observed;
use once::storage::sqlite::{CommitCounts, SqliteOptions, SqliteStorage, Synchronous};
use once::storage::{CommitError, Flush, Storage};
use once::types::{AuditEvent, Batch, Ending, Outcome, Put, Row, State, Table};
use once::{Called, Once, Sent};

fn counter(version: u64, body: String) -> Row {
    Row {
        table: Table::Quota,
        scope: "s".into(),
        key: "counter".into(),
        version,
        state: None,
        due_at: None,
        owner: None,
        body,
    }
}

fn put(expected: Option<u64>, row: Row) -> Put {
    Put {
        table: row.table,
        scope: row.scope.clone(),
        key: row.key.clone(),
        expected,
        row: Some(row),
    }
}

fn event(key: &str, version: u64) -> AuditEvent {
    AuditEvent {
        scope: "s".into(),
        key: key.into(),
        version,
        at: version,
        kind: "bump".into(),
        from_state: None,
        to_state: None,
        attempt: None,
        detail: "{}".into(),
    }
}

fn open(path: &Path, synchronous: Synchronous) -> SqliteStorage {
    SqliteStorage::open(
        path,
        SqliteOptions {
            synchronous,
            busy_timeout: Duration::from_secs(5),
        },
    )
    .expect("open sqlite")
}

/// The store at `path`, the flushes its commits were asked for, and a `Once` over both.
fn observed(path: &Path, synchronous: Synchronous) -> (Arc<SqliteStorage>, Arc<Mutex<Vec<Flush>>>, Once) {
    let store = Arc::new(open(path, synchronous));
    let flushes = Arc::new(Mutex::new(Vec::new()));
    let seen = flushes.clone();
    let once = Once::builder(Observed {
        store: store.clone(),
        seen: move |_: &Batch, flush, _: &Result<(), CommitError>| seen.lock().unwrap().push(flush),
    })
    .build()
    .unwrap();
    (store, flushes, once)
}

/// Confirmed by this call's own send (not a replay).
fn sent_now(called: &Called) -> bool {
    called.confirmed().is_some_and(|c| !c.replayed)
}

/// One protected call over a store opened with `synchronous`: the flush the
/// host asked for on each commit, and the store's commit counts.
fn protected_call(synchronous: Synchronous) -> (Called, Vec<Flush>, CommitCounts, Option<Row>) {
    protected_call_answered(synchronous, Sent::Success(r#"{"id":"r_1"}"#.into()))
}

/// [`protected_call`] with the provider answering `sent`.
fn protected_call_answered(synchronous: Synchronous, sent: Sent) -> (Called, Vec<Flush>, CommitCounts, Option<Row>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let (store, flushes, once) = observed(&path, synchronous);
    let called = once
        .call(
            "tenant",
            Some("refund-1"),
            "refund",
            r#"{"order":1,"amount":2}"#,
            |_| sent.clone(),
        )
        .unwrap();
    let counts = store.commit_counts();
    let flushes = flushes.lock().unwrap().clone();
    drop(once);
    drop(store);
    // What a fresh process reads back from the file.
    let reopened = open(&path, Synchronous::Full);
    let rows = reopened.list(None, 10).unwrap();
    (called, flushes, counts, rows.into_iter().next())
}

#[test]
fn intent_only_commits_begin_full_and_finish_normal() {
    let (called, flushes, counts, row) = protected_call(Synchronous::IntentOnly);
    assert!(sent_now(&called), "{called:?}");
    // The engine marks only the success's commit deferrable, and it is the last one.
    assert_eq!(flushes.last(), Some(&Flush::Deferred), "{flushes:?}");
    assert_eq!(
        flushes.iter().filter(|f| **f == Flush::Deferred).count(),
        1,
        "{flushes:?}"
    );
    let begin_commits = flushes.len() as u64 - 1;
    assert!(begin_commits >= 1, "{flushes:?}");
    assert_eq!(
        counts,
        CommitCounts {
            full: begin_commits,
            normal: 1,
            batches: begin_commits + 1,
            backed_off: 0
        }
    );
    assert_eq!(row.unwrap().state, Some(State::Confirmed));
}

/// A rejection is not deferred: lost in a power failure it would turn a
/// reported refusal into an owed dispatch. Only a success rides on the next fsync.
#[test]
fn intent_only_commits_a_rejection_full() {
    let (called, flushes, counts, row) = protected_call_answered(
        Synchronous::IntentOnly,
        Sent::Rejected(r#"{"error":"declined"}"#.into()),
    );
    assert!(matches!(called.ending(), Some(Ending::Rejected(_))), "{called:?}");
    assert!(flushes.iter().all(|f| *f == Flush::Now), "{flushes:?}");
    let n = flushes.len() as u64;
    assert_eq!(
        counts,
        CommitCounts {
            full: n,
            normal: 0,
            batches: n,
            backed_off: 0
        }
    );
    assert_eq!(row.unwrap().state, Some(State::Failed));
}

/// A replay's count is bookkeeping (lost, the receipt still replays), so it rides
/// on the next fsync; a late success that settles an unknown record is evidence
/// nothing else re-reads for sure, so it is durable before `Ok`.
#[test]
fn intent_only_defers_a_replay_count_but_not_a_late_success() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, flushes, once) = observed(&dir.path().join("once.db"), Synchronous::IntentOnly);
    let args = r#"{"order":1,"amount":2}"#;
    let first = once
        .call("tenant", Some("r-1"), "refund", args, |_| {
            Sent::Success(r#"{"id":"r_1"}"#.into())
        })
        .unwrap();
    assert!(sent_now(&first), "{first:?}");
    flushes.lock().unwrap().clear();
    let again = once
        .call("tenant", Some("r-1"), "refund", args, |_| panic!("a replay sent"))
        .unwrap();
    assert!(again.confirmed().is_some_and(|c| c.replayed), "{again:?}");
    let replay = flushes.lock().unwrap().clone();
    // The blind claim conflicts (nothing written either way), then the count.
    assert_eq!(replay.last(), Some(&Flush::Deferred), "{replay:?}");

    // A lost reply: the record is unknown. A late success reported for it is
    // the only news the ledger gets that the effect happened.
    let lost = once
        .call("tenant", Some("r-2"), "refund", args, |_| {
            Sent::Ambiguous("reset".into())
        })
        .unwrap();
    let grant_fence = once.inspect("tenant", "r-2").unwrap().unwrap().body;
    assert!(matches!(lost.ending(), Some(Ending::Unknown(_))), "{lost:?}");
    let fence = serde_json::from_str::<serde_json::Value>(&grant_fence).unwrap()["attempts"][0]["fence"]
        .as_str()
        .unwrap()
        .to_string();
    flushes.lock().unwrap().clear();
    once.transitions()
        .finish("tenant", "r-2", &fence, &Outcome::Success(r#"{"id":"r_2"}"#.into()))
        .unwrap();
    let late = flushes.lock().unwrap().clone();
    assert!(late.iter().all(|f| *f == Flush::Now), "{late:?}");
    assert_eq!(once.inspect("tenant", "r-2").unwrap().unwrap().state, State::Confirmed);
}

#[test]
fn full_mode_commits_everything_full() {
    let (called, flushes, counts, row) = protected_call(Synchronous::Full);
    assert!(sent_now(&called), "{called:?}");
    let n = flushes.len() as u64;
    assert_eq!(
        counts,
        CommitCounts {
            full: n,
            normal: 0,
            batches: n,
            backed_off: 0
        }
    );
    assert_eq!(row.unwrap().state, Some(State::Confirmed));
}

#[test]
fn normal_mode_commits_everything_normal() {
    let (called, flushes, counts, _) = protected_call(Synchronous::Normal);
    assert!(called.receipt().is_some(), "{called:?}");
    assert_eq!(counts.full, 0);
    assert_eq!(counts.normal, flushes.len() as u64);
}

#[test]
fn a_deferred_commit_alone_is_normal_and_a_later_one_full() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("once.db"), Synchronous::IntentOnly);
    let b = |expected, v: u64| Batch {
        puts: vec![put(expected, counter(v, v.to_string()))],
        events: vec![],
        deferrable: false,
    };
    s.commit_with(&b(None, 1), Flush::Deferred).unwrap();
    s.commit_with(&b(Some(1), 2), Flush::Now).unwrap();
    s.commit(&b(Some(2), 3)).unwrap();
    assert_eq!(
        s.commit_counts(),
        CommitCounts {
            full: 2,
            normal: 1,
            batches: 3,
            backed_off: 0
        }
    );
    // A conflict commits nothing at either level.
    assert_eq!(
        s.commit_with(&b(Some(1), 2), Flush::Deferred),
        Err(CommitError::Conflict)
    );
    assert_eq!(s.commit_counts().batches, 3);
}

/// Many threads bump one counter by compare-and-swap, retrying on conflict.
/// Every version has exactly one winning batch and none is lost.
#[test]
fn concurrent_compare_and_swap_has_one_winner_per_version() {
    const THREADS: usize = 16;
    const EACH: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("once.db"), Synchronous::Full);
    s.commit(&Batch {
        puts: vec![put(None, counter(0, "start".into()))],
        events: vec![],
        deferrable: false,
    })
    .unwrap();
    let barrier = Barrier::new(THREADS);
    let won: Vec<(usize, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let mut won = Vec::new();
                    while won.len() < EACH {
                        let current = s.get(Table::Quota, "s", "counter").unwrap().unwrap().version;
                        let next = current + 1;
                        let batch = Batch {
                            puts: vec![put(Some(current), counter(next, format!("{t}:{next}")))],
                            events: vec![event("counter", next)],
                            deferrable: false,
                        };
                        match s.commit(&batch) {
                            Ok(()) => won.push((t, next)),
                            Err(CommitError::Conflict) => {}
                            Err(e) => panic!("thread {t}: {e}"),
                        }
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let total = (THREADS * EACH) as u64;
    let mut versions: Vec<u64> = won.iter().map(|(_, v)| *v).collect();
    versions.sort_unstable();
    assert_eq!(versions, (1..=total).collect::<Vec<_>>(), "one winner per version");
    let last = s.get(Table::Quota, "s", "counter").unwrap().unwrap();
    assert_eq!(last.version, total);
    let (winner, _) = won.iter().find(|(_, v)| *v == total).unwrap();
    assert_eq!(last.body, format!("{winner}:{total}"));
    let trail = s.audit("s", "counter").unwrap();
    assert_eq!(
        trail.iter().map(|e| e.version).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
    let counts = s.commit_counts();
    assert_eq!(counts.batches, total + 1);
    eprintln!("{THREADS} threads: {counts:?}");
}

/// Racing inserts of one key from many threads: exactly one succeeds per round.
#[test]
fn concurrent_inserts_one_winner_per_key() {
    const THREADS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("once.db"), Synchronous::IntentOnly);
    for round in 0..10 {
        let key = format!("k{round}");
        let barrier = Barrier::new(THREADS);
        let results: Vec<Result<(), CommitError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (s, barrier, key) = (&s, &barrier, &key);
                    scope.spawn(move || {
                        let row = Row {
                            key: key.clone(),
                            ..counter(1, format!("thread {t}"))
                        };
                        barrier.wait();
                        let flush = if t % 2 == 0 { Flush::Now } else { Flush::Deferred };
                        s.commit_with(
                            &Batch {
                                puts: vec![put(None, row)],
                                events: vec![event(key, 1)],
                                deferrable: false,
                            },
                            flush,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        assert!(results.iter().all(|r| matches!(r, Ok(()) | Err(CommitError::Conflict))));
        assert_eq!(s.audit("s", &key).unwrap().len(), 1);
    }
}

/// Holds the write lock from another connection so that batches queue up
/// behind a first leader, then releases it: the queued batches form one group.
fn queued_group(
    path: &Path,
    s: &SqliteStorage,
    batches: Vec<Batch>,
    before_release: impl FnOnce(),
) -> Vec<Result<(), CommitError>> {
    let blocker = rusqlite::Connection::open(path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::scope(|scope| {
        // The first leader takes its own batch and waits for the lock.
        let first = batches[0].clone();
        let leader = scope.spawn(move || s.commit(&first));
        std::thread::sleep(Duration::from_millis(150));
        let rest: Vec<_> = batches[1..]
            .iter()
            .map(|b| {
                let handle = scope.spawn(move || s.commit(b));
                std::thread::sleep(Duration::from_millis(30));
                handle
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        before_release();
        blocker.execute_batch("ROLLBACK").unwrap();
        let mut results = vec![leader.join().unwrap()];
        results.extend(rest.into_iter().map(|h| h.join().unwrap()));
        results
    })
}

/// A batch inserting a counter row named `key` (body `key`), with no audit event.
fn insert_counter(key: &str) -> Batch {
    Batch {
        puts: vec![put(
            None,
            Row {
                key: key.into(),
                ..counter(1, key.into())
            },
        )],
        events: vec![],
        deferrable: false,
    }
}

#[test]
fn a_conflicting_batch_in_a_group_is_rolled_back_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let s = open(&path, Synchronous::Full);
    let insert = |key: &str| Batch {
        events: vec![event(key, 1)],
        ..insert_counter(key)
    };
    let before = s.commit_counts();
    let results = queued_group(
        &path,
        &s,
        vec![insert("a"), insert("b"), insert("a"), insert("c")],
        || {},
    );
    assert_eq!(results, vec![Ok(()), Ok(()), Err(CommitError::Conflict), Ok(())]);
    for key in ["a", "b", "c"] {
        assert_eq!(s.get(Table::Quota, "s", key).unwrap().unwrap().body, key);
        assert_eq!(s.audit("s", key).unwrap().len(), 1);
    }
    let after = s.commit_counts();
    // The leader's batch alone, then b, a (conflict) and c in one transaction.
    assert_eq!(after.full - before.full, 2, "{after:?}");
    assert_eq!(after.batches - before.batches, 3, "{after:?}");
}

/// Only a loser to its own group backs off, and only if it is not deferrable: the leader commits
/// `a` alone; then one group holds `b`, `b` again (lost to its own group: backs off), `a` again (lost
/// to the earlier commit, as a replay's blind insert does: answers at once), `c` twice deferrable
/// (the second lost to its group, but a deferrable batch is a replay's count or a report: at once).
#[test]
fn only_a_loser_to_its_own_group_backs_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let s = open(&path, Synchronous::Full);
    let deferrable = |key: &str| Batch {
        deferrable: true,
        ..insert_counter(key)
    };
    let batches = vec![
        insert_counter("a"),
        insert_counter("b"),
        insert_counter("b"),
        insert_counter("a"),
        deferrable("c"),
        deferrable("c"),
    ];
    let results = queued_group(&path, &s, batches, || {});
    let conflict = || Err(CommitError::Conflict);
    assert_eq!(
        results,
        vec![Ok(()), Ok(()), conflict(), conflict(), Ok(()), conflict()]
    );
    assert_eq!(s.commit_counts().backed_off, 1, "{:?}", s.commit_counts());
}

#[test]
fn a_failed_group_fails_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let moved = dir.path().join("moved.db");
    let s = open(&path, Synchronous::Full);
    // The file is moved away while the batches wait: none may be reported applied.
    let results = queued_group(
        &path,
        &s,
        vec![insert_counter("a"), insert_counter("b"), insert_counter("c")],
        || {
            std::fs::rename(&path, &moved).unwrap();
        },
    );
    for r in &results {
        match r {
            Err(CommitError::Storage(e)) => assert!(e.0.contains("deleted since it was opened"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(s.commit_counts().batches, 0);
}

/// Two callers commit side by side (so the leader delays for company): after
/// each `Ok`, another connection already sees the batch, and the store counts
/// every batch in a committed FULL transaction.
#[test]
fn a_delayed_group_reports_ok_only_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let s = open(&path, Synchronous::Full);
    let per_caller = 150;
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (s, path) = (&s, &path);
            scope.spawn(move || {
                let reader = rusqlite::Connection::open(path).unwrap();
                for i in 0..per_caller {
                    let key = format!("t{t}-{i}");
                    s.commit(&insert_counter(&key)).unwrap();
                    let seen: bool = reader
                        .query_row(
                            "SELECT EXISTS (SELECT 1 FROM rows WHERE tbl = 'quota' AND scope = 's' AND key = ?1)",
                            [&key],
                            |r| r.get(0),
                        )
                        .unwrap();
                    assert!(seen, "{key} was acknowledged before its COMMIT");
                }
            });
        }
    });
    let counts = s.commit_counts();
    assert_eq!(counts.batches, 2 * per_caller, "{counts:?}");
    assert!(counts.full >= 1 && counts.full <= counts.batches, "{counts:?}");
    assert_eq!(counts.normal, 0, "{counts:?}");
    // A caller left alone afterwards is not held back waiting for the other.
    s.commit(&insert_counter("alone")).unwrap();
    assert!(s.get(Table::Quota, "s", "alone").unwrap().is_some());
}

/// Where the child writer of [`a_sigkilled_writer_keeps_every_acknowledged_batch`] writes.
const CHILD_LEDGER: &str = "ONCE_GROUP_TEST_LEDGER";

/// Run by the test below: two threads insert rows through group commit
/// until killed, printing each key once its commit returned `Ok`.
#[test]
#[ignore = "a child process of a_sigkilled_writer_keeps_every_acknowledged_batch"]
fn child_group_writer() {
    let Ok(path) = std::env::var(CHILD_LEDGER) else {
        return;
    };
    let s = open(Path::new(&path), Synchronous::Full);
    let out = Mutex::new(std::io::stdout());
    std::thread::scope(|scope| {
        for t in 0..2 {
            let (s, out) = (&s, &out);
            scope.spawn(move || {
                for i in 0u64.. {
                    let key = format!("t{t}-{i}");
                    s.commit(&insert_counter(&key)).unwrap();
                    let mut out = out.lock().unwrap();
                    writeln!(out, "{key}").unwrap();
                    out.flush().unwrap();
                }
            });
        }
    });
}

/// A process whose two callers share delayed group commits is SIGKILLed
/// mid-stream: every batch it acknowledged is in the file afterwards.
#[test]
fn a_sigkilled_writer_keeps_every_acknowledged_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    drop(open(&path, Synchronous::Full));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_group_writer",
            "--test-threads=1",
            "--quiet",
            "--nocapture",
        ])
        .env(CHILD_LEDGER, &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The test harness prints a line or two of its own around the keys.
    let is_key = |l: &String| l.starts_with("t0-") || l.starts_with("t1-");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acknowledged = Vec::new();
    while acknowledged.len() < 200 {
        let line = lines.next().expect("the child stopped early").unwrap();
        if is_key(&line) {
            acknowledged.push(line);
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // What it printed before dying was acknowledged too.
    acknowledged.extend(lines.map_while(Result::ok).filter(is_key));
    let s = open(&path, Synchronous::Full);
    for key in &acknowledged {
        assert!(
            s.get(Table::Quota, "s", key).unwrap().is_some(),
            "{key} was acknowledged but is not in the ledger"
        );
    }
}
