//! Storage backends: the compare-and-swap contract.
//!
//! One conformance suite (every behaviour the engine relies on) runs on
//! memory, on SQLite files and on PostgreSQL (a schema of its own per test on
//! the server named by `ONCE_TEST_DATABASE_URL`; without it the PostgreSQL
//! cases print "skipped: no database" and pass; they need once-host's
//! `postgres` feature, which `cargo test --workspace` enables through the CLI).
//! Backend-specific checks follow.

#[cfg(feature = "postgres")]
mod postgres_common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;
#[cfg(feature = "postgres")]
use std::time::Instant;

#[cfg(feature = "postgres")]
use once::Clock;
use once::Once;
#[cfg(feature = "postgres")]
use once::storage::StorageError;
use once::storage::memory::MemoryStorage;
#[cfg(feature = "postgres")]
use once::storage::postgres::{self as pg, PostgresOptions, PostgresStorage};
use once::storage::sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStorage, Synchronous};
use once::storage::{CommitError, Stats, Storage};
use once::types::{AuditEvent, Batch, Put, Row, State, Table};
#[cfg(feature = "postgres")]
use postgres_common::TestSchema;

// ---------------------------------------------------------------- helpers

fn row(table: Table, scope: &str, key: &str, version: u64) -> Row {
    Row {
        table,
        scope: scope.into(),
        key: key.into(),
        version,
        state: None,
        due_at: None,
        owner: None,
        body: format!("{{\"v\":{version}}}"),
    }
}

fn op(scope: &str, key: &str, version: u64, state: State, due_at: Option<u64>) -> Row {
    Row {
        state: Some(state),
        due_at,
        owner: Some("o1".into()),
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
    Batch {
        puts,
        events,
        deferrable: false,
    }
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
        put(
            None,
            Row {
                owner: Some("o2".into()),
                ..op("e", "1", 1, State::Unknown, Some(12))
            },
        ),
    ]))
    .unwrap();

    let scan = |states: &[State], before: u64, limit: u32| {
        keys(&s.scan(Table::Operation, states, before, Some("o1"), limit).unwrap())
    };
    // An owner sees only its rows; no owner, every row.
    assert_eq!(
        keys(
            &s.scan(Table::Operation, &[State::Unknown], 100, Some("o2"), 10)
                .unwrap()
        ),
        pairs(&[("e", "1")])
    );
    assert_eq!(
        keys(&s.scan(Table::Operation, &[State::Unknown], 100, None, 10).unwrap()),
        pairs(&[("e", "1"), ("a", "2")])
    );
    assert!(s.scan(Table::Operation, &[], 100, Some("o3"), 10).unwrap().is_empty());
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
        keys(&s.scan(Table::Tombstone, &[], 5, None, 10).unwrap()),
        pairs(&[("t", "1")])
    );
    assert!(s.scan(Table::Quota, &[], u64::MAX, None, 10).unwrap().is_empty());
    // Whole rows come back, owner and all.
    assert_eq!(
        s.scan(Table::Operation, &[State::Absent], 10, Some("o1"), 1).unwrap(),
        vec![op("c", "1", 1, State::Absent, Some(10))]
    );
}

fn list_and_stats(s: &dyn Storage) {
    assert_eq!(s.stats(None).unwrap(), Stats::default());
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
        s.stats(None).unwrap(),
        Stats {
            by_state: vec![(State::InFlight, 1), (State::Confirmed, 2), (State::Unknown, 1)],
            events: vec![("begin".into(), 2), ("lease-expired".into(), 1), ("replay".into(), 2)],
        }
    );
    // One scope's counts: an operator limited to it sees nothing of another's.
    assert_eq!(
        s.stats(Some("b")).unwrap(),
        Stats {
            by_state: vec![(State::Unknown, 1)],
            events: vec![("lease-expired".into(), 1)],
        }
    );
    assert_eq!(s.stats(Some("c")).unwrap(), Stats::default());
}

/// Names sort by their UTF-8 bytes on every backend (upper case before lower,
/// ASCII before everything else), whatever the database's collation says.
fn names_order_by_bytes(s: &dyn Storage) {
    let names = ["b", "B", "a", "é", "Z", "a b", "ab", "_", "1"];
    s.commit(&puts(
        names
            .iter()
            .map(|k| put(None, op("s", k, 1, State::Unknown, Some(7))))
            .collect(),
    ))
    .unwrap();
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort_unstable();
    let listed: Vec<String> = s.list(None, 100).unwrap().into_iter().map(|r| r.key).collect();
    assert_eq!(listed, sorted);
    let scanned: Vec<String> = s
        .scan(Table::Operation, &[State::Unknown], 7, None, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(scanned, sorted);
}

fn writes_are_visible_across_handles(f: &dyn Fresh) {
    let (a, b) = (f.handle(), f.handle());
    a.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();
    assert_eq!(get(&*b, Table::Operation, "s", "k").unwrap().version, 1);
    b.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]))
        .unwrap();
    assert_eq!(get(&*a, Table::Operation, "s", "k").unwrap().version, 2);
    assert_eq!(
        a.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Failed, None))])),
        Err(CommitError::Conflict)
    );
}

