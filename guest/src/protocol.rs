//! The call protocol: after every answer, what the host does next.
//!
//! A host starts a call, then follows steps until one is `done`: it sends a
//! `dispatch` grant and `report`s what happened, or sleeps until a `wait`'s
//! time and `resume`s (or stops there and shows the wait's `meanwhile`
//! account). Every decision — retry after "not sent", reconcile after a lost
//! reply, take a holder's outcome, what a caller may do next — is made here,
//! from the engine's single transitions, so every host's loop is the same
//! few lines and no host ever reads a record's state.

use crate::config::Config;
use crate::engine::{
    self, BeginRequest, ReadWhen, await_loaded, begin_keyed, confirmed_info, finish_with_record, load_awaited,
    reconcile, rejected_info,
};
use crate::host::Host;
use crate::mutant::{self, Mutant};
use crate::record::OpRecord;
use crate::types::{
    Account, Awaited, BlockReason, Blocked, Call, Confirmation, Decision, Effect, Ending, Error, Evidence, FinishAck,
    InFlightInfo, KeySource, NotSentInfo, Outcome, Reading, Repeat, State, Step, SweepResult, UnrecordedInfo,
    WaitReason, Waiting,
};
use alloc::string::String;
use alloc::vec::Vec;

/// How soon a call waiting for another attempt's holder asks again.
pub const HOLDER_POLL_MS: u64 = 50;

/// The `start` export: a protected call, as its tool's configured policy says.
pub fn start(h: &impl Host, config: &Config, call: Call) -> Result<Step, Error> {
    start_request(h, config.request(call))
}

/// [`start`] with the policy already attached (native tests, tools).
pub fn start_request(h: &impl Host, request: BeginRequest) -> Result<Step, Error> {
    stepped(h, None, || started(h, request))
}

/// The `read-back` export: go on after a `read` step with what the read found. `request`: the
/// call `start` was deciding (none after `report` or `resume`). The decision is made again from
/// the ledger as it is now, and takes `evidence` where it needs the same read ([`crate::reads`]).
pub fn read_back(
    h: &impl Host,
    request: Option<BeginRequest>,
    reading: Reading,
    evidence: Evidence,
) -> Result<Step, Error> {
    if h.reads().is_none() {
        return Err(Error::InvalidRequest(
            "read-back: this instance reads the provider through its provider.lookup import \
             (configuration reads: import), so no step asked for a read"
                .into(),
        ));
    }
    let (scope, key) = (reading.scope.clone(), reading.key.clone());
    stepped(h, Some((reading, evidence)), || match request {
        Some(request) => started(h, request),
        None => resumed(h, &scope, &key),
    })
}

/// Run one protocol export: with reads as steps, a decision that stopped for a provider read
/// (it wrote nothing on the read's strength, and its own answer is void) is answered `read`.
fn stepped(
    h: &impl Host,
    brought: Option<(Reading, Evidence)>,
    export: impl FnOnce() -> Result<Step, Error>,
) -> Result<Step, Error> {
    let Some(reads) = h.reads() else {
        return export();
    };
    reads.arm(brought);
    let answer = export();
    match reads.needed() {
        Some(reading) => Ok(Step::Read(reading)),
        None => answer,
    }
}

fn started(h: &impl Host, request: BeginRequest) -> Result<Step, Error> {
    let (scope, tool) = (request.scope.clone(), request.tool.clone());
    let begun = begin_keyed(h, request)?;
    let call = CallRef {
        scope: &scope,
        tool,
        key: begun.key,
        skew: h.settings().clock_skew_ms,
        known: begun.effect,
    };
    call.follow(h, begun.decision, true)
}

/// The `report` export: what the provider answered to a dispatched grant.
pub fn report(h: &impl Host, scope: &str, key: &str, fence: &str, outcome: Outcome) -> Result<Step, Error> {
    stepped(h, None, || reported(h, scope, key, fence, outcome))
}

