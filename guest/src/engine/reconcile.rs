//! `reconcile`: settle an unknown record with the provider's authoritative read.

use alloc::format;

use super::begin::{
    awaiting_approval, blocked, denied, end_approval_wait, grant, other_owner, replay_of, superseded, unknown,
};
use super::escalation;
use super::{Races, account, now_for, storage_error};
use crate::host::Host;
use crate::input::{check_name, provider_receipt};
use crate::mutant::{self, Mutant};
use crate::record::OpRecord;
use crate::store::{LedgerError, Loaded, Tx, load};
use crate::types::{
    Awaited, BlockReason, Decision, Error, Evidence, InFlightInfo, KeySource, RejectedInfo, ReplayVia, State,
};

/// Longest wait between two provider reads of one unknown record.
const MAX_RECONCILE_BACKOFF_MS: u64 = 5 * 60 * 1_000;

/// When an unknown record's provider is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadWhen {
    /// Now: an explicit `reconcile` (or `await-holder`) asks for a read.
    Now,
    /// Only once its next read is due: the call protocol, whose caller may
    /// ask again as often as it likes without pushing the backoff out.
    Due,
}

/// The `reconcile` export.
pub fn reconcile(h: &impl Host, scope: &str, key: &str) -> Result<Decision, Error> {
    reconcile_when(h, scope, key, ReadWhen::Now)
}

/// [`reconcile`], reading the provider as `when` says.
pub fn reconcile_when(h: &impl Host, scope: &str, key: &str, when: ReadWhen) -> Result<Decision, Error> {
    let settings = h.settings();
    check_name("scope", scope, &settings)?;
    check_name("key", key, &settings)?;
    let mut races = Races::new();
    while races.again(h) {
        let loaded = load(h, scope, key).map_err(storage_error)?.ok_or(Error::NotFound)?;
        match step(h, loaded, when) {
            Ok(decision) => return Ok(decision),
            Err(LedgerError::Conflict) => continue,
            Err(e) => return Err(storage_error(e)),
        }
    }
    Err(storage_error(LedgerError::Conflict))
}

/// The `await-holder` export. A waiter takes the holder's outcome: its
/// rejection as is, anything else as `reconcile` decides it (a confirmed
/// record replays). It never starts an attempt while the holder's lease is live.
pub fn await_holder(h: &impl Host, scope: &str, key: &str) -> Result<Awaited, Error> {
    await_with_record(h, scope, key, ReadWhen::Now).map(|(awaited, _)| awaited)
}

/// [`await_holder`], also returning the record as it was read first (its key
/// source and budget do not change in the step).
pub fn await_with_record(h: &impl Host, scope: &str, key: &str, when: ReadWhen) -> Result<(Awaited, OpRecord), Error> {
    let loaded = load_awaited(h, scope, key)?;
    await_loaded(h, scope, key, loaded, when)
}

/// The record a waiter asks about, its names checked first: not found is an error.
pub fn load_awaited(h: &impl Host, scope: &str, key: &str) -> Result<Loaded, Error> {
    let settings = h.settings();
    check_name("scope", scope, &settings)?;
    check_name("key", key, &settings)?;
    load(h, scope, key).map_err(storage_error)?.ok_or(Error::NotFound)
}

/// [`await_with_record`] on the record the caller has just loaded (no second read of it).
pub fn await_loaded(
    h: &impl Host,
    scope: &str,
    key: &str,
    loaded: Loaded,
    when: ReadWhen,
) -> Result<(Awaited, OpRecord), Error> {
    let rec = &loaded.rec;
    let awaited = match rec.state {
        // Not even another account's rejection is this host's to hand out.
        _ if !account::answers(h, rec) => Awaited::Decided(account::refusal(h, rec)),
        // "Not sent" is not a rejection: what happens next is reconcile's to say.
        State::Failed if !rec.last_not_sent() => Awaited::Rejected(rejected_info(rec)),
        State::InFlight if !rec.lease_ended(now_for(h, Some(rec))) => Awaited::Pending(in_flight(rec)),
        _ => Awaited::Decided(reconcile_when(h, scope, key, when)?),
    };
    Ok((awaited, loaded.rec))
}

/// A failed record's rejection, as its caller is told.
pub fn rejected_info(rec: &OpRecord) -> RejectedInfo {
    RejectedInfo {
        error: rec.error.clone().unwrap_or_default(),
        attempt: rec.current().map_or(0, |a| a.n),
    }
}

