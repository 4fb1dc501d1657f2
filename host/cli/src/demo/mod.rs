//! `once demo`: the refund fault matrix, end to end, measured from the
//! service's effect ledger.
//!
//! Every cell is policy × protection × fault; every trial gets a fresh refund
//! service (unsafe mode: it records the key and never dedupes, like the
//! study's server), a fresh fault proxy and a fresh once ledger.

mod agent;
mod ledger;
mod report;
mod trial;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use refund::Fault;

use crate::Failure;
use agent::{Env, Policy};
use trial::{Cell, Verdict};

/// `once demo` options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Trials per cell.
    #[arg(long, default_value_t = 30)]
    trials: u64,
    /// Seed for the order trials run in.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG chart here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Trials run at once (they mostly wait on timeouts, not the CPU).
    #[arg(long, default_value_t = 12)]
    jobs: usize,
    /// Only this policy (always_retry, never_retry, read_then_decide).
    #[arg(long, value_parser = parse_policy)]
    policy: Option<Policy>,
    /// Only this fault.
    #[arg(long)]
    fault: Option<Fault>,
    /// once's ledger for protected agents: a postgres:// URL puts every trial in one
    /// schema made for this run (dropped afterwards), each trial in its own scope.
    /// Default: a fresh SQLite file per trial.
    #[arg(long)]
    db: Option<String>,
}

/// `once demo-agent`: one agent as its own process (crash and concurrency trials).
#[derive(clap::Args)]
pub struct AgentArgs {
    /// Policy.
    #[arg(long, value_parser = parse_policy)]
    policy: Policy,
    /// Through once.
    #[arg(long)]
    protected: bool,
    /// Refund service base URL.
    #[arg(long)]
    target: String,
    /// once ledger: an SQLite file or a PostgreSQL URL.
    #[arg(long)]
    ledger: String,
    /// once scope.
    #[arg(long)]
    scope: String,
    /// Operation key.
    #[arg(long)]
    key: String,
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::parse(s).ok_or_else(|| format!("unknown policy {s:?}; one of always_retry, never_retry, read_then_decide"))
}

/// Run one agent and print its final report.
pub fn run_agent(args: AgentArgs) -> Result<(), Failure> {
    let env = Env {
        target: args.target,
        ledger: args.ledger,
        scope: args.scope,
        key: args.key,
    };
    let cell = Cell {
        policy: args.policy,
        protected: args.protected,
        fault: Fault::None,
    };
    let report = trial::run_agent(cell, &env).map_err(|message| Failure { code: 1, message })?;
    println!("{}", report.name());
    Ok(())
}

/// Run the matrix and print the table.
pub fn run(args: DemoArgs) -> Result<(), Failure> {
    let fail = |message: String| Failure { code: 1, message };
    if args.trials == 0 {
        return Err(Failure {
            code: 2,
            message: "--trials must be at least 1".to_string(),
        });
    }
    if let Some(url) = &args.db {
        ledger::RunSchema::check(url).map_err(|message| Failure { code: 2, message })?;
    }
    let exe = std::env::current_exe().map_err(|e| fail(format!("locating this binary: {e}")))?;
    let cells: Vec<Cell> = Policy::ALL
        .into_iter()
        .filter(|p| args.policy.is_none_or(|only| only == *p))
        .flat_map(|policy| [false, true].map(|protected| (policy, protected)))
        .flat_map(|(policy, protected)| {
            Fault::ALL.map(|fault| Cell {
                policy,
                protected,
                fault,
            })
        })
        .filter(|c| args.fault.is_none_or(|only| only == c.fault))
        .collect();
    let mut work: Vec<(Cell, u64)> = cells
        .iter()
        .flat_map(|c| (0..args.trials).map(move |t| (*c, t)))
        .collect();
    shuffle(&mut work, args.seed);
    let workdir = tempfile::Builder::new()
        .prefix("once-demo-")
        .tempdir()
        .map_err(|e| fail(e.to_string()))?;
    let shared_ledger = match &args.db {
        Some(url) => {
            let run = ledger::RunSchema::create(url).map_err(fail)?;
            println!(
                "once ledger: PostgreSQL schema {} for this run, a scope per trial (dropped when the run ends)",
                run.schema()
            );
            Some(run)
        }
        None => None,
    };
    let progress = ProgressBar::new(work.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} trials {elapsed} (eta {eta}) {msg}")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<Cell, Vec<Verdict>>> = Mutex::new(BTreeMap::new());
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let busy_ms = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..args.jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&(cell, _)) = work.get(i) else { break };
                    let dir = workdir.path().join(format!("trial-{i}"));
                    let trial_started = Instant::now();
                    let outcome = std::fs::create_dir(&dir).map_err(|e| e.to_string()).and_then(|()| {
                        let ledger = match &shared_ledger {
                            Some(run) => run.location().to_string(),
                            None => dir.join("once.db").to_string_lossy().into_owned(),
                        };
                        trial::run(cell, i as u64, &dir, &ledger, &exe)
                    });
                    let _ = std::fs::remove_dir_all(&dir);
                    busy_ms.fetch_add(trial_started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    match outcome {
                        Ok(verdict) => results.lock().unwrap().entry(cell).or_default().push(verdict),
                        Err(e) => errors.lock().unwrap().push(format!(
                            "{} {} {}: {e}",
                            cell.policy.name(),
                            if cell.protected { "protected" } else { "unprotected" },
                            cell.fault.name()
                        )),
                    }
                    progress.inc(1);
                }
            });
        }
    });
    progress.finish_and_clear();
    if let Some(run) = shared_ledger {
        run.drop_schema().map_err(fail)?;
    }
    let errors = errors.into_inner().unwrap();
    if !errors.is_empty() {
        return Err(fail(format!(
            "{} trials could not run; first: {}",
            errors.len(),
            errors[0]
        )));
    }
    let elapsed = started.elapsed();
    let report = report::aggregate(args.trials, &results.into_inner().unwrap());
    print!("{}", report.table());
    let trials = work.len() as f64;
    println!(
        "{} trials in {:.1} s ({} at a time): {:.1} ms of wall time per trial; a trial takes {:.0} ms on average",
        work.len(),
        elapsed.as_secs_f64(),
        args.jobs.max(1),
        elapsed.as_secs_f64() * 1000.0 / trials,
        busy_ms.into_inner() as f64 / trials,
    );
    if let Some(path) = &args.json {
        report.write_json(path).map_err(fail)?;
    }
    if let Some(path) = &args.svg {
        report.write_svg(path).map_err(fail)?;
    }
    Ok(())
}

/// Deterministic Fisher–Yates shuffle (xorshift64*), so a seed reproduces the trial order.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..items.len()).rev() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let j = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}