fn reported(h: &impl Host, scope: &str, key: &str, fence: &str, outcome: Outcome) -> Result<Step, Error> {
    // A success is recorded whatever its response's form (`finish` stores one that is
    // not strict I-JSON as it came, flagged): the effect happened.
    let (ack, rec) = finish_with_record(h, scope, key, fence, outcome.clone())?;
    let call = CallRef::of(h, scope, key, rec.as_ref());
    match (outcome, ack) {
        // The effect happened; the ledger could not record it yet: reconciliation will find it.
        (Outcome::Success(response), FinishAck::Unrecorded) => {
            Ok(call.done(Ending::Unrecorded(UnrecordedInfo { response }), rec.as_ref()))
        }
        // This call's own answer is its receipt, whatever else the record knows.
        (Outcome::Success(response), _) => {
            let rec = rec.ok_or(Error::NotFound)?;
            let ending = Ending::Confirmed(own_success(&rec, fence, response, rec.updated_at));
            Ok(call.done(ending, Some(&rec)))
        }
        // A rejection is reported only once the ledger holds it.
        (Outcome::Rejected(_), FinishAck::Recorded(State::Failed)) => {
            let rec = rec.ok_or(Error::NotFound)?;
            Ok(call.done(Ending::Rejected(rejected_info(&rec)), Some(&rec)))
        }
        // Not recorded: the record is as it was, in flight under this attempt's lease.
        (_, FinishAck::Unrecorded) => {
            let lease_until = rec
                .as_ref()
                .and_then(|r| r.attempts.iter().find(|a| a.fence == fence))
                .map_or_else(|| h.now(), |a| a.lease_until);
            Ok(call.wait_for_holder(h.now(), InFlightInfo { lease_until }, rec.as_ref()))
        }
        // Nothing sent: the next attempt backs off.
        (Outcome::NotSent, _) if let Some(wait) = rec.as_ref().and_then(|r| call.back_off(h, r)) => Ok(wait),
        // A lost reply, nothing sent, or a rejection after the record moved on: the record says what is next.
        _ => resumed(h, scope, key),
    }
}

/// The `resume` export: go on after a wait, or with an operation from the
/// ledger (after a crash). A waiter takes the holder's outcome; it never
/// starts an attempt while a holder's lease is live; an unknown record's
/// provider is read only when its next read is due.
pub fn resume(h: &impl Host, scope: &str, key: &str) -> Result<Step, Error> {
    stepped(h, None, || resumed(h, scope, key))
}

fn resumed(h: &impl Host, scope: &str, key: &str) -> Result<Step, Error> {
    let loaded = load_awaited(h, scope, key)?;
    // The attempt after one that was not sent is granted when its back-off is over, not earlier.
    if let Some(wait) = CallRef::of(h, scope, key, Some(&loaded.rec)).back_off(h, &loaded.rec) {
        return Ok(wait);
    }
    // A read happens when one is due: a caller asking early (or often) gets the same wait.
    let (awaited, rec) = await_loaded(h, scope, key, loaded, ReadWhen::Due)?;
    let call = CallRef::of(h, scope, key, Some(&rec));
    match awaited {
        Awaited::Pending(holder) => Ok(call.wait_for_holder(h.now(), holder, Some(&rec))),
        Awaited::Rejected(rejected) => Ok(call.done(Ending::Rejected(rejected), Some(&rec))),
        // `reconcile` has just read the provider if the record was unknown.
        Awaited::Decided(decision) => call.follow(h, decision, false),
    }
}

