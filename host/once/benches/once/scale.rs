//! Scaling row: a durable protected call (SQLite, `synchronous=FULL`, one
//! caller) on ledgers that already hold 1 k, 100 k and 1 M confirmed records
//! with their audit trails (two events each), and on the 1 k ledger with a
//! 10 KB payload; plus `prune` on each ledger (100 records past retention to
//! tombstones). The ledgers are seeded with bulk SQL from real records and
//! kept under `target/once-bench/scale/` between runs (seeding 1 M records
//! takes a while once).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use once::storage::sqlite::{SCHEMA_VERSION, SqliteOptions, SqliteStorage};
use once::{ManualClock, Once, Sent};

use crate::record::{compare, note, timed};
use crate::{ARGS, RECEIPT};

const SIZES: [(u64, &str); 3] = [(1_000, "1k"), (100_000, "100k"), (1_000_000, "1M")];
/// Records past retention kept ready in each ledger for the prune figure.
const EXPIRED: u64 = 200;
/// How old the expired records are (past the default 7-day retention).
const AGE_MS: u64 = 30 * 24 * 3600 * 1000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A payload of about `size` bytes: the bench's arguments plus a note.
fn payload(size: usize) -> String {
    let pad = size.saturating_sub(ARGS.len() + 12);
    format!(
        r#"{{"order":1234,"amount":200,"currency":"EUR","note":"{}"}}"#,
        "n".repeat(pad)
    )
}

fn call(once: &Once, key: &str, args: &str) {
    let called = once
        .call("tenant", Some(key), "refund", args, |_| Sent::Success(RECEIPT.into()))
        .unwrap();
    assert!(called.confirmed().is_some_and(|c| !c.replayed), "{called:?}");
}

/// Copies of the record `template` (and its audit events) under keys `{prefix}{i:08}`, i in 1..=n.
fn copy_records(conn: &rusqlite::Connection, template: &str, prefix: &str, n: u64) {
    let from = format!(r#""key":"{template}""#);
    conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?2)
         INSERT INTO rows (tbl, scope, key, version, state, due_at, body, owner)
         SELECT r.tbl, r.scope, printf('%s%08d', ?3, c.i), r.version, r.state, r.due_at,
                replace(r.body, ?4, printf('\"key\":\"%s%08d\"', ?3, c.i)), r.owner
         FROM rows r, c WHERE r.tbl = 'operation' AND r.key = ?1",
        rusqlite::params![template, n as i64, prefix, from],
    )
    .unwrap();
    conn.execute(
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?2)
         INSERT INTO audit (scope, key, version, at, kind, from_state, to_state, attempt, detail)
         SELECT a.scope, printf('%s%08d', ?3, c.i), a.version, a.at, a.kind, a.from_state, a.to_state,
                a.attempt, a.detail
         FROM audit a, c WHERE a.key = ?1",
        rusqlite::params![template, n as i64, prefix],
    )
    .unwrap();
}

/// The cached ledger of `n` live records (seeded on first use), topped up to
/// [`EXPIRED`] records past retention.
fn ledger(n: u64) -> PathBuf {
    let dir = crate::sqlite::bench_dir().join("scale");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("ledger-v{SCHEMA_VERSION}-{n}.db"));
    if !path.exists() {
        let started = Instant::now();
        let seeding = dir.join(format!("seeding-{n}.db"));
        let _ = std::fs::remove_file(&seeding);
        let store = Arc::new(SqliteStorage::open(&seeding, SqliteOptions::default()).unwrap());
        let once = Once::builder(store.clone()).build().unwrap();
        call(&once, "template", ARGS);
        drop(once);
        drop(store);
        let conn = rusqlite::Connection::open(&seeding).unwrap();
        copy_records(&conn, "template", "live-", n);
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        drop(conn);
        std::fs::rename(&seeding, &path).unwrap();
        note(format!(
            "scale: seeded {n} records with their audit trails in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let expired: i64 = conn
        .query_row(
            "SELECT count(*) FROM rows WHERE tbl = 'operation' AND key LIKE 'old-%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let expired = expired as u64;
    if expired < EXPIRED {
        // A record written a month ago (its clock, its retention), copied under fresh keys.
        let store = Arc::new(SqliteStorage::open(&path, SqliteOptions::default()).unwrap());
        let past = ManualClock::new(now_ms() - AGE_MS);
        let once = Once::builder(store.clone()).clock(past).build().unwrap();
        let template = format!("old-template-{}", now_ms());
        call(&once, &template, ARGS);
        drop(once);
        copy_records(&conn, &template, &format!("old-{}-", now_ms()), EXPIRED - expired);
    }
    path
}

/// Register the row's groups.
pub fn bench(c: &mut Criterion) {
    let samples = 10;
    let mut g = c.benchmark_group("scale");
    g.sample_size(samples)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    let next = AtomicU64::new(0);
    let run = now_ms();
    for (n, name) in SIZES {
        // Seeding a ledger takes minutes and up to 2 GB of disk: only for a run that measures it.
        let measured = crate::selected(&format!("scale/call/{name}"))
            || (n == SIZES[0].0 && crate::selected("scale/call-10KB/1k"));
        if !measured {
            continue;
        }
        let path = ledger(n);
        let store = Arc::new(SqliteStorage::open(&path, SqliteOptions::default()).unwrap());
        let once = Once::builder(store.clone()).build().expect("the once component");
        let id = format!("scale/call/{name}");
        g.bench_function(BenchmarkId::new("call", name), |b| {
            timed(b, &id, |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    call(
                        &once,
                        &format!("new-{run}-{}", next.fetch_add(1, Ordering::Relaxed)),
                        ARGS,
                    );
                }
                start.elapsed()
            })
        });
        if n == SIZES[0].0 {
            let args = payload(10_000);
            let id = "scale/call-10KB/1k".to_string();
            g.bench_function(BenchmarkId::new("call-10KB", name), |b| {
                timed(b, &id, |iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        call(
                            &once,
                            &format!("big-{run}-{}", next.fetch_add(1, Ordering::Relaxed)),
                            &args,
                        );
                    }
                    start.elapsed()
                })
            });
        }
        // Prune: 100 records past retention become tombstones, in one export call.
        let started = Instant::now();
        let report = once.prune(100).expect("prune");
        let took = started.elapsed();
        assert!(report.pruned > 0, "nothing to prune in the {name} ledger: {report:?}");
        note(format!(
            "scale/prune/{name}: {} records pruned in {:.2} ms ({:.1} µs per record)",
            report.pruned,
            took.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e6 / f64::from(report.pruned)
        ));
    }
    g.finish();
    for (_, name) in &SIZES[1..] {
        compare(
            "scaling: ledger size",
            &format!("scale/call/{name}"),
            "scale/call/1k",
            samples,
        );
    }
    compare("scaling: payload", "scale/call-10KB/1k", "scale/call/1k", samples);
}
