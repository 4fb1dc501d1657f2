//! The operation record and every transition of its state machine.
//!
//! This file is the one place a record changes state. Each transition
//! method mutates the record and returns the [`Event`] that the store
//! commits atomically with it (DESIGN.md "One atomic write per transition").

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::policy::Policy;
use crate::types::{Confirmation, KeySource, RecordSummary, State};

/// The `due_at` of an absent record with nothing else pending: far in the
/// future (so a due scan skips it) yet listed by [`OWED`]-bounded scans of
/// owed dispatches. The largest timestamp every store can hold (i64).
pub const OWED: u64 = i64::MAX as u64;

/// Longest wait between two deliveries of an escalation the sink refused.
pub const MAX_REDELIVERY_BACKOFF_MS: u64 = 5 * 60 * 1_000;

/// Longest back-off before the attempt after one that was not sent.
pub const MAX_NOT_SENT_BACKOFF_MS: u64 = 30 * 1_000;

/// One granted execute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Attempt number, from 1.
    pub n: u32,
    /// Its fence token.
    pub fence: String,
    /// When it was granted.
    pub granted_at: u64,
    /// Its lease end: the host never sends after it.
    pub lease_until: u64,
    /// When its holder's `finish` was recorded (it stops sending then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// What the holder reported, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Granted as the owed dispatch of an absent record: if it is not sent,
    /// the dispatch is still owed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub owed: bool,
    /// The person's approval this attempt was granted on (the tool's `approval`
    /// rule): used up by it, unless it is not sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// A person's approval of one operation's next attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Who approved it and why (the operator's note).
    pub note: String,
    /// The fingerprint approved: the payload as the person saw it.
    pub fingerprint: String,
    /// When it was given (ledger clock).
    pub at: u64,
    /// It may be used before this (ledger clock).
    pub valid_until: u64,
}

impl Attempt {
    /// The last moment its holder may start sending (ledger clock): a send
    /// started by then ends, reply or timeout, inside the lease on any host's clock.
    pub fn send_by(&self, policy: &Policy, skew_ms: u64) -> u64 {
        self.lease_until
            .saturating_sub(policy.dispatch_timeout_ms)
            .saturating_sub(skew_ms)
    }

    /// Whether its request may have taken effect: its outcome is not a definite
    /// "nothing happened" (the provider's rejection, or nothing sent).
    pub fn may_have_taken_effect(&self) -> bool {
        !matches!(self.outcome.as_deref(), Some("rejected" | "not-sent"))
    }

    /// The latest moment this attempt could have been sent.
    pub fn last_dispatch(&self) -> u64 {
        match self.ended_at {
            Some(t) => t.min(self.lease_until),
            None => self.lease_until,
        }
    }
}

/// A quota reservation held by a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Quota bucket.
    pub bucket: String,
    /// Start of the window the amount was reserved in (fixed at reservation).
    pub window_start: u64,
    /// Window length.
    pub window_ms: u64,
    /// Amount in minor units (decimal digits, exact).
    pub units: String,
}

/// How a stored receipt falls short of the provider's strict I-JSON
/// (DESIGN.md "Every answer is true"). A receipt that fails the strict check
/// (a lone surrogate, a duplicate key, not JSON at all, too deep, too large)
/// is still the evidence that the effect happened, so it is stored anyway:
/// verbatim within the size limit, else as a stand-in naming its size and
/// digest. This says which, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptFlaw {
    /// What the strict check found (its message, e.g. a duplicate key and where).
    pub problem: String,
    /// Over the size limit: the stored receipt is a stand-in, not the provider's text.
    #[serde(default, skip_serializing_if = "is_false")]
    pub abridged: bool,
    /// Not JSON: the stored receipt is a stand-in holding the provider's text whole, as a string
    /// (`{"once_unparsed_receipt":{"bytes":…,"sha256":…,"text":…}}`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub unparsed: bool,
    /// The size of the provider's text in bytes.
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the provider's text.
    pub sha256: String,
}

/// A receipt as the ledger keeps it: the text stored (and replayed), and how
/// it falls short of strict I-JSON, if it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The stored text: the provider's own, or a stand-in when abridged.
    pub text: String,
    /// Set when the text is not the provider's strict I-JSON.
    pub flaw: Option<ReceiptFlaw>,
}

impl Receipt {
    /// A receipt that passed the strict check.
    pub fn strict(text: String) -> Self {
        Receipt { text, flaw: None }
    }

    /// The audit fields of an event that carries this receipt. A strict
    /// receipt is JSON and goes in as it is; a flawed one may not be JSON (or
    /// not JSON a ledger's own JSON columns would take), so it goes in as a
    /// JSON string, beside its flaw.
    fn audit_fields(&self) -> Vec<(&'static str, String)> {
        match &self.flaw {
            None => alloc::vec![("receipt", self.text.clone())],
            Some(flaw) => alloc::vec![("receipt", string(&self.text)), ("receipt_flaw", flaw_json(flaw))],
        }
    }
}

/// A receipt flaw as JSON text (an audit detail's member).
fn flaw_json(flaw: &ReceiptFlaw) -> String {
    serde_json::to_string(flaw).expect("a receipt flaw always serializes")
}

