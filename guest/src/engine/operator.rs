//! Operator exports: `inspect` a record, `resolve` what nothing else can.

use alloc::format;
use alloc::string::ToString;

use super::begin::state_name;
use super::{MAX_RACES, now_for, storage_error};
use crate::host::Host;
use crate::input::{check_name, check_note, checked_receipt};
use crate::record::{Receipt, detail, string};
use crate::store::{LedgerError, Loaded, Tx, load};
use crate::types::{Error, RecordView, Resolution, State};

/// The `inspect` export.
pub fn inspect(h: &impl Host, scope: &str, key: &str) -> Result<Option<RecordView>, Error> {
    let settings = h.settings();
    check_name("scope", scope, &settings)?;
    check_name("key", key, &settings)?;
    let Some(Loaded { rec, version }) = load(h, scope, key).map_err(storage_error)? else {
        return Ok(None);
    };
    let audit = h.audit(scope, key).map_err(Error::Storage)?;
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
        body: serde_json::to_string(&rec).expect("records always serialize"),
        audit,
    }))
}

/// The `resolve` export: an operator asserts what happened, with a note.
///
/// `confirmed` settles an unknown, absent, failed or lease-expired record;
/// `absent` settles an unknown (or lease-expired) one, and before
/// `max_in_flight` has passed since the last dispatch it needs `force`.
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
        Resolution::Absent => Resolution::Absent,
    };
    for _ in 0..MAX_RACES {
        let loaded = load(h, scope, key).map_err(storage_error)?.ok_or(Error::NotFound)?;
        match apply(h, loaded, resolution.clone(), note, force) {
            Ok(result) => return result,
            Err(LedgerError::Conflict) => continue,
            Err(e) => return Err(storage_error(e)),
        }
    }
    Err(storage_error(LedgerError::Conflict))
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
    let live = rec.state == State::InFlight && !rec.lease_ended(now);
    let refuse = |why: &str| Ok(Err(Error::InvalidTransition(why.to_string())));
    if live {
        return refuse("the record is in flight with a live lease: wait for its holder or the lease end");
    }
    let mut tx = Tx::new();
    let mut event = match resolution {
        Resolution::Confirmed(receipt) => match rec.state {
            State::Unknown | State::Absent | State::Failed | State::InFlight => {
                tx.count_spend(h, &mut rec, now)?;
                rec.confirm(Receipt::strict(receipt), None, now, "operator-confirmed")
            }
            other => {
                return refuse(&format!(
                    "a {} record cannot be resolved as confirmed",
                    state_name(other)
                ));
            }
        },
        Resolution::Absent => match rec.state {
            State::Unknown | State::InFlight => {
                let settled_at = rec
                    .last_dispatch()
                    .unwrap_or(0)
                    .saturating_add(rec.policy.max_in_flight_ms);
                let early = !rec.policy.provider_claims_key && now <= settled_at;
                if early && !force {
                    return refuse(&format!(
                        "an earlier request may still commit until {settled_at} (max_in_flight after the last dispatch); \
                         pass force to resolve absent now"
                    ));
                }
                // Forced early, a late arrival may still make an effect: later answers say so.
                rec.absence_forced |= early;
                rec.prove_absent(now, now, "operator-absent")
            }
            other => return refuse(&format!("a {} record cannot be resolved as absent", state_name(other))),
        },
    };
    event.detail = detail(&[("note", string(note)), ("forced", force.to_string())]);
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok(Ok(rec.state))
}
