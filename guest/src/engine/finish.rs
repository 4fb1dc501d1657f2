//! `finish`: record what the provider answered to one attempt.

use alloc::string::String;

use super::escalation;
use super::{Races, now_for};
use crate::host::Host;
use crate::input::provider_receipt;
use crate::mutant::{self, Mutant};
use crate::record::{OpRecord, Receipt};
use crate::store::{LedgerError, Loaded, Tx, load};
use crate::types::{Error, FinishAck, Outcome, State};

/// The `finish` export.
pub fn finish(h: &impl Host, scope: &str, key: &str, fence: &str, outcome: Outcome) -> Result<FinishAck, Error> {
    finish_with_record(h, scope, key, fence, outcome).map(|(ack, _)| ack)
}

/// [`finish`], also returning the record as the outcome left it (as last read
/// when the outcome could not be recorded; none when it could not be read).
pub fn finish_with_record(
    h: &impl Host,
    scope: &str,
    key: &str,
    fence: &str,
    outcome: Outcome,
) -> Result<(FinishAck, Option<OpRecord>), Error> {
    // A response that is not strict I-JSON still says the effect happened: it
    // is stored as it came (or abridged) and flagged, never refused.
    let outcome = match outcome {
        Outcome::Success(response) => Reported::Success(provider_receipt(response, &h.settings())),
        Outcome::Rejected(error) => Reported::Rejected(error),
        Outcome::Ambiguous(reason) => Reported::Ambiguous(reason),
        Outcome::NotSent => Reported::NotSent,
    };
    let mut races = Races::new();
    while races.again(h) {
        let loaded = match load(h, scope, key) {
            Ok(Some(loaded)) => loaded,
            Ok(None) => return Err(Error::NotFound),
            Err(_) => return Ok((FinishAck::Unrecorded, None)),
        };
        let read = loaded.rec.clone();
        if !loaded.rec.attempts.iter().any(|a| a.fence == fence) {
            // A success of the operation this record replaced (a derived key past its window) is
            // still evidence: never dropped.
            if let Reported::Success(receipt) = &outcome
                && loaded.rec.previous_fences.iter().any(|f| f == fence)
            {
                match previous_success(h, loaded, fence, receipt.clone()) {
                    Ok((ack, rec)) => return Ok((ack, Some(rec))),
                    Err(LedgerError::Conflict) => continue,
                    Err(LedgerError::Storage(_) | LedgerError::ReadDeferred) => {
                        return Ok((FinishAck::Unrecorded, Some(read)));
                    }
                }
            }
            return Err(Error::FenceMismatch);
        }
        match apply(h, loaded, fence, outcome.clone()) {
            Ok((ack, rec)) => return Ok((ack, Some(rec))),
            Err(LedgerError::Conflict) => continue,
            // (`finish` reads no provider: nothing is deferred.)
            Err(LedgerError::Storage(_) | LedgerError::ReadDeferred) => return Ok((FinishAck::Unrecorded, Some(read))),
        }
    }
    Ok((FinishAck::Unrecorded, None))
}

/// An [`Outcome`] with its receipt as the ledger keeps it.
#[derive(Clone)]
enum Reported {
    Success(Receipt),
    Rejected(String),
    Ambiguous(String),
    NotSent,
}

fn apply(h: &impl Host, loaded: Loaded, fence: &str, outcome: Reported) -> Result<(FinishAck, OpRecord), LedgerError> {
    let Loaded { mut rec, version } = loaded;
    let now = now_for(h, Some(&rec));
    let current = rec.state == State::InFlight
        && (rec.current().is_some_and(|a| a.fence == fence) || mutant::on(Mutant::SkipFenceCheck));
    let mut tx = Tx::new();
    let event = match (outcome, rec.state) {
        // Evidence beats fences: a success from any attempt means the effect happened.
        (Reported::Success(receipt), State::InFlight) if current => {
            // Lost, this write leaves the record in flight: its lease ends, it goes unknown and
            // reconciliation finds the effect. Every other success settles what nothing re-reads.
            tx.defer();
            rec.confirm(receipt, Some(fence), now, "finish-success")
        }
        (Reported::Success(receipt), State::InFlight) => {
            let id = escalation::duplicate_id(&rec, fence, now);
            rec.confirm_possible_duplicate(receipt, fence, id, now)
        }
        // A call held for (or denied by) a person whose earlier attempt took effect after all.
        (
            Reported::Success(receipt),
            State::Unknown | State::Absent | State::Failed | State::AwaitingApproval | State::Denied,
        ) => {
            tx.count_spend(h, &mut rec, now)?;
            rec.confirm(receipt, Some(fence), now, "late-success")
        }
        (Reported::Success(receipt), State::Superseded) if rec.receipt.is_none() => {
            tx.count_spend(h, &mut rec, now)?;
            let id = escalation::duplicate_id(&rec, fence, now);
            rec.flag_superseded_effect(receipt, fence, id, now)
        }
        // The attempt whose effect is recorded, or one already flagged, reporting again: nothing new.
        (Reported::Success(_), state)
            if rec.confirmed_by_fence(fence)
                || rec.reported_success(fence)
                || mutant::on(Mutant::ForgetSecondSuccess) =>
        {
            return Ok((FinishAck::Ignored(state), rec));
        }
        // Another attempt's effect is already recorded: this one may be a second.
        (Reported::Success(receipt), _) => {
            let id = escalation::duplicate_id(&rec, fence, now);
            rec.flag_second_success(receipt, fence, id, now)
        }
        // A stale fence cannot claim failure or ambiguity.
        (_, state) if !current => return Ok((FinishAck::Ignored(state), rec)),
        (Reported::Rejected(error), _) => release(h, &mut tx, &mut rec, fence, Some(error), now)?,
        (Reported::NotSent, _) => {
            let (event, released) = rec.not_sent(fence, now);
            if let Some(reservation) = released {
                tx.release(h, &rec.scope, &reservation)?;
            }
            event
        }
        (Reported::Ambiguous(reason), _) => rec.ambiguous(fence, reason, now),
    };
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    let state = rec.state;
    let (delivered, _) = escalation::deliver(
        h,
        Loaded {
            rec,
            version: version + 1,
        },
    );
    Ok((FinishAck::Recorded(state), delivered.rec))
}

/// A success reported by an attempt of the operation this record replaced:
/// audited with its receipt and escalated on the current record, whose own
/// state it cannot change (it is another operation's evidence).
fn previous_success(
    h: &impl Host,
    loaded: Loaded,
    fence: &str,
    receipt: Receipt,
) -> Result<(FinishAck, OpRecord), LedgerError> {
    let Loaded { mut rec, version } = loaded;
    if rec.reported_previous.iter().any(|f| f == fence) {
        return Ok((FinishAck::Ignored(rec.state), rec));
    }
    let now = now_for(h, Some(&rec));
    let id = escalation::duplicate_id(&rec, fence, now);
    let event = rec.flag_previous_success(receipt, fence, id);
    let mut tx = Tx::new();
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    let state = rec.state;
    let (delivered, _) = escalation::deliver(
        h,
        Loaded {
            rec,
            version: version + 1,
        },
    );
    Ok((FinishAck::Recorded(state), delivered.rec))
}

fn release(
    h: &impl Host,
    tx: &mut Tx,
    rec: &mut OpRecord,
    fence: &str,
    error: Option<String>,
    now: u64,
) -> Result<crate::record::Event, LedgerError> {
    let (event, released) = rec.fail(fence, error, now);
    if let Some(reservation) = released {
        tx.release(h, &rec.scope, &reservation)?;
    }
    Ok(event)
}
