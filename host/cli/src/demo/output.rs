//! What a study shows when its trials are done: the table on stdout, the JSON report and the SVG chart.

use std::path::Path;

use serde::Serialize;

/// A study's report.
pub trait Shown: Serialize {
    /// The table printed on stdout.
    fn table(&self) -> String;
    /// Draw the chart into an SVG file at `path`.
    fn draw_svg(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>>;
}

/// Print the table and the run's summary; write the JSON and the chart where asked.
pub fn publish(report: &impl Shown, summary: &str, json: Option<&Path>, svg: Option<&Path>) -> Result<(), String> {
    print!("{}", report.table());
    println!("{summary}");
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = svg {
        report
            .draw_svg(path)
            .map_err(|e| format!("drawing {}: {e}", path.display()))?;
    }
    Ok(())
}
