//! The study's results: per-cell counts and costs, the stdout table, the JSON report and the SVG chart.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use refund::tool_server::ToolFault;
use serde::Serialize;

use super::cells;
use super::policy::ClientPolicy;
use super::request::{PAYLOAD_CHARS, TRANSCRIPT_CHARS};
use super::trial::{Cell, Knowledge, Verdict};
use crate::demo::chart::{grouped_bars, policy_series};
use crate::demo::output::Shown;

/// One cell's counts and means (the JSON report's shape; keep it stable).
#[derive(Debug, Clone, Serialize)]
pub struct CellCounts {
    /// Client policy (A, B, C, D).
    pub policy: &'static str,
    /// Through once or not.
    pub protected: bool,
    /// Fault name.
    pub fault: &'static str,
    /// Trials run.
    pub trials: u64,
    /// Trials whose effects table holds what one execution leaves: one effect, none where the server never commits.
    pub exactly_once: u64,
    /// Trials with more than one effect.
    pub duplicates: u64,
    /// Mean rows of the effects table.
    pub effects_per_trial: f64,
    /// Mean `POST /tool` requests in the server's log.
    pub attempts_per_trial: f64,
    /// Mean characters of those requests.
    pub chars_per_trial: f64,
    /// `chars_per_trial` over one execution's request.
    pub ratio_to_one_execution: f64,
    /// Trials where the client ends knowing the effect happened.
    pub known_effect: u64,
    /// Trials where it ends knowing it did not.
    pub known_absence: u64,
    /// Trials where it ends not knowing.
    pub unknown: u64,
    /// Trials where what it knows contradicts the effects table.
    pub false_knowledge: u64,
    /// Trials whose requests carried more than one call id.
    pub call_id_changed: u64,
    /// Trials whose requests carried more than one Idempotency-Key.
    pub key_changed: u64,
}

/// The JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Which study.
    pub study: &'static str,
    /// Trials per cell.
    pub trials_per_cell: u64,
    /// Characters of one execution's request.
    pub payload_chars: usize,
    /// Characters a client's retry adds.
    pub transcript_chars: usize,
    /// Every cell, in table order.
    pub cells: Vec<CellCounts>,
}

/// Aggregate trial verdicts into cells, in table order.
pub fn aggregate(trials_per_cell: u64, verdicts: &BTreeMap<Cell, Vec<Verdict>>) -> Report {
    let cells = cells()
        .into_iter()
        .filter_map(|cell| Some((cell, verdicts.get(&cell)?)))
        .map(|(cell, verdicts)| {
            let n = verdicts.len().max(1) as f64;
            let count = |f: &dyn Fn(&Verdict) -> bool| verdicts.iter().filter(|v| f(v)).count() as u64;
            let mean = |f: fn(&Verdict) -> u64| verdicts.iter().map(f).sum::<u64>() as f64 / n;
            let chars_per_trial = mean(|v| v.chars);
            CellCounts {
                policy: cell.policy.name(),
                protected: cell.protected,
                fault: cell.fault.name(),
                trials: verdicts.len() as u64,
                exactly_once: count(&|v| v.exactly_once(cell.fault)),
                duplicates: count(&Verdict::duplicate),
                effects_per_trial: mean(|v| v.effects),
                attempts_per_trial: mean(|v| v.attempts),
                chars_per_trial,
                ratio_to_one_execution: chars_per_trial / PAYLOAD_CHARS as f64,
                known_effect: count(&|v| v.knowledge == Knowledge::Effect),
                known_absence: count(&|v| v.knowledge == Knowledge::Absence),
                unknown: count(&|v| v.knowledge == Knowledge::Unknown),
                false_knowledge: count(&Verdict::false_knowledge),
                call_id_changed: count(&|v| v.call_ids > 1),
                key_changed: count(&|v| v.keys > 1),
            }
        })
        .collect();
    Report {
        study: "retry-cost",
        trials_per_cell,
        payload_chars: PAYLOAD_CHARS,
        transcript_chars: TRANSCRIPT_CHARS,
        cells,
    }
}

