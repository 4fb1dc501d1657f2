//! Pacing the losers of a hot quota bucket.
//!
//! Every call on one tenant's quota bucket ends in a compare-and-swap of the
//! same row. PostgreSQL runs them side by side and all but one lose
//! (`CommitError::Conflict`); each loser's engine reads the row again and
//! commits again. Were they all to come back at once, each round would again
//! hold every contender and let one win, and under enough callers on a slow
//! machine one caller can lose every round until its contention window ends
//! and it is refused (`blocked(storage)`: "the record kept changing under
//! concurrent writers"), as the gateway's 128-client load test once saw.
//! The calls through one `Once` take turns at a bucket (`crate::turns`)
//! and do not race each other; what is left is the race with other
//! processes and handles (and a call that gave up waiting for its turn).
//! So a loser waits a random time up to what serving the contenders one
//! by one takes (the commits in flight times a commit's recent duration,
//! at most [`MAX_BACK_OFF`]), and the contenders come back spread out. The
//! wait shrinks with each loss in a row, so a caller that lost often is
//! likely to come back before those that lost less.
//!
//! Only a batch that updates a quota bucket is paced: that is the row many
//! callers race on, and the engine always decides again after losing it
//! (`begin`, or a `finish` that releases a reservation). A lost update of an
//! operation record alone is answered at once: a lease renewal that lost is
//! not tried again and its grant must go out before its `send-by`; a blind
//! claim of a key that exists is answered by a read, not another race. A
//! deferrable batch is never paced (a replay's count, a report that must not
//! wait behind claims).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::bindings::types::{Batch, Table};
use crate::storage::jitter;

/// The longest a lost bucket update waits before its caller races again.
const MAX_BACK_OFF: Duration = Duration::from_millis(500);

std::thread_local! {
    /// How many bucket updates in a row this thread lost. A caller's races
    /// (an engine export) run on its thread, so this is that caller's count
    /// until it wins; any other answer resets it.
    static LOST_IN_A_ROW: Cell<u32> = const { Cell::new(0) };
}

/// One store's commits in flight and their recent duration.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Commits begun and not answered, waiting for a connection or not: the contenders.
    in_flight: AtomicUsize,
    /// A moving average of one commit's round trip (from holding a connection to the answer), in ns.
    commit_nanos: AtomicU64,
    /// Lost bucket updates that were paced.
    backed_off: AtomicU64,
    /// The waits drawn for them, and the time actually slept, in ns (for tests).
    drawn_nanos: AtomicU64,
    slept_nanos: AtomicU64,
}

/// A commit in flight; dropping it ends it.
pub(super) struct Committing<'a> {
    pacing: &'a Pacing,
    /// When the current try got its connection.
    sent: Instant,
    paced: bool,
}

/// What pacing has done since a store opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacingCounts {
    /// Lost quota-bucket updates that waited before their callers raced again.
    pub backed_off: u64,
    /// The random waits drawn for them, in all.
    pub drawn: Duration,
    /// The time they slept, in all (at least `drawn`).
    pub slept: Duration,
}

impl Pacing {
    /// A commit begins: it counts as a contender until dropped.
    pub(super) fn begin(&self) -> Committing<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Committing {
            pacing: self,
            sent: Instant::now(),
            paced: false,
        }
    }

    pub(super) fn counts(&self) -> PacingCounts {
        PacingCounts {
            backed_off: self.backed_off.load(Ordering::Relaxed),
            drawn: Duration::from_nanos(self.drawn_nanos.load(Ordering::Relaxed)),
            slept: Duration::from_nanos(self.slept_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// How long a loser may wait: serving `contenders` one by one, at most
/// [`MAX_BACK_OFF`], shrunk by the losses in a row before this one.
fn window(commit: Duration, contenders: usize, lost_before: u32) -> Duration {
    let contenders = u32::try_from(contenders.max(1)).unwrap_or(u32::MAX);
    commit.saturating_mul(contenders).min(MAX_BACK_OFF) / (1 + lost_before.min(7))
}

impl Committing<'_> {
    /// The try holds a connection now: its round trip starts.
    pub(super) fn sending(&mut self) {
        self.sent = Instant::now();
    }

    /// The server answered the try: record how long a round trip takes.
    pub(super) fn answered(&self) {
        let took = u64::try_from(self.sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let average = &self.pacing.commit_nanos;
        // Two updates racing lose one sample of a moving average: harmless.
        let old = average.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old / 4) * 3 + took / 4 };
        average.store(new, Ordering::Relaxed);
    }

    /// `batch` lost its version check. If it updates a quota bucket and is not
    /// deferrable, wait before answering so the contenders come back spread out.
    /// A caller holding the bucket's turn (`crate::turns`) waits too: it lost
    /// to another process's holder, which would otherwise come back at the
    /// same moment; its own process's waiters are parked, not in flight, so
    /// they do not widen the wait.
    pub(super) fn lost(mut self, batch: &Batch) {
        let bucket = batch
            .puts
            .iter()
            .any(|p| p.table == Table::Quota && p.expected.is_some());
        if !bucket || batch.deferrable {
            return;
        }
        self.paced = true;
        let lost_before = LOST_IN_A_ROW.get();
        LOST_IN_A_ROW.set(lost_before.saturating_add(1));
        let pacing = self.pacing;
        // Every commit in flight now but this one may win before it comes back.
        let others = pacing.in_flight.load(Ordering::Relaxed).saturating_sub(1);
        let commit = Duration::from_nanos(pacing.commit_nanos.load(Ordering::Relaxed));
        let window = window(commit, others, lost_before);
        // No longer a contender while it waits.
        drop(self);
        let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let drawn = if nanos > 0 { jitter() % nanos } else { 0 };
        let slept = Instant::now();
        std::thread::sleep(Duration::from_nanos(drawn));
        let slept = u64::try_from(slept.elapsed().as_nanos()).unwrap_or(u64::MAX);
        pacing.backed_off.fetch_add(1, Ordering::Relaxed);
        pacing.drawn_nanos.fetch_add(drawn, Ordering::Relaxed);
        pacing.slept_nanos.fetch_add(slept, Ordering::Relaxed);
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.pacing.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.paced {
            // Applied, failed otherwise, or lost where no race follows: the run of losses ends.
            LOST_IN_A_ROW.set(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_serves_the_contenders_one_by_one_and_shrinks_with_losses() {
        let ms = Duration::from_millis;
        assert_eq!(window(ms(2), 0, 0), ms(2), "a lone loser waits at most one commit");
        assert_eq!(window(ms(2), 10, 0), ms(20));
        assert_eq!(window(ms(2), 10, 1), ms(10));
        assert_eq!(window(ms(2), 1_000, 0), MAX_BACK_OFF);
        assert_eq!(window(ms(2), 1_000, 100), MAX_BACK_OFF / 8, "shrinks at most eightfold");
        assert_eq!(window(Duration::MAX, usize::MAX, 0), MAX_BACK_OFF);
    }
}
