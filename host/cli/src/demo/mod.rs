//! `once demo`: the refund fault matrix, end to end, measured from the
//! service's effect ledger.
//!
//! Every cell is policy × protection × fault; every trial gets a fresh refund
//! service (unsafe mode: it records the key and never dedupes, like the
//! study's server), a fresh fault proxy and a fresh once ledger.

mod agent;
mod chart;
mod classify;
mod ledger;
mod output;
mod pool;
mod report;
mod trial;

use std::path::PathBuf;

use refund::Fault;

use crate::Failure;
use agent::{Env, Policy};
use trial::Cell;

/// Most trials per cell a run accepts (every trial is queued before the first runs).
const MAX_TRIALS: u64 = 100_000;

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
    if !(1..=MAX_TRIALS).contains(&args.trials) {
        return Err(Failure {
            code: 2,
            message: format!("--trials must be 1 to {MAX_TRIALS}"),
        });
    }
    let trials = args.trials;
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
    let work: Vec<Cell> = cells
        .iter()
        .flat_map(|c| std::iter::repeat_n(*c, trials as usize))
        .collect();
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
    let ran = pool::run(
        work,
        args.seed,
        args.jobs,
        workdir.path(),
        |cell, i, dir| {
            let ledger = match &shared_ledger {
                Some(run) => run.location().to_string(),
                None => dir.join("once.db").to_string_lossy().into_owned(),
            };
            trial::run(cell, i, dir, &ledger, &exe)
        },
        |cell| {
            format!(
                "{} {} {}",
                cell.policy.name(),
                if cell.protected { "protected" } else { "unprotected" },
                cell.fault.name()
            )
        },
    );
    if let Some(run) = shared_ledger {
        run.drop_schema().map_err(fail)?;
    }
    ran.check().map_err(fail)?;
    let report = report::aggregate(trials, &ran.results);
    output::publish(&report, &ran.summary(), args.json.as_deref(), args.svg.as_deref()).map_err(fail)
}