/// The `sweep` export: the engine's background work. With `dispatch` (a host
/// that sends, e.g. a gateway's worker) every owed dispatch is granted and
/// comes back as a grant to send and report; without it (an operator's
/// sweep, which cannot send) owed dispatches are only listed, so no attempt
/// is spent on them.
///
/// With reads as steps ([`crate::reads`]) it reads no provider: the due reads are listed
/// (`reads`), and a host that reads resumes each.
pub fn sweep(h: &impl Host, limit: u32, dispatch: bool) -> Result<SweepResult, Error> {
    if let Some(reads) = h.reads() {
        reads.arm(None);
    }
    let report = engine::sweep(h, limit);
    if let Some(reads) = h.reads() {
        // Each deferred read is listed in the report; none is this export's answer.
        reads.needed();
    }
    let report = report?;
    let mut result = SweepResult {
        expired: report.expired,
        reconciled: report.reconciled,
        confirmed: report.confirmed,
        escalated: report.escalated,
        owed: Vec::new(),
        dispatches: Vec::new(),
        reads: report.reads,
    };
    for (scope, key) in report.owed {
        if !dispatch {
            result.owed.push((scope, key));
            continue;
        }
        // One whose last attempt was not sent waits out its back-off: listed, not granted.
        if let Ok(Some(loaded)) = crate::store::load(h, &scope, &key)
            && backing_off_until(h, &loaded.rec).is_some()
        {
            result.owed.push((scope, key));
            continue;
        }
        // Someone else may take it first; then it is theirs to send.
        let decided = reconcile(h, &scope, &key);
        // It became unknown meanwhile, and its read is the host's (reads as steps).
        if h.reads().and_then(|reads| reads.needed()).is_some() {
            result.reads.push((scope, key));
            continue;
        }
        match decided {
            Ok(Decision::Execute(grant)) => result.dispatches.push(grant),
            Ok(_) | Err(Error::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(result)
}

/// The call a step is about: scope, tool and (once settled) its key.
struct CallRef<'a> {
    scope: &'a str,
    tool: String,
    key: Option<(String, KeySource)>,
    /// The declared skew: whether an earlier request may have committed unseen depends on it.
    skew: u64,
    /// What the ledger knows of the key's effect where the decision alone
    /// does not say (an expired key's tombstone).
    known: Option<Effect>,
}

impl<'a> CallRef<'a> {
    fn of(h: &impl Host, scope: &'a str, key: &str, rec: Option<&OpRecord>) -> CallRef<'a> {
        CallRef {
            scope,
            tool: rec.map_or_else(String::new, |r| r.tool.clone()),
            key: Some((key.into(), rec.map_or(KeySource::Application, |r| r.key_source))),
            skew: h.settings().clock_skew_ms,
            known: None,
        }
    }

    /// The step for a single transition's decision. `may_read`: an unknown
    /// record whose read is due is read now (once per step).
    fn follow(&self, h: &impl Host, decision: Decision, may_read: bool) -> Result<Step, Error> {
        Ok(match decision {
            Decision::Execute(grant) => Step::Dispatch(grant),
            Decision::Direct => Step::Direct,
            Decision::Replay(info) => self.done(Ending::Confirmed(info), None),
            Decision::Conflict(summary) => self.done(Ending::Conflict(summary), None),
            Decision::InFlight(holder) => self.wait_for_holder(h.now(), holder, None),
            Decision::Unknown(unknown) => {
                let now = h.now();
                match unknown.next_read {
                    Some(at) if at <= now && may_read => {
                        let (scope, key) = (self.scope, self.key_str());
                        return self.follow(h, reconcile(h, scope, key)?, false);
                    }
                    // Due later; or due already, though this step has read (one read per step):
                    // on a slow host the next read can come due before the step ends, and the
                    // caller then resumes at once and reads (it used to be told "unknown" and stop,
                    // its effect never sent: the study's never-retry agent omitted the refund).
                    // Only if its resume would read: another owner's record is not this host's to.
                    Some(at) if at > now || engine::reads_when_due(h, self.scope, self.key_str()) => {
                        let until = at.max(now);
                        Step::Wait(Waiting {
                            scope: self.scope.into(),
                            key: self.key_str().into(),
                            next: until,
                            until,
                            reason: WaitReason::Reconciliation,
                            meanwhile: self.account(Ending::Unknown(unknown), None),
                        })
                    }
                    _ => self.done(Ending::Unknown(unknown), None),
                }
            }
            // An owed redispatch awaiting approval may follow an attempt whose effect can still
            // arrive (an operator forced its absence): the answer reads the record, as a denial's does.
            Decision::AwaitingApproval(info) => {
                let rec = crate::store::load(h, self.scope, self.key_str()).map_err(|e| Error::Storage(e.message()))?;
                self.done(Ending::AwaitsApproval(info), rec.as_ref().map(|l| &l.rec))
            }
            Decision::Blocked(b) if b.reason == BlockReason::AttemptBudget => self.spent(h, b)?,
            // A superseded record may still hold an attempt whose effect can arrive (its absence
            // forced, or proven only by a claim), and another owner's may owe a dispatch that owner
            // will send: their answers read the record.
            // A record that cannot be read is no answer (its effect is not known): the ledger's error.
            Decision::Blocked(b)
                if matches!(
                    b.reason,
                    BlockReason::Superseded
                        | BlockReason::OtherOwner
                        | BlockReason::OtherAccount
                        | BlockReason::ApprovalDenied
                ) =>
            {
                let rec = crate::store::load(h, self.scope, self.key_str()).map_err(|e| Error::Storage(e.message()))?;
                self.done(Ending::Blocked(b), rec.as_ref().map(|l| &l.rec))
            }
            Decision::Blocked(b) => self.done(Ending::Blocked(b), None),
        })
    }

    /// A spent budget: "not sent" when no attempt was ever sent.
    fn spent(&self, h: &impl Host, b: Blocked) -> Result<Step, Error> {
        let loaded = crate::store::load(h, self.scope, self.key_str()).map_err(|e| Error::Storage(e.message()))?;
        Ok(match loaded {
            Some(l)
                if !l.rec.attempts.is_empty()
                    && l.rec.attempts.iter().all(|a| a.outcome.as_deref() == Some("not-sent")) =>
            {
                let attempts = l.rec.attempts.len() as u32;
                self.done(Ending::NotSent(NotSentInfo { attempts }), Some(&l.rec))
            }
            Some(l) => self.done(Ending::Blocked(b), Some(&l.rec)),
            None => self.done(Ending::Blocked(b), None),
        })
    }

    fn key_str(&self) -> &str {
        self.key.as_ref().map_or("", |(k, _)| k.as_str())
    }

    /// The wait before the attempt after one that was not sent, while its
    /// back-off lasts; none when the next attempt may be granted now (or
    /// there is none to grant: the budget is spent, or the record moved on).
    fn back_off(&self, h: &impl Host, rec: &OpRecord) -> Option<Step> {
        // Another owner's record is refused by the engine, not waited for.
        let grantable = matches!(rec.state, State::Failed | State::Absent)
            && rec.owner == h.settings().owner
            && !engine::other_account_here(h, rec);
        if !grantable || !rec.budget_left() {
            return None;
        }
        let at = backing_off_until(h, rec)?;
        let attempts = rec.attempts.len() as u32;
        let mut meanwhile = self.account(Ending::NotSent(NotSentInfo { attempts }), Some(rec));
        // Nothing was sent and the same call goes on after the back-off.
        meanwhile.repeat = Repeat::Retries;
        Some(Step::Wait(Waiting {
            scope: self.scope.into(),
            key: self.key_str().into(),
            next: at,
            until: at,
            reason: WaitReason::Retry,
            meanwhile,
        }))
    }

    /// Wait for a holder: its outcome may come any time before its lease ends, so ask often.
    fn wait_for_holder(&self, now: u64, holder: InFlightInfo, rec: Option<&OpRecord>) -> Step {
        Step::Wait(Waiting {
            scope: self.scope.into(),
            key: self.key_str().into(),
            next: now.saturating_add(HOLDER_POLL_MS).min(holder.lease_until),
            until: holder.lease_until,
            reason: WaitReason::Holder,
            meanwhile: self.account(Ending::InFlight(holder), rec),
        })
    }

    fn done(&self, ending: Ending, rec: Option<&OpRecord>) -> Step {
        Step::Done(self.account(ending, rec))
    }

    /// The facts a caller is shown: did it happen, and what the same call again would do.
    fn account(&self, ending: Ending, rec: Option<&OpRecord>) -> Account {
        let (mut effect, mut repeat) = match &ending {
            Ending::Confirmed(_) => (Effect::Happened, Repeat::Replays),
            Ending::Unrecorded(_) => (Effect::Happened, Repeat::Waits),
            Ending::Rejected(_) if rec.is_some_and(OpRecord::budget_left) => (Effect::None, Repeat::Retries),
            Ending::Rejected(_) | Ending::NotSent(_) | Ending::Conflict(_) => (Effect::None, Repeat::Refused),
            Ending::Unknown(_) | Ending::InFlight(_) => (Effect::Unknown, Repeat::Waits),
            // Nothing is sent until a person decides; that decision is the same call's answer.
            Ending::AwaitsApproval(_) => (Effect::None, Repeat::Waits),
            Ending::Blocked(b) => (
                match b.reason {
                    // The ledger failed (perhaps after applying the write), or the provider could not
                    // tell: nothing is known of an effect, so none is claimed either way.
                    BlockReason::Storage | BlockReason::Unverified => Effect::Unknown,
                    _ => Effect::None,
                },
                match b.reason {
                    // Nothing was recorded, or nothing could be verified: the same call tries again.
                    BlockReason::Storage | BlockReason::Unverified => Repeat::Retries,
                    BlockReason::SupersededUnresolved => Repeat::Waits,
                    _ => Repeat::Refused,
                },
            ),
        };
        match &ending {
            // A superseded record that stored a late receipt: its effect happened after all.
            Ending::Blocked(b) if b.reason == BlockReason::Superseded && b.receipt.is_some() => {
                effect = Effect::Happened;
            }
            // Another account's operation: not this call's to answer, but its effect is what the
            // record knows of it (a confirmed refund is never "none").
            Ending::Blocked(b) if b.reason == BlockReason::OtherAccount => {
                effect = match rec {
                    Some(r) if r.state == State::Confirmed || r.receipt.is_some() => Effect::Happened,
                    Some(r) if matches!(r.state, State::Unknown | State::InFlight) => Effect::Unknown,
                    // Its own account's hosts may still send it: a dispatch owed, a person's approval asked
                    // for, or a retry after an attempt that was not sent.
                    Some(r)
                        if r.budget_left()
                            && (matches!(r.state, State::Absent | State::AwaitingApproval)
                                || (r.state == State::Failed && r.last_not_sent())) =>
                    {
                        Effect::Unknown
                    }
                    Some(_) => Effect::None,
                    // No record of this key: the call was a successor refused another account's original,
                    // and did nothing.
                    None => Effect::None,
                };
            }
            // A pruned key: its tombstone keeps whether the effect happened.
            Ending::Blocked(b) if b.reason == BlockReason::Expired => {
                effect = self.known.unwrap_or(effect);
            }
            // Another owner owes this dispatch and sends it: the effect is coming, not absent, and
            // its outcome is this call's answer (a new key would be a second operation).
            Ending::Blocked(b)
                if b.reason == BlockReason::OtherOwner
                    && rec.is_some_and(|r| r.state == State::Absent && r.budget_left())
                    && !mutant::on(Mutant::OtherOwnersOwedSaysNone) =>
            {
                (effect, repeat) = (Effect::Unknown, Repeat::Waits);
            }
            _ => {}
        }
        // "None" only when no earlier request can still commit.
        if effect == Effect::None && rec.is_some_and(|r| r.late_effect_possible(self.skew)) {
            effect = Effect::Unknown;
        }
        Account {
            scope: self.scope.into(),
            key: self.key.as_ref().map(|(k, _)| k.clone()),
            key_source: self.key.as_ref().map(|(_, s)| *s),
            tool: self.tool.clone(),
            awaits_operator: awaits_operator(&ending),
            ending,
            effect,
            repeat,
        }
    }
}

/// Whether nothing but an operator can settle a call that ended so, now (the
/// account's `awaits-operator`). Only an unknown outcome with no read of the
/// provider scheduled: the engine names no next read when no lookup can be
/// made for the tool (`unknown_info`, and `begin` names one again for a record
/// of this owner once its host has a lookup). Every other ending either is
/// settled or is settled without a person: a holder reports or its lease ends,
/// a due read runs (this owner's, or another owner's that is not this host's to
/// run), a not-sent call retries, an unrecorded success waits for its lease to
/// end (no operator may resolve it before). A call refused behind an unresolved
/// original it supersedes waits on that original: the original's own account
/// says whether it awaits an operator.
fn awaits_operator(ending: &Ending) -> bool {
    matches!(ending, Ending::Unknown(u) if u.next_read.is_none()) || matches!(ending, Ending::AwaitsApproval(_))
}

/// Until when `rec`'s next attempt waits out the back-off of a not-sent one,
/// by the ledger's clock (never earlier than the record's own last write);
/// none once it may be granted.
fn backing_off_until(h: &impl Host, rec: &OpRecord) -> Option<u64> {
    if mutant::on(Mutant::NotSentRetriesAtOnce) {
        return None;
    }
    let now = h.now().max(rec.updated_at);
    rec.retry_at().filter(|&at| at > now)
}

/// A success this call's own attempt reported: its answer is the receipt it is
/// shown. If the record already held another attempt's effect, it says so.
fn own_success(rec: &OpRecord, fence: &str, response: String, reported_at: u64) -> crate::types::ConfirmedInfo {
    let mine = rec.attempts.iter().find(|a| a.fence == fence).map(|a| a.n);
    let mut info = confirmed_info(rec, None);
    if info.attempt != mine || rec.state != State::Confirmed {
        info.at = reported_at;
    }
    info.receipt = response;
    info.attempt = mine;
    info.confirmed_by = Confirmation::Answer;
    info
}