/// A binding is first come, first served across handles (processes), even when they race, and the
/// store's rows are untouched by it.
fn bindings_are_first_come(f: &dyn Fresh) {
    let (a, b) = (f.handle(), f.handle());
    assert_eq!(a.bind("scope:default", "gateway a #1").unwrap(), "gateway a #1");
    assert_eq!(
        b.bind("scope:default", "gateway b #2").unwrap(),
        "gateway a #1",
        "the first holder stays"
    );
    assert_eq!(
        a.bind("scope:default", "gateway a #1").unwrap(),
        "gateway a #1",
        "binding again is a no-op"
    );
    assert_eq!(
        b.bind("scope:acme", "gateway b #2").unwrap(),
        "gateway b #2",
        "names are independent"
    );
    assert!(a.list(None, 10).unwrap().is_empty(), "a binding is not a record");
    let holders: Vec<String> = std::thread::scope(|t| {
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let s = f.handle();
                t.spawn(move || s.bind("scope:raced", &format!("racer {i}")).unwrap())
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert!(
        holders.windows(2).all(|w| w[0] == w[1]),
        "every racer sees one holder: {holders:?}"
    );
    assert_eq!(a.bind("scope:raced", "late").unwrap(), holders[0]);
    // An operator hands a renamed holder's bindings to its new name; others stay.
    assert_eq!(
        b.rebind("gateway a #1", "gateway a #9").unwrap(),
        ["scope:default"],
        "only a's bindings move"
    );
    assert_eq!(a.bind("scope:default", "gateway b #2").unwrap(), "gateway a #9");
    assert_eq!(a.bind("scope:acme", "x").unwrap(), "gateway b #2");
    assert!(a.rebind("nobody", "gateway a #1").unwrap().is_empty());
}

/// One fresh, empty store of some backend; [`Fresh::handle`] opens another
/// handle on that same store (a new connection, as another process would).
trait Fresh: Sync {
    fn handle(&self) -> Arc<dyn Storage>;
}

struct FreshMemory(Arc<MemoryStorage>);

impl Fresh for FreshMemory {
    fn handle(&self) -> Arc<dyn Storage> {
        // Memory is not shared between processes: every handle is the one store.
        self.0.clone()
    }
}

struct FreshSqlite {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl FreshSqlite {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        drop(open(&path));
        FreshSqlite { _dir: dir, path }
    }
}

impl Fresh for FreshSqlite {
    fn handle(&self) -> Arc<dyn Storage> {
        Arc::new(open(&self.path))
    }
}

#[cfg(feature = "postgres")]
impl Fresh for TestSchema {
    fn handle(&self) -> Arc<dyn Storage> {
        Arc::new(self.open())
    }
}

// ------------------------------------------------- concurrency, every backend

fn racing_inserts_one_wins(f: &dyn Fresh) {
    const THREADS: usize = 8;
    for round in 0..5 {
        let key = format!("k{round}");
        let barrier = Barrier::new(THREADS);
        let results: Vec<(usize, Result<(), CommitError>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|i| {
                    let (barrier, key) = (&barrier, &key);
                    scope.spawn(move || {
                        let s = f.handle();
                        let mut r = op("s", key, 1, State::InFlight, Some(1));
                        r.body = format!("thread {i}");
                        barrier.wait();
                        (
                            i,
                            s.commit(&batch(vec![put(None, r)], vec![event("s", key, 1, "begin")])),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = results.iter().filter(|(_, r)| r.is_ok()).map(|(i, _)| *i).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (_, r) in &results {
            assert!(matches!(r, Ok(()) | Err(CommitError::Conflict)), "{r:?}");
        }
        let s = f.handle();
        assert_eq!(
            get(&*s, Table::Operation, "s", &key).unwrap().body,
            format!("thread {}", winners[0])
        );
        assert_eq!(s.audit("s", &key).unwrap().len(), 1);
    }
}

fn concurrent_compare_and_swap_loses_nothing(f: &dyn Fresh) {
    const THREADS: usize = 6;
    const EACH: usize = 25;
    let shared = f.handle();
    std::thread::scope(|scope| {
        for i in 0..THREADS {
            let shared = shared.clone();
            scope.spawn(move || {
                // Half the threads share one handle, half have their own.
                if i % 2 == 0 {
                    increment(&*shared, EACH);
                } else {
                    increment(&*f.handle(), EACH);
                }
            });
        }
    });
    let total = (THREADS * EACH) as u64;
    assert_eq!(get(&*shared, Table::Quota, "s", "counter").unwrap().version, total);
    let trail = shared.audit("s", "counter").unwrap();
    assert_eq!(
        trail.iter().map(|e| e.version).collect::<Vec<_>>(),
        (1..=total).collect::<Vec<_>>()
    );
}

/// A multi-row batch and its mirror image, racing: they touch the same rows
/// in opposite orders, so a backend that locks rows as it goes must not
/// deadlock, and each commit is all or nothing.
fn crossing_batches_stay_atomic(f: &dyn Fresh) {
    const ROUNDS: u64 = 20;
    let s = f.handle();
    s.commit(&puts(vec![
        put(None, row(Table::Quota, "s", "a", 1)),
        put(None, row(Table::Quota, "s", "b", 1)),
    ]))
    .unwrap();
    std::thread::scope(|scope| {
        for forward in [true, false] {
            scope.spawn(move || {
                let s = f.handle();
                let mut applied = 0;
                while applied < ROUNDS {
                    let a = get(&*s, Table::Quota, "s", "a").unwrap().version;
                    let b = get(&*s, Table::Quota, "s", "b").unwrap().version;
                    let mut both = vec![
                        put(Some(a), row(Table::Quota, "s", "a", a + 1)),
                        put(Some(b), row(Table::Quota, "s", "b", b + 1)),
                    ];
                    if !forward {
                        both.reverse();
                    }
                    match s.commit(&puts(both)) {
                        Ok(()) => applied += 1,
                        Err(CommitError::Conflict) => {}
                        Err(e) => panic!("crossing batch: {e}"),
                    }
                }
            });
        }
    });
    let a = get(&*s, Table::Quota, "s", "a").unwrap().version;
    let b = get(&*s, Table::Quota, "s", "b").unwrap().version;
    assert_eq!((a, b), (1 + 2 * ROUNDS, 1 + 2 * ROUNDS));
}

/// Runs each behaviour on a fresh memory store, a fresh SQLite file and a fresh
/// PostgreSQL schema: `store` behaviours get one handle, `shared` ones open more.
macro_rules! conformance {
    (store: [$($name:ident),* $(,)?], shared: [$($shared:ident),* $(,)?] $(,)?) => {
        mod memory {
            $(#[test] fn $name() { super::$name(&super::MemoryStorage::new()); })*
            $(#[test] fn $shared() {
                super::$shared(&super::FreshMemory(std::sync::Arc::new(super::MemoryStorage::new())));
            })*
        }
        mod sqlite {
            $(#[test] fn $name() {
                let dir = tempfile::tempdir().unwrap();
                let s = super::open(&dir.path().join("ledger.db"));
                super::$name(&s);
            })*
            $(#[test] fn $shared() { super::$shared(&super::FreshSqlite::new()); })*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(#[test] fn $name() {
                if let Some(schema) = super::TestSchema::new() {
                    super::$name(&schema.open());
                }
            })*
            $(#[test] fn $shared() {
                if let Some(schema) = super::TestSchema::new() {
                    super::$shared(&schema);
                }
            })*
        }
    };
}

conformance!(
    store: [
        insert_if_absent,
        compare_and_swap,
        delete_with_version,
        batch_is_atomic,
        mismatched_row_is_refused,
        audit_is_append_only,
        scan_filters_and_orders,
        list_and_stats,
        names_order_by_bytes,
    ],
    shared: [
        racing_inserts_one_wins,
        concurrent_compare_and_swap_loses_nothing,
        crossing_batches_stay_atomic,
        writes_are_visible_across_handles,
        bindings_are_first_come,
    ],
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

const CHILD_DB: &str = "ONCE_STORAGE_TEST_CHILD_DB";
const CHILD_BUMPS: usize = 20;

/// Not a test on its own: the body of each child process of
/// `sqlite_processes_share_one_file` and `postgres_processes_share_one_schema`.
#[test]
#[ignore = "run by *_processes_share_one_* in child processes"]
fn child_process_increments() {
    let Some(location) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let opened = once::storage::open(location.to_str().unwrap()).expect("open the shared store");
    increment(&*opened.storage, CHILD_BUMPS);
}

/// Four OS processes bump one counter by compare-and-swap: none is lost.
fn processes_share_one_store(location: &str) {
    const PROCESSES: usize = 4;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "child_process_increments",
                    "--test-threads=1",
                    "--quiet",
                ])
                .env(CHILD_DB, location)
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
    let s = once::storage::open(location).unwrap().storage;
    let total = (PROCESSES * CHILD_BUMPS) as u64;
    assert_eq!(get(&*s, Table::Quota, "s", "counter").unwrap().version, total);
    assert_eq!(s.audit("s", "counter").unwrap().len() as u64, total);
}

#[test]
fn sqlite_processes_share_one_file() {
    let dir = tempfile::tempdir().unwrap();
    processes_share_one_store(dir.path().join("ledger.db").to_str().unwrap());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_processes_share_one_schema() {
    if let Some(schema) = TestSchema::new() {
        processes_share_one_store(&schema.location());
    }
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

/// A version-1 file (before operation rows named their owner) is migrated
/// on open: its operation rows were written by hosts without an owner name,
/// so they become `default`'s, and an owner scan finds them.
#[test]
fn sqlite_version_1_files_are_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    // A version-1 layout: today's without `owner` and its index (the ledger's
    // DDL lives only in schema/, so the file is made by this build, then cut back).
    drop(open(&path));
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP INDEX rows_owner_due; ALTER TABLE rows DROP COLUMN owner;
         UPDATE meta SET value = '1' WHERE key = 'schema_version';
         INSERT INTO rows VALUES ('operation', 's', 'k', 3, 'unknown', 50, '{}');
         INSERT INTO rows VALUES ('quota', 's', 'b@0', 1, NULL, 60, '{}');",
    )
    .unwrap();
    drop(raw);
    let s = open(&path);
    let found = s
        .scan(Table::Operation, &[State::Unknown], 100, Some("default"), 10)
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].version, found[0].owner.as_deref()), (3, Some("default")));
    assert_eq!(get(&s, Table::Quota, "s", "b@0").unwrap().owner, None);
    drop(s);
    let raw = rusqlite::Connection::open(&path).unwrap();
    let version: String = raw
        .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION.to_string());
    // Opening again changes nothing.
    drop(open(&path));
}

