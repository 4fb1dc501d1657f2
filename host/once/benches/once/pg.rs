//! Row 5: PostgreSQL begin + finish throughput at 1, 4 and 16 workers, vs
//! bare single-row INSERT commits by as many connections, in a schema of
//! the bench's own. Skipped, with a note, without `ONCE_TEST_DATABASE_URL`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use once::Once;
use once::storage::postgres::{PostgresOptions, PostgresStorage};

use crate::RECEIPT;
use crate::record::{compare, timed};

const WORKERS: [usize; 3] = [1, 4, 16];

/// Drops the bench's schema when done.
struct Schema {
    url: String,
    name: String,
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

/// Register the row's groups (or print why not).
pub fn bench(c: &mut Criterion) {
    let url = match std::env::var("ONCE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            println!("postgres: skipped (set ONCE_TEST_DATABASE_URL to run the PostgreSQL rows)");
            return;
        }
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() % 1_000_000_000_000;
    let schema = Schema {
        url: url.clone(),
        name: format!("once_bench_{}_{nanos}", std::process::id()),
    };
    let store = PostgresStorage::open_with(
        &url,
        PostgresOptions {
            schema: schema.name.clone(),
            max_connections: 16,
            ..PostgresOptions::default()
        },
    )
    .expect("open the bench schema");
    let clock = store.clock().expect("the database clock");
    let once = Once::builder(store).clock(clock).build().expect("the once component");
    let bare: Vec<Mutex<postgres::Client>> = (0..16)
        .map(|_| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
            client
                .batch_execute(&format!(
                    "SET search_path TO {0}; CREATE TABLE IF NOT EXISTS bare (k BIGSERIAL PRIMARY KEY, v TEXT NOT NULL)",
                    schema.name
                ))
                .expect("bare table");
            Mutex::new(client)
        })
        .collect();

    let samples = 10;
    let mut g = c.benchmark_group("postgres");
    g.sample_size(samples)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let next = AtomicU64::new(0);
    for workers in WORKERS {
        let id = format!("postgres/bare/{workers}");
        g.bench_function(BenchmarkId::new("bare", workers), |b| {
            timed(b, &id, |iters| {
                crate::sqlite::spread_calls(&id, workers, iters, &|t, _| {
                    bare[t]
                        .lock()
                        .unwrap()
                        .execute("INSERT INTO bare (v) VALUES ($1)", &[&RECEIPT])
                        .unwrap();
                })
            })
        });
        let id = format!("postgres/once/{workers}");
        g.bench_function(BenchmarkId::new("once", workers), |b| {
            timed(b, &id, |iters| {
                crate::sqlite::spread_calls(&id, workers, iters, &|_, _| {
                    let key = format!("op-{}", next.fetch_add(1, Ordering::Relaxed));
                    crate::protected_call(&once, &key);
                })
            })
        });
    }
    g.finish();
    for workers in WORKERS {
        compare(
            &format!("5. postgres, {workers} worker(s)"),
            &format!("postgres/once/{workers}"),
            &format!("postgres/bare/{workers}"),
            samples,
        );
    }
    for workers in [4, 16] {
        compare(
            "5. postgres scaling",
            &format!("postgres/once/{workers}"),
            "postgres/once/1",
            samples,
        );
    }
    drop(once);
    drop(bare);
    drop(schema);
}
