//! `once demo`: the published studies, end to end, measured from the
//! server's own tables.
//!
//! The default (`--study lost-reply`) is the refund fault matrix: every cell
//! is policy × protection × fault; every trial gets a fresh refund service
//! (unsafe mode: it records the key and never dedupes, like the study's
//! server), a fresh fault proxy and a fresh once ledger. `--study
//! retry-cost` is the second study ([`retry_cost`]).

mod agent;
mod chart;
mod classify;
mod ledger;
mod output;
mod pool;
mod report;
mod retry_cost;
mod trial;

use std::path::PathBuf;

use refund::Fault;

use crate::Failure;
use agent::{Env, Policy};
use trial::Cell;

/// Most trials per cell a run accepts (every trial is queued before the first runs).
const MAX_TRIALS: u64 = 100_000;

/// Which published study `once demo` reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Study {
    /// The first study: scripted agents, a lost reply before or after the effect (the fault matrix).
    LostReply,
    /// The second study: four client retry policies against a tool server, what each costs in attempts and text.
    RetryCost,
}

/// `once demo` options.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// The study to reproduce.
    #[arg(long, value_enum, default_value_t = Study::LostReply)]
    study: Study,
    /// Trials per cell [default: 30; retry-cost: 50, the study's N].
    #[arg(long)]
    trials: Option<u64>,
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
    /// Only this policy (always_retry, never_retry, read_then_decide); lost-reply only.
    #[arg(long, value_parser = parse_policy)]
    policy: Option<Policy>,
    /// Only this fault; lost-reply only.
    #[arg(long)]
    fault: Option<Fault>,
    /// once's ledger for protected agents: a postgres:// URL puts every trial in one
    /// schema made for this run (dropped afterwards), each trial in its own scope.
    /// Default: a fresh SQLite file per trial. Lost-reply only.
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

/// Run the chosen study and print its table.
pub fn run(args: DemoArgs) -> Result<(), Failure> {
    let bad = |message: &str| Failure {
        code: 2,
        message: message.to_string(),
    };
    if args.trials.is_some_and(|n| !(1..=MAX_TRIALS).contains(&n)) {
        return Err(bad(&format!("--trials must be 1 to {MAX_TRIALS}")));
    }
    match args.study {
        Study::LostReply => lost_reply(args),
        Study::RetryCost if args.policy.is_some() || args.fault.is_some() || args.db.is_some() => Err(bad(
            "--policy, --fault and --db choose cells and ledgers of the lost-reply study; \
             the retry-cost study always runs all of its cells, each on a fresh SQLite ledger",
        )),
        Study::RetryCost => retry_cost::run(&retry_cost::Options {
            trials: args.trials.unwrap_or(retry_cost::STUDY_TRIALS),
            seed: args.seed,
            jobs: args.jobs,
            json: args.json,
            svg: args.svg,
        }),
    }
}

/// The first study's fault matrix.
fn lost_reply(args: DemoArgs) -> Result<(), Failure> {
    let fail = |message: String| Failure { code: 1, message };
    let trials = args.trials.unwrap_or(30);
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
