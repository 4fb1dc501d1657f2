//! `cargo bench -p once-host --bench once`: every row of BENCHMARKS.md, each
//! next to its baseline measured in the same run, then a summary table of
//! medians and ratios (the figures BENCHMARKS.md quotes).
//!
//! Rows: `fingerprint/*` (canonicalize + fingerprint), `call/*` (warm
//! protected call), `sqlite/*` (durable protected call vs bare commits),
//! `cold/*` (cold start) and `postgres/*` (when `ONCE_TEST_DATABASE_URL`
//! is set). A criterion filter (`cargo bench -- sqlite`) runs a subset.

mod call;
mod canon;
mod cold;
mod pg;
mod record;
mod sqlite;

use criterion::Criterion;

fn main() {
    let mut c = Criterion::default().configure_from_args();
    canon::bench(&mut c);
    call::bench(&mut c);
    sqlite::bench(&mut c);
    cold::bench(&mut c);
    pg::bench(&mut c);
    c.final_summary();
    record::print_summary();
}
