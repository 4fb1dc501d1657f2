//! Tool policies: what a host's user configured, the engine's defaults for
//! the rest, the consistency checks, and routing.
//!
//! A host passes [`PolicyInput`]s (every field optional); [`resolve`] fills
//! what is unset — from the configuration's defaults, then the engine's —
//! and [`check_policy`] refuses an inconsistent result, naming the field.
//! Nothing is ever adjusted behind the user's back.

mod check;
mod route;

pub use check::{DEFAULT_KEY_ARGUMENTS, LEASE_MARGIN_MS, check_policy, key_argument_names};
pub use route::{Routing, descriptor_fingerprint, route};

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::types::{
    ApprovalRule as WitApprovalRule, ApprovalThreshold, IdentityMode, PolicyInput, QuotaInput, QuotaPolicy, Route,
    Settings, ToolPolicy,
};

const SECOND: u64 = 1_000;
const DAY: u64 = 24 * 3_600 * SECOND;
/// Decimal places of a quota's minor unit when none are configured (cents).
pub const DEFAULT_DECIMALS: u8 = 2;
/// Tombstones are kept at least this long when their retention is not configured.
pub const DEFAULT_TOMBSTONE_RETENTION_MS: u64 = 90 * DAY;
/// How long an approval may be used when its validity is not configured.
pub const DEFAULT_APPROVAL_VALID_MS: u64 = 3_600 * SECOND;
/// How long a call may wait for a person's decision when that is not configured.
pub const DEFAULT_APPROVAL_WAIT_MS: u64 = DAY;

/// When a person must approve a call before it is sent, as records keep it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalRule {
    /// Never.
    #[default]
    Never,
    /// Every operation of the tool.
    Always,
    /// When the amount at `field` (an effect field) is above `above`, or is missing or not a number.
    Above {
        /// JSON pointer to the amount.
        field: String,
        /// The threshold, a decimal string.
        above: String,
    },
}

impl ApprovalRule {
    /// Whether the rule never asks.
    pub fn is_never(&self) -> bool {
        *self == ApprovalRule::Never
    }

    fn of(rule: &WitApprovalRule) -> ApprovalRule {
        match rule {
            WitApprovalRule::Never => ApprovalRule::Never,
            WitApprovalRule::Always => ApprovalRule::Always,
            WitApprovalRule::Above(t) => ApprovalRule::Above {
                field: t.field.clone(),
                above: t.above.clone(),
            },
        }
    }

    fn to_wit(&self) -> WitApprovalRule {
        match self {
            ApprovalRule::Never => WitApprovalRule::Never,
            ApprovalRule::Always => WitApprovalRule::Always,
            ApprovalRule::Above { field, above } => WitApprovalRule::Above(ApprovalThreshold {
                field: field.clone(),
                above: above.clone(),
            }),
        }
    }
}

/// A spend ceiling as the engine applies it (and keeps it in records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// JSON pointer to the amount in the args; an effect field.
    pub spend_field: String,
    /// Ceiling per scope per window, a decimal string.
    pub ceiling: String,
    /// Decimal places of the minor unit.
    pub decimals: u8,
    /// Window length in milliseconds.
    pub window_ms: u64,
    /// Shared bucket; none: the tool's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
}

/// One tool's policy with every field decided, as the engine applies it and
/// as records keep it. Fields added after a record was written read as their
/// default, so every record a ledger holds stays readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Explicit route; none: from the descriptor's annotations, else protect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    /// Whether an application key is required or may be derived.
    pub identity: IdentityMode,
    /// The args field the provider key travels in; none: the recognised names when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_argument: Option<String>,
    /// The host carries the provider key out of band.
    #[serde(default, skip_serializing_if = "crate::record::is_false")]
    pub key_sent_by_host: bool,
    /// JSON pointers of the effect-bearing args; none: every argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_fields: Option<Vec<String>>,
    /// Ask the provider before the first dispatch of a key the ledger never saw.
    #[serde(default, skip_serializing_if = "crate::record::is_false")]
    pub verify_first: bool,
    /// The provider claims the key atomically.
    #[serde(default, skip_serializing_if = "crate::record::is_false")]
    pub provider_claims_key: bool,
    /// The host can read the provider for this tool.
    #[serde(default = "yes")]
    pub lookup: bool,
    /// Longest time an old request can still commit at the provider.
    pub max_in_flight_ms: u64,
    /// The host's dispatch timeout.
    pub dispatch_timeout_ms: u64,
    /// Lease of one attempt.
    pub lease_ms: u64,
    /// Granted dispatches allowed per key.
    pub attempt_budget: u32,
    /// A derived key's window.
    #[serde(default = "one_day")]
    pub derived_window_ms: u64,
    /// Time before an unknown or absent record is escalated.
    pub resolve_deadline_ms: u64,
    /// First interval between reconciliation reads.
    pub reconcile_interval_ms: u64,
    /// Retention of finished records.
    pub retention_ms: u64,
    /// Retention of tombstones.
    pub tombstone_retention_ms: u64,
    /// Spend ceiling, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// Pinned descriptor fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor_pin: Option<String>,
    /// When a person must approve a call before it is sent.
    #[serde(default, skip_serializing_if = "ApprovalRule::is_never")]
    pub approval: ApprovalRule,
    /// How long an approval may be used after it was given.
    #[serde(default = "one_hour", skip_serializing_if = "is_one_hour")]
    pub approval_valid_ms: u64,
    /// How long a call may wait for a person's decision before it is denied.
    #[serde(default = "one_day", skip_serializing_if = "is_one_day")]
    pub approval_wait_ms: u64,
    /// The provider account (a credential's fingerprint) the tool is sent and read through, if named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_account: Option<String>,
}

