//! Human names and messages for the WIT types.

use std::fmt;

use crate::bindings::types::{
    BlockReason, Confirmation, Decision, Effect, Ending, Error, JsonErrorKind, Repeat, ReplayVia, Route, State,
};

impl Error {
    /// One human line saying what was wrong.
    pub fn message(&self) -> String {
        match self {
            Error::InvalidJson(e) => format!("invalid JSON: {}", e.message),
            Error::InvalidRequest(m) => format!("invalid request: {m}"),
            Error::InvalidPolicy(m) => format!("invalid policy: {m}"),
            Error::Storage(m) => format!("storage: {m}"),
            Error::NotFound => "no record for this scope and key".to_string(),
            Error::FenceMismatch => "the fence belongs to no attempt of this record".to_string(),
            Error::InvalidTransition(m) => format!("not allowed: {m}"),
            Error::NotConfigured => "the component was called before configure".to_string(),
        }
    }
}

impl State {
    /// The WIT name (`in-flight`, `confirmed`, ...).
    pub fn name(self) -> &'static str {
        match self {
            State::InFlight => "in-flight",
            State::Confirmed => "confirmed",
            State::Failed => "failed",
            State::Unknown => "unknown",
            State::Absent => "absent",
            State::Superseded => "superseded",
            State::AwaitingApproval => "awaiting-approval",
            State::Denied => "denied",
        }
    }

    /// Every state, in WIT order.
    pub const ALL: [State; 8] = [
        State::InFlight,
        State::Confirmed,
        State::Failed,
        State::Unknown,
        State::Absent,
        State::Superseded,
        State::AwaitingApproval,
        State::Denied,
    ];

    /// Parse a WIT name (underscores accepted).
    pub fn parse(name: &str) -> Option<State> {
        let name = name.replace('_', "-");
        State::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Route::Direct => "DIRECT",
            Route::Protect => "PROTECT",
            Route::Block => "BLOCK",
        })
    }
}

impl fmt::Display for ReplayVia {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplayVia::Key => "key",
            ReplayVia::DerivedArgs => "derived-args",
            ReplayVia::Provider => "provider",
        })
    }
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockReason::RouteBlocked => "route-blocked",
            BlockReason::DescriptorChanged => "descriptor-changed",
            BlockReason::Quota => "quota",
            BlockReason::AttemptBudget => "attempt-budget",
            BlockReason::IdentityRequired => "identity-required",
            BlockReason::IdentityConflict => "identity-conflict",
            BlockReason::PayloadRequired => "payload-required",
            BlockReason::Superseded => "superseded",
            BlockReason::SupersededUnresolved => "superseded-unresolved",
            BlockReason::SupersededConfirmed => "superseded-confirmed",
            BlockReason::SupersedesMissing => "supersedes-missing",
            BlockReason::Expired => "expired",
            BlockReason::Unverified => "unverified",
            BlockReason::Storage => "storage",
            BlockReason::Failed => "failed",
            BlockReason::OtherOwner => "other-owner",
            BlockReason::ApprovalDenied => "approval-denied",
            BlockReason::OtherAccount => "other-account",
        })
    }
}

impl fmt::Display for JsonErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl Decision {
    /// The decision's WIT case name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Execute(_) => "execute",
            Decision::Replay(_) => "replay",
            Decision::Conflict(_) => "conflict",
            Decision::InFlight(_) => "in-flight",
            Decision::Unknown(_) => "unknown",
            Decision::AwaitingApproval(_) => "awaiting-approval",
            Decision::Blocked(_) => "blocked",
            Decision::Direct => "direct",
        }
    }
}

impl Ending {
    /// The ending's WIT case name (`confirmed`, `unknown`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Ending::Confirmed(_) => "confirmed",
            Ending::Rejected(_) => "rejected",
            Ending::NotSent(_) => "not-sent",
            Ending::Unknown(_) => "unknown",
            Ending::InFlight(_) => "in-flight",
            Ending::Conflict(_) => "conflict",
            Ending::Blocked(_) => "blocked",
            Ending::Unrecorded(_) => "unrecorded",
            Ending::AwaitsApproval(_) => "awaits-approval",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Effect::Happened => "happened",
            Effect::None => "none",
            Effect::Unknown => "unknown",
        })
    }
}

impl fmt::Display for Repeat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Repeat::Replays => "replays",
            Repeat::Waits => "waits",
            Repeat::Retries => "retries",
            Repeat::Refused => "refused",
        })
    }
}

impl fmt::Display for Confirmation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Confirmation::Answer => "answer",
            Confirmation::Provider => "provider",
            Confirmation::Operator => "operator",
        })
    }
}

/// A ledger timestamp (ms since the Unix epoch) as a UTC calendar time, for
/// messages and pages that show times to people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    /// Year (proleptic Gregorian).
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day of the month, 1–31.
    pub day: u32,
    /// Hour, 0–23.
    pub hour: u32,
    /// Minute, 0–59.
    pub minute: u32,
    /// Second, 0–59.
    pub second: u32,
    /// Millisecond, 0–999.
    pub millis: u32,
}

impl UtcTime {
    /// The calendar time of `ms` milliseconds since 1970-01-01 00:00:00 UTC.
    pub fn from_ms(ms: u64) -> UtcTime {
        let secs = ms / 1000;
        let (days, rem) = (secs / 86_400, secs % 86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm): shift to an era starting on
        // 0000-03-01, so leap days fall at each era's end.
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        UtcTime {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: (rem / 3_600) as u32,
            minute: (rem % 3_600 / 60) as u32,
            second: (rem % 60) as u32,
            millis: (ms % 1000) as u32,
        }
    }
}