impl Report {
    fn cell(&self, policy: ClientPolicy, protected: bool, fault: ToolFault) -> Option<&CellCounts> {
        self.cells
            .iter()
            .find(|c| c.policy == policy.name() && c.protected == protected && c.fault == fault.name())
    }
}

impl Shown for Report {
    /// The table: one row per cell, every count from the server's tables.
    fn table(&self) -> String {
        let mut out = format!(
            "retry-cost: {} trials per cell; one execution's request is {} characters, a client's retry {} \
             ({} + {} of transcript)\n\
             exactly-once: one effect, or none under a fault where the server never commits ({}, {}); \
             effect / absence / unknown: what the client finally knows, false: it contradicts the effects table\n",
            self.trials_per_cell,
            thousands(PAYLOAD_CHARS as f64),
            thousands((PAYLOAD_CHARS + TRANSCRIPT_CHARS) as f64),
            thousands(PAYLOAD_CHARS as f64),
            thousands(TRANSCRIPT_CHARS as f64),
            ToolFault::PreCommitStall.name(),
            ToolFault::Reject502.name(),
        );
        out.push_str(&format!(
            "{:<17} {:<33} {:<11} | {:>12} {:>3} {:>13} {:>14} {:>11} {:>6} | {:>6} {:>7} {:>7} {:>5} | {:>15} {:>11}\n",
            "fault",
            "policy",
            "client",
            "exactly-once",
            "dup",
            "effects/trial",
            "attempts/trial",
            "chars/trial",
            "ratio",
            "effect",
            "absence",
            "unknown",
            "false",
            "call id changed",
            "key changed",
        ));
        for c in &self.cells {
            let policy = ClientPolicy::ALL
                .into_iter()
                .find(|p| p.name() == c.policy)
                .map_or("", ClientPolicy::describe);
            out.push_str(&format!(
                "{:<17} {:<33} {:<11} | {:>12} {:>3} {:>13.2} {:>14.2} {:>11} {:>5.2}x | {:>6} {:>7} {:>7} {:>5} | {:>15} {:>11}\n",
                c.fault,
                format!("{}  {policy}", c.policy),
                if c.protected { "once" } else { "unprotected" },
                format!("{}/{}", c.exactly_once, c.trials),
                c.duplicates,
                c.effects_per_trial,
                c.attempts_per_trial,
                thousands(c.chars_per_trial),
                c.ratio_to_one_execution,
                c.known_effect,
                c.known_absence,
                c.unknown,
                c.false_knowledge,
                format!("{}/{}", c.call_id_changed, c.trials),
                format!("{}/{}", c.key_changed, c.trials),
            ));
        }
        out
    }

    fn draw_svg(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let categories: Vec<&str> = ToolFault::ALL.iter().map(|f| f.name()).collect();
        let series = |value: fn(&CellCounts) -> f64| {
            policy_series(
                &ClientPolicy::ALL,
                ClientPolicy::name,
                ToolFault::ALL.len(),
                |p, protected, f| self.cell(p, protected, ToolFault::ALL[f]).map(value),
            )
        };
        let most = |value: fn(&CellCounts) -> f64| self.cells.iter().map(value).fold(1.0, f64::max).ceil();
        let root = SVGBackend::new(path, (1600, 600)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(800);
        let effects = |c: &CellCounts| c.effects_per_trial;
        let ratio = |c: &CellCounts| c.ratio_to_one_execution;
        grouped_bars(
            &left,
            "effects per trial (server's effects table)",
            &categories,
            &series(effects),
            most(effects),
            "effects",
        )?;
        grouped_bars(
            &right,
            "characters sent per trial, x one execution",
            &categories,
            &series(ratio),
            most(ratio),
            "x",
        )?;
        root.present()?;
        Ok(())
    }
}

/// `13080.0` as `13,080`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_groups_digits() {
        assert_eq!(super::thousands(13_080.0), "13,080");
        assert_eq!(super::thousands(1_920.4), "1,920");
        assert_eq!(super::thousands(999.0), "999");
        assert_eq!(super::thousands(1_234_567.0), "1,234,567");
    }
}