fn yes() -> bool {
    true
}

fn one_hour() -> u64 {
    DEFAULT_APPROVAL_VALID_MS
}

fn is_one_hour(ms: &u64) -> bool {
    *ms == DEFAULT_APPROVAL_VALID_MS
}

fn one_day() -> u64 {
    DAY
}

fn is_one_day(ms: &u64) -> bool {
    *ms == DEFAULT_APPROVAL_WAIT_MS
}

/// The engine's policy of a tool nobody configured (and what every unset field starts from).
pub fn default_policy() -> Policy {
    let timeout = 30 * SECOND;
    Policy {
        route: None,
        identity: IdentityMode::Derived,
        key_argument: None,
        key_sent_by_host: false,
        effect_fields: None,
        verify_first: false,
        provider_claims_key: false,
        lookup: true,
        max_in_flight_ms: 60 * SECOND,
        dispatch_timeout_ms: timeout,
        lease_ms: default_lease(timeout, 0),
        attempt_budget: 3,
        derived_window_ms: DAY,
        resolve_deadline_ms: 15 * 60 * SECOND,
        reconcile_interval_ms: SECOND,
        retention_ms: 7 * DAY,
        tombstone_retention_ms: DEFAULT_TOMBSTONE_RETENTION_MS,
        quota: None,
        descriptor_pin: None,
        approval: ApprovalRule::Never,
        approval_valid_ms: DEFAULT_APPROVAL_VALID_MS,
        approval_wait_ms: DEFAULT_APPROVAL_WAIT_MS,
        provider_account: None,
    }
}

/// A policy input with nothing set: every field is the engine's (or the defaults').
pub fn unset() -> PolicyInput {
    PolicyInput {
        route: None,
        identity: None,
        key_argument: None,
        key_sent_by_host: None,
        effect_fields: None,
        verify_first: None,
        provider_claims_key: None,
        lookup: None,
        max_in_flight_ms: None,
        dispatch_timeout_ms: None,
        lease_ms: None,
        attempt_budget: None,
        derived_window_ms: None,
        resolve_deadline_ms: None,
        reconcile_interval_ms: None,
        retention_ms: None,
        tombstone_retention_ms: None,
        quota: None,
        descriptor_pin: None,
        approval: None,
        approval_valid_ms: None,
        approval_wait_ms: None,
        provider_account: None,
    }
}

/// The lease of a tool whose lease is not configured: its timeout, a sixth of
/// it more (at least the margin) to cover claim and send, and twice the skew.
pub fn default_lease(timeout_ms: u64, skew_ms: u64) -> u64 {
    timeout_ms
        .saturating_add((timeout_ms / 6).max(LEASE_MARGIN_MS))
        .saturating_add(skew_ms.saturating_mul(2))
}

