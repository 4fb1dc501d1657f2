//! `sweep` and `prune`: the background work over due records.

use alloc::vec::Vec;

use super::escalation;
use super::reconcile::{Read, expire, provider_readable, read_provider};
use super::{MAX_RACES, now_for, witness};
use crate::host::Host;
use crate::identity::escalation_id;
use crate::mutant::{self, Mutant};
use crate::store::{LedgerError, Loaded, Tx, decode, load};
use crate::types::{Error, Escalation, KeySource, PruneReport, Row, State, Table};

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// In-flight records whose lease ended: now unknown.
    pub expired: u32,
    /// Unknown records read from the provider.
    pub reconciled: u32,
    /// Of those, confirmed.
    pub confirmed: u32,
    /// Escalations delivered (including re-deliveries).
    pub escalated: u32,
    /// Rows this build could not read: skipped and escalated.
    pub unreadable: u32,
    /// Every owed dispatch of this owner with an attempt left (scope, key),
    /// proven now or earlier: `reconcile` grants each.
    pub owed: Vec<(alloc::string::String, alloc::string::String)>,
    /// With reads as steps ([`crate::reads`]): this owner's unknown records whose read is due,
    /// not read (scope, key).
    pub reads: Vec<(alloc::string::String, alloc::string::String)>,
}

/// The `sweep` of the background work: expire leases, read the provider for
/// due unknowns, escalate past deadlines, re-deliver unacknowledged
/// escalations, and list every owed dispatch of this owner that has an
/// attempt left.
pub fn sweep(h: &impl Host, limit: u32) -> Result<SweepReport, Error> {
    let now = h.now();
    // A host's background work touches only the records it owns.
    let owner = Some(h.settings().owner).filter(|_| !mutant::on(Mutant::SweepTakesOtherOwners));
    let rows = h
        .scan(
            Table::Operation,
            &[State::InFlight, State::Unknown, State::Absent, State::AwaitingApproval],
            now,
            owner.clone(),
            limit,
        )
        .map_err(Error::Storage)?;
    let mut report = SweepReport::default();
    for row in rows {
        if let Some(loaded) = readable(h, &row, &mut report) {
            sweep_row(h, &row, loaded, &mut report)?;
        }
    }
    // An unknown record begun while no lookup was configured has no next read:
    // the scan above lists it only at its deadline (or never, once escalated:
    // it is due at `OWED`). Read each one whose tool has a lookup now; the read
    // schedules the next, so a record is found here once.
    let not_due = h
        .scan(
            Table::Operation,
            &[State::Unknown],
            crate::record::OWED,
            owner.clone(),
            limit,
        )
        .map_err(Error::Storage)?;
    for row in not_due.into_iter().filter(|r| r.due_at.is_some_and(|d| d > now)) {
        // A row this build cannot read is reported by the scan above, when it is due.
        if let Ok(loaded) = decode(&row)
            && loaded.rec.next_check.is_none()
            && provider_readable(h, &loaded.rec)
            && super::account::reads_own_account(h, &loaded.rec)
        {
            sweep_row(h, &row, loaded, &mut report)?;
        }
    }
    // Deadlines escalate whoever owns the record: an owner that was renamed or
    // is gone never reads or dispatches its records again, but an operator
    // must hear of them. Only the escalation is done here, never a read or a send.
    let rows = h
        .scan(
            Table::Operation,
            &[State::Unknown, State::Absent, State::AwaitingApproval],
            now,
            None,
            limit,
        )
        .map_err(Error::Storage)?;
    for row in rows.iter().filter(|r| r.owner != owner) {
        let Some(loaded) = readable(h, row, &mut report) else {
            continue;
        };
        let now = now_for(h, Some(&loaded.rec));
        if (escalation::deadline_passed(&loaded.rec, now) || loaded.rec.escalation_pending())
            && let Ok((_, true)) = escalation::escalate_if_due(h, loaded, now)
        {
            report.escalated += 1;
        }
    }
    // A possible-duplicate escalation lives on a confirmed (or superseded)
    // record: it is delivered at least once too, so re-deliver it while the
    // sink has not acknowledged it.
    let rows = h
        .scan(
            Table::Operation,
            &[State::Confirmed, State::Superseded],
            now,
            owner.clone(),
            limit,
        )
        .map_err(Error::Storage)?;
    for row in rows {
        let Some(loaded) = readable(h, &row, &mut report) else {
            continue;
        };
        if escalation::deliver(h, loaded).1 {
            report.escalated += 1;
        }
    }
    // Every dispatch still owed, whenever it was proven.
    let owed = h
        .scan(Table::Operation, &[State::Absent], crate::record::OWED, owner, limit)
        .map_err(Error::Storage)?;
    for row in owed {
        let Some(loaded) = readable(h, &row, &mut report) else {
            continue;
        };
        // One with no attempt left waits for its escalation and an operator, not a host.
        if loaded.rec.budget_left() {
            report.owed.push((row.scope, row.key));
        }
    }
    Ok(report)
}

