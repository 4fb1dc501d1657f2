//! One trial: a fresh tool server (its dedupe as the policy's study server had it, the cell's fault) and, for a
//! protected client, a fresh once ledger; the verdict read from the server's tables, never from the client.

use std::collections::BTreeSet;
use std::path::Path;

use refund::tool_server::{ToolClient, ToolFault, ToolServer, ToolServerOptions, ToolTables};

use super::policy::ClientPolicy;
use super::{CLIENT_TIMEOUT, protected, unprotected};

/// One cell of the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    /// The client's retry policy.
    pub policy: ClientPolicy,
    /// Through once or not.
    pub protected: bool,
    /// What the server does to `POST /tool`.
    pub fault: ToolFault,
}

impl Cell {
    /// `A unprotected post_commit_stall`.
    pub fn name(self) -> String {
        let via = if self.protected { "once" } else { "unprotected" };
        format!("{} {via} {}", self.policy.name(), self.fault.name())
    }
}

/// What the client knows at the end of a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knowledge {
    /// The effect happened.
    Effect,
    /// It did not, and nothing pending can make it happen.
    Absence,
    /// It may or may not have happened.
    Unknown,
}

/// What one trial left in the server's tables, and what the client knew.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Rows of the effects table.
    pub effects: u64,
    /// `POST /tool` requests in the server's log.
    pub attempts: u64,
    /// Characters of those requests' bodies.
    pub chars: u64,
    /// Distinct call ids among them.
    pub call_ids: u64,
    /// Distinct Idempotency-Keys among them.
    pub keys: u64,
    /// The client's final knowledge.
    pub knowledge: Knowledge,
}

impl Verdict {
    /// As many effects as one execution leaves under `fault`: one, or none where the server never commits.
    pub fn exactly_once(&self, fault: ToolFault) -> bool {
        self.effects == u64::from(fault.commits())
    }
    /// More than one effect.
    pub fn duplicate(&self) -> bool {
        self.effects > 1
    }
    /// The client's knowledge contradicts the table (a known effect that is not exactly one, or a known absence
    /// with an effect).
    pub fn false_knowledge(&self) -> bool {
        match self.knowledge {
            Knowledge::Effect => self.effects != 1,
            Knowledge::Absence => self.effects != 0,
            Knowledge::Unknown => false,
        }
    }
}

/// Run one trial in `dir` (fresh).
pub fn run(cell: Cell, trial: u64, dir: &Path) -> Result<Verdict, String> {
    let server = ToolServer::start(
        dir.join("tool.db"),
        cell.policy.dedupe(),
        cell.fault,
        ToolServerOptions::default(),
    )
    .map_err(|e| format!("tool server: {e}"))?;
    let client = ToolClient::new(server.base_url(), CLIENT_TIMEOUT);
    let knowledge = if cell.protected {
        protected::run(cell.policy, trial, &client, &dir.join("once.db")).map_err(|e| format!("through once: {e}"))?
    } else {
        unprotected::run(cell.policy, trial, &client)
    };
    let tables_path = server.db_path().to_path_buf();
    // Stopped first: a request still stalled ends as its fault says, before the tables are read.
    drop(server);
    let tables = ToolTables::open(&tables_path).map_err(|e| format!("tool tables: {e}"))?;
    let requests = tables.requests().map_err(|e| e.to_string())?;
    let distinct = |f: fn(&refund::tool_server::ToolRequest) -> Option<&str>| {
        requests.iter().filter_map(f).collect::<BTreeSet<_>>().len() as u64
    };
    Ok(Verdict {
        effects: tables.effects().map_err(|e| e.to_string())?,
        attempts: requests.len() as u64,
        chars: requests.iter().map(|r| r.chars).sum(),
        call_ids: distinct(|r| r.call_id.as_deref()),
        keys: distinct(|r| r.idempotency_key.as_deref()),
        knowledge,
    })
}
