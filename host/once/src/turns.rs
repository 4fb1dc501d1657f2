//! Callers of one ledger handle take turns at a quota bucket.
//!
//! Every call that spends from a tenant's quota reads the bucket's row,
//! decides, and commits the row with a compare-and-swap. Callers whose reads
//! and commits interleave lose to each other: of each round all but one decide
//! again, and which one wins is luck. A caller can lose round after round: on
//! a slow machine with 128 callers on one bucket, the gateway's load test saw
//! one lose for its whole contention window and be refused
//! (`blocked(storage)`, "the record kept changing under concurrent writers")
//! while its budget had room. The stores' back-offs spread the losers out but
//! cannot order them.
//!
//! So the exports running over one `Arc<dyn Storage>` (one [`crate::Once`]
//! and its instances) take turns at a bucket, first come first served. An
//! export's read of a bucket ([`Turns::take`]) waits until no other export
//! holds that row, and holds it until the export commits a batch that writes
//! the row (a lost compare-and-swap keeps it: the engine reads again at once)
//! or returns. An export holds at most one turn: it hands the one it holds on
//! before it waits for another. A thread that holds a turn never waits for
//! one: an export nested in another's import on the same thread (an operator
//! sink or a provider that calls `Once` again) reads without a turn. So no
//! caller waits while holding one, and no two wait on each other.
//!
//! Turns order callers; they guard nothing. The compare-and-swap still decides
//! every write, so a caller of another process (another gateway on the same
//! ledger) or another handle races as before, and an export whose queue did
//! not move for [`MAX_WAIT`] (its holder stuck) gives up on that row for the
//! rest of the export and races too, rather than stall.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::ThreadId;
use std::time::Duration;

/// The longest an export waits for its turn while the row's turn is not
/// handed on (a long queue that moves is waited out) before it reads
/// without one.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(10);

/// Whether an export on this thread holds a turn: SQLite's group commit then
/// does not back off after a lost bucket update, since the callers it would
/// make room for are parked behind the turn and a sleep would only stall
/// them. Asked only after a lost update, so it may look through every row
/// held.
pub(crate) fn held_here() -> bool {
    let me = std::thread::current().id();
    Turns::shared().lock().values().any(|q| q.holder == me)
}

/// A row of one store: the store's address (the `Arc<dyn Storage>` of one
/// ledger handle), the row's scope and key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RowId {
    store: usize,
    scope: String,
    key: String,
}

impl RowId {
    /// The row `scope`/`key` of the store at `store` (`Arc::as_ptr` of its `Arc<dyn Storage>`).
    pub(crate) fn new(store: usize, scope: &str, key: &str) -> RowId {
        RowId {
            store,
            scope: scope.to_string(),
            key: key.to_string(),
        }
    }

    /// Whether this is row `scope`/`key` (of the same store).
    pub(crate) fn is(&self, scope: &str, key: &str) -> bool {
        self.scope == scope && self.key == key
    }
}

/// The turns of every row some export holds or waits for.
#[derive(Default)]
pub(crate) struct Turns {
    rows: Mutex<HashMap<RowId, Queue>>,
}

/// One row's holder and waiters.
struct Queue {
    /// The thread whose export holds the turn.
    holder: ThreadId,
    /// Waiters in arrival order; the holder is not among them.
    waiting: VecDeque<Arc<Waiter>>,
    /// How many times the turn was handed on: a waiter whose wait ran out
    /// while this moved goes on waiting.
    handed_on: u64,
}

/// One export waiting for its turn.
struct Waiter {
    thread: ThreadId,
    /// Set by the holder that hands the turn on.
    granted: Mutex<bool>,
    wake: Condvar,
}

/// How [`Turns::take`] went.
pub(crate) enum Took {
    /// Nobody held the row: the turn, at once.
    AtOnce(Turn),
    /// The turn, after others held it: what the export read of the clock
    /// before it waited is that much older.
    AfterWaiting(Turn),
    /// No turn: the queue did not move for the wait, or this thread holds a turn already.
    No,
}

/// A turn held; dropping it hands the row to the next waiter, if any.
pub(crate) struct Turn {
    turns: &'static Turns,
    row: RowId,
}

impl Turn {
    /// The row this turn is for.
    pub(crate) fn row(&self) -> &RowId {
        &self.row
    }
}