// ------------------------------------------------------- the body format

/// The format of the row bodies this build's engine writes, as it states it.
fn engine_body_format() -> u32 {
    Once::builder(MemoryStorage::new())
        .build()
        .expect("the once component")
        .configured()
        .body_format
}

/// What a ledger that holds `holds` says to a build whose engine reads `reads`.
fn newer_format_refusal(ledger: &str, holds: u32, reads: u32) -> String {
    format!(
        "storage: ledger {ledger} holds record bodies of format {holds}; this build of once reads format {reads}: \
         upgrade once (any build reading format {holds})"
    )
}

/// The `body_format` an SQLite ledger's meta records, if any.
fn sqlite_body_format(path: &Path) -> Option<String> {
    use rusqlite::OptionalExtension;
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT value FROM meta WHERE key = 'body_format'", [], |r| r.get(0))
        .optional()
        .unwrap()
}

/// Set (or, with `None`, remove) an SQLite ledger's recorded body format, as
/// another build (or one from before the key) left it.
fn set_sqlite_body_format(path: &Path, value: Option<&str>) {
    let raw = rusqlite::Connection::open(path).unwrap();
    match value {
        Some(v) => raw
            .execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('body_format', ?1)",
                [v],
            )
            .unwrap(),
        None => raw.execute("DELETE FROM meta WHERE key = 'body_format'", []).unwrap(),
    };
}

