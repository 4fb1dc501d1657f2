//! The record state machine's single transitions (world `once`'s
//! `transitions`, `sweep`, operators' commands): each reads the ledger,
//! decides, and commits one transition per write, re-deciding when a
//! concurrent writer wins. [`crate::protocol`] drives them for hosts.

mod account;
mod begin;
mod escalation;
mod finish;
mod maintenance;
mod operator;
mod queue;
mod reconcile;
mod witness;

pub(crate) use account::foreign as other_account_here;
pub use begin::{BeginRequest, Begun, begin, begin_keyed, confirmed_info, grant_of, unknown_info};
pub use finish::{finish, finish_with_record};
pub use maintenance::{SweepReport, prune, sweep};
pub use operator::{adopt, inspect, resolve};
pub use queue::queue;
pub use reconcile::{
    ReadWhen, await_holder, await_loaded, await_with_record, load_awaited, reads_when_due, reconcile, reconcile_when,
    rejected_info,
};
pub(crate) use witness::catch_up;

use alloc::string::String;

use crate::canon;
use crate::host::Host;
use crate::input::limits;
use crate::record::OpRecord;
use crate::types::{Error, JsonError};

/// How many times background work (a sweep, an adoption) re-reads and
/// re-decides a row after losing a compare-and-swap before it leaves the row
/// to the next pass; the first [`Races`] of a call, too.
const MAX_RACES: u32 = 16;

/// How long, on the ledger clock, a call keeps re-deciding after its first
/// [`MAX_RACES`] lost compare-and-swaps before it reports contention as a
/// storage failure (`blocked(storage)`, or `unrecorded` for a report).
const CONTENTION_MS: u64 = 30_000;

/// At most this many races in all: a clock that stands still cannot make a
/// call's loop endless, and the races of one export stay well inside its fuel
/// (a race costs well under 10^6 instructions of the 2^33 a call may burn).
const RACES_CAP: u32 = 2_000;

/// The races of one call's transition: `while races.again(h) { … }`.
///
/// A lost compare-and-swap means another writer committed: the ledger is
/// busy, not broken. A hot quota bucket or key under many concurrent calls
/// loses dozens of races in a row, and a caller within its budget must not be
/// refused for that, so a call races on for [`CONTENTION_MS`] after its first
/// [`MAX_RACES`] (at most [`RACES_CAP`] in all). Each race is a read and a
/// commit; the stores pace them (SQLite's loser to its own group, and
/// PostgreSQL's loser of a quota-bucket update, backs off before it
/// answers). The clock is read only once the first races are lost,
/// so an uncontended call makes no extra host call.
struct Races {
    run: u32,
    until: Option<u64>,
}

impl Races {
    fn new() -> Races {
        Races { run: 0, until: None }
    }

    /// Whether to decide (once more).
    fn again(&mut self, h: &impl Host) -> bool {
        self.run += 1;
        if self.run <= MAX_RACES {
            return true;
        }
        let now = h.now();
        let until = *self.until.get_or_insert(now.saturating_add(CONTENTION_MS));
        self.run <= RACES_CAP && now < until
    }
}

/// Now, never earlier than the record's last write: time does not run
/// backwards in a comparison even if the host's clock does.
fn now_for(h: &impl Host, rec: Option<&OpRecord>) -> u64 {
    let now = h.now();
    rec.map_or(now, |r| now.max(r.updated_at))
}

/// The `canonicalize` export.
pub fn canonicalize(h: &impl Host, json: &[u8]) -> Result<String, JsonError> {
    canon::canonicalize(json, &limits(&h.settings())).map_err(crate::input::to_wit_json_error)
}

/// The `fingerprint` export: over the args exactly as given.
pub fn fingerprint(h: &impl Host, tool: &str, args: &str) -> Result<String, JsonError> {
    // One pass, no tree: the export only needs the hash (BENCHMARKS.md row 1).
    crate::payload::fingerprint_of_text(tool, args.as_bytes(), &limits(&h.settings()))
        .map_err(crate::input::to_wit_json_error)
}

fn storage_error(e: crate::store::LedgerError) -> Error {
    Error::Storage(e.message())
}
