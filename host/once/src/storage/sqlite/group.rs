//! Group commit: one writer and an in-process commit queue (see the module
//! docs of [`super`]). A caller that finds no commit running leads: it takes
//! the batches queued meanwhile and applies them, in arrival order, in one
//! `BEGIN IMMEDIATE` transaction, each inside its own `SAVEPOINT`; one
//! `COMMIT` (one fsync) covers the group and every caller gets its own result.
//!
//! Commit delay: callers that just shared a group come back at about the same
//! time, but not at once (each runs the engine between two commits). So a
//! leader that expects company (the last group, plus what queued behind it,
//! held more than its own batch) waits for that many batches before it
//! begins, at most about one commit's duration ([`MAX_COMMIT_DELAY`] at
//! most): waiting is then never dearer than the fsync it may save. A lone
//! caller never waits. The delay is before `BEGIN`; `Ok` still comes only
//! after `COMMIT` returned.

use std::collections::{HashMap, VecDeque};
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::batch::{Abort, apply_event, apply_put};
use super::{Level, MAX_GROUP, SqliteStorage, err};
use crate::bindings::types::{Batch, Put};
use crate::storage::{CommitError, Flush, StorageError, jitter};

/// The commit queue: callers append, one leader at a time drains.
#[derive(Default)]
pub(super) struct Queue {
    /// Whether a leader is applying a group now.
    leading: bool,
    /// Batches waiting, oldest first.
    pending: VecDeque<Pending>,
    /// Results of applied batches, until their callers take them.
    done: HashMap<u64, Applied>,
    /// The next ticket.
    next: u64,
    /// How many batches the next group should gather: the size of the last
    /// group plus the batches that queued while it committed (0 or 1: no wait).
    expect: usize,
    /// A leader is waiting for batches (so a new one must wake it).
    gathering: bool,
    /// Recent duration of one group transaction (a moving average): how long a
    /// leader may wait for company.
    commit_time: Duration,
}

/// A batch's result, and, when it lost its version check to a batch of its
/// own group (a hot row: a quota bucket, a key many callers share), how many
/// of that group lost so; 0 when it did not (it applied, failed otherwise, or
/// lost to an earlier commit, as a blind insert of an existing key does).
type Applied = (Result<(), CommitError>, usize);

/// The longest a leader waits for other batches before it begins.
pub const MAX_COMMIT_DELAY: Duration = Duration::from_millis(2);

/// The longest a batch that lost its version check waits before its caller
/// tries again (see [`SqliteStorage::group_commit`]).
pub const MAX_BACK_OFF: Duration = Duration::from_millis(500);

/// A queued batch: a caller is waiting for its result under `id`.
struct Pending {
    id: u64,
    batch: Batch,
    flush: Flush,
    /// Its caller's losses to its own group in a row (see [`LOST_IN_A_ROW`]).
    lost: u32,
}

std::thread_local! {
    /// How many commits in a row this thread lost to its own group and backed
    /// off after. A caller's races (an engine export) run on its thread, so
    /// this is that caller's count until it wins: its next batch goes before
    /// those of callers that lost less (the first batch on a hot row wins), so
    /// no caller loses for ever to newcomers that share its group.
    static LOST_IN_A_ROW: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Up to `max` of the oldest queued batches.
fn take_group(queue: &mut Queue, max: usize) -> Vec<Pending> {
    let n = queue.pending.len().min(max);
    queue.pending.drain(..n).collect()
}

/// Hands a group's results to its waiting callers and ends the lead, also
/// when the leader unwinds (those callers then get a storage error rather
/// than waiting forever).
struct Handoff<'a> {
    store: &'a SqliteStorage,
    ids: Vec<u64>,
    results: Vec<Applied>,
    /// Batches in the group, the leader's own included.
    size: usize,
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let mut results = std::mem::take(&mut self.results).into_iter();
        let mut queue = self.store.lock_queue();
        for id in self.ids.drain(..) {
            let result = results.next().unwrap_or_else(|| {
                let lost = "sqlite: the group commit failed before this batch's outcome was known";
                (Err(CommitError::Storage(StorageError(lost.to_string()))), 0)
            });
            queue.done.insert(id, result);
        }
        queue.expect = (self.size + queue.pending.len()).min(MAX_GROUP);
        queue.leading = false;
        drop(queue);
        self.store.group_done.notify_all();
    }
}