/// An engine built over a ledger records its body format there: on a new
/// file, on a file from before the key (its bodies are format 1), and over
/// an earlier format, which this build reads; the record written before
/// still replays.
#[test]
fn sqlite_ledger_records_its_body_format() {
    let format = engine_body_format();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let location = path.to_str().unwrap();
    let once = Once::open(location).unwrap().build().unwrap();
    assert_eq!(sqlite_body_format(&path), Some(format.to_string()), "a new ledger");
    let sent = once
        .call("s", Some("k"), "refund", r#"{"amount":1}"#, |_| {
            once::Sent::Success(r#"{"id":"r-1"}"#.into())
        })
        .unwrap();
    assert!(sent.confirmed().is_some(), "{sent:?}");
    drop(once);

    for (left, why) in [(None, "a ledger from before the key"), (Some("0"), "an earlier format")] {
        set_sqlite_body_format(&path, left);
        let once = Once::open(location).unwrap().build().unwrap();
        assert_eq!(sqlite_body_format(&path), Some(format.to_string()), "{why}");
        let again = once
            .call("s", Some("k"), "refund", r#"{"amount":1}"#, |_| {
                panic!("a confirmed record is replayed, never sent again")
            })
            .unwrap();
        assert_eq!(again.receipt(), Some(r#"{"id":"r-1"}"#), "{why}");
    }

    // Hosts opening one such file at once all agree, and all open it.
    set_sqlite_body_format(&path, None);
    let barrier = Barrier::new(4);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                barrier.wait();
                Once::open(location).unwrap().build().unwrap();
            });
        }
    });
    assert_eq!(sqlite_body_format(&path), Some(format.to_string()), "after a race");
}

