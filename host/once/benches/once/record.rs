//! Per-sample timings kept beside criterion's own analysis, so the run can
//! end with one table of medians and ratios against each row's baseline.

use std::collections::BTreeMap;
use std::path::Path;
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

/// The summary: per comparison, both medians and subject / baseline; printed, and returned as the
/// same markdown for a run file (`ONCE_BENCH_RECORD`, see `write_run_file`).
pub fn print_summary() -> String {
    let mut out = String::new();
    let mut line = |l: String| {
        println!("{l}");
        out.push_str(&l);
        out.push('\n');
    };
    let comparisons = COMPARISONS.lock().unwrap();
    line(String::new());
    line("== once bench summary (medians of criterion's samples; ratio = subject / baseline time)".into());
    line(String::new());
    line("| row | subject | median | per second | baseline | median | per second | ratio |".into());
    line("|---|---|---|---|---|---|---|---|".into());
    for c in comparisons.iter() {
        let (Some(s), Some(b)) = (
            measured_median(&c.subject, c.samples),
            measured_median(&c.baseline, c.samples),
        ) else {
            continue;
        };
        line(format!(
            "| {} | {} | {} | {:.0} | {} | {} | {:.0} | {:.2}× |",
            c.row,
            c.subject,
            show(s),
            1e9 / s,
            c.baseline,
            show(b),
            1e9 / b,
            s / b
        ));
    }
    let latencies = LATENCIES.lock().unwrap().keys().cloned().collect::<Vec<_>>();
    if !latencies.is_empty() {
        line(String::new());
        line("| latency of one call | p50 | p99 | max |".into());
        line("|---|---|---|---|".into());
        for id in latencies {
            let q = |q| quantile(&id, q).map_or("-".to_string(), |d| show(d.as_nanos() as f64));
            line(format!("| {id} | {} | {} | {} |", q(0.5), q(0.99), q(1.0)));
        }
    }
    let notes = NOTES.lock().unwrap();
    if !notes.is_empty() {
        line(String::new());
    }
    for l in notes.iter() {
        println!("{l}");
        // A markdown line break, so each note keeps its own line in the run file.
        out.push_str(&format!("{l}  \n"));
    }
    out
}

/// With `ONCE_BENCH_RECORD=benchmarks/<date>-<slug>.md` (relative to the workspace root), write a
/// run file: the date, the command line, the commit, the machine facts that are cheap to read, and
/// `summary` as printed. Without the variable, nothing is written.
pub fn write_run_file(summary: &str) {
    let Some(path) = std::env::var_os("ONCE_BENCH_RECORD") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(path);
    // cargo passes `--bench`; what follows `--` on cargo's command line is the rest.
    let args = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .map(quoted)
        .collect::<Vec<_>>();
    let features = if cfg!(feature = "postgres") {
        " --features postgres"
    } else {
        ""
    };
    let rest = if args.is_empty() {
        String::new()
    } else {
        format!(" -- {}", args.join(" "))
    };
    let postgres = if std::env::var_os("ONCE_TEST_DATABASE_URL").is_some() {
        "set (the `postgres/*` rows ran if the `postgres` feature was on)"
    } else {
        "not set (no `postgres/*` rows)"
    };
    let cpu = read("/proc/cpuinfo", |t| {
        t.lines().find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
    });
    let memory = read("/proc/meminfo", |t| {
        let kb: u64 = t
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .trim_end_matches(" kB")
            .parse()
            .ok()?;
        Some(format!("{:.1} GiB", kb as f64 / (1024.0 * 1024.0)))
    });
    let os = read("/etc/os-release", |t| {
        t.lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string()))
    });
    let kernel = read("/proc/sys/kernel/osrelease", |t| Some(t.trim().to_string()));
    let load = read("/proc/loadavg", |t| {
        Some(t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
    });
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let record = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
    let text = format!(
        "# once bench run, {date}\n\n\
         Written by `host/once/benches/once` with `ONCE_BENCH_RECORD` set: criterion's medians and the\n\
         same-run ratios, as the bench printed them; see [the method](README.md#method).\n\n\
         ## Command\n\n\
         ```sh\n\
         ONCE_BENCH_RECORD={record} cargo bench -p once-host{features} --bench once{rest}\n\
         ```\n\n\
         - commit: `{commit}`\n\
         - `ONCE_TEST_DATABASE_URL`: {postgres}\n\n\
         ## Machine\n\n\
         - {cpus} CPUs available (`nproc`), `{cpu}`, {memory} RAM\n\
         - {os}, Linux {kernel}, {arch}\n\
         - {rustc}\n\
         - load average at the end: {load}\n\
         \n## Results\n{summary}",
        date = output("date", &["-u", "+%F"]),
        commit = output("git", &["describe", "--always", "--dirty"]),
        arch = std::env::consts::ARCH,
        rustc = output("rustc", &["--version"]),
    );
    match std::fs::write(&path, text) {
        Ok(()) => println!("run file written: {record}"),
        Err(e) => eprintln!("run file not written ({record}): {e}"),
    }
}

/// `arg` as a shell word: as it is when that is safe, else in single quotes.
fn quoted(arg: String) -> String {
    if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c)) {
        arg
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// `parse` of the text of `file`, or "unknown".
fn read(file: &str, parse: impl Fn(&str) -> Option<String>) -> String {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|t| parse(&t))
        .unwrap_or_else(|| "unknown".into())
}

/// The first line `program args` prints, or "unknown".
fn output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}
