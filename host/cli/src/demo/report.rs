//! The matrix's results: per-cell counts, the stdout table, the JSON report
//! and the SVG chart.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use refund::Fault;
use serde::Serialize;

use super::agent::Policy;
use super::chart::{grouped_bars, policy_series};
use super::output::Shown;
use super::trial::{Cell, Verdict};

/// Counts of one cell (the JSON report's shape; keep it stable).
#[derive(Debug, Clone, Serialize)]
pub struct CellCounts {
    /// Agent policy.
    pub policy: &'static str,
    /// Through once or not.
    pub protected: bool,
    /// Fault name.
    pub fault: &'static str,
    /// Trials run.
    pub trials: u64,
    /// Trials with exactly one $200 refund.
    pub exactly_once: u64,
    /// Trials with more than one refund.
    pub duplicates: u64,
    /// Trials with no refund.
    pub omissions: u64,
    /// Trials where an agent's final report contradicts the ledger.
    pub false_completions: u64,
}

/// The JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Trials per cell.
    pub trials_per_cell: u64,
    /// Every cell, policy × protection × fault.
    pub cells: Vec<CellCounts>,
}

/// Aggregate trial verdicts into cells, in matrix order.
pub fn aggregate(trials_per_cell: u64, verdicts: &BTreeMap<Cell, Vec<Verdict>>) -> Report {
    let cells = verdicts
        .iter()
        .map(|(cell, verdicts)| {
            let count = |f: fn(&Verdict) -> bool| verdicts.iter().filter(|v| f(v)).count() as u64;
            CellCounts {
                policy: cell.policy.name(),
                protected: cell.protected,
                fault: cell.fault.name(),
                trials: verdicts.len() as u64,
                exactly_once: count(Verdict::exactly_once),
                duplicates: count(Verdict::duplicate),
                omissions: count(Verdict::omission),
                false_completions: count(Verdict::false_completion),
            }
        })
        .collect();
    Report { trials_per_cell, cells }
}

impl Report {
    fn cell(&self, policy: Policy, protected: bool, fault: Fault) -> Option<&CellCounts> {
        self.cells
            .iter()
            .find(|c| c.policy == policy.name() && c.protected == protected && c.fault == fault.name())
    }
}

impl Shown for Report {
    /// The table: one row per policy × protection, one column per fault,
    /// each cell `exactly-once/trials` then duplicates, omissions, false completions.
    fn table(&self) -> String {
        let mut out = String::new();
        out.push_str("each fault: exactly-once/trials  dup omit false\n");
        out.push_str(&format!("{:<30}", "policy"));
        for fault in Fault::ALL {
            out.push_str(&format!(" | {:^22}", fault.name()));
        }
        out.push('\n');
        for policy in Policy::ALL {
            for protected in [false, true] {
                let label = format!(
                    "{} {}",
                    policy.name(),
                    if protected { "(once)" } else { "(unprotected)" }
                );
                out.push_str(&format!("{label:<30}"));
                for fault in Fault::ALL {
                    let text = match self.cell(policy, protected, fault) {
                        Some(c) => format!(
                            "{:>5} {:>3} {:>3} {:>3}",
                            format!("{}/{}", c.exactly_once, c.trials),
                            c.duplicates,
                            c.omissions,
                            c.false_completions
                        ),
                        None => "-".to_string(),
                    };
                    out.push_str(&format!(" | {text:^22}"));
                }
                out.push('\n');
            }
        }
        out
    }

    fn draw_svg(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let categories: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
        let series = policy_series(&Policy::ALL, Policy::name, Fault::ALL.len(), |policy, protected, f| {
            let cell = self.cell(policy, protected, Fault::ALL[f])?;
            Some(100.0 * cell.exactly_once as f64 / cell.trials.max(1) as f64)
        });
        let root = SVGBackend::new(path, (1600, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = "exactly one $200 refund, per fault (% of trials)";
        grouped_bars(&root, caption, &categories, &series, 100.0, "%")?;
        root.present()?;
        Ok(())
    }
}
