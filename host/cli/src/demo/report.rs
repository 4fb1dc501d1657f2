//! The matrix's results: per-cell counts, the stdout table, the JSON report
//! and the SVG chart.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use refund::Fault;
use serde::Serialize;

use super::agent::Policy;
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

    /// The table: one row per policy × protection, one column per fault,
    /// each cell `exactly-once/trials` then duplicates, omissions, false completions.
    pub fn table(&self) -> String {
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

    /// Write the JSON report.
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Write a grouped bar chart of the exactly-once rate per cell.
    pub fn write_svg(&self, path: &Path) -> Result<(), String> {
        self.draw_svg(path)
            .map_err(|e| format!("drawing {}: {e}", path.display()))
    }

    fn draw_svg(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let rows: Vec<(Policy, bool)> = Policy::ALL.into_iter().flat_map(|p| [(p, false), (p, true)]).collect();
        let faults = Fault::ALL.len();
        let root = SVGBackend::new(path, (1600, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("exactly one $200 refund, per fault (% of trials)", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(60)
            .y_label_area_size(50)
            // Categories sit on integers; headroom above 100 % keeps the legend off the bars.
            .build_cartesian_2d(-0.5f64..faults as f64 - 0.5, 0f64..135f64)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(faults)
            .x_label_formatter(&|x| {
                let i = x.round();
                let on_category = (x - i).abs() < 1e-6 && i >= 0.0;
                let fault = on_category.then(|| Fault::ALL.get(i as usize)).flatten();
                fault.map(|f| f.name().to_string()).unwrap_or_default()
            })
            .y_label_formatter(&|y| if *y <= 100.0 { format!("{y:.0}") } else { String::new() })
            .y_desc("%")
            .draw()?;
        let width = 0.8 / rows.len() as f64;
        for (i, (policy, protected)) in rows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let style = if *protected {
                color.filled()
            } else {
                color.mix(0.45).filled()
            };
            let bars = Fault::ALL.iter().enumerate().filter_map(|(f, fault)| {
                let cell = self.cell(*policy, *protected, *fault)?;
                let pct = 100.0 * cell.exactly_once as f64 / cell.trials.max(1) as f64;
                let x0 = f as f64 - 0.4 + i as f64 * width;
                Some(Rectangle::new([(x0, 0.0), (x0 + width * 0.9, pct)], style))
            });
            let label = format!(
                "{} {}",
                policy.name(),
                if *protected { "(once)" } else { "(unprotected)" }
            );
            chart
                .draw_series(bars)?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperMiddle)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}