impl Turns {
    /// The process's turns.
    pub(crate) fn shared() -> &'static Turns {
        static SHARED: OnceLock<Turns> = OnceLock::new();
        SHARED.get_or_init(Turns::default)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RowId, Queue>> {
        // Every change leaves the map consistent: a poisoned lock is usable.
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for `row`'s turn, while its queue moves and at most `max_wait`
    /// after it last moved.
    pub(crate) fn take(&'static self, row: RowId, max_wait: Duration) -> Took {
        let me = std::thread::current().id();
        let (waiter, mut seen) = {
            let mut rows = self.lock();
            // An export nested in a holder's import: waiting could wait for its own thread.
            if rows.values().any(|q| q.holder == me) {
                return Took::No;
            }
            match rows.get_mut(&row) {
                None => {
                    // Nobody holds it: a row is in the map exactly while it is held.
                    rows.insert(
                        row.clone(),
                        Queue {
                            holder: me,
                            waiting: VecDeque::new(),
                            handed_on: 0,
                        },
                    );
                    return Took::AtOnce(Turn { turns: self, row });
                }
                Some(queue) => {
                    let waiter = Arc::new(Waiter {
                        thread: me,
                        granted: Mutex::new(false),
                        wake: Condvar::new(),
                    });
                    queue.waiting.push_back(waiter.clone());
                    (waiter, queue.handed_on)
                }
            }
        };
        loop {
            let granted = waiter.granted.lock().unwrap_or_else(PoisonError::into_inner);
            let (granted, _) = waiter
                .wake
                .wait_timeout_while(granted, max_wait, |granted| !*granted)
                .unwrap_or_else(PoisonError::into_inner);
            if *granted {
                return Took::AfterWaiting(Turn { turns: self, row });
            }
            drop(granted);
            // The wait ran out. Under the map's lock (the holder grants under it) look again:
            // granted meanwhile, or the queue moved (wait on), or it did not (leave it).
            let mut rows = self.lock();
            if *waiter.granted.lock().unwrap_or_else(PoisonError::into_inner) {
                drop(rows);
                return Took::AfterWaiting(Turn { turns: self, row });
            }
            let Some(queue) = rows.get_mut(&row) else {
                // Unreachable while this waiter is queued (a row leaves the map only with no waiters).
                return Took::No;
            };
            if queue.handed_on != seen {
                seen = queue.handed_on;
                continue;
            }
            queue.waiting.retain(|w| !Arc::ptr_eq(w, &waiter));
            return Took::No;
        }
    }

    /// Hand `row` to its next waiter, or free it.
    fn release(&self, row: &RowId) {
        let mut rows = self.lock();
        let Some(queue) = rows.get_mut(row) else {
            return;
        };
        match queue.waiting.pop_front() {
            Some(next) => {
                queue.holder = next.thread;
                queue.handed_on += 1;
                *next.granted.lock().unwrap_or_else(PoisonError::into_inner) = true;
                next.wake.notify_one();
            }
            None => {
                rows.remove(row);
            }
        }
    }

    /// How many exports wait for `row` (for tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self, row: &RowId) -> Option<usize> {
        self.lock().get(row).map(|q| q.waiting.len())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.release(&self.row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// A row no other test uses (tests share the process's turns).
    fn row(name: &str) -> RowId {
        RowId::new(usize::MAX, "turns-test", name)
    }

    fn turn(took: Took) -> Turn {
        match took {
            Took::AtOnce(t) | Took::AfterWaiting(t) => t,
            Took::No => panic!("no turn"),
        }
    }

    fn wait_for_waiters(row: &RowId, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Turns::shared().waiting(row) != Some(n) {
            assert!(Instant::now() < deadline, "{n} waiters never queued");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_free_row_is_taken_at_once_and_freed_on_drop() {
        let turns = Turns::shared();
        let r = row("free");
        let Took::AtOnce(turn) = turns.take(r.clone(), Duration::ZERO) else {
            panic!("a free row's turn comes at once");
        };
        assert_eq!(turns.waiting(&r), Some(0));
        assert!(held_here());
        drop(turn);
        assert_eq!(turns.waiting(&r), None, "a row nobody holds leaves the map");
    }

    #[test]
    fn waiters_get_the_turn_in_arrival_order_and_know_they_waited() {
        let turns = Turns::shared();
        let r = row("order");
        let first = turn(turns.take(r.clone(), MAX_WAIT));
        let served = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        for i in 0..5 {
            let (mine, served) = (r.clone(), served.clone());
            threads.push(std::thread::spawn(move || {
                let Took::AfterWaiting(turn) = Turns::shared().take(mine, MAX_WAIT) else {
                    panic!("a held row's turn comes after waiting");
                };
                served.lock().unwrap().push(i);
                drop(turn);
            }));
            // Each queues before the next starts, so arrival order is 0, 1, 2, …
            wait_for_waiters(&r, i + 1);
        }
        drop(first);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(turns.waiting(&r), None);
    }

    #[test]
    fn one_holder_at_a_time() {
        let r = row("exclusive");
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (r, inside, most) = (r.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let turn = turn(Turns::shared().take(r.clone(), MAX_WAIT));
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(turn);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(Turns::shared().waiting(&r), None);
    }

    #[test]
    fn a_waiter_that_times_out_leaves_the_queue_and_the_holder_keeps_the_row() {
        let turns = Turns::shared();
        let r = row("timeout");
        let holder = turn(turns.take(r.clone(), MAX_WAIT));
        let other_thread = {
            let r = r.clone();
            std::thread::spawn(move || matches!(Turns::shared().take(r, Duration::from_millis(20)), Took::No))
        };
        assert!(other_thread.join().unwrap(), "no turn within the wait");
        assert_eq!(turns.waiting(&r), Some(0), "the waiter that gave up is gone");
        // Another row is not held up by this one.
        let other_row = std::thread::spawn(|| {
            matches!(
                Turns::shared().take(row("timeout-other"), Duration::ZERO),
                Took::AtOnce(_)
            )
        });
        assert!(other_row.join().unwrap());
        drop(holder);
        assert_eq!(turns.waiting(&r), None);
        assert!(matches!(turns.take(r, Duration::ZERO), Took::AtOnce(_)));
    }

    #[test]
    fn a_thread_that_holds_a_turn_does_not_wait_for_another() {
        let turns = Turns::shared();
        let (mine, theirs) = (row("nested-mine"), row("nested-theirs"));
        let holder = turn(turns.take(mine.clone(), MAX_WAIT));
        // Another thread holds `theirs` until told.
        let (held, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let other = {
            let (theirs, held) = (theirs.clone(), held.0);
            let release = release.1;
            std::thread::spawn(move || {
                let turn = turn(Turns::shared().take(theirs, MAX_WAIT));
                held.send(()).unwrap();
                release.recv().unwrap();
                drop(turn);
            })
        };
        held.1.recv().unwrap();
        // Watch the queues: a take that queued would sit there for MAX_WAIT.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let (rows, stop) = ([mine.clone(), theirs.clone()], stop.clone());
            std::thread::spawn(move || {
                let mut queued = false;
                while !stop.load(Ordering::SeqCst) {
                    queued |= rows.iter().any(|r| Turns::shared().waiting(r) == Some(1));
                    std::thread::sleep(Duration::from_millis(1));
                }
                queued
            })
        };
        // Exports nested in the holder's import, on its thread: no turn, no place in a queue.
        assert!(matches!(turns.take(mine.clone(), MAX_WAIT), Took::No));
        assert!(matches!(turns.take(theirs.clone(), MAX_WAIT), Took::No));
        stop.store(true, Ordering::SeqCst);
        assert!(
            !watcher.join().unwrap(),
            "a nested export queued while its thread held a turn"
        );
        release.0.send(()).unwrap();
        other.join().unwrap();
        drop(holder);
        assert!(!held_here());
    }

    #[test]
    fn a_queue_that_moves_is_waited_out_past_the_wait() {
        let turns = Turns::shared();
        let r = row("moving");
        let first = turn(turns.take(r.clone(), MAX_WAIT));
        let release = std::sync::mpsc::channel::<()>();
        let second = {
            let (r, release) = (r.clone(), release.1);
            std::thread::spawn(move || {
                let turn = turn(Turns::shared().take(r, MAX_WAIT));
                release.recv().unwrap();
                drop(turn);
            })
        };
        wait_for_waiters(&r, 1);
        let wait = Duration::from_secs(1);
        let third = {
            let r = r.clone();
            std::thread::spawn(move || matches!(Turns::shared().take(r, wait), Took::AfterWaiting(_)))
        };
        wait_for_waiters(&r, 2);
        // The queue moves within the third's wait, and its turn comes only after that wait.
        std::thread::sleep(wait / 2);
        drop(first);
        std::thread::sleep(wait);
        release.0.send(()).unwrap();
        second.join().unwrap();
        assert!(third.join().unwrap(), "the third waited on while the queue moved");
        assert_eq!(turns.waiting(&r), None);
    }
}
