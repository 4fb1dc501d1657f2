//! The record state machine's single transitions (world `once`'s
//! `transitions`, `sweep`, operators' commands): each reads the ledger,
//! decides, and commits one transition per write, re-deciding when a
//! concurrent writer wins. [`crate::protocol`] drives them for hosts.

mod begin;
mod escalation;
mod finish;
mod maintenance;
mod operator;
mod queue;
mod reconcile;

pub use begin::{BeginRequest, Begun, begin, begin_keyed, confirmed_info, grant_of, unknown_info};
pub use finish::{finish, finish_with_record};
pub use maintenance::{SweepReport, prune, sweep};
pub use operator::{adopt, inspect, resolve};
pub use queue::queue;
pub use reconcile::{ReadWhen, await_holder, await_with_record, reconcile, reconcile_when, rejected_info};

use alloc::string::String;

use crate::canon;
use crate::host::Host;
use crate::input::limits;
use crate::record::OpRecord;
use crate::types::{Error, JsonError};

/// How many times an export re-reads and re-decides after losing a
/// compare-and-swap before it reports contention.
const MAX_RACES: u32 = 16;

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