/// The engine's record of one operation, stored as the row body. A body
/// leaves out every field that is absent, false or zero (each reads back as
/// such, and bodies written with them spelled out read the same): most are,
/// and a shorter body is less to write, fsync and parse on every transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpRecord {
    /// Scope.
    pub scope: String,
    /// Operation key.
    pub key: String,
    /// Where the key came from.
    pub key_source: KeySource,
    /// Tool.
    pub tool: String,
    /// Fingerprint of the effect-bearing payload.
    pub fingerprint: String,
    /// Canonical args to dispatch (key argument set to the provider key).
    pub args: String,
    /// What travels to the provider. Derived once, when the record was
    /// created, and never again: every dispatch and read uses this one.
    pub provider_key: String,
    /// The id of the ledger secret [`Self::provider_key`] was derived with
    /// ([`crate::secret::KeySecret::id`]); none: the record was made before
    /// provider keys had a secret, with the unsalted derivation
    /// ([`crate::identity::legacy_provider_key`]), and keeps that key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<String>,
    /// Whether the dispatched args carry the provider key (a key argument).
    /// Records written before this was kept read as false: a provider cannot
    /// be trusted to claim a key nobody can show it saw.
    #[serde(default, skip_serializing_if = "is_false")]
    pub key_in_args: bool,
    /// Who dispatches this operation (the creating host's `settings.owner`).
    #[serde(default = "default_owner")]
    pub owner: String,
    /// State.
    pub state: State,
    /// Granted executes, oldest first.
    pub attempts: Vec<Attempt>,
    /// Fences of the operation this record replaced (a derived key past its
    /// window): a late success of theirs is still evidence, audited here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_fences: Vec<String>,
    /// Of those, the ones whose success was already audited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reported_previous: Vec<String>,
    /// Receipt of the effect, once confirmed; never changes after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// How the stored receipt falls short of strict I-JSON, if it does
    /// (stored verbatim, or abridged to a stand-in). Set with the receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_flaw: Option<ReceiptFlaw>,
    /// The attempt whose effect the receipt is: the one that reported it, or
    /// for a confirmation by reading the provider, the latest attempt then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_by: Option<u32>,
    /// How the ledger learnt of the effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_via: Option<Confirmation>,
    /// An operator resolved it absent before `max_in_flight` had passed (forced):
    /// an earlier attempt may still have an effect.
    #[serde(default, skip_serializing_if = "is_false")]
    pub absence_forced: bool,
    /// The last definite rejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the record is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_reason: Option<String>,
    /// Since when the record is unknown or absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// When the operator is escalated to (unknown, absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<u64>,
    /// Next provider read of an unknown record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_check: Option<u64>,
    /// Provider reads of this record that could not settle it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checks: u32,
    /// The last read position an absent answer carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read_position: Option<u64>,
    /// Escalated to the operator.
    #[serde(default, skip_serializing_if = "is_false")]
    pub escalated: bool,
    /// The operator sink acknowledged the escalation.
    #[serde(default, skip_serializing_if = "is_false")]
    pub escalation_acked: bool,
    /// Id of the current escalation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation_id: Option<String>,
    /// Deliveries of the current escalation the sink did not acknowledge:
    /// each one pushes the next re-delivery out (doubling), so an escalation
    /// the sink keeps refusing never crowds other work out of a sweep.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub escalation_failures: u32,
    /// A success arrived while a newer attempt was in flight.
    #[serde(default, skip_serializing_if = "is_false")]
    pub possible_duplicate: bool,
    /// Key this operation supersedes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
    /// Key that superseded this operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// Spend in minor units, if the tool has a quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend: Option<String>,
    /// Quota reservation held now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Reservation>,
    /// Why a person must approve each attempt before it is sent (the tool's
    /// `approval` rule, judged on the payload when the record was created);
    /// none: no approval is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_reason: Option<String>,
    /// An approval given and not used yet: the next attempt may be sent on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// The tool's policy when the record was created.
    pub policy: Policy,
    /// Replays answered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replays: u32,
    /// Conflicts answered.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub conflicts: u32,
    /// Created.
    pub created_at: u64,
    /// Last write.
    pub updated_at: u64,
    /// Last state change (retention counts from here).
    pub transitioned_at: u64,
}

/// The audit event of one transition, before the store numbers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: &'static str,
    /// State before.
    pub from: Option<State>,
    /// Attempt concerned.
    pub attempt: Option<u32>,
    /// Details, as JSON text.
    pub detail: String,
}

/// How `begin` found the evidence of an effect before any dispatch.
pub enum Origin {
    /// A fresh claim: attempt 1 is in flight.
    Claimed {
        /// Fence of attempt 1.
        fence: String,
        /// Lease end of attempt 1.
        lease_until: u64,
    },
    /// verify-first found the effect at the provider: confirmed without a dispatch.
    Verified {
        /// The provider's receipt.
        receipt: Receipt,
    },
    /// A person must approve the first attempt: nothing is granted yet.
    AwaitingApproval,
}

/// What a new record is made from.
pub struct NewRecord {
    /// Scope.
    pub scope: String,
    /// Key.
    pub key: String,
    /// Key source.
    pub key_source: KeySource,
    /// Tool.
    pub tool: String,
    /// Fingerprint.
    pub fingerprint: String,
    /// Dispatch args.
    pub args: String,
    /// Provider key.
    pub provider_key: String,
    /// The id of the secret it was derived with.
    pub key_secret: Option<String>,
    /// Whether the args carry the provider key.
    pub key_in_args: bool,
    /// Owner (the creating host's).
    pub owner: String,
    /// Spend in minor units.
    pub spend: Option<u128>,
    /// Reservation taken in the same write.
    pub reservation: Option<Reservation>,
    /// Why each attempt needs a person's approval, if it does.
    pub approval_reason: Option<String>,
    /// Key superseded.
    pub supersedes: Option<String>,
    /// Policy snapshot.
    pub policy: Policy,
}