/// A row's record, or none when this build cannot read it (a newer build's
/// body during a rolling upgrade, a damaged row): one such row never stops
/// the background work. It is skipped, counted, and escalated to the
/// operator (delivered at least once per sweep that meets it; the sink
/// dedupes on its id).
fn readable(h: &impl Host, row: &Row, report: &mut SweepReport) -> Option<Loaded> {
    match decode(row) {
        Ok(loaded) => Some(loaded),
        Err(e) => {
            report.unreadable += 1;
            let escalation = Escalation {
                id: escalation_id(&row.scope, &row.key, row.version, "unreadable"),
                scope: row.scope.clone(),
                key: row.key.clone(),
                tool: alloc::string::String::new(),
                state: row.state.unwrap_or(State::Unknown),
                reason: alloc::format!("unreadable: {}", e.message()),
                deadline: h.now(),
            };
            if h.escalate(&escalation) {
                report.escalated += 1;
            }
            None
        }
    }
}

/// Sweep one listed row (this host's owner's), loading it again after each race it lost.
fn sweep_row(h: &impl Host, row: &Row, mut loaded: Loaded, report: &mut SweepReport) -> Result<(), Error> {
    for _ in 0..MAX_RACES {
        match sweep_one(h, loaded.clone(), report) {
            Ok(()) => break,
            Err(LedgerError::Conflict) => match load(h, &row.scope, &row.key) {
                // The race may have been an operator's adoption: another owner's record is not this
                // host's to expire or read (its lookup may not see that owner's account).
                Ok(Some(fresh))
                    if fresh.rec.owner == h.settings().owner || mutant::on(Mutant::SweepTakesOtherOwners) =>
                {
                    loaded = fresh
                }
                Ok(_) => break,
                Err(e) => return Err(Error::Storage(e.message())),
            },
            Err(e) => return Err(Error::Storage(e.message())),
        }
    }
    Ok(())
}

fn sweep_one(h: &impl Host, mut loaded: Loaded, report: &mut SweepReport) -> Result<(), LedgerError> {
    let now = now_for(h, Some(&loaded.rec));
    if loaded.rec.state == State::InFlight {
        if !loaded.rec.lease_ended(now) {
            return Ok(());
        }
        loaded = expire(h, loaded, now)?;
        report.expired += 1;
    }
    // A record begun without a lookup has no next read: it is read as soon as a lookup is configured.
    // Through another provider account a read proves nothing absent: such a record waits for its
    // own account's hosts, or for its escalation and an operator. Its next read is unscheduled once
    // (audited), so it is not due again before its deadline and never crowds this owner's scans.
    if loaded.rec.state == State::Unknown
        && provider_readable(h, &loaded.rec)
        && !super::account::reads_own_account(h, &loaded.rec)
        && loaded.rec.next_check.is_some_and(|t| t <= now)
    {
        let Loaded { mut rec, version } = loaded;
        let event = rec.await_own_account(&super::account::left_unread(h, &rec));
        let mut tx = Tx::new();
        tx.record(&mut rec, version, event, now);
        tx.commit(h)?;
        loaded = Loaded {
            rec,
            version: version + 1,
        };
    }
    if loaded.rec.state == State::Unknown
        && provider_readable(h, &loaded.rec)
        && super::account::reads_own_account(h, &loaded.rec)
        && loaded.rec.next_check.is_none_or(|t| t <= now)
    {
        match read_provider(h, loaded.clone()) {
            Ok((after, read)) => {
                loaded = after;
                report.reconciled += 1;
                if let Read::Confirmed = read {
                    report.confirmed += 1;
                }
            }
            // With reads as steps a sweep reads nothing: it lists the due read, and the host's
            // `resume` of it is a `read` step.
            Err(LedgerError::ReadDeferred) => report.reads.push((loaded.rec.scope.clone(), loaded.rec.key.clone())),
            Err(e) => return Err(e),
        }
    }
    // Nobody approved it in time: denied, its spend released (this owner's background work ends the wait).
    if loaded.rec.approval_wait_until().is_some_and(|until| now >= until) {
        super::begin::end_approval_wait(h, loaded.rec, loaded.version, now)?;
        return Ok(());
    }
    let (_, delivered) = escalation::escalate_if_due(h, loaded, now)?;
    if delivered {
        report.escalated += 1;
    }
    Ok(())
}

