//! Storage backends: the compare-and-swap contract, on memory and on SQLite files.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use once::bindings::types::{AuditEvent, Batch, Put, Row, State, Table};
use once::storage::memory::MemoryStorage;
use once::storage::sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStorage, Synchronous};
use once::storage::{CommitError, Stats, Storage};

// ---------------------------------------------------------------- helpers

fn row(table: Table, scope: &str, key: &str, version: u64) -> Row {
    Row {
        table,
        scope: scope.into(),
        key: key.into(),
        version,
        state: None,
        due_at: None,
        body: format!("{{\"v\":{version}}}"),
    }
}

fn op(scope: &str, key: &str, version: u64, state: State, due_at: Option<u64>) -> Row {
    Row {
        state: Some(state),
        due_at,
        ..row(Table::Operation, scope, key, version)
    }
}

/// A put that writes `r` over `expected`.
fn put(expected: Option<u64>, r: Row) -> Put {
    Put {
        table: r.table,
        scope: r.scope.clone(),
        key: r.key.clone(),
        expected,
        row: Some(r),
    }
}

fn delete(table: Table, scope: &str, key: &str, expected: Option<u64>) -> Put {
    Put {
        table,
        scope: scope.into(),
        key: key.into(),
        expected,
        row: None,
    }
}

fn event(scope: &str, key: &str, version: u64, kind: &str) -> AuditEvent {
    AuditEvent {
        scope: scope.into(),
        key: key.into(),
        version,
        at: 1_000 + version,
        kind: kind.into(),
        from_state: None,
        to_state: Some(State::InFlight),
        attempt: Some(1),
        detail: "{}".into(),
    }
}

fn batch(puts: Vec<Put>, events: Vec<AuditEvent>) -> Batch {
    Batch { puts, events }
}

fn puts(puts: Vec<Put>) -> Batch {
    batch(puts, vec![])
}

fn get(s: &dyn Storage, table: Table, scope: &str, key: &str) -> Option<Row> {
    s.get(table, scope, key).expect("get")
}

fn keys(rows: &[Row]) -> Vec<(String, String)> {
    rows.iter().map(|r| (r.scope.clone(), r.key.clone())).collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

fn open(path: &Path) -> SqliteStorage {
    SqliteStorage::open(path, SqliteOptions::default()).expect("open sqlite")
}

// ------------------------------------------------- behaviour, both backends

fn insert_if_absent(s: &dyn Storage) {
    assert_eq!(get(s, Table::Operation, "s", "k"), None);
    let first = op("s", "k", 1, State::InFlight, Some(10));
    s.commit(&puts(vec![put(None, first.clone())])).unwrap();
    assert_eq!(get(s, Table::Operation, "s", "k"), Some(first.clone()));

    let second = Row {
        body: "other".into(),
        ..first.clone()
    };
    assert_eq!(s.commit(&puts(vec![put(None, second)])), Err(CommitError::Conflict));
    assert_eq!(get(s, Table::Operation, "s", "k"), Some(first));

    // The same (scope, key) in another table is another row.
    let quota = row(Table::Quota, "s", "k", 1);
    s.commit(&puts(vec![put(None, quota.clone())])).unwrap();
    assert_eq!(get(s, Table::Quota, "s", "k"), Some(quota));
    assert_eq!(get(s, Table::Tombstone, "s", "k"), None);

    // Scope and key are both part of the identity.
    assert_eq!(get(s, Table::Operation, "s", "k2"), None);
    assert_eq!(get(s, Table::Operation, "s2", "k"), None);
}

fn compare_and_swap(s: &dyn Storage) {
    s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, Some(5)))]))
        .unwrap();

    // Wrong version: too old, too new, or expecting a row that is absent.
    for expected in [0, 2, 7] {
        let r = op("s", "k", expected + 1, State::Confirmed, None);
        assert_eq!(
            s.commit(&puts(vec![put(Some(expected), r)])),
            Err(CommitError::Conflict),
            "expected {expected}"
        );
    }
    assert_eq!(
        s.commit(&puts(vec![put(Some(1), op("s", "missing", 2, State::Confirmed, None))])),
        Err(CommitError::Conflict)
    );
    assert_eq!(get(s, Table::Operation, "s", "k").unwrap().version, 1);

    // Right version: every field is replaced, including clearing due_at.
    let mut v2 = op("s", "k", 2, State::Confirmed, None);
    v2.body = "{\"receipt\":\"é\\u0000 ✓\"}".into();
    s.commit(&puts(vec![put(Some(1), v2.clone())])).unwrap();
    assert_eq!(get(s, Table::Operation, "s", "k"), Some(v2));

    // The old version no longer matches.
    assert_eq!(
        s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Failed, None))])),
        Err(CommitError::Conflict)
    );
    let v3 = Row {
        state: None,
        body: String::new(),
        ..op("s", "k", 3, State::Failed, Some(0))
    };
    s.commit(&puts(vec![put(Some(2), v3.clone())])).unwrap();
    assert_eq!(get(s, Table::Operation, "s", "k"), Some(v3));
}

