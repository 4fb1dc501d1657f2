//! `cargo bench -p once-host --features postgres --bench once`: rows 1–5 of BENCHMARKS.md, each
//! next to its baseline measured in the same run, then a summary table of
//! medians and ratios (the figures the run files under `benchmarks/` keep and BENCHMARKS.md quotes).
//! With `ONCE_BENCH_RECORD=benchmarks/<date>-<slug>.md` it also writes that summary as a run file,
//! with the command line, the date, the commit and the machine (`record::write_run_file`).
//!
//! Rows: `fingerprint/*` (canonicalize + fingerprint), `call/*` (warm
//! protected call), `sqlite/*` (durable protected call vs bare commits),
//! `scale/*` (a call vs ledger and payload size),
//! `cold/*` (cold start) and `postgres/*` (with the `postgres` feature, when
//! `ONCE_TEST_DATABASE_URL` is set). A criterion filter (`cargo bench -- sqlite`)
//! runs a subset.

mod call;
mod canon;
mod cold;
#[cfg(feature = "postgres")]
mod pg;
mod record;
mod scale;
mod sqlite;

use criterion::Criterion;
use once::{Once, Sent};
use regex::Regex;

/// The arguments of every protected call the benches make.
const ARGS: &str = r#"{"order":1234,"amount":200,"currency":"EUR"}"#;
/// The provider's answer to each of them.
const RECEIPT: &str = r#"{"refund_id":"r_1"}"#;

/// One protected call under a fresh `key`: it must dispatch and confirm, or the figure would time something else.
fn protected_call(once: &Once, key: &str) {
    let called = once
        .call("tenant", Some(key), "refund", ARGS, |_| Sent::Success(RECEIPT.into()))
        .unwrap();
    assert!(called.confirmed().is_some_and(|c| !c.replayed), "{called:?}");
}

/// Whether criterion's filter (the first argument that is not a flag; a regex)
/// selects the benchmark `id`: groups with costly set-up skip what is not asked for.
fn selected(id: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `--bench` is cargo's flag; criterion's own flags that take a value are skipped with it.
    let mut filter = None;
    let mut skip = false;
    for a in &args {
        if skip {
            skip = false;
        } else if a.starts_with("--") {
            skip = !a.contains('=') && VALUE_FLAGS.contains(&a.as_str());
        } else {
            filter = Some(a.as_str());
            break;
        }
    }
    filter.is_none_or(|f| Regex::new(f).is_ok_and(|r| r.is_match(id)))
}

/// Criterion flags followed by a value (so the value is not taken for the filter).
const VALUE_FLAGS: [&str; 12] = [
    "--save-baseline",
    "--baseline",
    "--baseline-lenient",
    "--load-baseline",
    "--profile-time",
    "--sample-size",
    "--warm-up-time",
    "--measurement-time",
    "--nresamples",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
];

fn main() {
    let mut c = Criterion::default().configure_from_args();
    canon::bench(&mut c);
    call::bench(&mut c);
    sqlite::bench(&mut c);
    scale::bench(&mut c);
    cold::bench(&mut c);
    #[cfg(feature = "postgres")]
    pg::bench(&mut c);
    c.final_summary();
    let summary = record::print_summary();
    record::write_run_file(&summary);
}