impl SqliteStorage {
    /// Commit `batch` through the queue: lead a group when no commit is
    /// running, else wait for a leader to apply it (or lead the next group).
    pub(super) fn group_commit(&self, batch: &Batch, flush: Flush) -> Result<(), CommitError> {
        let lost = LOST_IN_A_ROW.get();
        let (result, losers) = self.queue_commit(batch, flush, lost);
        // A deferrable batch's conflict is not retried (a replay's count) or is a report that must
        // not wait behind claims (an attempt's success): only the others back off.
        if losers > 0 && !batch.deferrable {
            LOST_IN_A_ROW.set(lost.saturating_add(1));
            self.back_off(losers);
        } else {
            LOST_IN_A_ROW.set(0);
        }
        result
    }

    /// A batch that lost its version check to another batch of its group lost
    /// on a hot row (a quota bucket, a key many callers share): its caller will
    /// re-read and commit again, and so will every other loser. Were they all
    /// to come back at once, each group would again hold every contender and
    /// let one win, the others' work wasted: a bucket with a hundred callers
    /// would serve one per commit at the cost of a hundred. So a loser waits a
    /// random time up to what serving the group's losers one by one takes
    /// (their number times a commit's duration, at most [`MAX_BACK_OFF`]) and
    /// the contenders come back spread out. Who won is then decided by the
    /// order of the next group, where the callers that lost most go first. A batch that lost to an earlier
    /// commit does not wait: a replay's blind insert of an existing key does
    /// so, and so does a lone batch behind a hot row's last winner (it comes
    /// back alone).
    ///
    /// A caller that holds a bucket's turn (`crate::turns`) does not wait: a
    /// loser to its own group lost to a writer of this process that took no
    /// turn (a nested export, a caller that gave up waiting), while the
    /// process's other callers of the bucket are parked behind the turn, and a
    /// sleep would only stall them.
    fn back_off(&self, losers: usize) {
        if crate::turns::held_here() {
            return;
        }
        self.backed_off.fetch_add(1, Ordering::Relaxed);
        let commit_time = self.lock_queue().commit_time;
        let window = commit_time.saturating_mul(losers as u32).min(MAX_BACK_OFF);
        let nanos = window.as_nanos() as u64;
        if nanos > 0 {
            std::thread::sleep(Duration::from_nanos(jitter() % nanos));
        }
    }