fn delete_with_version(s: &dyn Storage) {
    s.commit(&puts(vec![put(None, row(Table::Tombstone, "s", "k", 1))]))
        .unwrap();
    s.commit(&puts(vec![put(Some(1), row(Table::Tombstone, "s", "k", 2))]))
        .unwrap();

    for expected in [None, Some(1), Some(3)] {
        assert_eq!(
            s.commit(&puts(vec![delete(Table::Tombstone, "s", "k", expected)])),
            Err(CommitError::Conflict),
            "expected {expected:?}"
        );
    }
    assert!(get(s, Table::Tombstone, "s", "k").is_some());

    s.commit(&puts(vec![delete(Table::Tombstone, "s", "k", Some(2))]))
        .unwrap();
    assert_eq!(get(s, Table::Tombstone, "s", "k"), None);
    // Deleting again: the row is gone.
    assert_eq!(
        s.commit(&puts(vec![delete(Table::Tombstone, "s", "k", Some(2))])),
        Err(CommitError::Conflict)
    );
    // A delete with expected None asserts absence.
    s.commit(&puts(vec![delete(Table::Tombstone, "s", "k", None)])).unwrap();
    assert_eq!(get(s, Table::Tombstone, "s", "k"), None);

    // After a delete the row may be inserted afresh.
    s.commit(&puts(vec![put(None, row(Table::Tombstone, "s", "k", 1))]))
        .unwrap();
    assert_eq!(get(s, Table::Tombstone, "s", "k").unwrap().version, 1);
}

fn batch_is_atomic(s: &dyn Storage) {
    s.commit(&puts(vec![put(None, op("s", "b", 1, State::InFlight, None))]))
        .unwrap();

    // First put would apply, second conflicts: nothing applied.
    let r = s.commit(&batch(
        vec![
            put(None, op("s", "a", 1, State::InFlight, Some(1))),
            put(Some(9), op("s", "b", 10, State::Confirmed, None)),
        ],
        vec![event("s", "a", 1, "begin")],
    ));
    assert_eq!(r, Err(CommitError::Conflict));
    assert_eq!(get(s, Table::Operation, "s", "a"), None);
    assert_eq!(get(s, Table::Operation, "s", "b").unwrap().version, 1);
    assert!(s.audit("s", "a").unwrap().is_empty());

    // Same with an update then a failing insert, and an update then a failing delete.
    let r = s.commit(&puts(vec![
        put(Some(1), op("s", "b", 2, State::Confirmed, None)),
        put(None, op("s", "b", 1, State::InFlight, None)),
    ]));
    assert_eq!(r, Err(CommitError::Conflict));
    let r = s.commit(&puts(vec![
        put(Some(1), op("s", "b", 2, State::Confirmed, None)),
        delete(Table::Quota, "s", "b", Some(1)),
    ]));
    assert_eq!(r, Err(CommitError::Conflict));
    assert_eq!(
        get(s, Table::Operation, "s", "b"),
        Some(op("s", "b", 1, State::InFlight, None))
    );

    // Two rows in one batch (a successor and the superseded original, a quota bucket).
    s.commit(&batch(
        vec![
            put(None, op("s", "a", 1, State::InFlight, Some(1))),
            put(Some(1), op("s", "b", 2, State::Superseded, None)),
            put(None, row(Table::Quota, "s", "bucket", 1)),
        ],
        vec![event("s", "a", 1, "begin"), event("s", "b", 2, "superseded")],
    ))
    .unwrap();
    assert_eq!(get(s, Table::Operation, "s", "a").unwrap().version, 1);
    assert_eq!(
        get(s, Table::Operation, "s", "b").unwrap().state,
        Some(State::Superseded)
    );
    assert!(get(s, Table::Quota, "s", "bucket").is_some());

    // Puts on one row apply in order.
    s.commit(&puts(vec![
        put(None, row(Table::Quota, "s", "seq", 1)),
        put(Some(1), row(Table::Quota, "s", "seq", 2)),
        put(Some(2), row(Table::Quota, "s", "seq", 3)),
    ]))
    .unwrap();
    assert_eq!(get(s, Table::Quota, "s", "seq").unwrap().version, 3);
    s.commit(&puts(vec![
        delete(Table::Quota, "s", "seq", Some(3)),
        put(None, row(Table::Quota, "s", "seq", 1)),
    ]))
    .unwrap();
    assert_eq!(get(s, Table::Quota, "s", "seq").unwrap().version, 1);

    // An empty batch is fine.
    s.commit(&batch(vec![], vec![])).unwrap();
}

