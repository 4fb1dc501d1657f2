//! Operator exports: `inspect` a record, `resolve` what nothing else can.

use alloc::format;
use alloc::string::{String, ToString};

use super::begin::state_name;
use super::{MAX_RACES, Races, now_for, storage_error};
use crate::host::Host;
use crate::input::{check_name, check_note, checked_receipt};
use crate::mutant::{self, Mutant};
use crate::record::{Event, OpRecord};
use crate::record::{Receipt, detail, string};
use crate::store::{LedgerError, Loaded, Tx, decode, load};
use crate::types::{AdoptReport, Error, RecordView, Resolution, Resolvable, State, Table};

/// The `inspect` export.
pub fn inspect(h: &impl Host, scope: &str, key: &str) -> Result<Option<RecordView>, Error> {
    let settings = h.settings();
    check_name("scope", scope, &settings)?;
    check_name("key", key, &settings)?;
    let Some(Loaded { rec, version }) = load(h, scope, key).map_err(storage_error)? else {
        return Ok(None);
    };
    let audit = h.audit(scope, key).map_err(Error::Storage)?;
    // The clock `resolve` would judge it by.
    let resolvable = guards(&rec, now_for(h, Some(&rec))).resolvable();
    Ok(Some(RecordView {
        scope: rec.scope.clone(),
        key: rec.key.clone(),
        key_source: rec.key_source,
        tool: rec.tool.clone(),
        fingerprint: rec.fingerprint.clone(),
        args: rec.args.clone(),
        provider_key: rec.provider_key.clone(),
        owner: rec.owner.clone(),
        state: rec.state,
        version,
        attempts: rec.attempts.len() as u32,
        receipt: rec.receipt.clone(),
        error: rec.error.clone(),
        escalated: rec.escalated,
        possible_duplicate: rec.possible_duplicate,
        supersedes: rec.supersedes.clone(),
        superseded_by: rec.superseded_by.clone(),
        replays: rec.replays,
        conflicts: rec.conflicts,
        created_at: rec.created_at,
        updated_at: rec.updated_at,
        resolvable,
        body: serde_json::to_string(&rec).expect("records always serialize"),
        audit,
    }))
}

/// The `resolve` export: an operator asserts what happened, with a note.
///
/// `confirmed` settles an unknown, absent, failed, awaiting, denied or lease-expired record;
/// `absent` settles an unknown (or lease-expired) one, and before
/// `max_in_flight` has passed since the last dispatch it needs `force`.
/// `approve` and `deny` decide a record awaiting approval (the note says who and why).
pub fn resolve(
    h: &impl Host,
    scope: &str,
    key: &str,
    resolution: Resolution,
    note: &str,
    force: bool,
) -> Result<State, Error> {
    let settings = h.settings();
    check_name("scope", scope, &settings)?;
    check_name("key", key, &settings)?;
    check_note(note)?;
    let resolution = match resolution {
        Resolution::Confirmed(receipt) => Resolution::Confirmed(checked_receipt(receipt, &settings)?),
        Resolution::Approve | Resolution::Deny if note.trim().is_empty() => {
            return Err(Error::InvalidRequest(
                "an approval or a denial needs a note saying who decided and why (it is audited)".to_string(),
            ));
        }
        other => other,
    };
    let mut races = Races::new();
    while races.again(h) {
        let loaded = load(h, scope, key).map_err(storage_error)?.ok_or(Error::NotFound)?;
        match apply(h, loaded, resolution.clone(), note, force) {
            Ok(result) => return result,
            Err(LedgerError::Conflict) => continue,
            Err(e) => return Err(storage_error(e)),
        }
    }
    Err(storage_error(LedgerError::Conflict))
}

/// What `resolve` may do with a record at `now`: the one place its guards
/// live, read by `inspect` (a view's `resolvable`) and by `apply`, so what an
/// operator is offered and what is accepted cannot drift apart.
struct Guards {
    /// In flight with a live lease: its holder may still report.
    live: bool,
    /// The state, for a refusal's words.
    state: State,
    /// Confirmed is accepted (the lease permitting).
    confirmed: bool,
    /// Absent is accepted (the lease permitting).
    absent: bool,
    /// Approve and deny are accepted.
    approve: bool,
    /// Until when an earlier request may still commit: absent needs force at or
    /// before it; none when the provider claims keys (no late commit can land).
    settled_at: Option<u64>,
    /// Whether `now` is at or before `settled_at`.
    early: bool,
}

fn guards(rec: &OpRecord, now: u64) -> Guards {
    let settled_at = (!rec.policy.provider_claims_key).then(|| {
        rec.last_dispatch()
            .unwrap_or(0)
            .saturating_add(rec.policy.max_in_flight_ms)
    });
    Guards {
        live: rec.state == State::InFlight && !rec.lease_ended(now),
        state: rec.state,
        confirmed: matches!(
            rec.state,
            State::Unknown | State::Absent | State::Failed | State::InFlight | State::AwaitingApproval | State::Denied
        ),
        absent: matches!(rec.state, State::Unknown | State::InFlight),
        approve: rec.state == State::AwaitingApproval,
        settled_at,
        early: settled_at.is_some_and(|at| now <= at),
    }
}

impl Guards {
    /// The view's `resolvable`.
    fn resolvable(&self) -> Resolvable {
        let absent = !self.live && self.absent;
        Resolvable {
            confirmed: !self.live && self.confirmed,
            absent,
            absent_needs_force: absent && self.early,
            approve: self.approve,
        }
    }