fn in_flight(rec: &OpRecord) -> InFlightInfo {
    InFlightInfo {
        lease_until: rec.current().map_or(rec.updated_at, |a| a.lease_until),
    }
}

fn step(h: &impl Host, loaded: Loaded, when: ReadWhen) -> Result<Decision, LedgerError> {
    let now = now_for(h, Some(&loaded.rec));
    let rec = &loaded.rec;
    // Another provider account's record is neither answered, read nor sent here, whatever its state.
    if !account::answers(h, rec) {
        return Ok(account::refusal(h, rec));
    }
    // Another owner's record is read through its owner's provider and sent by it: never here.
    let ours = rec.owner == h.settings().owner;
    match rec.state {
        State::Confirmed => {
            let via = if rec.key_source == KeySource::Derived {
                ReplayVia::DerivedArgs
            } else {
                ReplayVia::Key
            };
            Ok(replay_of(rec, via))
        }
        State::InFlight if !rec.lease_ended(now) => Ok(Decision::InFlight(in_flight(rec))),
        State::InFlight if !ours => Ok(unknown(&expire(h, loaded, now)?.rec)),
        State::InFlight => {
            let loaded = expire(h, loaded, now)?;
            settle(h, loaded, when)
        }
        State::Unknown if !ours => Ok(unknown(rec)),
        State::Unknown => settle(h, loaded, when),
        State::Absent | State::Failed if !ours => Ok(other_owner(rec, &h.settings().owner)),
        State::Absent => grant(h, loaded.rec, loaded.version, now),
        // Nothing was sent: the caller's next attempt, within the budget.
        State::Failed if rec.last_not_sent() => grant(h, loaded.rec, loaded.version, now),
        State::Failed => Ok(blocked(
            BlockReason::Failed,
            format!(
                "{} failed (the provider rejected it); begin again to retry within the attempt budget",
                rec.key
            ),
        )),
        State::Superseded => Ok(superseded(rec)),
        State::AwaitingApproval if rec.approval_wait_until().is_some_and(|until| now >= until) => {
            end_approval_wait(h, loaded.rec, loaded.version, now)
        }
        State::AwaitingApproval => Ok(awaiting_approval(rec)),
        State::Denied => Ok(denied(rec)),
    }
}

/// Read the provider for an unknown record and act on the answer: a replay,
/// the owed dispatch, or still unknown. A tool without a lookup is never read:
/// it waits for its escalation and an operator; with [`ReadWhen::Due`] a read
/// that is not due yet is not made either.
fn settle(h: &impl Host, loaded: Loaded, when: ReadWhen) -> Result<Decision, LedgerError> {
    let now = now_for(h, Some(&loaded.rec));
    if mutant::on(Mutant::DispatchUnknownWithoutRead) {
        return grant(h, loaded.rec, loaded.version, now);
    }
    let not_due = when == ReadWhen::Due && loaded.rec.next_check.is_some_and(|t| t > now);
    if !provider_readable(h, &loaded.rec) || not_due {
        let (loaded, _) = escalation::escalate_if_due(h, loaded, now)?;
        return Ok(unknown(&loaded.rec));
    }
    let (loaded, read) = read_provider(h, loaded)?;
    match read {
        Read::Confirmed => Ok(replay_of(&loaded.rec, ReplayVia::Provider)),
        Read::Absent => {
            let now = now_for(h, Some(&loaded.rec));
            grant(h, loaded.rec, loaded.version, now)
        }
        Read::Unknown => {
            let now = now_for(h, Some(&loaded.rec));
            let (loaded, _) = escalation::escalate_if_due(h, loaded, now)?;
            Ok(unknown(&loaded.rec))
        }
    }
}

/// in_flight whose lease ended -> unknown.
pub(super) fn expire(h: &impl Host, loaded: Loaded, now: u64) -> Result<Loaded, LedgerError> {
    let Loaded { mut rec, version } = loaded;
    let event = rec.expire_lease(now);
    let mut tx = Tx::new();
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok(Loaded {
        rec,
        version: version + 1,
    })
}

/// What one provider read established.
pub(super) enum Read {
    /// The effect exists; the record is confirmed with the provider's receipt.
    Confirmed,
    /// No effect and none can arrive late; the record is absent (dispatch owed).
    Absent,
    /// Not settled; the record stays unknown.
    Unknown,
}

