//! Consistency checks of a policy, as when it is loaded: an inconsistent
//! policy is refused with the field named, never adjusted.

use alloc::format;
use alloc::string::{String, ToString};

use super::Policy;
use crate::amount::parse_minor_units;
use crate::canon;
use crate::digest::is_sha256_hex;
use crate::types::{Error, Settings};

/// Slack added to a tool's dispatch timeout (plus twice the declared clock skew)
/// that its lease must cover: the host re-checks the lease just before sending.
pub const LEASE_MARGIN_MS: u64 = 200;

/// Argument names recognised as the provider's idempotency key when a
/// policy names none.
pub const DEFAULT_KEY_ARGUMENTS: [&str; 2] = ["idempotency_key", "idempotencyKey"];

/// Check a policy for consistency, as when it is loaded.
pub fn check_policy(policy: &Policy, settings: &Settings) -> Result<(), Error> {
    let bad = |msg: String| Err(Error::InvalidPolicy(msg));
    let min_lease = policy
        .dispatch_timeout_ms
        .saturating_add(LEASE_MARGIN_MS)
        .saturating_add(settings.clock_skew_ms.saturating_mul(2));
    if policy.lease_ms < min_lease {
        return bad(format!(
            "lease_ms {} is below dispatch_timeout_ms {} + margin {} + 2 x clock skew {} = {min_lease}",
            policy.lease_ms, policy.dispatch_timeout_ms, LEASE_MARGIN_MS, settings.clock_skew_ms
        ));
    }
    if policy.attempt_budget == 0 {
        return bad("attempt_budget must be at least 1".to_string());
    }
    if policy.resolve_deadline_ms == 0 || policy.reconcile_interval_ms == 0 {
        return bad("resolve_deadline_ms and reconcile_interval_ms must be positive".to_string());
    }
    let recovery = policy
        .lease_ms
        .saturating_mul(u64::from(policy.attempt_budget))
        .saturating_add(policy.resolve_deadline_ms)
        .saturating_add(policy.max_in_flight_ms);
    if policy.retention_ms <= recovery {
        return bad(format!(
            "retention_ms {} must exceed the longest retry/recovery path \
             (lease x attempts + resolve deadline + max in flight = {recovery})",
            policy.retention_ms
        ));
    }
    if policy.tombstone_retention_ms < policy.retention_ms {
        return bad(format!(
            "tombstone_retention_ms {} must be at least retention_ms {}",
            policy.tombstone_retention_ms, policy.retention_ms
        ));
    }
    if policy.derived_window_ms == 0 || policy.derived_window_ms > policy.retention_ms {
        return bad(format!(
            "derived_window_ms {} must be positive and at most retention_ms {} (a finished record answers \
             identical arguments only while it is kept)",
            policy.derived_window_ms, policy.retention_ms
        ));
    }
    if policy.provider_claims_key && policy.key_argument.is_none() && !policy.key_sent_by_host {
        return bad(
            "provider_claims_key needs the provider key to reach the provider: name the key_argument it travels \
             in, or set key_sent_by_host when the host sends it (a header, _meta)"
                .to_string(),
        );
    }
    if policy.verify_first && !policy.lookup {
        return bad("verify_first needs a lookup: the provider is read before the first dispatch".to_string());
    }
    if policy.key_argument.as_ref().is_some_and(String::is_empty) {
        return bad("key_argument is empty".to_string());
    }
    if let Some(fields) = &policy.effect_fields {
        if fields.is_empty() {
            return bad("effect_fields is empty: omit it to make every argument effect-bearing".to_string());
        }
        for field in fields {
            canon::check_pointer(field).map_err(|e| Error::InvalidPolicy(format!("effect field {field:?}: {e}")))?;
            if field.is_empty() {
                return bad("effect field \"\" (the whole args) is the default; omit effect_fields".to_string());
            }
            if let Some(name) = key_argument_names(policy).find(|n| pointer_names_member(field, n)) {
                return bad(format!(
                    "effect field {field:?} is the key argument {name:?}, which is replaced at dispatch"
                ));
            }
        }
    }
    if let Some(quota) = &policy.quota {
        canon::check_pointer(&quota.spend_field)
            .map_err(|e| Error::InvalidPolicy(format!("spend field {:?}: {e}", quota.spend_field)))?;
        if quota.spend_field.is_empty() {
            return bad("spend field must point inside the args".to_string());
        }
        if let Some(fields) = &policy.effect_fields
            && !fields.contains(&quota.spend_field)
        {
            return bad(format!(
                "spend field {:?} must be one of the effect fields",
                quota.spend_field
            ));
        }
        if quota.decimals > 18 {
            return bad(format!("quota decimals {} is above 18", quota.decimals));
        }
        parse_minor_units(&quota.ceiling, quota.decimals)
            .map_err(|e| Error::InvalidPolicy(format!("quota ceiling: {e}")))?;
        if quota.window_ms == 0 {
            return bad("quota window_ms must be positive".to_string());
        }
    }
    if let super::ApprovalRule::Above { field, above } = &policy.approval {
        canon::check_pointer(field).map_err(|e| Error::InvalidPolicy(format!("approval field {field:?}: {e}")))?;
        if field.is_empty() {
            return bad("approval field must point inside the args".to_string());
        }
        // A changed amount must be a changed payload: otherwise an approval of one amount
        // would let another through under the same key.
        if let Some(fields) = &policy.effect_fields
            && !fields.contains(field)
        {
            return bad(format!("approval field {field:?} must be one of the effect fields"));
        }
        if let Some(name) = key_argument_names(policy).find(|n| pointer_names_member(field, n)) {
            return bad(format!(
                "approval field {field:?} is the key argument {name:?}, which is replaced at dispatch"
            ));
        }
        crate::amount::parse_decimal(above).map_err(|e| Error::InvalidPolicy(format!("approval threshold: {e}")))?;
    }
    if !policy.approval.is_never() && policy.route == Some(crate::types::Route::Direct) {
        return bad(
            "approval needs a protected route: a DIRECT call is sent unrecorded, so nothing can hold it for a person"
                .to_string(),
        );
    }
    if policy.approval_valid_ms == 0 {
        return bad("approval_valid_ms must be positive".to_string());
    }
    if policy.approval_wait_ms == 0 {
        return bad("approval_wait_ms must be positive".to_string());
    }
    if let Some(account) = &policy.provider_account {
        check_account(account, settings)?;
    }
    if let Some(pin) = &policy.descriptor_pin
        && !is_sha256_hex(pin)
    {
        return bad(format!("descriptor_pin {pin:?} is not a lower-case hex SHA-256"));
    }
    Ok(())
}

/// The key-argument names a policy recognises.
pub fn key_argument_names(policy: &Policy) -> impl Iterator<Item = &str> {
    let explicit = policy.key_argument.as_deref();
    explicit
        .into_iter()
        .chain(DEFAULT_KEY_ARGUMENTS.into_iter().filter(move |_| explicit.is_none()))
}

fn pointer_names_member(pointer: &str, name: &str) -> bool {
    pointer
        .strip_prefix('/')
        .map(|rest| rest.replace("~1", "/").replace("~0", "~"))
        == Some(name.to_string())
}

/// A provider account is a name like a key: within the key limit, no control character, not blank.
/// A host stores a fingerprint there; the engine only compares it, so any such text will do.
fn check_account(account: &str, settings: &Settings) -> Result<(), Error> {
    crate::input::check_new_name("provider_account", account, settings).map_err(|e| match e {
        Error::InvalidRequest(m) => Error::InvalidPolicy(m),
        other => other,
    })
}