/// The `prune` export: records past retention become tombstones; tombstones
/// and quota windows past their own time are removed. In-flight, unknown and
/// absent records are never touched.
pub fn prune(h: &impl Host, limit: u32) -> Result<PruneReport, Error> {
    let now = h.now();
    let mut report = PruneReport {
        pruned: 0,
        tombstones_removed: 0,
    };
    let rows = h
        .scan(
            Table::Operation,
            &[State::Confirmed, State::Failed, State::Superseded, State::Denied],
            now,
            None,
            limit,
        )
        .map_err(Error::Storage)?;
    for row in rows {
        // A row this build cannot read is the sweep's to report; prune leaves it as it is.
        let Ok(loaded) = decode(&row) else { continue };
        let rec = &loaded.rec;
        let terminal = matches!(
            rec.state,
            State::Confirmed | State::Failed | State::Superseded | State::Denied
        );
        if !terminal || rec.transitioned_at.saturating_add(rec.policy.retention_ms) > now {
            continue;
        }
        // An escalation the sink has not acknowledged outlives retention: the sweep re-delivers it.
        if rec.escalation_pending() && !mutant::on(Mutant::DropEscalationOnTransition) {
            continue;
        }
        // A derived key's record leaves no tombstone: the ledger forgets the operation now, and
        // the witness first (else a new operation on the key would be taken for lost history).
        if rec.key_source == KeySource::Derived {
            witness::forget(h, &rec.scope, &rec.key, rec.updated_at.saturating_add(1))
                .map_err(|e| Error::Storage(e.message()))?;
        }
        let mut tx = Tx::new();
        tx.prune(&loaded, now, h.settings().clock_skew_ms);
        match tx.commit(h) {
            Ok(()) => report.pruned += 1,
            // Changed meanwhile: the next prune looks again.
            Err(LedgerError::Conflict) => {}
            Err(e) => return Err(Error::Storage(e.message())),
        }
    }
    for table in [Table::Tombstone, Table::Quota] {
        let rows = h.scan(table, &[], now, None, limit).map_err(Error::Storage)?;
        for row in rows {
            if table == Table::Tombstone {
                // The key is forgotten with its tombstone: the witness first. No operation on the
                // key can have begun while the tombstone stood, so all it kept is the pruned one's.
                witness::forget(h, &row.scope, &row.key, now).map_err(|e| Error::Storage(e.message()))?;
            }
            if remove(h, &row)? && table == Table::Tombstone {
                report.tombstones_removed += 1;
            }
        }
    }
    Ok(report)
}

fn remove(h: &impl Host, row: &Row) -> Result<bool, Error> {
    let mut tx = Tx::new();
    tx.delete(row);
    match tx.commit(h) {
        Ok(()) => Ok(true),
        Err(LedgerError::Conflict) => Ok(false),
        Err(e) => Err(Error::Storage(e.message())),
    }
}