/// Whether the provider can be read for `rec`: its policy says so, or it was
/// begun while no lookup was configured and this host has one now.
pub(super) fn provider_readable(h: &impl Host, rec: &OpRecord) -> bool {
    rec.policy.lookup || h.lookup_configured(&rec.tool)
}

/// Whether this host's resume would read the provider for the unknown record
/// (scope, key) once its read is due: it is unknown, this host's owner
/// dispatches it, and the provider can be read for it.
pub fn reads_when_due(h: &impl Host, scope: &str, key: &str) -> bool {
    load(h, scope, key).ok().flatten().is_some_and(|l| {
        l.rec.state == State::Unknown
            && l.rec.owner == h.settings().owner
            && provider_readable(h, &l.rec)
            && account::reads_own_account(h, &l.rec)
    })
}

/// Ask the provider about an unknown record and record what it proved.
pub(super) fn read_provider(h: &impl Host, loaded: Loaded) -> Result<(Loaded, Read), LedgerError> {
    let Loaded { mut rec, version } = loaded;
    // Read once, a record stays readable: its next reads are scheduled and its
    // answers name them, whichever host (with or without a lookup) loads it next.
    rec.policy.lookup = true;
    let (_, evidence) = crate::reads::read(h, &rec.scope, &rec.key, &rec.tool, &rec.provider_key, &rec.args)?;
    let now = now_for(h, Some(&rec));
    let backoff = now.saturating_add(backoff(&rec));
    let (event, read) = match evidence {
        // The provider says the effect exists: that settles it, whatever its receipt's form
        // (one that is not strict I-JSON is stored as it came, flagged).
        Evidence::Confirmed(receipt) => {
            let receipt = provider_receipt(receipt, &h.settings());
            (rec.confirm(receipt, None, now, "reconciled-confirmed"), Read::Confirmed)
        }
        // Through another account than the operation's (a rotated credential), the provider may
        // not show its effect: not finding it there proves nothing.
        Evidence::Absent(read_position) if !account::reads_own_account(h, &rec) => {
            let why = account::absence_unproven(h, &rec, read_position);
            (rec.still_unknown(&why, None, backoff), Read::Unknown)
        }
        // A read cannot reflect commits later than the moment it returned: a
        // read position in the future must not skip max_in_flight.
        Evidence::Absent(read_position) => absent(
            &mut rec,
            read_position.min(now),
            h.settings().clock_skew_ms,
            now,
            backoff,
        ),
        Evidence::Unknown(why) => (
            rec.still_unknown(&format!("lookup could not tell: {why}"), None, backoff),
            Read::Unknown,
        ),
    };
    let mut tx = Tx::new();
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok((
        Loaded {
            rec,
            version: version + 1,
        },
        read,
    ))
}

/// ABSENT counts only after the last dispatch, and becomes `absent` only when
/// no late arrival can make a second effect.
///
/// The read position may come from a host's clock, so the declared skew is
/// added to every comparison with the ledger's times.
fn absent(rec: &mut OpRecord, read_position: u64, skew: u64, now: u64, backoff: u64) -> (crate::record::Event, Read) {
    let last_dispatch = rec.last_dispatch().unwrap_or(0);
    let settled_at = last_dispatch.saturating_add(rec.policy.max_in_flight_ms);
    if read_position <= last_dispatch.saturating_add(skew) {
        let why = format!("absent as of {read_position}, not after the last dispatch {last_dispatch}");
        (rec.still_unknown(&why, Some(read_position), backoff), Read::Unknown)
    } else if (rec.policy.provider_claims_key && rec.key_reaches_provider())
        || read_position > settled_at.saturating_add(skew)
        || mutant::on(Mutant::SkipMaxInFlight)
    {
        (rec.prove_absent(read_position, now, "reconciled-absent"), Read::Absent)
    } else {
        let why = format!("absent as of {read_position}, but an earlier request may still commit until {settled_at}");
        let next = settled_at
            .saturating_add(skew)
            .saturating_add(1)
            .max(now.saturating_add(1));
        (rec.still_unknown(&why, Some(read_position), next), Read::Unknown)
    }
}

fn backoff(rec: &OpRecord) -> u64 {
    let interval = rec.policy.reconcile_interval_ms;
    let doubled = interval.saturating_mul(1u64 << rec.checks.min(16));
    doubled.min(MAX_RECONCILE_BACKOFF_MS.max(interval))
}
