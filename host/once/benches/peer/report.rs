//! Reads `peer.py`'s JSON lines and prints them in the `once` bench's summary style.

use serde_json::Value;

/// Subject / baseline pairs of the summary: once's package against Powertools, like for like.
const COMPARISONS: [(&str, &str); 7] = [
    ("once-sqlite-full/new", "powertools-redis/new"),
    ("once-sqlite-full/replay", "powertools-redis/replay"),
    ("once-sqlite-intent-only/new", "powertools-redis/new"),
    ("once-sqlite-intent-only/replay", "powertools-redis/replay"),
    ("once-memory/new", "powertools-redis/new"),
    ("once-memory/replay", "powertools-redis/replay"),
    ("once-memory/replay", "powertools-redis-lru/replay"),
];

/// What one run of the script said.
#[derive(Default)]
pub struct Run {
    /// (row, seconds per call), in the order measured.
    rows: Vec<(String, f64)>,
    /// (what, why) for rows the script skipped.
    skips: Vec<(String, String)>,
    notes: Vec<String>,
    /// From `--profile`.
    profiles: Vec<Profile>,
}

/// One profiled row: where its time went.
struct Profile {
    row: String,
    calls: u64,
    total_s: f64,
    /// (owner, share of the profiled time), largest first.
    shares: Vec<(String, f64)>,
}

/// Parse every line; anything else than the script's JSON objects is an error.
pub fn parse(lines: &[String]) -> Result<Run, String> {
    let mut run = Run::default();
    for line in lines {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("peer.py printed {line:?}: {e}"))?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let number = |k: &str| v.get(k).and_then(Value::as_f64);
        if let (Some(row), Some(s)) = (text("row"), number("per_call_s")) {
            run.rows.push((row, s));
        } else if let (Some(what), Some(why)) = (text("skip"), text("reason")) {
            run.skips.push((what, why));
        } else if let Some(note) = text("note") {
            run.notes.push(note);
        } else if let (Some(row), Some(calls), Some(total), Some(Value::Object(shares))) = (
            text("profile"),
            v.get("calls").and_then(Value::as_u64),
            number("total_s"),
            v.get("shares"),
        ) {
            let mut shares: Vec<(String, f64)> = shares
                .iter()
                .map(|(k, s)| (k.clone(), s.as_f64().unwrap_or(f64::NAN)))
                .collect();
            shares.sort_by(|a, b| b.1.total_cmp(&a.1));
            run.profiles.push(Profile {
                row,
                calls,
                total_s: total,
                shares,
            });
        } else {
            return Err(format!("peer.py printed an unknown line: {line}"));
        }
    }
    Ok(run)
}

fn show(seconds: f64) -> String {
    let ns = seconds * 1e9;
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The summary: every row, the comparisons (a missing side printed as skipped, never dropped), the
/// profile of once's own share.
pub fn print(run: &Run, calls: u32, batches: u32) {
    let get = |name: &str| run.rows.iter().find(|(r, _)| r == name).map(|(_, s)| *s);
    println!();
    println!(
        "== once peer summary: AWS Powertools idempotency vs once's Python package, the same function \
         (median of {batches} batches of {calls} calls after a warm-up batch; ratio = subject / baseline time)"
    );
    for note in &run.notes {
        println!("{note}");
    }
    println!("| subject | per call | per second |");
    println!("|---|---|---|");
    for (row, s) in &run.rows {
        println!("| python/{row} | {} | {:.0} |", show(*s), 1.0 / s);
    }
    println!();
    println!("| row | subject | median | per second | baseline | median | per second | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for (subject, baseline) in COMPARISONS {
        match (get(subject), get(baseline)) {
            (Some(s), Some(b)) => println!(
                "| peer | {subject} | {} | {:.0} | {baseline} | {} | {:.0} | {:.2}× |",
                show(s),
                1.0 / s,
                show(b),
                1.0 / b,
                s / b
            ),
            _ => println!("| peer | {subject} | - | - | {baseline} | - | - | not measured (see above) |"),
        }
    }
    for (what, why) in &run.skips {
        println!("peer: {what} skipped: {why}");
    }
    if !run.profiles.is_empty() {
        println!();
        println!("| once's own share (cProfile of new-key calls) | calls | profiled time | where it goes |");
        println!("|---|---|---|---|");
        for p in &run.profiles {
            let split: Vec<String> = p.shares.iter().map(|(k, s)| format!("{k} {:.1}%", s * 100.0)).collect();
            println!(
                "| {} | {} | {} | {} |",
                p.row,
                p.calls,
                show(p.total_s),
                split.join(", ")
            );
        }
    }
}