fn mismatched_row_is_refused(s: &dyn Storage) {
    let mut p = put(None, op("s", "k", 1, State::InFlight, None));
    p.key = "other".into();
    let r = s.commit(&batch(
        vec![put(None, op("s", "first", 1, State::InFlight, None)), p],
        vec![],
    ));
    assert!(matches!(r, Err(CommitError::Storage(_))), "{r:?}");
    let mut p = put(None, op("s", "k", 1, State::InFlight, None));
    p.table = Table::Quota;
    assert!(matches!(s.commit(&puts(vec![p])), Err(CommitError::Storage(_))));
    assert_eq!(get(s, Table::Operation, "s", "first"), None);
    assert_eq!(get(s, Table::Operation, "s", "k"), None);
    assert_eq!(get(s, Table::Operation, "s", "other"), None);
}

fn audit_is_append_only(s: &dyn Storage) {
    s.commit(&batch(
        vec![put(None, op("s", "k", 1, State::InFlight, None))],
        vec![event("s", "k", 1, "begin")],
    ))
    .unwrap();

    // A duplicate event fails the batch, and its put with it.
    let r = s.commit(&batch(
        vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))],
        vec![event("s", "k", 1, "finish-success")],
    ));
    assert_eq!(r, Err(CommitError::Conflict));
    assert_eq!(get(s, Table::Operation, "s", "k").unwrap().version, 1);
    assert_eq!(s.audit("s", "k").unwrap(), vec![event("s", "k", 1, "begin")]);

    // Twice the same event in one batch.
    let r = s.commit(&batch(
        vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))],
        vec![event("s", "k", 2, "a"), event("s", "k", 2, "b")],
    ));
    assert_eq!(r, Err(CommitError::Conflict));
    assert_eq!(s.audit("s", "k").unwrap().len(), 1);

    // Events come back oldest version first, whatever the insertion order,
    // with every field intact.
    let mut e3 = event("s", "k", 3, "lease-expired");
    e3.from_state = Some(State::InFlight);
    e3.to_state = Some(State::Unknown);
    e3.attempt = None;
    e3.detail = "{\"note\":\"ü\"}".into();
    let mut e10 = event("s", "k", 10, "prune");
    e10.to_state = None;
    e10.at = 1 << 50;
    s.commit(&batch(vec![], vec![e10.clone(), e3.clone()])).unwrap();
    s.commit(&batch(vec![], vec![event("s", "k", 2, "finish-success")]))
        .unwrap();
    let trail = s.audit("s", "k").unwrap();
    assert_eq!(trail.iter().map(|e| e.version).collect::<Vec<_>>(), vec![1, 2, 3, 10]);
    assert_eq!(trail[2], e3);
    assert_eq!(trail[3], e10);

    // Other operations' trails are separate.
    s.commit(&batch(
        vec![],
        vec![event("s", "k2", 1, "begin"), event("t", "k", 1, "begin")],
    ))
    .unwrap();
    assert_eq!(s.audit("s", "k").unwrap().len(), 4);
    assert_eq!(s.audit("s", "k2").unwrap().len(), 1);
    assert_eq!(s.audit("t", "k").unwrap().len(), 1);
    assert!(s.audit("nobody", "k").unwrap().is_empty());
}

