//! Older history (DESIGN.md "Authority"; docs/design.md "Older history"): a
//! ledger restored from an older backup must not re-send what the newer
//! history had.
//!
//! The host keeps a witness outside the ledger (the `witness` import). After
//! the ledger commits a grant, and before the grant leaves the engine, the
//! record as granted is kept there ([`keep`]), as is an original a successor
//! supersedes ([`keep_superseded`]); a grant the witness could not keep never
//! leaves ([`unkept`]). Before any attempt is granted (a new key's first, a
//! retry, an owed redispatch), and whenever a failed or absent record is read
//! ([`catch_up`]), the engine asks what is kept for the operation ([`lost`]).
//! A kept record the ledger does not hold, an attempt or a supersede its
//! record lacks, or a later operation on the key, is history the ledger lost:
//! it is written back ([`restore`]), audited `restored-from-witness`, and
//! decided again like any record whose reply was lost. Its attempt's lease
//! runs out, and nothing more is sent before a read of the provider (or an
//! operator) settles it. Prune has the witness forget a key just before the
//! ledger does ([`forget`]).
//!
//! The witness is only as far from the ledger as its host keeps it: one
//! restored with the ledger, or none (a host with nowhere to keep it), tells
//! nothing, and nothing here can notice.

use alloc::format;
use alloc::string::String;

use super::begin::{blocked, state_name};
use crate::host::Host;
use crate::mutant::{self, Mutant};
use crate::record::{Event, OpRecord, detail, num, string};
use crate::store::{LedgerError, Loaded, Tx};
use crate::types::{BlockReason, Decision, Outcome, State};

/// The record the witness kept of (scope, key), when the ledger's record of it
/// (`ledger`, none when it holds none) lacks part of its history: an attempt
/// granted after the ledger's last, its supersede, or the record of a later
/// operation on the key. A store failure, or a kept record that is not one, is an error: nothing
/// is granted on a witness that could not be read.
pub(super) fn lost(
    h: &impl Host,
    scope: &str,
    key: &str,
    ledger: Option<&OpRecord>,
) -> Result<Option<OpRecord>, LedgerError> {
    if mutant::on(if ledger.is_some() {
        Mutant::WitnessUnreadOnRetry
    } else {
        Mutant::WitnessUnread
    }) {
        return Ok(None);
    }
    let body = match h.witnessed(scope, key) {
        Ok(None) => return Ok(None),
        Ok(Some(body)) => body,
        Err(why) => {
            return Err(LedgerError::Storage(format!(
                "the witness of {scope:?}/{key:?} could not be read: {why}"
            )));
        }
    };
    let unreadable = |why: &str| LedgerError::Storage(format!("the witness's record of {scope:?}/{key:?} {why}"));
    let kept: OpRecord = serde_json::from_str(&body).map_err(|e| unreadable(&format!("is unreadable: {e}")))?;
    if kept.scope != scope || kept.key != key {
        return Err(unreadable(&format!("is of {:?}/{:?}", kept.scope, kept.key)));
    }
    // Only a granted attempt (or a superseded original) is kept: a record without one is no
    // history to lose.
    if kept.attempts.is_empty() && kept.state != State::Superseded {
        return Ok(None);
    }
    // No clock here: what the witness holds is history until the ledger forgets the key itself
    // (prune forgets it first: `forget`), however long the operation stayed unsettled.
    let lost = match ledger {
        None => true,
        Some(rec) if kept.created_at != rec.created_at => kept.created_at > rec.created_at,
        Some(rec) => {
            kept.attempts.len() > rec.attempts.len()
                || (kept.state == State::Superseded && rec.state != State::Superseded)
        }
    };
    Ok(lost.then_some(kept))
}

/// Forget what the witness kept of (scope, key), before the ledger forgets the key itself
/// (prune removes its tombstone, or a derived key's record, which leaves none): from then on
/// the key names a new operation in any ledger. Only what was kept before `before` (the last
/// moment the forgotten operation was kept) goes: a later operation on the key stays.
pub(super) fn forget(h: &impl Host, scope: &str, key: &str, before: u64) -> Result<(), LedgerError> {
    h.forget_witnessed(scope, key, before).map_err(|why| {
        LedgerError::Storage(format!(
            "the witness could not forget {scope:?}/{key:?}, so the ledger keeps it: {why}"
        ))
    })
}

