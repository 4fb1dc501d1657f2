//! Row 4: cold start: compiling the component vs loading the cached
//! compiled artifact vs instantiating from the pre-linked `InstancePre`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use once::io::{HostState, SystemClock};
use once::runtime::{COMPONENT, Runtime};
use once::storage::memory::MemoryStorage;
use once::{GuestLimits, LogOperator, NoProvider};

use crate::record::{compare, timed};

/// Register the row's groups.
pub fn bench(c: &mut Criterion) {
    let cache = tempfile::Builder::new()
        .prefix("cache-")
        .tempdir_in(crate::sqlite::bench_dir())
        .expect("a cache directory under target/");
    // Fill the cache once.
    drop(Runtime::load_component(COMPONENT, Some(cache.path())).expect("compile the component"));

    let mut g = c.benchmark_group("cold");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    g.bench_function("compile", |b| {
        timed(b, "cold/compile", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                drop(Runtime::load_component(COMPONENT, None).unwrap());
            }
            start.elapsed()
        })
    });
    g.bench_function("cached", |b| {
        timed(b, "cold/cached", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                drop(Runtime::load_component(COMPONENT, Some(cache.path())).unwrap());
            }
            start.elapsed()
        })
    });
    g.finish();

    let runtime = Runtime::load_component(COMPONENT, Some(cache.path())).unwrap();
    let state = HostState {
        storage: Arc::new(MemoryStorage::new()),
        clock: Arc::new(SystemClock::default()),
        provider: Arc::new(NoProvider),
        operator: Arc::new(LogOperator),
        entropy: Arc::new(once::SystemEntropy),
    };
    let samples = 30;
    let mut g = c.benchmark_group("cold");
    g.sample_size(samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("instantiate", |b| {
        timed(b, "cold/instantiate", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                drop(
                    runtime
                        .instantiate_limited(state.clone(), &GuestLimits::DEFAULT)
                        .unwrap(),
                );
            }
            start.elapsed()
        })
    });
    g.finish();
    compare("4. cold start", "cold/cached", "cold/compile", 10);
}