fn scan_filters_and_orders(s: &dyn Storage) {
    s.commit(&puts(vec![
        put(None, op("b", "1", 1, State::InFlight, Some(30))),
        put(None, op("a", "2", 1, State::Unknown, Some(20))),
        put(None, op("a", "1", 1, State::InFlight, Some(20))),
        put(None, op("c", "1", 1, State::Absent, Some(10))),
        put(None, op("c", "2", 1, State::Confirmed, Some(40))),
        put(None, op("c", "3", 1, State::Confirmed, None)),
        put(
            None,
            Row {
                state: None,
                ..op("d", "1", 1, State::Failed, Some(15))
            },
        ),
        put(
            None,
            Row {
                due_at: Some(5),
                ..row(Table::Tombstone, "t", "1", 1)
            },
        ),
        put(None, row(Table::Quota, "q", "1", 1)),
    ]))
    .unwrap();

    let scan =
        |states: &[State], before: u64, limit: u32| keys(&s.scan(Table::Operation, states, before, limit).unwrap());
    // Any state (including none), ordered by due_at, then scope, then key.
    assert_eq!(
        scan(&[], u64::MAX, 100),
        pairs(&[("c", "1"), ("d", "1"), ("a", "1"), ("a", "2"), ("b", "1"), ("c", "2")])
    );
    // due_before is inclusive.
    assert_eq!(
        scan(&[], 20, 100),
        pairs(&[("c", "1"), ("d", "1"), ("a", "1"), ("a", "2")])
    );
    assert_eq!(scan(&[], 19, 100), pairs(&[("c", "1"), ("d", "1")]));
    assert_eq!(scan(&[], 9, 100), pairs(&[]));
    // Limit.
    assert_eq!(scan(&[], u64::MAX, 3), pairs(&[("c", "1"), ("d", "1"), ("a", "1")]));
    assert_eq!(scan(&[], u64::MAX, 0), pairs(&[]));
    // States.
    assert_eq!(
        scan(&[State::InFlight], u64::MAX, 100),
        pairs(&[("a", "1"), ("b", "1")])
    );
    assert_eq!(
        scan(&[State::Unknown, State::Absent], u64::MAX, 100),
        pairs(&[("c", "1"), ("a", "2")])
    );
    assert_eq!(scan(&[State::Confirmed, State::InFlight], 35, 1), pairs(&[("a", "1")]));
    assert_eq!(scan(&[State::Superseded], u64::MAX, 100), pairs(&[]));
    // Other tables.
    assert_eq!(
        keys(&s.scan(Table::Tombstone, &[], 5, 10).unwrap()),
        pairs(&[("t", "1")])
    );
    assert!(s.scan(Table::Quota, &[], u64::MAX, 10).unwrap().is_empty());
    // Whole rows come back.
    assert_eq!(
        s.scan(Table::Operation, &[State::Absent], 10, 1).unwrap(),
        vec![op("c", "1", 1, State::Absent, Some(10))]
    );
}

fn list_and_stats(s: &dyn Storage) {
    assert_eq!(s.stats().unwrap(), Stats::default());
    assert!(s.list(None, 10).unwrap().is_empty());

    s.commit(&batch(
        vec![
            put(None, op("b", "1", 1, State::Unknown, Some(1))),
            put(None, op("a", "2", 1, State::Confirmed, None)),
            put(None, op("a", "1", 1, State::InFlight, Some(1))),
            put(None, op("a", "3", 1, State::Confirmed, None)),
            put(None, row(Table::Tombstone, "a", "0", 1)),
            put(None, row(Table::Quota, "a", "q", 1)),
        ],
        vec![
            event("a", "1", 1, "begin"),
            event("a", "2", 1, "begin"),
            event("a", "2", 2, "replay"),
            event("b", "1", 1, "lease-expired"),
            event("a", "3", 7, "replay"),
        ],
    ))
    .unwrap();

    assert_eq!(
        keys(&s.list(None, 10).unwrap()),
        pairs(&[("a", "1"), ("a", "2"), ("a", "3"), ("b", "1")])
    );
    assert_eq!(keys(&s.list(None, 2).unwrap()), pairs(&[("a", "1"), ("a", "2")]));
    assert_eq!(
        keys(&s.list(Some(State::Confirmed), 10).unwrap()),
        pairs(&[("a", "2"), ("a", "3")])
    );
    assert_eq!(
        s.list(Some(State::Unknown), 10).unwrap(),
        vec![op("b", "1", 1, State::Unknown, Some(1))]
    );
    assert!(s.list(Some(State::Absent), 10).unwrap().is_empty());

    assert_eq!(
        s.stats().unwrap(),
        Stats {
            by_state: vec![(State::InFlight, 1), (State::Confirmed, 2), (State::Unknown, 1)],
            events: vec![("begin".into(), 2), ("lease-expired".into(), 1), ("replay".into(), 2)],
        }
    );
}

