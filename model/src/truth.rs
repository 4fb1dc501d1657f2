//! What makes an answer true against the world (DESIGN.md "Every answer is
//! true"): the facts an [`Account`] states are checked against the
//! provider's effects and the requests still in the network.

use once_guest::types::{Account, BlockReason, Effect, Ending, Repeat, State, Table};

use crate::world::World;

/// The provider keys an answer about (scope, key) speaks for: the record's,
/// or, with the record gone, every one the key ever sent with.
fn provider_keys(world: &World, scope: &str, key: &str) -> Vec<String> {
    match world
        .ledger
        .row(Table::Operation, scope, key)
        .and_then(|row| once_guest::store::decode(row).ok())
    {
        Some(loaded) => vec![loaded.rec.provider_key],
        None => world.provider_keys_of(scope, key).into_iter().collect(),
    }
}

/// Whether the record of (scope, key) owes a dispatch that will be sent: proven absent, with an
/// attempt left (with none, nothing will send it, and the operation ended without an effect).
fn owed(world: &World, scope: &str, key: &str) -> bool {
    world
        .ledger
        .row(Table::Operation, scope, key)
        .and_then(|row| once_guest::store::decode(row).ok())
        .is_some_and(|loaded| loaded.rec.state == State::Absent && loaded.rec.budget_left())
}

/// Whether `account` is true of `world`; the reason when it is not.
pub fn check_account(world: &World, account: &Account) -> Result<(), String> {
    let Some(key) = account.key.as_deref() else {
        // Refused before a key was settled: nothing of any operation is claimed.
        return match account.effect {
            Effect::Happened => Err("an answer without a key says the effect happened".into()),
            _ => Ok(()),
        };
    };
    let scope = account.scope.as_str();
    let keys = provider_keys(world, scope, key);
    let effects: Vec<String> = keys.iter().flat_map(|k| world.effects(k)).map(|(r, _)| r).collect();
    let pending = keys.iter().any(|k| world.pending(k));
    let said = describe(account);
    match account.effect {
        Effect::Happened if effects.is_empty() => {
            return Err(format!("{scope}/{key}: {said} says the effect happened; none exists"));
        }
        Effect::None if !effects.is_empty() => {
            return Err(format!(
                "{scope}/{key}: {said} says no effect; the provider has {effects:?}"
            ));
        }
        Effect::None if pending => {
            return Err(format!(
                "{scope}/{key}: {said} says no effect; a request that can still commit is in the network"
            ));
        }
        // Refused with no effect tells the caller to mint a new key: false while a dispatch of this
        // operation is owed, since whoever owes it sends it (two effects).
        Effect::None if account.repeat == Repeat::Refused && owed(world, scope, key) => {
            return Err(format!(
                "{scope}/{key}: {said} says no effect and refuses the same call; a dispatch of it is owed"
            ));
        }
        _ => {}
    }
    let receipt = match &account.ending {
        Ending::Confirmed(info) => Some(&info.receipt),
        Ending::Unrecorded(info) => Some(&info.response),
        Ending::Blocked(b) if b.reason == BlockReason::Superseded => b.receipt.as_ref(),
        _ => None,
    };
    if let Some(receipt) = receipt
        && !effects.contains(receipt)
    {
        return Err(format!(
            "{scope}/{key}: {said} shows receipt {receipt}, which is no effect of this operation ({effects:?})"
        ));
    }
    if let Ending::NotSent(info) = &account.ending {
        // Final (no attempt left): no attempt was sent. A retry's interim answer (attempts left):
        // its latest attempt was not sent; an earlier one may have been.
        if account.repeat != Repeat::Retries {
            if world.requests.iter().any(|r| keys.contains(&r.provider_key)) {
                return Err(format!(
                    "{scope}/{key}: {said} says nothing was sent; a request left a host"
                ));
            }
        } else if let Some(fence) = attempt_fence(world, scope, key, info.attempts)
            && world.requests.iter().any(|r| r.fence == fence)
        {
            return Err(format!(
                "{scope}/{key}: {said} says attempt {} was not sent; a request of it left a host",
                info.attempts
            ));
        }
    }
    Ok(())
}

/// The fence of attempt `n` of the record of (scope, key).
fn attempt_fence(world: &World, scope: &str, key: &str, n: u32) -> Option<String> {
    let row = world.ledger.row(Table::Operation, scope, key)?;
    let rec = once_guest::store::decode(row).ok()?.rec;
    rec.attempts.into_iter().find(|a| a.n == n).map(|a| a.fence)
}

/// A short description of an answer, for traces.
pub fn describe(account: &Account) -> String {
    let ending = match &account.ending {
        Ending::Confirmed(_) => "confirmed".to_string(),
        Ending::Rejected(_) => "rejected".to_string(),
        Ending::NotSent(_) => "not-sent".to_string(),
        Ending::Unknown(_) => "unknown".to_string(),
        Ending::InFlight(_) => "in-flight".to_string(),
        Ending::Conflict(_) => "conflict".to_string(),
        Ending::Blocked(b) => format!("blocked({:?}: {})", b.reason, b.detail),
        Ending::Unrecorded(_) => "unrecorded".to_string(),
        Ending::AwaitsApproval(_) => "awaits-approval".to_string(),
    };
    format!(
        "answer {ending} (effect {:?}, repeat {:?})",
        account.effect, account.repeat
    )
}
