//! Runs a study's trials: shuffled by a seed, a few at a time (they mostly wait on timeouts, not the CPU), each in
//! a fresh directory, behind a progress bar; what every trial measured, grouped by cell.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// What a run measured.
pub struct Ran<C, V> {
    /// Every trial's result, by cell.
    pub results: BTreeMap<C, Vec<V>>,
    errors: Vec<String>,
    trials: usize,
    jobs: usize,
    elapsed: Duration,
    busy: Duration,
}

impl<C, V> Ran<C, V> {
    /// Every trial ran, or how many did not and why the first did not.
    pub fn check(&self) -> Result<(), String> {
        match self.errors.first() {
            None => Ok(()),
            Some(first) => Err(format!("{} trials could not run; first: {first}", self.errors.len())),
        }
    }

    /// One line: trials, wall time, and what a trial costs.
    pub fn summary(&self) -> String {
        let trials = self.trials.max(1) as f64;
        format!(
            "{} trials in {:.1} s ({} at a time): {:.1} ms of wall time per trial; a trial takes {:.0} ms on average",
            self.trials,
            self.elapsed.as_secs_f64(),
            self.jobs,
            self.elapsed.as_secs_f64() * 1000.0 / trials,
            self.busy.as_secs_f64() * 1000.0 / trials,
        )
    }
}

/// Run every `(cell, trial)` of `work` in a shuffled order, `jobs` at a time. `trial(cell, index, dir)` gets a
/// fresh directory under `workdir` (removed afterwards); `name(cell)` labels a trial that failed.
pub fn run<C, V>(
    mut work: Vec<C>,
    seed: u64,
    jobs: usize,
    workdir: &Path,
    trial: impl Fn(C, u64, &Path) -> Result<V, String> + Sync,
    name: impl Fn(C) -> String + Sync,
) -> Ran<C, V>
where
    C: Copy + Ord + Send + Sync,
    V: Send,
{
    shuffle(&mut work, seed);
    let jobs = jobs.max(1);
    let progress = ProgressBar::new(work.len() as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} trials {elapsed} (eta {eta}) {msg}")
            .expect("a valid template"),
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<C, Vec<V>>> = Mutex::new(BTreeMap::new());
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let busy_ms = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&cell) = work.get(i) else { break };
                    let dir = workdir.join(format!("trial-{i}"));
                    let trial_started = Instant::now();
                    let outcome = std::fs::create_dir(&dir)
                        .map_err(|e| e.to_string())
                        .and_then(|()| trial(cell, i as u64, &dir));
                    let _ = std::fs::remove_dir_all(&dir);
                    busy_ms.fetch_add(trial_started.elapsed().as_millis() as u64, Ordering::Relaxed);
                    match outcome {
                        Ok(verdict) => lock(&results).entry(cell).or_default().push(verdict),
                        Err(e) => lock(&errors).push(format!("{}: {e}", name(cell))),
                    }
                    progress.inc(1);
                }
            });
        }
    });
    progress.finish_and_clear();
    Ran {
        results: results.into_inner().unwrap_or_else(|p| p.into_inner()),
        errors: errors.into_inner().unwrap_or_else(|p| p.into_inner()),
        trials: work.len(),
        jobs,
        elapsed: started.elapsed(),
        busy: Duration::from_millis(busy_ms.into_inner()),
    }
}

/// A panicking trial must not hide every other trial's result.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Deterministic Fisher–Yates shuffle (xorshift64*), so a seed reproduces the trial order.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for i in (1..items.len()).rev() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let j = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}