/// Runs one behaviour on a fresh memory store and a fresh SQLite file.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[test] fn $name() { super::$name(&super::MemoryStorage::new()); })*
        }
        mod sqlite {
            $(#[test] fn $name() {
                let dir = tempfile::tempdir().unwrap();
                let s = super::open(&dir.path().join("ledger.db"));
                super::$name(&s);
            })*
        }
    };
}

on_both!(
    insert_if_absent,
    compare_and_swap,
    delete_with_version,
    batch_is_atomic,
    mismatched_row_is_refused,
    audit_is_append_only,
    scan_filters_and_orders,
    list_and_stats,
);

// ----------------------------------------------------------- SQLite only

#[test]
fn sqlite_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let r = op("s", "k", 1, State::InFlight, Some(42));
    {
        let s = open(&path);
        s.commit(&batch(vec![put(None, r.clone())], vec![event("s", "k", 1, "begin")]))
            .unwrap();
    }
    let s = SqliteStorage::open(
        &path,
        SqliteOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_millis(100),
        },
    )
    .unwrap();
    assert_eq!(get(&s, Table::Operation, "s", "k"), Some(r));
    assert_eq!(s.audit("s", "k").unwrap(), vec![event("s", "k", 1, "begin")]);
    assert_eq!(
        s.commit(&puts(vec![put(None, op("s", "k", 1, State::Failed, None))])),
        Err(CommitError::Conflict)
    );
    drop(s);

    // The file is WAL, the schema is recorded, states are readable names.
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
    let version: String = raw
        .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION.to_string());
    let (tbl, state): (String, String) = raw
        .query_row("SELECT tbl, state FROM rows", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!((tbl.as_str(), state.as_str()), ("operation", "in-flight"));
}

#[test]
fn sqlite_writes_are_visible_across_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let a = open(&path);
    let b = open(&path);
    a.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();
    assert_eq!(get(&b, Table::Operation, "s", "k").unwrap().version, 1);
    b.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]))
        .unwrap();
    assert_eq!(get(&a, Table::Operation, "s", "k").unwrap().version, 2);
    assert_eq!(
        a.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Failed, None))])),
        Err(CommitError::Conflict)
    );
}

#[test]
fn sqlite_racing_inserts_one_wins() {
    const THREADS: usize = 8;
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = Arc::new(dir.path().join("ledger.db"));
        let barrier = Arc::new(Barrier::new(THREADS));
        let results: Vec<_> = (0..THREADS)
            .map(|i| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    // Every thread also races to create the file and its schema.
                    let s = SqliteStorage::open(&*path, SqliteOptions::default());
                    barrier.wait();
                    let s = s.expect("open sqlite");
                    let mut r = op("s", "k", 1, State::InFlight, Some(1));
                    r.body = format!("thread {i}");
                    let out = s.commit(&batch(vec![put(None, r)], vec![event("s", "k", 1, "begin")]));
                    (i, out)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let winners: Vec<usize> = results.iter().filter(|(_, r)| r.is_ok()).map(|(i, _)| *i).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (_, r) in &results {
            assert!(matches!(r, Ok(()) | Err(CommitError::Conflict)), "{r:?}");
        }
        let s = open(&path);
        assert_eq!(
            get(&s, Table::Operation, "s", "k").unwrap().body,
            format!("thread {}", winners[0])
        );
        assert_eq!(s.audit("s", "k").unwrap().len(), 1);
    }
}

/// Bump a counter row `n` times by compare-and-swap, retrying on conflict.
fn increment(s: &dyn Storage, n: usize) {
    for _ in 0..n {
        loop {
            let current = get(s, Table::Quota, "s", "counter").map(|r| r.version);
            let next = row(Table::Quota, "s", "counter", current.unwrap_or(0) + 1);
            match s.commit(&batch(
                vec![put(current, next.clone())],
                vec![event("s", "counter", next.version, "bump")],
            )) {
                Ok(()) => break,
                Err(CommitError::Conflict) => continue,
                Err(e) => panic!("increment: {e}"),
            }
        }
    }
}

