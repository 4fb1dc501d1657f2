//! Row 3: a durable protected call on SQLite vs the physical floor, bare
//! single-row commits with the same `synchronous` setting in the same
//! directory, at 1, 2 and 8 concurrent callers; full durability vs
//! intent-only (DESIGN.md "Durability budget").
//!
//! Each sample runs `callers` threads for about `iters` calls in total and
//! reports elapsed / calls, so the median is the inverse of the throughput;
//! every call's latency is kept too (p99 wait).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use once::Once;
use once::storage::sqlite::{CommitCounts, SqliteOptions, SqliteStorage, Synchronous};

use crate::RECEIPT;
use crate::record::{compare, latencies, note, timed};

const CALLERS: [usize; 3] = [1, 2, 8];

/// The bench files live under the workspace's target directory (a real
/// disk, as a ledger would), never in a tmpfs `/tmp`.
pub fn bench_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("once-bench");
    std::fs::create_dir_all(&dir).expect("create the bench directory");
    dir
}

/// Run `per_thread` calls of `f` on each of `callers` threads; the wall time
/// and every call's latency.
fn run(callers: usize, per_thread: u64, f: &(dyn Fn(usize, u64) + Sync)) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let lat = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..callers)
            .map(|t| {
                scope.spawn(move || {
                    (0..per_thread)
                        .map(|i| {
                            let begun = Instant::now();
                            f(t, i);
                            begun.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    (start.elapsed(), lat)
}

/// Criterion's `iters` spread over `callers`: time per call, latencies kept under `id`.
pub fn spread_calls(id: &str, callers: usize, iters: u64, f: &(dyn Fn(usize, u64) + Sync)) -> Duration {
    let per_thread = iters.div_ceil(callers as u64).max(1);
    let (elapsed, lat) = run(callers, per_thread, f);
    latencies(id, lat);
    // Scale to `iters` calls at the measured rate.
    elapsed.mul_f64(iters as f64 / (per_thread * callers as u64) as f64)
}

/// A bare SQLite connection in WAL mode at `synchronous`, on a table of one row per commit.
fn bare(path: &Path, synchronous: &str) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", synchronous).unwrap();
    conn.execute_batch("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .unwrap();
    conn
}

/// Register the row's groups.
pub fn bench(c: &mut Criterion) {
    let root = tempfile::Builder::new()
        .prefix("sqlite-")
        .tempdir_in(bench_dir())
        .expect("a bench directory under target/");
    let samples = 10;
    let mut g = c.benchmark_group("sqlite");
    g.sample_size(samples)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        // fsync times on this kind of disk swing widely: measure longer than the CPU rows.
        .measurement_time(Duration::from_secs(5));

    // The floor: bare single-row commits, one connection per caller.
    for (name, pragma) in [("bare-full", "FULL"), ("bare-normal", "NORMAL")] {
        let path = root.path().join(format!("{name}.db"));
        drop(bare(&path, pragma));
        for callers in CALLERS {
            let id = format!("sqlite/{name}/{callers}");
            let conns: Vec<_> = (0..callers)
                .map(|_| std::sync::Mutex::new(bare(&path, pragma)))
                .collect();
            g.bench_function(BenchmarkId::new(name, callers), |b| {
                timed(b, &id, |iters| {
                    spread_calls(&id, callers, iters, &|t, _| {
                        conns[t]
                            .lock()
                            .unwrap()
                            .execute("INSERT INTO t (v) VALUES (?1)", [RECEIPT])
                            .unwrap();
                    })
                })
            });
        }
    }

    // A protected call: begin (intent) + finish, through the component, on one shared store.
    let next = AtomicU64::new(0);
    for (name, synchronous) in [
        ("once-full", Synchronous::Full),
        ("once-intent-only", Synchronous::IntentOnly),
    ] {
        let path = root.path().join(format!("{name}.db"));
        let store = Arc::new(
            SqliteStorage::open(
                &path,
                SqliteOptions {
                    synchronous,
                    busy_timeout: Duration::from_secs(10),
                },
            )
            .expect("open the bench ledger"),
        );
        let once = Once::builder(store.clone()).build().expect("the once component");
        for callers in CALLERS {
            let id = format!("sqlite/{name}/{callers}");
            let before = store.commit_counts();
            let calls = AtomicU64::new(0);
            g.bench_function(BenchmarkId::new(name, callers), |b| {
                timed(b, &id, |iters| {
                    spread_calls(&id, callers, iters, &|_, _| {
                        let key = format!("op-{}", next.fetch_add(1, Ordering::Relaxed));
                        crate::protected_call(&once, &key);
                        calls.fetch_add(1, Ordering::Relaxed);
                    })
                })
            });
            let after = store.commit_counts();
            let n = calls.load(Ordering::Relaxed);
            if n > 0 {
                let d = CommitCounts {
                    full: after.full - before.full,
                    normal: after.normal - before.normal,
                    batches: after.batches - before.batches,
                    backed_off: after.backed_off - before.backed_off,
                };
                note(format!(
                    "{id}: {n} calls, {:.2} FULL + {:.2} NORMAL transactions and {:.2} batches per call ({:.2} batches per transaction)",
                    d.full as f64 / n as f64,
                    d.normal as f64 / n as f64,
                    d.batches as f64 / n as f64,
                    d.batches as f64 / (d.full + d.normal).max(1) as f64,
                ));
            }
        }
    }
    g.finish();
    for callers in CALLERS {
        let row = format!("3. sqlite, {callers} caller(s)");
        compare(
            &row,
            &format!("sqlite/once-full/{callers}"),
            &format!("sqlite/bare-full/{callers}"),
            samples,
        );
        compare(
            &row,
            &format!("sqlite/once-intent-only/{callers}"),
            &format!("sqlite/bare-full/{callers}"),
            samples,
        );
        compare(
            &row,
            &format!("sqlite/bare-normal/{callers}"),
            &format!("sqlite/bare-full/{callers}"),
            samples,
        );
    }
    for name in ["once-full", "once-intent-only", "bare-full"] {
        for callers in [2, 8] {
            compare(
                &format!("3. sqlite scaling, {name}"),
                &format!("sqlite/{name}/{callers}"),
                &format!("sqlite/{name}/1"),
                samples,
            );
        }
    }
}