impl OpRecord {
    /// A new record: in flight with attempt 1, or confirmed by verify-first evidence.
    pub fn create(new: NewRecord, origin: Origin, now: u64) -> (Self, Event) {
        let mut rec = OpRecord {
            scope: new.scope,
            key: new.key,
            key_source: new.key_source,
            tool: new.tool,
            fingerprint: new.fingerprint,
            args: new.args,
            provider_key: new.provider_key,
            key_secret: new.key_secret,
            key_in_args: new.key_in_args,
            owner: new.owner,
            state: State::InFlight,
            attempts: Vec::new(),
            previous_fences: Vec::new(),
            reported_previous: Vec::new(),
            receipt: None,
            receipt_flaw: None,
            confirmed_by: None,
            confirmed_via: None,
            absence_forced: false,
            error: None,
            unknown_reason: None,
            since: None,
            deadline: None,
            next_check: None,
            checks: 0,
            last_read_position: None,
            escalated: false,
            escalation_acked: false,
            escalation_id: None,
            escalation_failures: 0,
            possible_duplicate: false,
            supersedes: new.supersedes,
            superseded_by: None,
            spend: new.spend.map(|s| s.to_string()),
            reservation: new.reservation,
            approval_reason: new.approval_reason,
            approval: None,
            policy: new.policy,
            replays: 0,
            conflicts: 0,
            created_at: now,
            updated_at: now,
            transitioned_at: now,
        };
        let event = match origin {
            Origin::Claimed { fence, lease_until } => {
                rec.attempts.push(Attempt {
                    n: 1,
                    fence,
                    granted_at: now,
                    lease_until,
                    ended_at: None,
                    outcome: None,
                    owed: false,
                    approval: None,
                });
                Event {
                    kind: "begin",
                    from: None,
                    attempt: Some(1),
                    detail: detail(&[("lease_until", num(lease_until))]),
                }
            }
            Origin::Verified { receipt } => {
                rec.state = State::Confirmed;
                rec.confirmed_via = Some(Confirmation::Provider);
                let detail = rec.store_receipt(receipt);
                Event {
                    kind: "verified-confirmed",
                    from: None,
                    attempt: None,
                    detail,
                }
            }
            Origin::AwaitingApproval => {
                // The reservation, if any, came with the new record.
                let mut event = rec.ask_approval(now, None);
                event.from = None;
                event
            }
        };
        (rec, event)
    }

    /// The current attempt, if any.
    pub fn current(&self) -> Option<&Attempt> {
        self.attempts.last()
    }

    /// The latest moment any attempt could have been sent.
    pub fn last_dispatch(&self) -> Option<u64> {
        self.attempts.iter().map(Attempt::last_dispatch).max()
    }

    /// Whether the current attempt's lease has ended at `now`.
    pub fn lease_ended(&self, now: u64) -> bool {
        self.state == State::InFlight && self.current().is_none_or(|a| now >= a.lease_until)
    }

    /// Whether the attempt budget allows another execute.
    pub fn budget_left(&self) -> bool {
        (self.attempts.len() as u64) < u64::from(self.policy.attempt_budget)
    }

    /// Whether every dispatch carries the provider key to the provider: in the
    /// args, or out of band by the host. A provider cannot claim a key it never saw.
    pub fn key_reaches_provider(&self) -> bool {
        self.key_in_args || self.policy.key_sent_by_host
    }

    /// Whether a request of an attempt whose outcome is not definite (a lost
    /// reply, an expired lease) may have committed, or may still commit,
    /// without the ledger knowing: no provider read after its last dispatch
    /// plus `max_in_flight` (give or take the skew) proved it absent. An
    /// absence proven by the provider's claim on the key (which stops a
    /// second effect, not a late first one) or forced by an operator proves
    /// nothing past that time, and time passing proves nothing either: the
    /// request may have committed before it. An answer says "no effect" only
    /// when this does not hold.
    pub fn late_effect_possible(&self, skew: u64) -> bool {
        self.late_effect_settles_at(skew).is_some()
    }

    /// When [`OpRecord::late_effect_possible`] holds: the time (ledger clock, give or take the
    /// skew) after which none of those requests can still commit. Until then one may; after it,
    /// one may have, unless a read after it finds no effect.
    pub fn late_effect_settles_at(&self, skew: u64) -> Option<u64> {
        self.attempts
            .iter()
            .filter(|a| a.may_have_taken_effect())
            .map(|a| {
                a.last_dispatch()
                    .saturating_add(self.policy.max_in_flight_ms)
                    .saturating_add(skew)
            })
            .filter(|settled_at| self.last_read_position.is_none_or(|read| read <= *settled_at))
            .max()
    }

    /// Whether an escalation the sink has not acknowledged is marked: it
    /// survives every transition and prune until it is acknowledged.
    pub fn escalation_pending(&self) -> bool {
        self.escalated && !self.escalation_acked
    }

    /// Whether the last attempt ended without being sent.
    pub fn last_not_sent(&self) -> bool {
        self.current().is_some_and(|a| a.outcome.as_deref() == Some("not-sent"))
    }

