//! The `queue` export: what reconciliation has not settled, as an operator
//! sees it. Read-only: it judges records at the ledger clock and writes
//! nothing (expiring a lease is the sweep's job).

use alloc::vec::Vec;

use super::now_for;
use crate::host::Host;
use crate::input::check_name;
use crate::record::{OWED, OpRecord};
use crate::store::decode;
use crate::types::{Attention, Error, OperatorQueue, QueueEntry, QueueFilter, State, Table};

/// The `queue` export: unknown, absent, lease-expired and awaiting-approval
/// records matching `filter`, unknown first, oldest first within each attention.
pub fn queue(h: &impl Host, filter: &QueueFilter, limit: u32) -> Result<OperatorQueue, Error> {
    let settings = h.settings();
    for scope in filter.scopes.iter().flatten() {
        check_name("scope", scope, &settings)?;
    }
    if let Some(tool) = &filter.tool {
        check_name("tool", tool, &settings)?;
    }
    let now = h.now();
    // The store filters by state only: with a filter, every unsettled row is read and the
    // filter applied before the limit (a limit applied first hid a scope's records behind
    // another's). Without one, one row more than asked tells whether there were more.
    let filtered = filter.scopes.is_some() || filter.tool.is_some() || filter.key_prefix.is_some();
    let scan_limit = if filtered { u32::MAX } else { limit.saturating_add(1) };
    let rows = h
        .scan(
            Table::Operation,
            &[State::Unknown, State::Absent, State::InFlight, State::AwaitingApproval],
            OWED,
            None,
            scan_limit,
        )
        .map_err(Error::Storage)?;
    let mut entries = Vec::new();
    let mut truncated = !filtered && rows.len() > limit as usize;
    let read = if filtered { rows.len() } else { limit as usize };
    for row in rows.iter().take(read) {
        // A row this build cannot read is the sweep's to report (and escalate); the queue goes on.
        let Ok(rec) = decode(row).map(|l| l.rec) else { continue };
        if !matches(filter, &rec) {
            continue;
        }
        if let Some(entry) = entry(h, rec, row.version) {
            if entries.len() == limit as usize {
                truncated = true;
                break;
            }
            entries.push(entry);
        }
    }
    entries.sort_by(|a, b| {
        (rank(a.attention), a.since, &a.scope, &a.key).cmp(&(rank(b.attention), b.since, &b.scope, &b.key))
    });
    Ok(OperatorQueue {
        now,
        entries,
        truncated,
    })
}

fn matches(filter: &QueueFilter, rec: &OpRecord) -> bool {
    filter.scopes.as_ref().is_none_or(|s| s.contains(&rec.scope))
        && filter.tool.as_ref().is_none_or(|t| *t == rec.tool)
        && filter
            .key_prefix
            .as_ref()
            .is_none_or(|p| rec.key.starts_with(p.as_str()))
}

/// The queue entry of one pending record, or none if it needs nobody yet
/// (in flight within its lease).
fn entry(h: &impl Host, rec: OpRecord, version: u64) -> Option<QueueEntry> {
    let now = now_for(h, Some(&rec));
    let (attention, since) = match rec.state {
        State::Unknown => (Attention::Unknown, rec.since.unwrap_or(rec.transitioned_at)),
        State::Absent => (Attention::Absent, rec.since.unwrap_or(rec.transitioned_at)),
        State::AwaitingApproval => (Attention::Approval, rec.since.unwrap_or(rec.transitioned_at)),
        State::InFlight if rec.lease_ended(now) => (
            Attention::LeaseExpired,
            rec.current().map_or(rec.updated_at, |a| a.lease_until),
        ),
        _ => return None,
    };
    let deadline = match attention {
        Attention::LeaseExpired => None,
        // What a person must beat: the end of the wait, when it is denied unless approved.
        Attention::Approval => rec.approval_wait_until(),
        Attention::Unknown | Attention::Absent => rec.deadline,
    };
    Some(QueueEntry {
        attention,
        since,
        deadline,
        escalated: rec.escalated,
        escalation_acknowledged: rec.escalation_acked,
        possible_duplicate: rec.possible_duplicate,
        attempts: rec.attempts.len() as u32,
        reason: rec
            .unknown_reason
            .or(rec.approval_reason.filter(|_| attention == Attention::Approval)),
        version,
        scope: rec.scope,
        key: rec.key,
        tool: rec.tool,
        owner: rec.owner,
        state: rec.state,
    })
}

fn rank(a: Attention) -> u8 {
    match a {
        Attention::Unknown => 0,
        Attention::Absent => 1,
        Attention::LeaseExpired => 2,
        Attention::Approval => 3,
    }
}
