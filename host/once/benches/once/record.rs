//! Per-sample timings kept beside criterion's own analysis, so the run can
//! end with one table of medians and ratios against each row's baseline.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use criterion::Bencher;
use criterion::measurement::WallTime;

/// Per-iteration nanoseconds of every sample, per benchmark id.
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());
/// Individual call latencies, per benchmark id (for p99).
static LATENCIES: Mutex<BTreeMap<String, Vec<Duration>>> = Mutex::new(BTreeMap::new());
/// Lines to print after the table (diagnostics such as commit counts).
static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// (row, subject id, baseline id, sample size) to compare in the summary.
static COMPARISONS: Mutex<Vec<Comparison>> = Mutex::new(Vec::new());

struct Comparison {
    row: String,
    subject: String,
    baseline: String,
    samples: usize,
}

/// Run `f(iters)` as criterion's routine (it returns the time of `iters`
/// iterations) and keep each sample's time per iteration under `id`.
pub fn timed(b: &mut Bencher<'_, WallTime>, id: &str, mut f: impl FnMut(u64) -> Duration) {
    b.iter_custom(|iters| {
        let elapsed = f(iters);
        let per = elapsed.as_nanos() as f64 / iters.max(1) as f64;
        SAMPLES.lock().unwrap().entry(id.to_string()).or_default().push(per);
        elapsed
    });
}

/// Keep individual latencies of `id` (warm-up included: same workload).
pub fn latencies(id: &str, mut more: Vec<Duration>) {
    LATENCIES
        .lock()
        .unwrap()
        .entry(id.to_string())
        .or_default()
        .append(&mut more);
}

/// Print `line` under the summary.
pub fn note(line: String) {
    NOTES.lock().unwrap().push(line);
}

/// Compare `subject` with `baseline` in the summary; `samples` is the
/// group's sample size (the last that many samples are the measured ones,
/// earlier ones are criterion's warm-up).
pub fn compare(row: &str, subject: &str, baseline: &str, samples: usize) {
    COMPARISONS.lock().unwrap().push(Comparison {
        row: row.to_string(),
        subject: subject.to_string(),
        baseline: baseline.to_string(),
        samples,
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median per-iteration time of the measured samples of `id`, in ns.
fn measured_median(id: &str, samples: usize) -> Option<f64> {
    let all = SAMPLES.lock().unwrap();
    let v = all.get(id)?;
    let start = v.len().saturating_sub(samples);
    Some(median(v[start..].to_vec()))
}

/// The `q` quantile (0..=1) of the latencies kept under `id`.
pub fn quantile(id: &str, q: f64) -> Option<Duration> {
    let all = LATENCIES.lock().unwrap();
    let mut v = all.get(id)?.clone();
    if v.is_empty() {
        return None;
    }
    v.sort();
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    Some(v[i])
}

fn show(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The summary: per comparison, both medians and subject / baseline.
pub fn print_summary() {
    let comparisons = COMPARISONS.lock().unwrap();
    println!();
    println!("== once bench summary (medians of criterion's samples; ratio = subject / baseline time)");
    println!("| row | subject | median | per second | baseline | median | per second | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for c in comparisons.iter() {
        let (Some(s), Some(b)) = (
            measured_median(&c.subject, c.samples),
            measured_median(&c.baseline, c.samples),
        ) else {
            continue;
        };
        println!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.0} | {:.2}× |",
            c.row,
            c.subject,
            show(s),
            1e9 / s,
            c.baseline,
            show(b),
            1e9 / b,
            s / b
        );
    }
    let latencies = LATENCIES.lock().unwrap().keys().cloned().collect::<Vec<_>>();
    if !latencies.is_empty() {
        println!();
        println!("| latency of one call | p50 | p99 | max |");
        println!("|---|---|---|---|");
        for id in latencies {
            let q = |q| quantile(&id, q).map_or("-".to_string(), |d| show(d.as_nanos() as f64));
            println!("| {id} | {} | {} | {} |", q(0.5), q(0.99), q(1.0));
        }
    }
    for line in NOTES.lock().unwrap().iter() {
        println!("{line}");
    }
}