    /// When the attempt after one that was not sent may be granted: the
    /// reconcile interval after it ended, doubled for each not-sent attempt
    /// in a row (at most [`MAX_NOT_SENT_BACKOFF_MS`]). None when the last
    /// attempt was sent (or there is none).
    pub fn retry_at(&self) -> Option<u64> {
        let last = self.current().filter(|_| self.last_not_sent())?;
        let in_a_row = self
            .attempts
            .iter()
            .rev()
            .take_while(|a| a.outcome.as_deref() == Some("not-sent"))
            .count() as u32;
        let interval = self.policy.reconcile_interval_ms;
        let backoff = interval
            .saturating_mul(1u64 << (in_a_row - 1).min(16))
            .min(MAX_NOT_SENT_BACKOFF_MS);
        Some(last.ended_at.unwrap_or(self.updated_at).saturating_add(backoff))
    }

    /// For a derived key, until when identical arguments are this operation.
    pub fn window_until(&self) -> Option<u64> {
        (self.key_source == KeySource::Derived)
            .then(|| self.transitioned_at.saturating_add(self.policy.derived_window_ms))
    }

    /// Whether the attempt with `fence` already reported a success (recorded or flagged).
    pub fn reported_success(&self, fence: &str) -> bool {
        self.attempts
            .iter()
            .any(|a| a.fence == fence && a.outcome.as_deref() == Some("success"))
    }

    /// Whether `fence` is the attempt whose effect the receipt records.
    pub fn confirmed_by_fence(&self, fence: &str) -> bool {
        let n = self.attempts.iter().find(|a| a.fence == fence).map(|a| a.n);
        n.is_some() && n == self.confirmed_by
    }

    /// The summary shown on a conflict.
    pub fn summary(&self) -> RecordSummary {
        RecordSummary {
            key: self.key.clone(),
            tool: self.tool.clone(),
            fingerprint: self.fingerprint.clone(),
            args: self.args.clone(),
            state: self.state,
            created_at: self.created_at,
        }
    }

    /// When the engine next wants to look at this record (sweep or prune).
    pub fn due_at(&self) -> Option<u64> {
        let escalation_redelivery = self.escalation_pending().then(|| {
            let interval = self.policy.reconcile_interval_ms;
            let backoff = interval
                .saturating_mul(1u64 << self.escalation_failures.min(16))
                .min(MAX_REDELIVERY_BACKOFF_MS.max(interval));
            self.updated_at.saturating_add(backoff)
        });
        let pending_deadline = if self.escalated { None } else { self.deadline };
        match self.state {
            State::InFlight => self.current().map(|a| a.lease_until),
            // One never read (begun while no lookup was configured) with nothing
            // else pending is listed by `OWED`-bounded scans, so the sweep of a
            // host that has a lookup now finds it.
            State::Unknown => [self.next_check, pending_deadline, escalation_redelivery]
                .into_iter()
                .flatten()
                .min()
                .or(Some(OWED)),
            // Always listed: an owed dispatch is due now, whatever else is pending.
            State::Absent => [pending_deadline, escalation_redelivery]
                .into_iter()
                .flatten()
                .min()
                .or(Some(OWED)),
            // Due for its escalation (that tells a person), and when the wait for one ends.
            State::AwaitingApproval => [pending_deadline, escalation_redelivery, self.approval_wait_until()]
                .into_iter()
                .flatten()
                .min()
                .or(Some(OWED)),
            State::Confirmed | State::Failed | State::Superseded | State::Denied => {
                let prune_at = self.transitioned_at.saturating_add(self.policy.retention_ms);
                [Some(prune_at), escalation_redelivery].into_iter().flatten().min()
            }
        }
    }

    fn enter(&mut self, state: State, now: u64) -> State {
        let from = self.state;
        self.state = state;
        self.transitioned_at = now;
        from
    }

    fn end_attempt(&mut self, fence: &str, now: u64, outcome: &str) -> Option<u32> {
        let attempt = self.attempts.iter_mut().find(|a| a.fence == fence)?;
        if attempt.ended_at.is_none() {
            attempt.ended_at = Some(now);
            attempt.outcome = Some(outcome.to_string());
        } else if outcome == "success" {
            // Evidence that arrives after the holder's first report is what happened.
            attempt.outcome = Some(outcome.to_string());
        }
        Some(attempt.n)
    }

    /// failed or absent -> in_flight: grant the next attempt.
    pub fn grant(&mut self, fence: String, now: u64, reservation: Option<Reservation>) -> Event {
        let n = self.attempts.len() as u32 + 1;
        let lease_until = now.saturating_add(self.policy.lease_ms);
        let owed = self.state == State::Absent;
        // An approval is for one attempt that may reach the provider.
        let approval = if crate::mutant::on(crate::mutant::Mutant::ApprovalReused) {
            self.approval.clone()
        } else {
            self.approval.take()
        };
        self.attempts.push(Attempt {
            n,
            fence,
            granted_at: now,
            lease_until,
            ended_at: None,
            outcome: None,
            owed,
            approval,
        });
        if reservation.is_some() {
            self.reservation = reservation;
        }
        let from = self.enter(State::InFlight, now);
        self.clear_pending();
        Event {
            kind: if owed { "owed-dispatch" } else { "retry" },
            from: Some(from),
            attempt: Some(n),
            detail: detail(&[("lease_until", num(lease_until))]),
        }
    }

