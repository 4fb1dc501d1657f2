//! `cargo bench -p once-host --bench peer`: AWS Powertools idempotency beside once's Python package on
//! the same function in the same run (BENCHMARKS.md, row "7. Peer"; the figures and the method are in
//! `benchmarks/2026-12-03-rows-1-7.md`), printed in the summary style of the
//! `once` bench.
//!
//! It makes (or reuses) a venv of pinned packages under the target directory
//! (`python/bench/requirements-peer.txt`, then `./python` from the working tree with the component this
//! crate embeds), checks the Redis at 127.0.0.1:6379, and runs `python/bench/peer.py`, which does the
//! timing. A package that cannot be installed, a missing `python3` or a Redis that does not answer is
//! printed as the reason for a skip. Under `cargo test` (no `--bench`) it is a smoke run of a few
//! calls; there, with `CI` set, a skip is a failure.

mod python;
mod report;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The Redis Powertools' rows run against, unless `ONCE_PEER_REDIS` names another `HOST:PORT`.
const REDIS: &str = "127.0.0.1:6379";

/// How much a run measures.
struct Size {
    calls: u32,
    batches: u32,
    profile_calls: u32,
}

const BENCH: Size = Size {
    calls: 200,
    batches: 7,
    profile_calls: 100,
};
const SMOKE: Size = Size {
    calls: 3,
    batches: 1,
    profile_calls: 3,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    if let Some(filter) = args.iter().find(|a| !a.starts_with('-') && !a.contains("peer")) {
        println!("peer: not selected by the filter {filter:?}");
        return ExitCode::SUCCESS;
    }
    let strict = !bench && std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    match run(if bench { &BENCH } else { &SMOKE }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Skip(reason)) if !strict => {
            println!("peer: skipped: {reason}");
            ExitCode::SUCCESS
        }
        Err(Stop::Skip(reason)) => {
            eprintln!("peer: skipped with CI set, so a failure: {reason}");
            ExitCode::FAILURE
        }
        Err(Stop::Fail(why)) => {
            eprintln!("peer: failed: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Why a run ended early.
enum Stop {
    /// Something outside the project is missing (a package, python3, Redis): print and skip.
    Skip(String),
    /// The bench itself or a package under test is broken.
    Fail(String),
}

fn run(size: &Size) -> Result<(), Stop> {
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let venv = python::Venv::prepare(&root, &target.join("peer-python"))?;
    let at = std::env::var("ONCE_PEER_REDIS").unwrap_or_else(|_| REDIS.to_string());
    let redis = match python::redis_answers(&at) {
        Ok(()) => Some(at.as_str()),
        Err(why) => {
            // The once rows still run; the comparison rows say the peer is missing.
            println!("peer: Powertools' rows skipped: no Redis at {at} ({why})");
            None
        }
    };
    let dir = target.join("once-bench-peer");
    let script = root.join("python/bench/peer.py");
    let (mut lines, mut failed) = venv.run_script(&script, &dir, size.calls, size.batches, redis, false)?;
    if failed.is_none() {
        let (more, why) = venv.run_script(&script, &dir, size.profile_calls, 1, None, true)?;
        lines.extend(more);
        failed = why;
    }
    let parsed = report::parse(&lines).map_err(Stop::Fail)?;
    // What was measured is printed even when a later row failed.
    report::print(&parsed, size.calls, size.batches);
    if let Some(why) = failed {
        return Err(Stop::Fail(why));
    }
    if redis.is_none() {
        return Err(Stop::Skip(format!("no Redis at {at}: the peer's rows are missing")));
    }
    Ok(())
}

/// The workspace root: two levels above this crate.
fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).unwrap_or(manifest).to_path_buf()
}