/// Write the record the witness kept back into the ledger, in place of
/// `previous` (none: the ledger holds no record of the key, and the kept one is
/// inserted at `insert_version`). Its spend is not counted again: the ledger's
/// quota buckets never held its reservation, so the record holds none.
pub(super) fn restore(
    h: &impl Host,
    mut kept: OpRecord,
    previous: Option<&Loaded>,
    insert_version: u64,
    now: u64,
) -> Result<(), LedgerError> {
    let attempt = kept.attempts.last().map(|a| (a.n, a.granted_at));
    let held = match previous {
        Some(p) => format!(
            "{} record with {} attempt(s)",
            state_name(p.rec.state),
            p.rec.attempts.len()
        ),
        None => String::from("no record"),
    };
    let mut fields = alloc::vec![("ledger_held", string(&held))];
    if let Some((n, granted_at)) = attempt {
        fields.push(("attempt", num(u64::from(n))));
        fields.push(("granted_at", num(granted_at)));
    }
    let event = Event {
        kind: "restored-from-witness",
        from: previous.map(|p| p.rec.state),
        attempt: attempt.map(|(n, _)| n),
        detail: detail(&fields),
    };
    // The spend this ledger's buckets hold is the previous record's reservation: a restored
    // attempt takes it over (the lost history's own reservation was never held here); a
    // superseded original holds none, and gives it back.
    let held = previous.and_then(|p| p.rec.reservation.clone());
    let mut tx = Tx::new();
    kept.reservation = None;
    match held {
        Some(reservation) if kept.state == State::Superseded => tx.release(h, &kept.scope, &reservation)?,
        held => kept.reservation = held,
    }
    match previous {
        Some(p) => tx.record(&mut kept, p.version, event, now),
        None => tx.insert(&mut kept, insert_version, event, now),
    }
    tx.commit(h)
}

/// `loaded`, or, when the ledger lost part of its history, the record the witness kept,
/// written back ([`restore`]) and read again. Another writer's change meanwhile wins: it is
/// read as it is (and checked again by the next read).
pub(crate) fn catch_up(h: &impl Host, loaded: Loaded) -> Result<Option<Loaded>, LedgerError> {
    let Some(kept) = lost(h, &loaded.rec.scope, &loaded.rec.key, Some(&loaded.rec))? else {
        return Ok(Some(loaded));
    };
    let (scope, key) = (loaded.rec.scope.clone(), loaded.rec.key.clone());
    let now = h.now().max(loaded.rec.updated_at);
    match restore(h, kept, Some(&loaded), loaded.version + 1, now) {
        Ok(()) | Err(LedgerError::Conflict) => crate::store::load_as_stored(h, &scope, &key),
        Err(e) => Err(e),
    }
}

/// Keep the record `rec` is granted with, before the grant leaves the engine.
pub(super) fn keep(h: &impl Host, rec: &OpRecord) -> Result<(), String> {
    let Some(attempt) = rec.current() else {
        return Ok(());
    };
    if mutant::on(Mutant::WitnessNotKept) {
        return Ok(());
    }
    h.keep_witness(&rec.scope, &rec.key, &crate::body::record_json(rec), attempt.granted_at)
}

/// Keep an original as superseded (at `now`) before its successor leaves: a restored ledger
/// that lost the supersede must not send the original again beside the successor.
pub(super) fn keep_superseded(h: &impl Host, original: &OpRecord, now: u64) -> Result<(), String> {
    h.keep_witness(&original.scope, &original.key, &crate::body::record_json(original), now)
}

/// The answer to a grant the witness could not keep: it never leaves the
/// engine, so it ends "not sent" (best effort: left in flight, its lease runs
/// out and a read settles it, as for any lost reply).
pub(super) fn unkept(h: &impl Host, rec: &OpRecord, why: &str) -> Decision {
    let attempt = rec.current().map(|a| (a.n, a.fence.clone()));
    if let Some((_, fence)) = &attempt {
        let _ = super::finish::finish(h, &rec.scope, &rec.key, fence, Outcome::NotSent);
    }
    blocked(
        BlockReason::Storage,
        format!(
            "the witness could not keep attempt {} of {} ({why}), so it was not sent",
            attempt.map_or(0, |(n, _)| n),
            rec.key
        ),
    )
}