    /// in_flight -> in_flight: the current attempt's lease starts again at
    /// `now`. Only before its grant has left the engine, so nothing of it can
    /// have been sent (see `engine::begin::granted`). None when there is no
    /// attempt in flight.
    pub fn renew_lease(&mut self, now: u64) -> Option<Event> {
        if self.state != State::InFlight {
            return None;
        }
        let lease_until = now.saturating_add(self.policy.lease_ms);
        let attempt = self.attempts.last_mut().filter(|a| a.ended_at.is_none())?;
        attempt.lease_until = lease_until;
        Some(Event {
            kind: "lease-renewed",
            from: Some(State::InFlight),
            attempt: Some(attempt.n),
            detail: detail(&[("lease_until", num(lease_until))]),
        })
    }

    /// -> confirmed with the receipt. `fence` names the attempt that reported it, if any.
    pub fn confirm(&mut self, receipt: Receipt, fence: Option<&str>, now: u64, kind: &'static str) -> Event {
        let attempt = fence.and_then(|f| self.end_attempt(f, now, "success"));
        // Read from the provider: the effect found is the latest dispatch's.
        self.confirmed_by = attempt.or_else(|| self.current().map(|a| a.n));
        self.confirmed_via = Some(match kind {
            "reconciled-confirmed" => Confirmation::Provider,
            "operator-confirmed" => Confirmation::Operator,
            _ => Confirmation::Answer,
        });
        let from = self.enter(State::Confirmed, now);
        let detail = self.store_receipt(receipt);
        self.clear_pending();
        // Nothing more is sent: an approval held for the next attempt is moot.
        self.approval = None;
        Event {
            kind,
            from: Some(from),
            attempt,
            detail,
        }
    }

    /// failed or absent -> confirmed: the provider has the effect of a request the ledger thought
    /// had none (one whose absence was proven before it could last commit). The effect is the
    /// latest attempt's whose outcome was not definite, not a later rejected or unsent one's.
    pub fn confirm_unseen(&mut self, receipt: Receipt, now: u64) -> Event {
        let unseen = self
            .attempts
            .iter()
            .rev()
            .find(|a| a.may_have_taken_effect())
            .map(|a| a.n);
        let event = self.confirm(receipt, None, now, "reconciled-confirmed");
        self.confirmed_by = unseen.or(self.confirmed_by);
        event
    }

    /// Keep `receipt` as the record's, with its flaw if it has one. Returns
    /// the audit detail of the event that stores it: empty for a strict
    /// receipt, else the flaw (the flag an operator sees in the audit trail).
    fn store_receipt(&mut self, receipt: Receipt) -> String {
        let detail = match &receipt.flaw {
            None => "{}".to_string(),
            Some(flaw) => detail(&[("receipt_flaw", flaw_json(flaw))]),
        };
        self.receipt = Some(receipt.text);
        self.receipt_flaw = receipt.flaw;
        detail
    }

    /// A success from an old attempt while a newer one is in flight: keep the
    /// receipt, flag the possible duplicate. The state moves to confirmed.
    /// The escalation is marked in the same write.
    pub fn confirm_possible_duplicate(
        &mut self,
        receipt: Receipt,
        fence: &str,
        escalation_id: String,
        now: u64,
    ) -> Event {
        let fields = receipt.audit_fields();
        let mut event = self.confirm(receipt, Some(fence), now, "late-success-possible-duplicate");
        self.possible_duplicate = true;
        self.escalated = true;
        self.escalation_failures = 0;
        self.escalation_id = Some(escalation_id.clone());
        event.detail = detail_with(&[("escalation_id", string(&escalation_id))], fields);
        event
    }

    /// A success from an attempt other than the one the receipt records, on a
    /// record that already has its effect: a second effect may exist. The
    /// record keeps its receipt; this one is audited, and the escalation is
    /// marked in the same write.
    pub fn flag_second_success(&mut self, receipt: Receipt, fence: &str, escalation_id: String, now: u64) -> Event {
        let attempt = self.end_attempt(fence, now, "success");
        self.possible_duplicate = true;
        self.escalated = true;
        self.escalation_acked = false;
        self.escalation_failures = 0;
        self.escalation_id = Some(escalation_id.clone());
        Event {
            kind: "late-success-possible-duplicate",
            from: Some(self.state),
            attempt,
            detail: detail_with(&[("escalation_id", string(&escalation_id))], receipt.audit_fields()),
        }
    }

    /// A success reported against a superseded record: the effect happened after all.
    /// The escalation is marked in the same write.
    pub fn flag_superseded_effect(&mut self, receipt: Receipt, fence: &str, escalation_id: String, now: u64) -> Event {
        let attempt = self.end_attempt(fence, now, "success");
        let fields = receipt.audit_fields();
        if self.receipt.is_none() {
            self.store_receipt(receipt);
        }
        self.confirmed_by = attempt;
        self.possible_duplicate = true;
        self.escalated = true;
        self.escalation_acked = false;
        self.escalation_failures = 0;
        self.escalation_id = Some(escalation_id.clone());
        Event {
            kind: "late-success-superseded",
            from: Some(self.state),
            attempt,
            detail: detail_with(&[("escalation_id", string(&escalation_id))], fields),
        }
    }

