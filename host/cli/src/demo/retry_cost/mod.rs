//! `once demo --study retry-cost`: the second study, reproduced. Four client retry policies against an HTTP tool
//! server (one `POST /tool`, an effects table and a responses table keyed by `Idempotency-Key`, on SQLite), a
//! client timeout of 0.12 s against a stall of 0.35 s, three faults and a no-fault control; each policy
//! unprotected and through once. Every count is read from the server's tables.

mod policy;
mod protected;
mod report;
mod request;
mod trial;
mod unprotected;

use std::path::PathBuf;
use std::time::Duration;

use refund::tool_server::ToolFault;

use super::{output, pool};
use crate::Failure;
use policy::ClientPolicy;
use trial::Cell;

/// The study's trials per cell.
pub const STUDY_TRIALS: u64 = 50;
/// The client's timeout; the server's stalls last 0.35 s.
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(120);

/// What to run.
pub struct Options {
    /// Trials per cell.
    pub trials: u64,
    /// Seed for the order trials run in.
    pub seed: u64,
    /// Trials run at once.
    pub jobs: usize,
    /// Write the JSON report here.
    pub json: Option<PathBuf>,
    /// Write the SVG chart here.
    pub svg: Option<PathBuf>,
}

/// The study's cells, in table order: the no-fault control under A, then every policy under each fault; each
/// unprotected, then through once.
fn cells() -> Vec<Cell> {
    ToolFault::ALL
        .into_iter()
        .flat_map(|fault| {
            let policies: &[ClientPolicy] = if fault == ToolFault::None {
                &[ClientPolicy::A]
            } else {
                &ClientPolicy::ALL
            };
            policies.iter().flat_map(move |&policy| {
                [false, true].map(|protected| Cell {
                    policy,
                    protected,
                    fault,
                })
            })
        })
        .collect()
}

/// Run the study and print its table.
pub fn run(options: &Options) -> Result<(), Failure> {
    let fail = |message: String| Failure { code: 1, message };
    // Compiled (or loaded) once before the trials start: trials racing to first use would each compile it.
    once::runtime::Runtime::shared()?;
    let work: Vec<Cell> = cells()
        .into_iter()
        .flat_map(|c| std::iter::repeat_n(c, options.trials as usize))
        .collect();
    let workdir = tempfile::Builder::new()
        .prefix("once-retry-cost-")
        .tempdir()
        .map_err(|e| fail(e.to_string()))?;
    let ran = pool::run(work, options.seed, options.jobs, workdir.path(), trial::run, Cell::name);
    ran.check().map_err(fail)?;
    let report = report::aggregate(options.trials, &ran.results);
    output::publish(&report, &ran.summary(), options.json.as_deref(), options.svg.as_deref()).map_err(fail)
}