/// A ledger whose bodies are of a later format than this build reads is
/// refused by `build`, before any row is read, with an error that names the
/// ledger, the format it holds and the one this build reads; nothing is
/// written to it.
#[test]
fn sqlite_ledger_of_a_later_body_format_is_refused() {
    let format = engine_body_format();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let location = path.to_str().unwrap();
    drop(Once::open(location).unwrap().build().unwrap());
    let later = (format + 1).to_string();
    set_sqlite_body_format(&path, Some(&later));

    for builder in [Once::open(location).unwrap(), Once::sqlite(&path).unwrap()] {
        let Err(e) = builder.build() else {
            panic!("a build reading format {format} opened a ledger of format {later}");
        };
        assert!(
            matches!(&e, once::OnceError::Engine(once::types::Error::Storage(_))),
            "{e:?}"
        );
        assert_eq!(e.to_string(), newer_format_refusal(location, format + 1, format));
    }
    assert_eq!(sqlite_body_format(&path), Some(later), "the refusal wrote nothing");
}

/// One memory store shared by engines: the first records its format, and a
/// later one than the engine's is refused as on a file.
#[test]
fn memory_ledger_of_a_later_body_format_is_refused() {
    let format = engine_body_format();
    let store = Arc::new(MemoryStorage::new());
    drop(Once::builder(store.clone()).build().unwrap());
    store.claim_body_format(format + 1).unwrap();
    let Err(e) = Once::builder(store.clone()).build() else {
        panic!(
            "a build reading format {format} opened a store of format {}",
            format + 1
        );
    };
    assert_eq!(e.to_string(), newer_format_refusal("(in memory)", format + 1, format));
}

/// Without the `postgres` feature a PostgreSQL URL is refused with a storage
/// error that says what is missing (`.ci/run` runs this with `-p once-host`).
#[cfg(not(feature = "postgres"))]
#[test]
fn postgres_urls_need_the_postgres_feature() {
    let url = "postgres://u@127.0.0.1:1/db";
    let Err(e) = once::storage::open(url) else {
        panic!("a build without PostgreSQL opened {url}");
    };
    assert!(
        e.0.contains("no PostgreSQL support") && e.0.contains("`postgres` feature"),
        "{e}"
    );
    let Err(e) = Once::open(url) else {
        panic!("a build without PostgreSQL opened {url}");
    };
    assert!(
        matches!(&e, once::OnceError::Engine(once::types::Error::Storage(m)) if m.contains("`postgres` feature")),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("storage: postgres: this build of once has no PostgreSQL support"),
        "{e}"
    );
}

// ------------------------------------------------------- PostgreSQL only