    /// A success from an attempt of the operation this record replaced: audited
    /// with its receipt, escalated; this record's own state does not change.
    pub fn flag_previous_success(&mut self, receipt: Receipt, fence: &str, escalation_id: String) -> Event {
        self.reported_previous.push(fence.to_string());
        self.possible_duplicate = true;
        self.escalated = true;
        self.escalation_acked = false;
        self.escalation_failures = 0;
        self.escalation_id = Some(escalation_id.clone());
        Event {
            kind: "late-success-previous-operation",
            from: Some(self.state),
            attempt: None,
            detail: detail_with(
                &[("escalation_id", string(&escalation_id)), ("fence", string(fence))],
                receipt.audit_fields(),
            ),
        }
    }

    /// in_flight -> failed: the provider answered and did nothing (or the host did not send).
    /// Returns the reservation to release.
    pub fn fail(&mut self, fence: &str, error: Option<String>, now: u64) -> (Event, Option<Reservation>) {
        let outcome = if error.is_some() { "rejected" } else { "not-sent" };
        if error.is_none() {
            self.keep_unsent_approval(fence);
        }
        let attempt = self.end_attempt(fence, now, outcome);
        let from = self.enter(State::Failed, now);
        self.error = error.clone().or_else(|| Some("not sent".to_string()));
        self.clear_pending();
        let kind = if error.is_some() {
            "finish-rejected"
        } else {
            "finish-not-sent"
        };
        (
            Event {
                kind,
                from: Some(from),
                attempt,
                detail: "{}".to_string(),
            },
            self.reservation.take(),
        )
    }

    /// The holder did not send its attempt. Nothing happened: an owed dispatch
    /// is still owed (back to absent, keeping its reservation); any other
    /// attempt ends failed, without counting as an effect. Returns the
    /// reservation to release.
    pub fn not_sent(&mut self, fence: &str, now: u64) -> (Event, Option<Reservation>) {
        let owed = self.attempts.iter().any(|a| a.fence == fence && a.owed);
        if !owed {
            return self.fail(fence, None, now);
        }
        self.keep_unsent_approval(fence);
        let attempt = self.end_attempt(fence, now, "not-sent");
        let from = self.owe_dispatch(now);
        (
            Event {
                kind: "finish-not-sent",
                from: Some(from),
                attempt,
                detail: detail(&[("still_owed", "true".to_string())]),
            },
            None,
        )
    }

    /// in_flight -> unknown: the holder reported an ambiguous outcome.
    pub fn ambiguous(&mut self, fence: &str, reason: String, now: u64) -> Event {
        let attempt = self.end_attempt(fence, now, "ambiguous");
        let event_detail = detail(&[("reason", string(&reason))]);
        self.become_unknown(reason, now, now);
        Event {
            kind: "finish-ambiguous",
            from: Some(State::InFlight),
            attempt,
            detail: event_detail,
        }
    }

    /// in_flight -> unknown: the lease ended without a `finish`.
    pub fn expire_lease(&mut self, now: u64) -> Event {
        let attempt = self.current().map(|a| (a.n, a.lease_until));
        let since = attempt.map_or(now, |(_, until)| until);
        self.become_unknown("lease expired without a reported outcome".to_string(), since, now);
        Event {
            kind: "lease-expired",
            from: Some(State::InFlight),
            attempt: attempt.map(|a| a.0),
            detail: "{}".to_string(),
        }
    }

    fn become_unknown(&mut self, reason: String, since: u64, now: u64) {
        self.enter(State::Unknown, now);
        self.unknown_reason = Some(reason);
        self.since = Some(since);
        self.deadline = Some(since.saturating_add(self.policy.resolve_deadline_ms));
        // Without a lookup nothing reads it: only the deadline is due.
        self.next_check = self.policy.lookup.then_some(now);
        self.checks = 0;
        self.drop_deadline_escalation();
    }

    /// A new unknown or absent spell gets a deadline of its own; a pending
    /// possible-duplicate escalation is kept.
    fn drop_deadline_escalation(&mut self) {
        if self.possible_duplicate
            && self.escalation_pending()
            && !crate::mutant::on(crate::mutant::Mutant::DropEscalationOnTransition)
        {
            return;
        }
        self.escalated = false;
        self.escalation_acked = false;
        self.escalation_id = None;
    }

    /// unknown -> absent: no effect, and none can arrive late. A dispatch is owed.
    pub fn prove_absent(&mut self, read_position: u64, now: u64, kind: &'static str) -> Event {
        let from = self.enter(State::Absent, now);
        self.last_read_position = Some(read_position);
        self.since = Some(now);
        self.deadline = Some(now.saturating_add(self.policy.resolve_deadline_ms));
        self.next_check = None;
        self.drop_deadline_escalation();
        Event {
            kind,
            from: Some(from),
            attempt: None,
            detail: detail(&[("read_position", num(read_position))]),
        }
    }

    /// failed or absent stays so: a provider read after every earlier request's last chance to
    /// commit found no effect, so none can arrive late ([`OpRecord::late_effect_possible`] no longer holds).
    pub fn absence_read(&mut self, read_position: u64) -> Event {
        self.last_read_position = Some(read_position);
        Event {
            kind: "read-absent",
            from: Some(self.state),
            attempt: None,
            detail: detail(&[("read_position", num(read_position))]),
        }
    }