    /// [`SqliteStorage::group_commit`] before any back-off.
    fn queue_commit(&self, batch: &Batch, flush: Flush, lost: u32) -> Applied {
        let mut queue = self.lock_queue();
        if !queue.leading {
            // No commit running: lead a group of this batch and whatever is queued.
            queue.leading = true;
            let (queue, others) = self.gather(queue, Vec::new(), 1);
            drop(queue);
            return self.lead(Some((batch, flush, lost)), others).unwrap_or_else(|| {
                let lost = "sqlite: the group commit lost this batch's result";
                (Err(CommitError::Storage(StorageError(lost.to_string()))), 0)
            });
        }
        let id = queue.next;
        queue.next += 1;
        queue.pending.push_back(Pending {
            id,
            batch: batch.clone(),
            flush,
            lost,
        });
        if queue.gathering {
            self.arrived.notify_one();
        }
        loop {
            if let Some(result) = queue.done.remove(&id) {
                return result;
            }
            if !queue.leading {
                // No group is running and this batch is still queued (it came after the last
                // leader took its group, or that group was full): lead the next one.
                queue.leading = true;
                let group = take_group(&mut queue, MAX_GROUP);
                let (queue_after, group) = self.gather(queue, group, 0);
                drop(queue_after);
                self.lead(None, group);
                queue = self.lock_queue();
                continue;
            }
            queue = self
                .group_done
                .wait(queue)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The leader's commit delay: with `group` taken (and `own` batches of the
    /// leader's own), wait until the group is as large as expected or about one
    /// commit's time has passed, then take what arrived.
    fn gather<'q>(
        &'q self,
        mut queue: MutexGuard<'q, Queue>,
        mut group: Vec<Pending>,
        own: usize,
    ) -> (MutexGuard<'q, Queue>, Vec<Pending>) {
        let delay = queue.commit_time.min(MAX_COMMIT_DELAY);
        let mut size = own + group.len() + queue.pending.len();
        if size < queue.expect && !delay.is_zero() {
            let deadline = Instant::now() + delay;
            queue.gathering = true;
            while size < queue.expect {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                queue = self
                    .arrived
                    .wait_timeout(queue, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
                size = own + group.len() + queue.pending.len();
            }
            queue.gathering = false;
        }
        let room = MAX_GROUP - own - group.len();
        group.extend(take_group(&mut queue, room));
        (queue, group)
    }

    /// Fold one group transaction's duration into the commit delay's bound.
    fn record_commit_time(&self, took: Duration) {
        let mut queue = self.lock_queue();
        // A moving average over about four commits: one slow fsync does not set the bound.
        queue.commit_time = (queue.commit_time * 3 + took) / 4;
    }

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        // The queue is only ever left consistent (see `Handoff`): a poisoned lock is usable.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply `own` (the leader's batch, if it has one) and `group` as one
    /// transaction; hand out the group's results, return `own`'s.
    fn lead(&self, own: Option<(&Batch, Flush, u32)>, group: Vec<Pending>) -> Option<Applied> {
        let mut handoff = Handoff {
            store: self,
            ids: group.iter().map(|p| p.id).collect(),
            results: Vec::new(),
            size: group.len() + usize::from(own.is_some()),
        };
        let all: Vec<(&Batch, Flush, u32)> = own
            .into_iter()
            .chain(group.iter().map(|p| (&p.batch, p.flush, p.lost)))
            .collect();
        // Callers that lost most in a row go first (a stable sort: otherwise in arrival order).
        let mut order: Vec<usize> = (0..all.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(all[i].2));
        let batches: Vec<(&Batch, Flush)> = order.iter().map(|&i| (all[i].0, all[i].1)).collect();
        let mut applied = self.apply_group(&batches);
        let mut results: Vec<Applied> = vec![(Ok(()), 0); all.len()];
        for (result, &i) in applied.drain(..).zip(&order) {
            results[i] = result;
        }
        let losers = results.iter().filter(|(_, lost)| *lost > 0).count();
        for (_, lost) in &mut results {
            if *lost > 0 {
                *lost = losers;
            }
        }
        let own_result = own.map(|_| results.remove(0));
        handoff.results = results;
        drop(handoff);
        own_result
    }

    /// One transaction for every batch, in order; one result per batch.
    fn apply_group(&self, batches: &[(&Batch, Flush)]) -> Vec<Applied> {
        let all = |e: StorageError| {
            batches
                .iter()
                .map(|_| (Err(CommitError::Storage(e.clone())), 0))
                .collect()
        };
        // The group is as durable as its most demanding batch.
        let flush = if batches.iter().any(|(_, f)| *f == Flush::Now) {
            Flush::Now
        } else {
            Flush::Deferred
        };
        let level = self.options.synchronous.level(flush);
        let mut guard = match self.writer() {
            Ok(guard) => guard,
            Err(e) => return all(e),
        };
        let Some(writer) = guard.as_mut() else {
            unreachable!("writer() always leaves a connection")
        };
        if writer.level != level {
            // Outside any transaction, so it governs the COMMIT below.
            if let Err(e) = writer.conn.pragma_update(None, "synchronous", level.pragma()) {
                return all(err("set synchronous", e));
            }
            writer.level = level;
        }
        let conn = &writer.conn;
        let began = Instant::now();
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            return all(err("begin transaction", e));
        }
        // Under the write lock: no other once writer is mid-batch while we look.
        let outcome = self.check_file().and_then(|()| apply_each(conn, batches));
        let results = match outcome {
            Ok(results) if results.iter().any(|(r, _)| r.is_ok()) => match conn.execute_batch("COMMIT") {
                Ok(()) => {
                    let counter = match level {
                        Level::Full => &self.commits_full,
                        Level::Normal => &self.commits_normal,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let applied = results.iter().filter(|(r, _)| r.is_ok()).count() as u64;
                    self.commits_batches.fetch_add(applied, Ordering::Relaxed);
                    drop(guard);
                    self.record_commit_time(began.elapsed());
                    return results;
                }
                Err(e) => all(err("COMMIT failed (the batch is not known to be durable)", e)),
            },
            // Nothing applied: the ROLLBACK below ends the transaction.
            Ok(results) => results,
            Err(e) => all(e),
        };
        // Undo; SQLite may already have rolled back on its own (I/O error, full disk).
        if !conn.is_autocommit() {
            let rolled_back = conn.execute_batch("ROLLBACK");
            if rolled_back.is_err() || !conn.is_autocommit() {
                // Closing the connection rolls back whatever is left open.
                *guard = None;
            }
        }
        results
    }
}

/// Apply each batch inside the open transaction. A lone batch needs no
/// savepoint (a failure rolls the transaction back); in a group each batch
/// gets one, so a failed batch is undone alone. `Err` means the transaction
/// itself is lost and no batch may be reported applied.
fn apply_each(conn: &Connection, batches: &[(&Batch, Flush)]) -> Result<Vec<Applied>, StorageError> {
    // `lost` is 1 for a loser to its own group; `lead` makes it the group's count of such losers.
    let applied = |i: usize, results: &[Applied]| match apply_batch(conn, batches[i].0) {
        Ok(()) => (Ok(()), 0),
        Err((e, put)) => (
            Err(e),
            usize::from(put.is_some_and(|p| lost_to_group(p, &batches[..i], results))),
        ),
    };
    if batches.len() == 1 {
        return Ok(vec![applied(0, &[])]);
    }
    let mut results = Vec::with_capacity(batches.len());
    for i in 0..batches.len() {
        conn.execute_batch("SAVEPOINT batch").map_err(|e| err("savepoint", e))?;
        let result = applied(i, &results);
        if result.0.is_err() {
            conn.execute_batch("ROLLBACK TO batch")
                .map_err(|e| err("roll back a failed batch of the group", e))?;
        }
        conn.execute_batch("RELEASE batch")
            .map_err(|e| err("release savepoint", e))?;
        if conn.is_autocommit() {
            // SQLite ended the transaction on its own (I/O error, full disk).
            return Err(StorageError(
                "sqlite: the group transaction was rolled back by SQLite".to_string(),
            ));
        }
        results.push(result);
    }
    Ok(results)
}

/// Apply one batch inside the open transaction; on failure, the put that lost its version check
/// (none when an audit event or the storage failed).
fn apply_batch<'b>(conn: &Connection, batch: &'b Batch) -> Result<(), (CommitError, Option<&'b Put>)> {
    for put in &batch.puts {
        match apply_put(conn, put) {
            Ok(()) => {}
            Err(Abort::Conflict) => return Err((CommitError::Conflict, Some(put))),
            Err(Abort::Storage(e)) => return Err((CommitError::Storage(e), None)),
        }
    }
    batch
        .events
        .iter()
        .try_for_each(|ev| apply_event(conn, ev))
        .map_err(|abort| match abort {
            Abort::Conflict => (CommitError::Conflict, None),
            Abort::Storage(e) => (CommitError::Storage(e), None),
        })
}

/// Whether an earlier batch of the group that applied wrote `put`'s row: `put` lost to its own
/// group, not to an earlier commit. Looked up only on a conflict, so a group pays nothing for it.
fn lost_to_group(put: &Put, earlier: &[(&Batch, Flush)], results: &[Applied]) -> bool {
    earlier
        .iter()
        .zip(results)
        .filter(|(_, (result, _))| result.is_ok())
        .any(|((batch, _), _)| {
            batch
                .puts
                .iter()
                .any(|p| p.table == put.table && p.scope == put.scope && p.key == put.key)
        })
}
