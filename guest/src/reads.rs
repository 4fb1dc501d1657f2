//! The provider read as a protocol step (configuration `reads: steps`).
//!
//! Some decisions need the provider's authoritative read: verify-first before
//! a key's first dispatch, and reconciling an unknown outcome. With
//! `reads: import` the engine calls the host's `provider.lookup` there and
//! waits inside the step. A host whose read is I/O it awaits (a gateway
//! reading its upstream) cannot answer a synchronous import without blocking
//! a thread on it, so with `reads: steps` the decision stops where it would
//! read, before anything is written on the strength of the read, and the
//! step is `read(reading)`. The host reads on its own time and calls
//! `read-back`, which decides again from the ledger as it is then: where
//! that decision needs the same read (the same scope, key, tool, provider key
//! and args), it takes the evidence the host brought instead of stopping
//! again. A record that moved on meanwhile is decided as it stands, and the
//! evidence is not used.
//!
//! Evidence brought later than it was read is still true of its moment: a
//! confirmed effect stays confirmed, and an absence is absence as of its read
//! position, which the engine compares with the record's latest dispatch
//! whenever it uses it. A verify-first read must cover the moment the guest
//! asked (`asked-at`), which travels with the reading.

use alloc::string::String;
use core::cell::RefCell;

use crate::host::Host;
use crate::mutant::{self, Mutant};
use crate::store::LedgerError;
use crate::types::{Evidence, Reading};

/// The reads of one protocol export: the evidence `read-back` brought, and
/// the read a stopped decision needs.
#[derive(Debug, Default)]
pub struct Reads {
    brought: RefCell<Option<(Reading, Evidence)>>,
    needed: RefCell<Option<Reading>>,
}

impl Reads {
    /// No evidence, nothing needed.
    pub const fn new() -> Reads {
        Reads {
            brought: RefCell::new(None),
            needed: RefCell::new(None),
        }
    }

    /// Before an export: the evidence a `read-back` brought (none for every other export).
    pub fn arm(&self, brought: Option<(Reading, Evidence)>) {
        *self.brought.borrow_mut() = brought;
        *self.needed.borrow_mut() = None;
    }

    /// After an export: the read its decision stopped at, if it did (and nothing brought is kept).
    pub fn needed(&self) -> Option<Reading> {
        self.brought.borrow_mut().take();
        self.needed.borrow_mut().take()
    }

    /// The evidence brought for `reading`, with the time its read was asked for; else `reading`
    /// is needed and the decision stops ([`LedgerError::ReadDeferred`]). The evidence serves the
    /// whole export: a decision made again after a lost compare-and-swap (a busy quota bucket)
    /// takes it again, as true of its read position as the first time, rather than asking the
    /// host for another read per race.
    fn take(&self, reading: Reading) -> Result<(u64, Evidence), LedgerError> {
        let brought = self.brought.borrow();
        // A reading asked for later than now is none this guest asked for.
        if let Some((asked, evidence)) = brought.as_ref()
            && same_read(asked, &reading)
            && asked.asked_at <= reading.asked_at
        {
            return Ok((asked.asked_at, evidence.clone()));
        }
        *self.needed.borrow_mut() = Some(reading);
        Err(LedgerError::ReadDeferred)
    }
}

/// Whether two readings ask the provider the same question (when they were asked aside).
fn same_read(a: &Reading, b: &Reading) -> bool {
    a.scope == b.scope && a.key == b.key && a.tool == b.tool && a.provider_key == b.provider_key && a.args == b.args
}

/// The provider's authoritative read for a decision: what it found, and when it was asked for
/// (ledger clock). Through the `provider.lookup` import, or (with [`Host::reads`]) the evidence
/// `read-back` brought for it; without that, the decision stops here with
/// [`LedgerError::ReadDeferred`] and writes nothing more.
pub fn read(
    h: &impl Host,
    scope: &str,
    key: &str,
    tool: &str,
    provider_key: &str,
    args: &str,
) -> Result<(u64, Evidence), LedgerError> {
    let asked_at = h.now();
    let Some(reads) = h.reads() else {
        return Ok((asked_at, h.lookup(tool, provider_key, args)));
    };
    let found = reads.take(Reading {
        scope: String::from(scope),
        key: String::from(key),
        tool: String::from(tool),
        provider_key: String::from(provider_key),
        args: String::from(args),
        asked_at,
    });
    match found {
        Ok((asked, Evidence::Absent(_))) if mutant::on(Mutant::ReadBackTakenAsNow) => {
            Ok((asked, Evidence::Absent(h.now())))
        }
        found => found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(asked_at: u64) -> Reading {
        Reading {
            scope: "s".into(),
            key: "k".into(),
            tool: "refund".into(),
            provider_key: "pk".into(),
            args: "{}".into(),
            asked_at,
        }
    }

    #[test]
    fn brought_evidence_serves_every_decision_of_its_export_and_no_later_one() {
        let reads = Reads::new();
        reads.arm(Some((reading(10), Evidence::Absent(12))));
        // A decision made again after a lost race asks again: the same evidence.
        for _ in 0..3 {
            assert_eq!(reads.take(reading(20)), Ok((10, Evidence::Absent(12))));
        }
        assert_eq!(reads.needed(), None);
        // The next export brought nothing: the read is needed.
        reads.arm(None);
        assert_eq!(reads.take(reading(30)), Err(LedgerError::ReadDeferred));
        assert_eq!(reads.needed(), Some(reading(30)));
    }

    #[test]
    fn evidence_asked_for_later_than_now_or_for_another_read_is_not_used() {
        let reads = Reads::new();
        reads.arm(Some((reading(50), Evidence::Absent(50))));
        assert_eq!(reads.take(reading(40)), Err(LedgerError::ReadDeferred));
        let mut other = reading(60);
        other.provider_key = "another".into();
        assert_eq!(reads.take(other.clone()), Err(LedgerError::ReadDeferred));
        assert_eq!(reads.needed(), Some(other));
    }
}
