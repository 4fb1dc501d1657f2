//! Escalation to the operator: marked in the ledger first, delivered at least
//! once, acknowledged in a later write.

use alloc::string::ToString;

use crate::host::Host;
use crate::identity::escalation_id;
use crate::record::{Event, OpRecord};
use crate::store::{LedgerError, Loaded, Tx};
use crate::types::{Escalation, State};

/// Whether the record's resolve deadline has passed without an escalation.
pub fn deadline_passed(rec: &OpRecord, now: u64) -> bool {
    matches!(rec.state, State::Unknown | State::Absent | State::AwaitingApproval)
        && !rec.escalated
        && rec.deadline.is_some_and(|d| now >= d)
}

/// Mark the deadline passed and escalated.
pub fn mark(rec: &mut OpRecord) -> Event {
    let deadline = rec.deadline.unwrap_or_default();
    let reason = reason_of(rec);
    let id = escalation_id(&rec.scope, &rec.key, deadline, reason);
    rec.escalate(id, reason)
}

/// Why a record is escalated: a person must approve it, or its deadline passed.
fn reason_of(rec: &OpRecord) -> &'static str {
    if rec.state == State::AwaitingApproval {
        "approval"
    } else {
        "deadline"
    }
}

/// The id of a possible-duplicate escalation: one per reporting attempt.
pub fn duplicate_id(rec: &OpRecord, fence: &str, now: u64) -> alloc::string::String {
    escalation_id(&rec.scope, &rec.key, now, &alloc::format!("possible-duplicate {fence}"))
}

/// When the resolve deadline has passed, mark the escalation (its own write)
/// and deliver it; otherwise re-deliver one the sink has not acknowledged.
/// Returns the record as now stored and whether an escalation was delivered.
pub fn escalate_if_due(h: &impl Host, loaded: Loaded, now: u64) -> Result<(Loaded, bool), LedgerError> {
    let loaded = if deadline_passed(&loaded.rec, now) {
        let Loaded { mut rec, version } = loaded;
        let event = mark(&mut rec);
        let mut tx = Tx::new();
        tx.record(&mut rec, version, event, now);
        tx.commit(h)?;
        Loaded {
            rec,
            version: version + 1,
        }
    } else {
        loaded
    };
    Ok(deliver(h, loaded))
}

/// Deliver a marked, unacknowledged escalation and record the acknowledgement.
/// Returns the record as now stored and whether it was delivered.
pub fn deliver(h: &impl Host, loaded: Loaded) -> (Loaded, bool) {
    let rec = &loaded.rec;
    if !rec.escalated || rec.escalation_acked {
        return (loaded, false);
    }
    let reason = if rec.possible_duplicate {
        "possible-duplicate"
    } else {
        reason_of(rec)
    };
    let escalation = Escalation {
        id: rec.escalation_id.clone().unwrap_or_default(),
        scope: rec.scope.clone(),
        key: rec.key.clone(),
        tool: rec.tool.clone(),
        state: rec.state,
        reason: reason.to_string(),
        deadline: rec.deadline.unwrap_or(rec.transitioned_at),
    };
    let acknowledged = h.escalate(&escalation);
    let mut after = rec.clone();
    let now = super::now_for(h, Some(rec));
    let event = if acknowledged {
        after.acknowledge_escalation()
    } else {
        after.escalation_refused()
    };
    let mut tx = Tx::new();
    tx.record(&mut after, loaded.version, event, now);
    // Losing this write only means an early re-delivery, which the sink dedupes.
    if tx.commit(h).is_ok() {
        return (
            Loaded {
                rec: after,
                version: loaded.version + 1,
            },
            true,
        );
    }
    (loaded, true)
}
