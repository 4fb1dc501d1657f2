//! The operations a call loop of this [`Once`](crate::Once) is driving now.
//!
//! A call whose reply was lost reads its provider and, if the effect is absent,
//! sends the next attempt itself. A settle round running beside it in the same
//! process ([`Once::settle`](crate::Once::settle), a gateway's worker) lists the
//! same operation as due (a read, or an owed dispatch) and would race the call
//! for it. Either winner keeps the effect single (the ledger's compare-and-swap
//! decides), but when the round wins, the caller, who made one call, is told its
//! operation "already ran" and was replayed: an answer that reads like a
//! duplicate it did not make. So a round leaves a driven operation to its
//! driver, which answers as the one that sent it.
//!
//! A loop drives an operation from its first step that names the key (a grant,
//! a read, a wait) until it returns, or its future is dropped; then the next
//! round takes what it left, as before. While the loop is in a send, its mark
//! counts only until the deadline the engine gave the answer: a send is the
//! caller's code, which may hang past it, and the operation (its lease over)
//! is then the round's to settle, as it would be without the mark. A read
//! (the caller's [`Provider`](crate::Provider) or
//! `Dispatcher::read`) holds it until it returns.
//!
//! The skip is a check before the round resumes an operation: a call that
//! takes its first mark between that check and the round's resume (a client
//! calling again at that moment) still races the round. Exactly once holds
//! either way; only which of the two answers as the sender differs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::types::Step;

/// One loop's mark on an operation: until when it counts (none: while the loop holds it).
struct Mark {
    id: u64,
    until: Option<Instant>,
}

/// The marks on each operation a call loop is driving, by (scope, key): one per loop.
#[derive(Default)]
pub(crate) struct Driving {
    marks: Mutex<HashMap<(String, String), Vec<Mark>>>,
    ids: AtomicU64,
}

impl Driving {
    /// Whether a loop of this process is driving (scope, key) now.
    pub(crate) fn driven(&self, scope: &str, key: &str) -> bool {
        let now = Instant::now();
        self.lock()
            .get(&(scope.to_string(), key.to_string()))
            .is_some_and(|marks| marks.iter().any(|m| m.until.is_none_or(|until| now < until)))
    }

    /// A loop's mark, which follows the operation its steps are about and is taken off when dropped.
    pub(crate) fn driver(&self) -> Driver<'_> {
        Driver {
            driving: self,
            held: None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Vec<Mark>>> {
        // A panic elsewhere cannot leave the map half-changed: each change is one push, set or removal.
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, op: &(String, String)) -> u64 {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(op.clone())
            .or_default()
            .push(Mark { id, until: None });
        id
    }

    fn set_until(&self, op: &(String, String), id: u64, until: Option<Instant>) {
        if let Some(mark) = self
            .lock()
            .get_mut(op)
            .and_then(|marks| marks.iter_mut().find(|m| m.id == id))
        {
            mark.until = until;
        }
    }

    fn give_back(&self, op: &(String, String), id: u64) {
        let mut map = self.lock();
        if let Some(marks) = map.get_mut(op) {
            marks.retain(|m| m.id != id);
            if marks.is_empty() {
                map.remove(op);
            }
        }
    }
}

/// One loop's mark on the operation it drives ([`Driving::driver`]).
pub(crate) struct Driver<'a> {
    driving: &'a Driving,
    held: Option<((String, String), u64)>,
}

impl Driver<'_> {
    /// Before the loop follows `step`: the operation it names is this loop's from now on, for as
    /// long as the loop holds it. A loop can move to another key (a successor reads or waits on the
    /// operation it supersedes).
    pub(crate) fn follow(&mut self, step: &Step) {
        match step {
            Step::Dispatch(grant) => self.hold(&grant.scope, &grant.key),
            Step::Read(reading) => self.hold(&reading.scope, &reading.key),
            Step::Wait(wait) => self.hold(&wait.scope, &wait.key),
            Step::Done(_) | Step::Direct => {}
        }
    }

    /// Around a send: the mark counts until `until` (the deadline the engine gave the answer), and no
    /// longer, however long the send takes; `None` once the send has returned: held again, as long
    /// as the loop holds it.
    pub(crate) fn held_until(&mut self, until: Option<Instant>) {
        if let Some((op, id)) = &self.held {
            self.driving.set_until(op, *id, until);
        }
    }

    fn hold(&mut self, scope: &str, key: &str) {
        if let Some((op, id)) = &self.held
            && op.0 == scope
            && op.1 == key
        {
            self.driving.set_until(op, *id, None);
            return;
        }
        self.release();
        let op = (scope.to_string(), key.to_string());
        let id = self.driving.take(&op);
        self.held = Some((op, id));
    }

    fn release(&mut self) {
        if let Some((op, id)) = self.held.take() {
            self.driving.give_back(&op, id);
        }
    }
}

impl Drop for Driver<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_operation_stays_driven_while_any_of_its_loops_holds_it() {
        let driving = Driving::default();
        let (mut first, mut second) = (driving.driver(), driving.driver());
        first.hold("t", "k");
        second.hold("t", "k");
        drop(first);
        assert!(driving.driven("t", "k"), "the second loop still drives it");
        drop(second);
        assert!(!driving.driven("t", "k"));
        assert!(driving.lock().is_empty(), "nothing is left behind");
    }

    #[test]
    fn a_loop_that_moves_to_another_key_gives_the_first_back() {
        let driving = Driving::default();
        let mut driver = driving.driver();
        driver.hold("t", "successor");
        driver.hold("t", "original");
        assert!(!driving.driven("t", "successor"));
        assert!(driving.driven("t", "original"));
        assert!(!driving.driven("other", "original"), "a scope is part of the operation");
    }

    #[test]
    fn a_send_past_its_deadline_no_longer_holds_its_operation() {
        let driving = Driving::default();
        let mut driver = driving.driver();
        driver.hold("t", "k");
        driver.held_until(Some(Instant::now() + Duration::from_secs(3600)));
        assert!(driving.driven("t", "k"), "within the deadline");
        driver.held_until(Some(Instant::now()));
        assert!(!driving.driven("t", "k"), "a send that hangs past its deadline");
        driver.held_until(None);
        assert!(driving.driven("t", "k"), "the send returned: held again");
        driver.held_until(Some(Instant::now()));
        driver.hold("t", "k");
        assert!(driving.driven("t", "k"), "the loop's next step holds it again");
    }
}
