//! Pacing the losers of a hot row.
//!
//! Every call on one tenant's quota bucket (or many calls on one key) ends in
//! a compare-and-swap of the same row. PostgreSQL runs them side by side and
//! all but one lose (`CommitError::Conflict`); each loser's engine reads the
//! row again and commits again. Were they all to come back at once, each
//! round would again hold every contender and let one win, and under enough
//! callers on a slow machine one caller can lose every round until its
//! contention window ends and it is refused (`blocked(storage)`: "the record
//! kept changing under concurrent writers"), as the gateway's 128-client load
//! test once saw. So a loser waits a random time up to what serving this
//! process's other commits one by one takes (their number times a commit's
//! recent duration, at most [`MAX_BACK_OFF`]), and the contenders come back
//! spread out. The wait shrinks with each loss in a row, so the callers that
//! lost most come back first and nobody loses for ever to newcomers.
//!
//! A deferrable batch is not paced: its conflict is not retried (a replay's
//! count) or is a report that must not wait behind claims. The SQLite store
//! does the same within its group commit (`storage/sqlite/group.rs`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::storage::jitter;

/// The longest a batch that lost its version check waits before its caller
/// tries again.
pub const MAX_BACK_OFF: Duration = Duration::from_millis(500);

std::thread_local! {
    /// How many commits in a row this thread lost. A caller's races (an
    /// engine export) run on its thread, so this is that caller's count
    /// until it wins.
    static LOST_IN_A_ROW: Cell<u32> = const { Cell::new(0) };
}

/// One store's commits in flight and their recent duration.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    in_flight: AtomicUsize,
    /// A moving average of one commit's duration, in nanoseconds.
    commit_nanos: AtomicU64,
    /// Conflicts that waited (for tests and operators: [`super::PostgresStorage::backed_off`]).
    backed_off: AtomicU64,
}

/// A commit in flight; dropping it ends it.
pub(super) struct Committing<'a> {
    pacing: &'a Pacing,
    began: Instant,
}

impl Pacing {
    /// A commit begins: it counts as a contender until dropped.
    pub(super) fn begin(&self) -> Committing<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Committing {
            pacing: self,
            began: Instant::now(),
        }
    }

    /// How many conflicts waited before their callers tried again.
    pub(super) fn backed_off(&self) -> u64 {
        self.backed_off.load(Ordering::Relaxed)
    }
}

impl Committing<'_> {
    /// The server answered: record how long a commit takes.
    pub(super) fn answered(&self) {
        let took = self.began.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        let average = &self.pacing.commit_nanos;
        // Races between two updates lose one sample of a moving average: harmless.
        let old = average.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old / 4) * 3 + took / 4 };
        average.store(new, Ordering::Relaxed);
    }

    /// The batch applied, or failed for another reason: the caller's run of losses ends.
    pub(super) fn won(self) {
        LOST_IN_A_ROW.set(0);
    }

    /// The batch lost its version check: unless it is `deferrable`, wait
    /// before answering so the contenders come back spread out.
    pub(super) fn lost(self, deferrable: bool) {
        if deferrable {
            LOST_IN_A_ROW.set(0);
            return;
        }
        let lost = LOST_IN_A_ROW.get();
        LOST_IN_A_ROW.set(lost.saturating_add(1));
        let pacing = self.pacing;
        // Every commit in flight now but this one may win before it comes back.
        let others = pacing.in_flight.load(Ordering::Relaxed).saturating_sub(1).max(1);
        let commit = Duration::from_nanos(pacing.commit_nanos.load(Ordering::Relaxed));
        let window = commit.saturating_mul(others as u32).min(MAX_BACK_OFF) / (1 + lost.min(7));
        drop(self);
        pacing.backed_off.fetch_add(1, Ordering::Relaxed);
        let nanos = window.as_nanos() as u64;
        if nanos > 0 {
            std::thread::sleep(Duration::from_nanos(jitter() % nanos));
        }
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.pacing.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