    /// unknown stays unknown: a provider read did not settle it. Records when to read again.
    pub fn still_unknown(&mut self, why: &str, read_position: Option<u64>, next_check: u64) -> Event {
        self.checks = self.checks.saturating_add(1);
        self.next_check = Some(next_check);
        if read_position.is_some() {
            self.last_read_position = read_position;
        }
        let mut fields = alloc::vec![("why", string(why)), ("next_check", num(next_check))];
        if let Some(rp) = read_position {
            fields.push(("read_position", num(rp)));
        }
        Event {
            kind: "reconcile-inconclusive",
            from: Some(State::Unknown),
            attempt: None,
            detail: detail(&fields),
        }
    }

    /// unknown stays unknown, unread: the host reads through another provider account than this
    /// record's, so no read of its could settle it. No read is scheduled here: a host on the record's
    /// own account reads it (as a host with a new lookup reads one never read), and its deadline
    /// escalates it to an operator meanwhile.
    pub fn await_own_account(&mut self, why: &str) -> Event {
        self.next_check = None;
        Event {
            kind: "reconcile-inconclusive",
            from: Some(State::Unknown),
            attempt: None,
            detail: detail(&[("why", string(why))]),
        }
    }

    /// failed or absent -> superseded by a successor; returns the reservation to release.
    pub fn supersede(&mut self, by: &str, now: u64) -> (Event, Option<Reservation>) {
        let from = self.enter(State::Superseded, now);
        self.superseded_by = Some(by.to_string());
        self.clear_pending();
        (
            Event {
                kind: "superseded",
                from: Some(from),
                attempt: None,
                detail: detail(&[("by", string(by))]),
            },
            self.reservation.take(),
        )
    }

    /// A confirmed original gets a successor that acknowledged it: lineage only, no state change.
    pub fn link_successor(&mut self, by: &str) -> Event {
        self.superseded_by = Some(by.to_string());
        Event {
            kind: "succeeded-by",
            from: Some(self.state),
            attempt: None,
            detail: detail(&[("by", string(by))]),
        }
    }

    /// Mark the deadline passed and escalated (same write), with the escalation's id.
    pub fn escalate(&mut self, id: String, reason: &str) -> Event {
        self.escalated = true;
        self.escalation_acked = false;
        self.escalation_failures = 0;
        self.escalation_id = Some(id.clone());
        Event {
            kind: "escalated",
            from: Some(self.state),
            attempt: None,
            detail: detail(&[("id", string(&id)), ("reason", string(reason))]),
        }
    }

    /// The sink acknowledged the escalation.
    pub fn acknowledge_escalation(&mut self) -> Event {
        self.escalation_acked = true;
        self.escalation_failures = 0;
        Event {
            kind: "escalation-acknowledged",
            from: Some(self.state),
            attempt: None,
            detail: "{}".to_string(),
        }
    }

    /// The sink did not acknowledge the escalation: the next delivery waits longer.
    pub fn escalation_refused(&mut self) -> Event {
        self.escalation_failures = self.escalation_failures.saturating_add(1);
        Event {
            kind: "escalation-refused",
            from: Some(self.state),
            attempt: None,
            detail: detail(&[("failures", num(u64::from(self.escalation_failures)))]),
        }
    }

    /// A repeat of a confirmed operation was answered from the receipt.
    pub fn note_replay(&mut self) -> Event {
        self.replays = self.replays.saturating_add(1);
        Event {
            kind: "replay",
            from: Some(self.state),
            attempt: None,
            detail: "{}".to_string(),
        }
    }

    /// A call with the same key and a different payload was refused.
    pub fn note_conflict(&mut self, tool: &str, fingerprint: &str) -> Event {
        self.conflicts = self.conflicts.saturating_add(1);
        Event {
            kind: "conflict",
            from: Some(self.state),
            attempt: None,
            detail: detail(&[("tool", string(tool)), ("fingerprint", string(fingerprint))]),
        }
    }

    /// The approval an attempt that was not sent was granted on is not used
    /// up: nothing reached the provider, so the next attempt may use it (while
    /// it is valid). Only the holder's own first report says "not sent".
    fn keep_unsent_approval(&mut self, fence: &str) {
        if let Some(a) = self
            .attempts
            .iter_mut()
            .find(|a| a.fence == fence && a.ended_at.is_none())
            && let Some(approval) = a.approval.take()
        {
            self.approval = Some(approval);
        }
    }

    /// Whether a host that sends and reads the tool through `account` (its
    /// `provider-account`, if it names one) goes through another provider
    /// account than the one this record was begun under. A record that names
    /// none binds no account; one that does is another account's for a host
    /// that names none, since nothing says they are the same.
    pub fn other_account(&self, account: Option<&str>) -> bool {
        self.policy
            .provider_account
            .as_deref()
            .is_some_and(|mine| Some(mine) != account)
    }

    /// Whether an attempt may be granted now as far as the tool's `approval`
    /// rule goes: none is needed, or an approval of this exact payload is held
    /// and still valid at `now`.
    pub fn approved_for_dispatch(&self, now: u64) -> bool {
        if self.approval_reason.is_none() || crate::mutant::on(crate::mutant::Mutant::NoApprovalGate) {
            return true;
        }
        self.approval.as_ref().is_some_and(|a| {
            a.fingerprint == self.fingerprint
                && (now < a.valid_until || crate::mutant::on(crate::mutant::Mutant::ApprovalNeverExpires))
        })
    }