/// Options for a store whose sessions a test can find in `pg_stat_activity`.
#[cfg(feature = "postgres")]
fn named(schema: &TestSchema, app: &str) -> PostgresOptions {
    PostgresOptions {
        application_name: Some(app.to_string()),
        ..schema.options()
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_migrations_are_idempotent_and_race_free() {
    let Some(schema) = TestSchema::new() else { return };
    // Eight processes' worth of stores opening a schema that does not exist yet.
    let barrier = Barrier::new(8);
    let opened: Vec<Result<PostgresStorage, StorageError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    PostgresStorage::open_with(&schema.url, schema.options())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for s in &opened {
        assert!(s.is_ok(), "{s:?}");
    }
    let s = schema.open();
    s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();
    drop(schema.open());
    assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, 1);

    let mut c = schema.client();
    let version: String = c
        .query_one("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, pg::SCHEMA_VERSION.to_string());
    // The scan and list indexes exist.
    let indexes: Vec<String> = c
        .query(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
            &[&schema.name],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for wanted in ["audit_kind", "rows_due", "rows_owner_due", "rows_state"] {
        assert!(indexes.iter().any(|i| i == wanted), "{indexes:?}");
    }
    // The schema is named by the URL, as `--db` and ONCE_DB give it.
    let by_url = PostgresStorage::open(&schema.location()).unwrap();
    assert_eq!(by_url.schema(), schema.name);
    assert_eq!(get(&by_url, Table::Operation, "s", "k").unwrap().version, 1);
}

/// A version-1 schema is migrated on open, its operation rows given to `default`.
#[cfg(feature = "postgres")]
#[test]
fn postgres_version_1_schemas_are_migrated() {
    let Some(schema) = TestSchema::new() else { return };
    drop(schema.open());
    let mut c = schema.client();
    c.batch_execute(
        "DROP INDEX rows_owner_due; ALTER TABLE rows DROP COLUMN owner;
         UPDATE meta SET value = '1' WHERE key = 'schema_version';
         INSERT INTO rows (tbl, scope, key, version, state, due_at, body)
           VALUES ('operation', 's', 'k', 3, 'unknown', 50, '{}');",
    )
    .unwrap();
    let s = schema.open();
    let found = s
        .scan(Table::Operation, &[State::Unknown], 100, Some("default"), 10)
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].version, found[0].owner.as_deref()), (3, Some("default")));
    let version: String = c
        .query_one("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, pg::SCHEMA_VERSION.to_string());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_newer_schema_is_refused() {
    let Some(schema) = TestSchema::new() else { return };
    drop(schema.open());
    schema
        .client()
        .execute(
            "UPDATE meta SET value = $1 WHERE key = 'schema_version'",
            &[&(pg::SCHEMA_VERSION + 1).to_string()],
        )
        .unwrap();
    let e = PostgresStorage::open_with(&schema.url, schema.options()).unwrap_err();
    assert!(e.0.contains("newer"), "{e}");
}

/// The `body_format` a PostgreSQL schema's meta records, if any.
#[cfg(feature = "postgres")]
fn postgres_body_format(schema: &TestSchema) -> Option<String> {
    schema
        .client()
        .query_opt("SELECT value FROM meta WHERE key = 'body_format'", &[])
        .unwrap()
        .map(|r| r.get(0))
}

/// As on SQLite: an engine built over a schema records its body format
/// (a new schema, one from before the key, an earlier format), hosts
/// opening it at once agree, and a later format is refused, naming the
/// schema and both formats, with nothing written.
#[cfg(feature = "postgres")]
#[test]
fn postgres_ledger_records_its_body_format_and_refuses_a_later_one() {
    let Some(schema) = TestSchema::new() else { return };
    let format = engine_body_format();
    let location = schema.location();
    drop(Once::open(&location).unwrap().build().unwrap());
    assert_eq!(postgres_body_format(&schema), Some(format.to_string()), "a new schema");
    let mut c = schema.client();
    for (left, why) in [(None, "a schema from before the key"), (Some("0"), "an earlier format")] {
        c.execute("DELETE FROM meta WHERE key = 'body_format'", &[]).unwrap();
        if let Some(v) = left {
            c.execute("INSERT INTO meta (key, value) VALUES ('body_format', $1)", &[&v])
                .unwrap();
        }
        drop(Once::open(&location).unwrap().build().unwrap());
        assert_eq!(postgres_body_format(&schema), Some(format.to_string()), "{why}");
    }

    c.execute("DELETE FROM meta WHERE key = 'body_format'", &[]).unwrap();
    let barrier = Barrier::new(4);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                barrier.wait();
                Once::open(&location).unwrap().build().unwrap();
            });
        }
    });
    assert_eq!(postgres_body_format(&schema), Some(format.to_string()), "after a race");

    let later = (format + 1).to_string();
    c.execute("UPDATE meta SET value = $1 WHERE key = 'body_format'", &[&later])
        .unwrap();
    let Err(e) = Once::open(&location).unwrap().build() else {
        panic!("a build reading format {format} opened a schema of format {later}");
    };
    assert!(
        matches!(&e, once::OnceError::Engine(once::types::Error::Storage(_))),
        "{e:?}"
    );
    let server = schema.url.split_once('@').map_or(schema.url.as_str(), |(_, s)| s);
    let server = server.split('?').next().unwrap_or(server);
    let ledger = format!("schema {} on {server}", schema.name);
    assert_eq!(e.to_string(), newer_format_refusal(&ledger, format + 1, format));
    assert_eq!(postgres_body_format(&schema), Some(later), "the refusal wrote nothing");
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_bad_locations_are_typed_errors() {
    for bad in ["Once", "1abc", "pg_catalog", "a-b", "x;drop", ""] {
        let e = PostgresStorage::open(&format!("postgres://u@127.0.0.1:1/db?schema={bad}")).unwrap_err();
        assert!(e.0.contains("schema name"), "{bad}: {e}");
    }
    let e = PostgresStorage::open("postgres://u@127.0.0.1:1/db?schema=a&schema=b").unwrap_err();
    assert!(e.0.contains("twice"), "{e}");
    let e = PostgresStorage::open("postgres://u@127.0.0.1:1/db?no_such_option=1").unwrap_err();
    assert!(e.0.contains("invalid URL"), "{e}");
    let e = PostgresStorage::open("mysql://u@127.0.0.1/db").unwrap_err();
    assert!(e.0.contains("postgres://"), "{e}");
    // Nothing listens on port 1: an error naming the server, never the password.
    let started = Instant::now();
    let e = PostgresStorage::open("postgres://u:sekrit@127.0.0.1:1/db").unwrap_err();
    assert!(e.0.contains("127.0.0.1:1/db"), "{e}");
    assert!(!e.0.contains("sekrit"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let e = PostgresStorage::open_with(
        "postgres://u@127.0.0.1:1/db",
        PostgresOptions {
            max_connections: 0,
            ..PostgresOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.0.contains("max_connections"), "{e}");
    // `open` picks the backend from the location.
    assert!(matches!(
        once::storage::Location::parse("postgresql://h/db"),
        once::storage::Location::Postgres(_)
    ));
    assert!(matches!(
        once::storage::Location::parse("./postgres.db"),
        once::storage::Location::Sqlite(_)
    ));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_values_it_cannot_hold_are_refused() {
    let Some(schema) = TestSchema::new() else { return };
    let s = schema.open();
    let too_big = op("s", "k", 1, State::InFlight, Some(u64::MAX));
    let mut nul = op("s", "n", 1, State::InFlight, None);
    nul.body = "a\u{0}b".into();
    for bad in [too_big, nul] {
        let out = s.commit(&puts(vec![
            put(None, op("s", "ok", 1, State::InFlight, None)),
            put(None, bad),
        ]));
        assert!(matches!(out, Err(CommitError::Storage(_))), "{out:?}");
        assert_eq!(get(&s, Table::Operation, "s", "ok"), None);
    }
    let mut e = event("s", "ok", 1, "begin");
    e.at = u64::MAX;
    assert!(matches!(
        s.commit(&batch(vec![], vec![e])),
        Err(CommitError::Storage(_))
    ));
    assert!(s.get(Table::Operation, "s\u{0}", "k").is_err());
    // The store still works.
    s.commit(&puts(vec![put(None, op("s", "ok", 1, State::InFlight, None))]))
        .unwrap();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_audit_is_append_only_in_the_database() {
    let Some(schema) = TestSchema::new() else { return };
    let s = schema.open();
    s.commit(&batch(vec![], vec![event("s", "k", 1, "begin")])).unwrap();
    let mut c = schema.client();
    for sql in ["UPDATE audit SET kind = 'forged'", "DELETE FROM audit"] {
        let e = c.batch_execute(sql).unwrap_err();
        assert!(format!("{:?}", e).contains("append-only"), "{sql}: {e:?}");
    }
    assert_eq!(s.audit("s", "k").unwrap(), vec![event("s", "k", 1, "begin")]);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_clock_is_the_database_clock() {
    let Some(schema) = TestSchema::new() else { return };
    let s = PostgresStorage::open_with(
        &schema.url,
        PostgresOptions {
            clock_resample: Duration::from_millis(50),
            ..schema.options()
        },
    )
    .unwrap();
    let clock = s.clock().unwrap();
    let mut previous = 0;
    for _ in 0..40 {
        let before = s.database_now().unwrap();
        let now = clock.now();
        let after = s.database_now().unwrap();
        // Within the readings around it, give or take the rounding of ms, the
        // carry between resamples and the uncertainty of the clock's last reading
        // (half its round trip, which a loaded machine stretches).
        let slack = 2 + clock.uncertainty_ms();
        assert!(
            now + slack >= before && now <= after + slack,
            "{before} <= {now} <= {after} (slack {slack} ms)"
        );
        assert!(now >= previous, "the clock ran backwards: {previous} -> {now}");
        previous = now;
        std::thread::sleep(Duration::from_millis(7));
    }
    // A handle over a PostgreSQL location measures leases in the database's clock.
    let once = Once::open(&schema.location()).unwrap().build().unwrap();
    let (before, now, after) = (s.database_now().unwrap(), once.now(), s.database_now().unwrap());
    assert!(now + 2 >= before && now <= after + 2, "{before} <= {now} <= {after}");
}

/// A batch's connection is terminated while it waits on a row lock: the
/// commit is a storage error, nothing of it applied, and the store goes on.
#[cfg(feature = "postgres")]
#[test]
fn postgres_connection_lost_mid_commit_is_a_storage_error() {
    let Some(schema) = TestSchema::new() else { return };
    let app = postgres_common::unique_name("once_kill");
    let s = PostgresStorage::open_with(&schema.url, named(&schema, &app)).unwrap();
    s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();

    // Another session holds the row: the commit below waits for it.
    let mut blocker = schema.client();
    let mut tx = blocker.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM rows WHERE tbl = 'operation' AND scope = 's' AND key = 'k' FOR UPDATE",
        &[],
    )
    .unwrap();
    let out = std::thread::scope(|scope| {
        let commit = scope.spawn(|| {
            s.commit(&batch(
                vec![
                    put(None, op("s", "other", 1, State::InFlight, None)),
                    put(Some(1), op("s", "k", 2, State::Confirmed, None)),
                ],
                vec![event("s", "k", 2, "finish-success")],
            ))
        });
        let killed = postgres_common::terminate_when_waiting(&schema.url, &app, Duration::from_secs(10));
        assert_eq!(killed, 1);
        commit.join().unwrap()
    });
    tx.rollback().unwrap();
    assert!(matches!(out, Err(CommitError::Storage(_))), "{out:?}");
    assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, 1);
    assert_eq!(get(&s, Table::Operation, "s", "other"), None);
    assert!(s.audit("s", "k").unwrap().is_empty());
    s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]))
        .unwrap();
}

/// Every session of a store is terminated while idle (as a server restart
/// does): the next read and the next commit reconnect, nothing is reported lost.
#[cfg(feature = "postgres")]
#[test]
fn postgres_idle_connections_killed_are_replaced() {
    let Some(schema) = TestSchema::new() else { return };
    let app = postgres_common::unique_name("once_idle");
    let s = PostgresStorage::open_with(&schema.url, named(&schema, &app)).unwrap();
    let mut admin = postgres_common::client(&schema.url);
    for round in 1..=3u64 {
        s.commit(&puts(vec![put(
            round.checked_sub(1).filter(|v| *v > 0),
            op("s", "k", round, State::InFlight, None),
        )]))
        .unwrap();
        assert!(postgres_common::terminate(&mut admin, &app, false) >= 1);
        // Give the server a moment to end the sessions.
        std::thread::sleep(Duration::from_millis(50));
        if round % 2 == 1 {
            assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, round);
        }
    }
    assert!(postgres_common::terminate(&mut admin, &app, false) >= 1);
    std::thread::sleep(Duration::from_millis(50));
    s.commit(&puts(vec![put(Some(3), op("s", "k", 4, State::Confirmed, None))]))
        .unwrap();
    assert_eq!(s.list(None, 10).unwrap().len(), 1);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_lock_held_beyond_timeout_is_a_storage_error() {
    let Some(schema) = TestSchema::new() else { return };
    let s = PostgresStorage::open_with(
        &schema.url,
        PostgresOptions {
            lock_timeout: Duration::from_millis(100),
            ..schema.options()
        },
    )
    .unwrap();
    s.commit(&puts(vec![put(None, op("s", "k", 1, State::InFlight, None))]))
        .unwrap();
    let mut blocker = schema.client();
    let mut tx = blocker.transaction().unwrap();
    tx.execute("UPDATE rows SET body = body WHERE key = 'k'", &[]).unwrap();
    let r = s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]));
    assert!(matches!(r, Err(CommitError::Storage(_))), "{r:?}");
    // Readers are not blocked by a writer.
    assert_eq!(get(&s, Table::Operation, "s", "k").unwrap().version, 1);
    tx.rollback().unwrap();
    s.commit(&puts(vec![put(Some(1), op("s", "k", 2, State::Confirmed, None))]))
        .unwrap();
}

