//! One trial: a fresh service, proxy and ledgers; the agent(s) under one fault;
//! the verdict read from the service's effect ledger, never from the agent.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use refund::{EffectLedger, Fault, FaultProxy, Mode, ORDER_ID, ProxyOptions, Service};

use super::agent::{self, Env, Policy, Report};

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    /// The agent's policy.
    pub policy: Policy,
    /// Through once or not.
    pub protected: bool,
    /// The fault on the first refund call.
    pub fault: Fault,
}

/// What one trial left in the effect ledger, and what the agents said.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Refund rows for the order.
    pub effects: u64,
    /// Refunded total in cents.
    pub refunded_cents: i64,
    /// The final reports of the agents (two under `concurrent_duplicate`).
    pub reports: Vec<Report>,
}

impl Verdict {
    /// Exactly one refund of exactly $200.
    pub fn exactly_once(&self) -> bool {
        self.effects == 1 && self.refunded_cents == 20_000
    }
    /// More than one refund.
    pub fn duplicate(&self) -> bool {
        self.effects > 1
    }
    /// No refund.
    pub fn omission(&self) -> bool {
        self.effects == 0
    }
    /// Some agent's final report contradicts the ledger.
    pub fn false_completion(&self) -> bool {
        self.reports.iter().any(|r| match r {
            Report::Refunded => !self.exactly_once(),
            Report::Failed => self.effects > 0,
            Report::Unknown => false,
        })
    }
}

/// How long once's background work may take to settle a trial.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);

/// Run one trial in `dir` (fresh), with once's ledger at `ledger` (an SQLite
/// file in `dir`, or a PostgreSQL schema shared by the run's trials). `exe` is
/// this binary, for agent processes.
pub fn run(cell: Cell, trial: u64, dir: &Path, ledger: &str, exe: &Path) -> Result<Verdict, String> {
    let service = Service::start(dir.join("effects.db"), Mode::Unsafe).map_err(|e| format!("service: {e}"))?;
    let proxy = FaultProxy::start(service.addr(), cell.fault, ProxyOptions::default())
        .map_err(|e| format!("fault proxy: {e}"))?;
    let env = Env {
        target: proxy.base_url(),
        ledger: ledger.to_string(),
        scope: format!("demo-trial-{trial}"),
        key: format!("refund-order-{ORDER_ID}-trial-{trial}"),
    };
    let reports = match cell.fault {
        Fault::CrashAfterDispatch => {
            let mut first = spawn_agent(exe, cell, &env)?;
            let dispatched = proxy.wait_dispatched(Duration::from_secs(10));
            // SIGKILL: after sending, before the reply is recorded.
            first.kill().map_err(|e| format!("killing the agent: {e}"))?;
            let _ = first.wait();
            proxy.release();
            if !dispatched {
                return Err("the agent never dispatched the refund".to_string());
            }
            // A restarted agent continues the same intent.
            vec![agent_report(spawn_agent(exe, cell, &env)?)?]
        }
        Fault::ConcurrentDuplicate => {
            let a = spawn_agent(exe, cell, &env)?;
            let b = spawn_agent(exe, cell, &env)?;
            vec![agent_report(a)?, agent_report(b)?]
        }
        _ => vec![run_agent(cell, &env)?],
    };
    if cell.protected {
        agent::settle(&env, SETTLE_WITHIN).map_err(|e| format!("once settle: {e}"))?;
    }
    drop(proxy);
    let ledger = EffectLedger::open(service.db_path()).map_err(|e| format!("effect ledger: {e}"))?;
    Ok(Verdict {
        effects: ledger.count(ORDER_ID).map_err(|e| e.to_string())?,
        refunded_cents: ledger.refunded_cents(ORDER_ID).map_err(|e| e.to_string())?,
        reports,
    })
}

/// Run the agent in this process.
pub fn run_agent(cell: Cell, env: &Env) -> Result<Report, String> {
    if cell.protected {
        agent::run_protected(cell.policy, env).map_err(|e| format!("protected agent: {e}"))
    } else {
        Ok(agent::run_unprotected(cell.policy, env))
    }
}

/// Start the agent as its own OS process (`once demo-agent …`).
fn spawn_agent(exe: &Path, cell: Cell, env: &Env) -> Result<Child, String> {
    Command::new(exe)
        .arg("demo-agent")
        .args(["--policy", cell.policy.name()])
        .args(["--target", &env.target])
        .args(["--ledger", &env.ledger])
        .args(["--scope", &env.scope, "--key", &env.key])
        .args(cell.protected.then_some("--protected"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting an agent process: {e}"))
}

/// The report an agent process printed (one word on stdout).
fn agent_report(child: Child) -> Result<Report, String> {
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for an agent process: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Report::parse(text.trim()).ok_or_else(|| {
        format!(
            "an agent process reported {:?} ({}): {}",
            text.trim(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