    /// created, failed or absent -> awaiting_approval: a person must approve the
    /// next attempt. `reservation`: the spend reserved for it in the same write,
    /// if it held none. An expired approval is dropped; the deadline is now, so
    /// the next sweep escalates to the operator (that is how a person hears of it).
    pub fn ask_approval(&mut self, now: u64, reservation: Option<Reservation>) -> Event {
        if reservation.is_some() {
            self.reservation = reservation;
        }
        let expired = self.approval.take();
        let from = self.enter(State::AwaitingApproval, now);
        self.clear_pending();
        self.since = Some(now);
        self.deadline = Some(now);
        let mut fields = alloc::vec![("reason", string(self.approval_reason.as_deref().unwrap_or_default()))];
        if let Some(a) = expired {
            fields.push(("expired_approval_at", num(a.at)));
        }
        Event {
            kind: "approval-asked",
            from: Some(from),
            attempt: None,
            detail: detail(&fields),
        }
    }

    /// awaiting_approval -> absent: a person approved this payload; the next
    /// attempt is owed and may be sent on it until `now` plus the tool's
    /// `approval_valid_ms`.
    pub fn approve(&mut self, note: &str, now: u64) -> Event {
        let valid_until = now.saturating_add(self.policy.approval_valid_ms);
        self.approval = Some(Approval {
            note: note.to_string(),
            fingerprint: self.fingerprint.clone(),
            at: now,
            valid_until,
        });
        let from = self.owe_dispatch(now);
        Event {
            kind: "approved",
            from: Some(from),
            attempt: None,
            detail: detail(&[
                ("note", string(note)),
                ("fingerprint", string(&self.fingerprint)),
                ("valid_until", num(valid_until)),
            ]),
        }
    }

    /// Until when an awaiting record waits for a person: past it, nobody having approved, it is denied.
    pub fn approval_wait_until(&self) -> Option<u64> {
        (self.state == State::AwaitingApproval).then(|| {
            self.since
                .unwrap_or(self.transitioned_at)
                .saturating_add(self.policy.approval_wait_ms)
        })
    }

    /// awaiting_approval -> denied: nobody approved it within the tool's
    /// `approval_wait_ms`. Returns the reservation to release.
    pub fn expire_approval_wait(&mut self, now: u64) -> (Event, Option<Reservation>) {
        let waited = self.policy.approval_wait_ms;
        let why = alloc::format!("nobody approved it within {waited} ms");
        self.end_denied(why, "approval-expired", detail(&[("waited_ms", num(waited))]), now)
    }

    /// awaiting_approval -> denied: a person refused; nothing more is sent.
    /// Returns the reservation to release.
    pub fn deny(&mut self, note: &str, now: u64) -> (Event, Option<Reservation>) {
        let why = alloc::format!("a person denied it: {note}");
        self.end_denied(why, "denied", detail(&[("note", string(note))]), now)
    }

    /// -> denied, saying why (the record's `error`); returns the reservation to release.
    fn end_denied(
        &mut self,
        why: String,
        kind: &'static str,
        detail: String,
        now: u64,
    ) -> (Event, Option<Reservation>) {
        let from = self.enter(State::Denied, now);
        self.clear_pending();
        self.error = Some(why);
        let event = Event {
            kind,
            from: Some(from),
            attempt: None,
            detail,
        };
        (event, self.reservation.take())
    }

    /// -> absent with a dispatch owed from `now` (escalated at the resolve deadline if nobody takes it).
    /// Returns the state before.
    fn owe_dispatch(&mut self, now: u64) -> State {
        let from = self.enter(State::Absent, now);
        self.clear_pending();
        self.since = Some(now);
        self.deadline = Some(now.saturating_add(self.policy.resolve_deadline_ms));
        from
    }

    fn clear_pending(&mut self) {
        self.next_check = None;
        self.deadline = None;
        self.unknown_reason = None;
        // A possible duplicate the sink has not acknowledged stays escalated until it is:
        // a transition never drops it (DESIGN.md "Background work always makes progress").
        if self.possible_duplicate
            && self.escalation_pending()
            && !crate::mutant::on(crate::mutant::Mutant::DropEscalationOnTransition)
        {
            return;
        }
        self.escalated = false;
        self.escalation_acked = false;
        self.escalation_id = None;
    }
}

/// Serde: a false flag is left out of a row body (absent reads as false).
pub(crate) fn is_false(flag: &bool) -> bool {
    !*flag
}

/// Serde: a zero count is left out of a row body (absent reads as zero).
fn is_zero(count: &u32) -> bool {
    *count == 0
}

fn default_owner() -> String {
    "default".to_string()
}

/// A tiny JSON object writer for event details (values already JSON).
pub fn detail(fields: &[(&str, String)]) -> String {
    let mut members: Vec<&(&str, String)> = fields.iter().collect();
    members.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::from("{");
    for (i, (name, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&string(name));
        out.push(':');
        out.push_str(value);
    }
    out.push('}');
    out
}

/// [`detail`] of `fields` and `more` together.
fn detail_with(fields: &[(&str, String)], more: Vec<(&'static str, String)>) -> String {
    let mut all: Vec<(&str, String)> = fields.to_vec();
    all.extend(more);
    detail(&all)
}

/// A number as JSON text.
pub fn num(n: u64) -> String {
    n.to_string()
}

/// A string as JSON text.
pub fn string(s: &str) -> String {
    let mut out = String::new();
    crate::canon::write_canonical(&crate::canon::Value::String(s.to_string()), &mut out);
    out
}