/// "Must not exist" waits for a concurrent, uncommitted insert of the key and
/// then conflicts: absence is checked at commit, not on a stale snapshot.
#[cfg(feature = "postgres")]
#[test]
fn postgres_absence_check_sees_a_concurrent_insert() {
    let Some(schema) = TestSchema::new() else { return };
    let s = schema.open();
    let mut other = schema.client();
    let mut tx = other.transaction().unwrap();
    tx.execute(
        "INSERT INTO rows (tbl, scope, key, version, body) VALUES ('tombstone', 's', 'k', 1, '{}')",
        &[],
    )
    .unwrap();
    let out = std::thread::scope(|scope| {
        let check = scope.spawn(|| {
            s.commit(&puts(vec![
                delete(Table::Tombstone, "s", "k", None),
                put(None, op("s", "k", 1, State::InFlight, None)),
            ]))
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!check.is_finished(), "the check must wait for the other insert");
        tx.commit().unwrap();
        check.join().unwrap()
    });
    assert_eq!(out, Err(CommitError::Conflict));
    assert_eq!(get(&s, Table::Operation, "s", "k"), None);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_pool_is_bounded() {
    let Some(schema) = TestSchema::new() else { return };
    let app = postgres_common::unique_name("once_pool");
    let s = PostgresStorage::open_with(
        &schema.url,
        PostgresOptions {
            max_connections: 2,
            ..named(&schema, &app)
        },
    )
    .unwrap();
    std::thread::scope(|scope| {
        for t in 0..6 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..20 {
                    let key = format!("{t}-{i}");
                    s.commit(&puts(vec![put(None, op("s", &key, 1, State::InFlight, None))]))
                        .unwrap();
                    assert!(get(s, Table::Operation, "s", &key).is_some());
                }
            });
        }
    });
    let mut admin = postgres_common::client(&schema.url);
    let sessions: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .unwrap()
        .get(0);
    assert!(sessions <= 2, "{sessions} sessions");
    assert_eq!(s.list(None, 1000).unwrap().len(), 120);
}