/// `own`'s fields, then `defaults`', then the engine's; then checked.
pub fn resolve(
    tool: &str,
    own: &PolicyInput,
    defaults: &PolicyInput,
    settings: &Settings,
) -> Result<Policy, crate::types::Error> {
    let engine = default_policy();
    macro_rules! pick {
        ($field:ident) => {
            own.$field.clone().or_else(|| defaults.$field.clone())
        };
    }
    let dispatch_timeout_ms = pick!(dispatch_timeout_ms).unwrap_or(engine.dispatch_timeout_ms);
    let retention_ms = pick!(retention_ms).unwrap_or(engine.retention_ms);
    let quota = own.quota.as_ref().map(quota_of);
    let policy = Policy {
        route: own.route,
        identity: pick!(identity).unwrap_or(engine.identity),
        key_argument: pick!(key_argument),
        key_sent_by_host: pick!(key_sent_by_host).unwrap_or(engine.key_sent_by_host),
        effect_fields: own.effect_fields.clone(),
        verify_first: pick!(verify_first).unwrap_or(engine.verify_first),
        provider_claims_key: pick!(provider_claims_key).unwrap_or(engine.provider_claims_key),
        lookup: pick!(lookup).unwrap_or(engine.lookup),
        max_in_flight_ms: pick!(max_in_flight_ms).unwrap_or(engine.max_in_flight_ms),
        dispatch_timeout_ms,
        lease_ms: pick!(lease_ms).unwrap_or_else(|| default_lease(dispatch_timeout_ms, settings.clock_skew_ms)),
        attempt_budget: pick!(attempt_budget).unwrap_or(engine.attempt_budget),
        derived_window_ms: pick!(derived_window_ms).unwrap_or(engine.derived_window_ms),
        resolve_deadline_ms: pick!(resolve_deadline_ms).unwrap_or(engine.resolve_deadline_ms),
        reconcile_interval_ms: pick!(reconcile_interval_ms).unwrap_or(engine.reconcile_interval_ms),
        retention_ms,
        tombstone_retention_ms: pick!(tombstone_retention_ms)
            .unwrap_or_else(|| DEFAULT_TOMBSTONE_RETENTION_MS.max(retention_ms)),
        quota,
        descriptor_pin: own.descriptor_pin.clone(),
        approval: pick!(approval).as_ref().map_or(engine.approval, ApprovalRule::of),
        approval_valid_ms: pick!(approval_valid_ms).unwrap_or(engine.approval_valid_ms),
        approval_wait_ms: pick!(approval_wait_ms).unwrap_or(engine.approval_wait_ms),
        provider_account: pick!(provider_account),
    };
    check_policy(&policy, settings).map_err(|e| match e {
        crate::types::Error::InvalidPolicy(m) => crate::types::Error::InvalidPolicy(alloc::format!("tool {tool}: {m}")),
        other => other,
    })?;
    Ok(policy)
}

fn quota_of(q: &QuotaInput) -> Quota {
    Quota {
        spend_field: q.spend_field.clone(),
        ceiling: q.ceiling.clone(),
        decimals: q.decimals.unwrap_or(DEFAULT_DECIMALS),
        window_ms: q.window_ms,
        bucket: q.bucket.clone(),
    }
}

impl Policy {
    /// The quota bucket a tool's spend counts in.
    pub fn bucket_of(quota: &Quota, tool: &str) -> String {
        quota.bucket.clone().unwrap_or_else(|| tool.into())
    }

    /// The WIT form, for showing a host how a tool is handled.
    pub fn to_wit(&self, tool: &str) -> ToolPolicy {
        ToolPolicy {
            route: self.route,
            identity: self.identity,
            key_argument: self.key_argument.clone(),
            key_sent_by_host: self.key_sent_by_host,
            effect_fields: self.effect_fields.clone(),
            verify_first: self.verify_first,
            provider_claims_key: self.provider_claims_key,
            lookup: self.lookup,
            max_in_flight_ms: self.max_in_flight_ms,
            dispatch_timeout_ms: self.dispatch_timeout_ms,
            lease_ms: self.lease_ms,
            attempt_budget: self.attempt_budget,
            derived_window_ms: self.derived_window_ms,
            resolve_deadline_ms: self.resolve_deadline_ms,
            reconcile_interval_ms: self.reconcile_interval_ms,
            retention_ms: self.retention_ms,
            tombstone_retention_ms: self.tombstone_retention_ms,
            quota: self.quota.as_ref().map(|q| QuotaPolicy {
                spend_field: q.spend_field.clone(),
                ceiling: q.ceiling.clone(),
                decimals: q.decimals,
                window_ms: q.window_ms,
                bucket: Policy::bucket_of(q, tool),
            }),
            descriptor_pin: self.descriptor_pin.clone(),
            approval: self.approval.to_wit(),
            approval_valid_ms: self.approval_valid_ms,
            approval_wait_ms: self.approval_wait_ms,
            provider_account: self.provider_account.clone(),
        }
    }
}