#[test]
fn sqlite_concurrent_compare_and_swap_loses_nothing() {
    const THREADS: usize = 6;
    const EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let shared = Arc::new(open(&path));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let shared = shared.clone();
            let path = path.clone();
            std::thread::spawn(move || {
                // Half the threads share one handle, half have their own.
                if i % 2 == 0 {
                    increment(&*shared, EACH);
                } else {
                    increment(&open(&path), EACH);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = (THREADS * EACH) as u64;
    assert_eq!(get(&*shared, Table::Quota, "s", "counter").unwrap().version, total);
    let trail = shared.audit("s", "counter").unwrap();
    assert_eq!(
        trail.iter().map(|e| e.version).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
}

const CHILD_DB: &str = "ONCE_STORAGE_TEST_CHILD_DB";
const CHILD_BUMPS: usize = 20;

/// Not a test on its own: the body of each child process of
/// `sqlite_processes_share_one_file`.
#[test]
#[ignore = "run by sqlite_processes_share_one_file in child processes"]
fn sqlite_child_process_increments() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    increment(&open(Path::new(&path)), CHILD_BUMPS);
}

#[test]
fn sqlite_processes_share_one_file() {
    const PROCESSES: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "sqlite_child_process_increments",
                    "--test-threads=1",
                    "--quiet",
                ])
                .env(CHILD_DB, &path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
    }
    let s = open(&path);
    let total = (PROCESSES * CHILD_BUMPS) as u64;
    assert_eq!(get(&s, Table::Quota, "s", "counter").unwrap().version, total);
    assert_eq!(s.audit("s", "counter").unwrap().len() as u64, total);
}

#[test]
fn sqlite_busy_beyond_timeout_is_a_storage_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let s = SqliteStorage::open(
        &path,
        SqliteOptions {
            busy_timeout: Duration::from_millis(50),
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();

    // Another connection holds the write lock.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let r = s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]));
    assert!(matches!(r, Err(CommitError::Storage(_))), "{r:?}");
    // Readers are not blocked by a writer.
    assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, 1);
    blocker.execute_batch("ROLLBACK").unwrap();

    // The store recovers once the lock is released.
    s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]))
        .unwrap();
    assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, 2);
}

#[test]
fn sqlite_values_beyond_i64_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("ledger.db"));
    let r = op("s", "k", 1, State::InFlight, Some(u64::MAX));
    let out = s.commit(&batch(
        vec![put(None, op("s", "ok", 1, State::InFlight, None)), put(None, r)],
        vec![],
    ));
    assert!(matches!(out, Err(CommitError::Storage(_))), "{out:?}");
    assert_eq!(get(&s, Table::Operation, "s", "ok"), None);
    // The store still works after the rollback.
    s.commit(&puts(vec![put(None, op("s", "ok", 1, State::InFlight, None))]))
        .unwrap();
}

#[test]
fn sqlite_directory_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = SqliteStorage::open(dir.path(), SqliteOptions::default()).unwrap_err();
    assert!(e.0.contains("directory"), "{e}");
    let e = SqliteStorage::open(dir.path().join("missing/ledger.db"), SqliteOptions::default()).unwrap_err();
    assert!(e.0.contains("open"), "{e}");
}

#[test]
fn sqlite_not_a_database_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    std::fs::write(&path, b"this is not an sqlite database, just some text\n".repeat(100)).unwrap();
    let e = SqliteStorage::open(&path, SqliteOptions::default()).unwrap_err();
    assert!(e.0.contains("ledger.db"), "{e}");
}

#[test]
fn sqlite_read_only_file_is_an_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    {
        let s = open(&path);
        s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
            .unwrap();
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    if std::fs::OpenOptions::new().write(true).open(&path).is_ok() {
        // Running as root: permissions do not make the file read-only.
        eprintln!("skipped: a 0444 file is still writable by this user");
        return;
    }
    let e = SqliteStorage::open(&path, SqliteOptions::default()).unwrap_err();
    assert!(e.0.contains("read-only") || e.0.contains("readonly"), "{e}");
}

#[test]
fn sqlite_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    drop(open(&path));
    // Reopening the same version is fine (the schema is created idempotently).
    drop(open(&path));
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'schema_version'",
        [(SCHEMA_VERSION + 1).to_string()],
    )
    .unwrap();
    drop(raw);
    let e = SqliteStorage::open(&path, SqliteOptions::default()).unwrap_err();
    assert!(e.0.contains("newer"), "{e}");
}