    /// Why `resolution` (with `force`) is refused now, if it is: refused
    /// exactly when [`Guards::resolvable`] does not offer it; the rest only
    /// words the reason.
    fn refusal(&self, resolution: &Resolution, force: bool) -> Option<String> {
        let offered = self.resolvable();
        let accepted = match resolution {
            Resolution::Confirmed(_) => offered.confirmed,
            Resolution::Absent => offered.absent && (force || !offered.absent_needs_force),
            Resolution::Approve | Resolution::Deny => offered.approve,
        };
        if accepted {
            return None;
        }
        Some(if self.live {
            "the record is in flight with a live lease: wait for its holder or the lease end".to_string()
        } else {
            match resolution {
                Resolution::Confirmed(_) => {
                    format!("a {} record cannot be resolved as confirmed", state_name(self.state))
                }
                Resolution::Absent if !offered.absent => {
                    format!("a {} record cannot be resolved as absent", state_name(self.state))
                }
                Resolution::Absent => format!(
                    "an earlier request may still commit until {} (max_in_flight after the last dispatch); \
                     pass force to resolve absent now",
                    self.settled_at.unwrap_or_default()
                ),
                Resolution::Approve | Resolution::Deny => {
                    format!("a {} record is not awaiting approval", state_name(self.state))
                }
            }
        })
    }
}

fn apply(
    h: &impl Host,
    loaded: Loaded,
    resolution: Resolution,
    note: &str,
    force: bool,
) -> Result<Result<State, Error>, LedgerError> {
    let Loaded { mut rec, version } = loaded;
    let now = now_for(h, Some(&rec));
    let guards = guards(&rec, now);
    if let Some(why) = guards.refusal(&resolution, force) {
        return Ok(Err(Error::InvalidTransition(why)));
    }
    let mut tx = Tx::new();
    // What an operator asserts is audited with their note (an approval's or denial's event carries it too).
    let asserted = || detail(&[("note", string(note)), ("forced", force.to_string())]);
    let event = match resolution {
        Resolution::Confirmed(receipt) => {
            tx.count_spend(h, &mut rec, now)?;
            let event = rec.confirm(Receipt::strict(receipt), None, now, "operator-confirmed");
            Event {
                detail: asserted(),
                ..event
            }
        }
        Resolution::Absent => {
            // Forced early, a late arrival may still make an effect: later answers say so.
            rec.absence_forced |= guards.early;
            let event = rec.prove_absent(now, now, "operator-absent");
            Event {
                detail: asserted(),
                ..event
            }
        }
        Resolution::Approve => rec.approve(note, now),
        Resolution::Deny => {
            let (event, released) = rec.deny(note, now);
            if let Some(reservation) = released {
                tx.release(h, &rec.scope, &reservation)?;
            }
            event
        }
    };
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok(Ok(rec.state))
}

/// The `adopt` export: an operator moves up to `limit` records of owner `from` to owner `to`.
///
/// A record's owner decides which host's background work reads, escalates
/// and dispatches it; a gateway whose owner name changed (a new path, a new
/// flag) leaves its old records to nobody. Adoption hands them to a live
/// owner: each moved record keeps its state, attempts, lease and fences (a
/// holder still running reports with its fence as before) and gets an
/// `adopted` audit event naming both owners and the note. A record that
/// changed meanwhile is read again; one this build cannot read stays put.
pub fn adopt(h: &impl Host, from: &str, to: &str, note: &str, limit: u32) -> Result<AdoptReport, Error> {
    let settings = h.settings();
    check_name("from owner", from, &settings)?;
    check_name("to owner", to, &settings)?;
    check_note(note)?;
    if from == to {
        return Err(Error::InvalidRequest(format!(
            "adopt: the records of {from:?} already belong to it: name another owner to move them to"
        )));
    }
    let mut report = AdoptReport {
        adopted: 0,
        unreadable: 0,
        more: false,
    };
    // One row more than asked tells whether more are left.
    let rows = h
        .scan(
            Table::Operation,
            &[],
            u64::MAX,
            Some(from.to_string()),
            limit.saturating_add(1),
        )
        .map_err(Error::Storage)?;
    report.more = rows.len() > limit as usize;
    for row in rows.into_iter().take(limit as usize) {
        let Ok(first) = decode(&row) else {
            report.unreadable += 1;
            continue;
        };
        let mut loaded = Some(first);
        for _ in 0..MAX_RACES {
            let Some(Loaded { mut rec, version }) = loaded.take() else {
                break;
            };
            if rec.owner != from {
                break;
            }
            let now = now_for(h, Some(&rec));
            rec.owner = to.to_string();
            if mutant::on(Mutant::AdoptStartsOver) && rec.state == State::Unknown {
                let _ = rec.prove_absent(now, now, "adopted");
            }
            let event = Event {
                kind: "adopted",
                from: Some(rec.state),
                attempt: None,
                detail: detail(&[("from", string(from)), ("to", string(to)), ("note", string(note))]),
            };
            let mut tx = Tx::new();
            tx.record(&mut rec, version, event, now);
            match tx.commit(h) {
                Ok(()) => {
                    report.adopted += 1;
                    break;
                }
                Err(LedgerError::Conflict) => {
                    loaded = load(h, &row.scope, &row.key).map_err(storage_error)?;
                }
                Err(e) => return Err(storage_error(e)),
            }
        }
    }
    Ok(report)
}
