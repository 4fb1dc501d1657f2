//! `begin`: claim a protected call before dispatch, or answer without one.

use alloc::format;
use alloc::string::{String, ToString};

use super::{Races, account, now_for, witness};
use crate::host::Host;
use crate::identity::{derived_key, fence, provider_key, resolve_carriers};
use crate::input::{check_name, check_new_name};
use crate::mutant::{self, Mutant};
use crate::payload::Payload;
use crate::policy::{Policy, Quota, Routing, check_policy, route};
use crate::record::{NewRecord, OpRecord, Origin, string};
use crate::secret::key_secret;
use crate::store::{LedgerError, Loaded, Reserved, Tx, load, load_tombstone};
use crate::types::{
    ApprovalInfo, BlockReason, Blocked, Confirmation, ConfirmedInfo, Decision, Effect, Error, Evidence, Grant,
    IdentityMode, InFlightInfo, KeySource, ReplayVia, State, Table, ToolDescriptor, UnknownInfo,
};

/// One protected call with its tool's policy, as `begin` decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginRequest {
    /// Tenant / agent / conversation namespace.
    pub scope: String,
    /// Operation keys from every application-controlled carrier (name, key); all must agree.
    pub keys: alloc::vec::Vec<(String, String)>,
    /// Tool name.
    pub tool: String,
    /// Tool args as JSON text.
    pub args: String,
    /// The tool's policy.
    pub policy: Policy,
    /// The tool's advertised definition, if known (routing, pinning).
    pub descriptor: Option<ToolDescriptor>,
    /// A key in the same scope that this operation replaces.
    pub supersedes: Option<String>,
    /// Proceed although the superseded original is confirmed.
    pub acknowledge_confirmed: bool,
}

/// What `begin` decided, and the operation key it decided it for (none when
/// the call was refused before a key was settled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begun {
    /// The decision.
    pub decision: Decision,
    /// The operation key and where it came from.
    pub key: Option<(String, KeySource)>,
    /// What the ledger knows of the key's effect where the decision does not
    /// carry it: an expired key's tombstone says whether its effect happened.
    pub effect: Option<Effect>,
}

/// The `begin` export.
pub fn begin(h: &impl Host, req: BeginRequest) -> Result<Decision, Error> {
    begin_keyed(h, req).map(|b| b.decision)
}

/// [`begin`], also naming the operation key.
pub fn begin_keyed(h: &impl Host, req: BeginRequest) -> Result<Begun, Error> {
    let unkeyed = |decision| {
        Ok(Begun {
            decision,
            key: None,
            effect: None,
        })
    };
    let settings = h.settings();
    check_new_name("scope", &req.scope, &settings)?;
    check_new_name("tool", &req.tool, &settings)?;
    check_policy(&req.policy, &settings)?;
    // One source of the account: a record is bound to the account the host sends and reads through.
    let hosts_account = h.provider_account(&req.tool);
    if req.policy.provider_account != hosts_account {
        let named = |a: Option<String>| a.unwrap_or_else(|| "none".to_string());
        return Err(Error::InvalidRequest(format!(
            "the call's policy names provider account {}, but this host sends and reads tool {} through {}",
            named(req.policy.provider_account.clone()),
            req.tool,
            named(hosts_account)
        )));
    }
    let app_key = match resolve_carriers(&req.keys, &settings)? {
        Ok(key) => key,
        Err((reason, detail)) => return unkeyed(blocked(reason, detail)),
    };
    if let Some(original) = &req.supersedes {
        check_name("supersedes", original, &settings)?;
    }
    let routing = route(&req.policy, req.descriptor.as_ref(), &settings)?;
    if let Routing::Block(reason, detail) = routing {
        return unkeyed(blocked(reason, detail));
    }
    // Malformed args are an error on every route; a refusal of the payload
    // (a missing effect field) only matters where a record is kept.
    let payload = Payload::build(&req.tool, &req.args, &req.policy, &settings)?;
    if routing == Routing::Direct {
        // Nothing is recorded for a read-only tool, but an existing record wins.
        let existing = match &app_key {
            Some(key) => h.get(Table::Operation, &req.scope, key),
            None => Ok(None),
        };
        match existing {
            Ok(None) => return unkeyed(Decision::Direct),
            Ok(Some(_)) => {}
            Err(e) => return unkeyed(blocked(BlockReason::Storage, e)),
        }
    }
    let payload = match payload {
        Ok(payload) => payload,
        Err((reason, detail)) => return unkeyed(blocked(reason, detail)),
    };
    let (key, key_source) = match app_key {
        Some(key) => (key, KeySource::Application),
        None => match req.policy.identity {
            IdentityMode::Required => {
                return unkeyed(blocked(
                    BlockReason::IdentityRequired,
                    format!("tool {} requires an application-minted operation key", req.tool),
                ));
            }
            IdentityMode::Derived => (derived_key(&payload.fingerprint), KeySource::Derived),
        },
    };
    if req.supersedes.as_deref() == Some(key.as_str()) {
        return Err(Error::InvalidRequest(
            "an operation cannot supersede itself".to_string(),
        ));
    }
    // Only these decisions rest on nothing but the key's absence; the others read
    // the provider, an original or a quota bucket first.
    let blind = !req.policy.verify_first && req.supersedes.is_none() && req.policy.quota.is_none();
    let claim = Claim {
        req: &req,
        payload: &payload,
        key,
        key_source,
        audit_base: core::cell::Cell::new(0),
        blind: core::cell::Cell::new(blind),
        effect: core::cell::Cell::new(None),
        superseded: core::cell::RefCell::new(None),
    };
    let keyed = |decision| {
        Ok(Begun {
            decision,
            key: Some((claim.key.clone(), key_source)),
            effect: claim.effect.get(),
        })
    };
    let mut races = Races::new();
    while races.again(h) {
        match claim.decide(h) {
            Ok(decision) => return keyed(decision),
            Err(LedgerError::Conflict) => continue,
            Err(LedgerError::Storage(e)) => return keyed(blocked(BlockReason::Storage, e)),
            // Nothing was written on the read's strength: the protocol answers the `read` step
            // instead (`crate::reads`). (What an earlier read of the same export proved, a
            // superseded original's, is recorded already: see `Claim::settle_original`.)
            Err(e @ LedgerError::ReadDeferred) => return keyed(blocked(BlockReason::Unverified, e.message())),
        }
    }
    keyed(blocked(BlockReason::Storage, LedgerError::Conflict.message()))
}

/// One attempt at deciding a `begin` against the ledger as it is now.
struct Claim<'a> {
    req: &'a BeginRequest,
    payload: &'a Payload,
    key: String,
    key_source: KeySource,
    /// Last audit version left by an earlier record of this key whose
    /// tombstone has since been removed: a new record continues after it,
    /// because audit events are never rewritten.
    audit_base: core::cell::Cell<u64>,
    /// The first decision claims the key without reading it (see [`Claim::decide`]).
    blind: core::cell::Cell<bool>,
    /// What a tombstone said of the key's effect (see [`Begun::effect`]).
    effect: core::cell::Cell<Option<Effect>>,
    /// The original this call's batch supersedes, as staged, and when: kept in the witness
    /// once the batch commits, before the successor leaves ([`witness::keep_superseded`]).
    superseded: core::cell::RefCell<Option<(OpRecord, u64)>>,
}

impl Claim<'_> {
    fn decide(&self, h: &impl Host) -> Result<Decision, LedgerError> {
        // Most calls name a key the ledger has never seen, so the first try writes the
        // claim without reading: its insert asserts that no record exists (and, for an
        // application key, no tombstone), so it applies exactly when reading first would
        // have found none. Any conflict is decided again the usual way, reading first.
        if self.blind.replace(false) {
            return self.fresh(h, None, true);
        }
        match load(h, &self.req.scope, &self.key)? {
            None => self.fresh(h, None, false),
            Some(loaded) => self.existing(h, loaded),
        }
    }

    /// A new operation for this key: none recorded (`previous` is `None`), or
    /// a derived key's finished record past its window, which it replaces.
    /// `blind`: nothing was read; the batch asserts what reading would have checked.
    fn fresh(&self, h: &impl Host, previous: Option<&Loaded>, blind: bool) -> Result<Decision, LedgerError> {
        let req = self.req;
        let first_version = previous.map_or(self.audit_base.get(), |p| p.version) + 1;
        let secret = key_secret(h)?;
        let provider_key = provider_key(&secret, &req.scope, &self.key, first_version);
        let args = self.payload.dispatch_args(&provider_key);
        let tombstone = match previous {
            Some(_) => None,
            None if blind => None,
            None => load_tombstone(h, &req.scope, &self.key)?,
        };
        // A derived key is never expired: past its window the same arguments are a new operation.
        if let Some(stone) = tombstone.filter(|_| self.key_source == KeySource::Application) {
            if stone.tool != req.tool || stone.fingerprint != self.payload.fingerprint {
                return Ok(blocked(
                    BlockReason::Expired,
                    format!(
                        "key {} was pruned after {} with another payload",
                        self.key,
                        state_name(stone.outcome)
                    ),
                ));
            }
            if req.policy.verify_first
                && let (_, Evidence::Confirmed(receipt)) =
                    crate::reads::read(h, &req.scope, &self.key, &req.tool, &provider_key, &args)?
            {
                let receipt = crate::input::provider_receipt(receipt, &h.settings());
                return Ok(replay(receipt.text, h.now()));
            }
            let happened = stone.effect_happened() && !crate::mutant::on(crate::mutant::Mutant::TombstoneSaysNone);
            let effect = match (happened, stone.uncertain) {
                (true, _) => Effect::Happened,
                (false, true) => Effect::Unknown,
                (false, false) => Effect::None,
            };
            self.effect.set(Some(effect));
            let detail = if effect == Effect::Unknown {
                format!(
                    "key {} was pruned after {} while an earlier attempt's effect was unknown; do not repeat it \
                     before checking with the provider (a new key would be a second operation)",
                    self.key,
                    state_name(stone.outcome)
                )
            } else if happened {
                format!(
                    "key {} was pruned after {}: its effect happened, and its receipt is no longer kept; \
                     do not repeat it (a new key would be a second operation)",
                    self.key,
                    state_name(stone.outcome)
                )
            } else {
                format!(
                    "key {} was pruned after {} (no effect happened); mint a new key for a new operation",
                    self.key,
                    state_name(stone.outcome)
                )
            };
            return Ok(blocked(BlockReason::Expired, detail));
        }
        // The newer history of a restored ledger: the first attempt (or the operation that
        // replaced `previous`) may have been sent already.
        if let Some(kept) = witness::lost(h, &req.scope, &self.key, previous.map(|p| &p.rec))? {
            if blind {
                // Unread: the ledger may hold the key after all. Read it and decide again.
                return Err(LedgerError::Conflict);
            }
            return Err(match witness::restore(h, kept, previous, first_version, h.now()) {
                // An insert that lost may have lost to an old trail of the key's: continue it.
                Err(LedgerError::Conflict) if previous.is_none() => self.after_insert_conflict(h),
                Ok(()) | Err(LedgerError::Conflict) => LedgerError::Conflict,
                Err(e) => e,
            });
        }
        if let Some(original) = &req.supersedes
            && let Some(answer) = self.settle_original(h, original)?
        {
            return Ok(answer);
        }
        let mut tx = Tx::new();
        if blind && self.key_source == KeySource::Application {
            // A tombstone would answer `expired` (a derived key's never holds it back).
            tx.assert_absent(Table::Tombstone, &req.scope, &self.key);
        }
        if req.policy.verify_first {
            // `lookup_started`: when the read was asked for (a read step's, brought back with it).
            let (lookup_started, evidence) =
                crate::reads::read(h, &req.scope, &self.key, &req.tool, &provider_key, &args)?;
            match evidence {
                Evidence::Confirmed(receipt) => {
                    // Found is found, whatever the receipt's form (a flawed one is stored flagged).
                    let receipt = crate::input::provider_receipt(receipt, &h.settings());
                    let now = h.now();
                    // The money moved: count it, ceiling or not.
                    let reservation = match (&req.policy.quota, self.payload.spend) {
                        (Some(quota), Some(units)) => {
                            match tx.reserve(h, &req.scope, &req.tool, quota, units, now, false)? {
                                Reserved::Yes(reservation) => Some(reservation),
                                Reserved::OverCeiling | Reserved::OtherUnit(_) => None,
                            }
                        }
                        _ => None,
                    };
                    let origin = Origin::Verified { receipt };
                    let (mut rec, event) = OpRecord::create(
                        self.new_record(h, (provider_key, secret.id.clone()), args, reservation),
                        origin,
                        now,
                    );
                    self.write(&mut tx, &mut rec, previous, event, now);
                    // The receipt is the answer even if recording it fails; a conflict means
                    // someone else recorded this key meanwhile, so decide again.
                    match tx.commit(h) {
                        Err(LedgerError::Conflict) => return Err(self.after_insert_conflict(h)),
                        // Best effort, as the recording: the successor's effect is found, so the
                        // original can no longer be sent on any ledger's strength but a restored
                        // one that lost this write (docs/design.md "Older history").
                        Ok(()) => {
                            let _ = self.keep_original(h);
                        }
                        Err(_) => {}
                    }
                    return Ok(replay_of(&rec, ReplayVia::Provider));
                }
                Evidence::Unknown(why) => {
                    return Ok(blocked(
                        BlockReason::Unverified,
                        format!("verify-first lookup could not tell: {why}"),
                    ));
                }
                // The read must cover the moment the lookup started, give or take the skew.
                Evidence::Absent(read_position)
                    if read_position < lookup_started.saturating_add(h.settings().clock_skew_ms) =>
                {
                    return Ok(blocked(
                        BlockReason::Unverified,
                        format!(
                            "verify-first read position {read_position} is before the lookup started ({lookup_started})"
                        ),
                    ));
                }
                Evidence::Absent(_) => {}
            }
        }
        let now = h.now();
        if let Some(original) = &req.supersedes
            && let Some(answer) = self.supersede(h, &mut tx, original, now)?
        {
            return Ok(answer);
        }
        let reservation = match (&req.policy.quota, self.payload.spend) {
            (Some(quota), Some(units)) => match tx.reserve(h, &req.scope, &req.tool, quota, units, now, true)? {
                Reserved::Yes(reservation) => Some(reservation),
                Reserved::OverCeiling => {
                    let seen = previous.map(|p| p.version);
                    return refuse_over_quota(h, &req.scope, &self.key, seen, quota, units);
                }
                Reserved::OtherUnit(why) => return Ok(blocked(BlockReason::Quota, why)),
            },
            _ => None,
        };
        if self.payload.approval.is_some() && !mutant::on(Mutant::NoApprovalGate) {
            // Recorded, with its spend reserved, and nothing granted: a person decides first.
            let (mut rec, event) = OpRecord::create(
                self.new_record(h, (provider_key, secret.id.clone()), args, reservation),
                Origin::AwaitingApproval,
                now,
            );
            self.write(&mut tx, &mut rec, previous, event, now);
            return match tx.commit(h) {
                Ok(()) => self
                    .keep_original(h)
                    .map(|()| awaiting_approval(&rec))
                    .map_err(LedgerError::Storage),
                Err(LedgerError::Conflict) if blind => Err(LedgerError::Conflict),
                Err(LedgerError::Conflict) => Err(self.after_insert_conflict(h)),
                Err(e) => Err(e),
            };
        }
        let fence = fence(&req.scope, &self.key, 1, now, now);
        let lease_until = now.saturating_add(req.policy.lease_ms);
        let origin = Origin::Claimed { fence, lease_until };
        let (mut rec, mut event) = OpRecord::create(
            self.new_record(h, (provider_key, secret.id.clone()), args, reservation),
            origin,
            now,
        );
        if let Some(previous) = previous {
            event.detail = crate::record::detail(&[
                ("lease_until", crate::record::num(lease_until)),
                ("new_operation_after", string(state_name(previous.rec.state))),
            ]);
        }
        self.write(&mut tx, &mut rec, previous, event, now);
        match tx.commit(h) {
            Ok(()) => Ok(match self.keep_original(h) {
                Ok(()) => granted(h, rec),
                Err(why) => witness::unkept(h, &rec, &why),
            }),
            // The key was not new after all: the next try reads what is there.
            Err(LedgerError::Conflict) if blind => Err(LedgerError::Conflict),
            Err(LedgerError::Conflict) => Err(self.after_insert_conflict(h)),
            Err(e) => Err(e),
        }
    }

    /// Keep in the witness the original this call's committed batch superseded, if any.
    fn keep_original(&self, h: &impl Host) -> Result<(), String> {
        match self.superseded.take() {
            Some((original, at)) => witness::keep_superseded(h, &original, at),
            None => Ok(()),
        }
    }

    /// Stage the new record: an insert, or the replacement of `previous`.
    fn write(
        &self,
        tx: &mut Tx,
        rec: &mut OpRecord,
        previous: Option<&Loaded>,
        mut event: crate::record::Event,
        now: u64,
    ) {
        match previous {
            Some(p) => {
                // The trail goes on from the operation this one replaces, whose late evidence stays ours to hear.
                event.from = Some(p.rec.state);
                rec.previous_fences = p.rec.attempts.iter().map(|a| a.fence.clone()).collect();
                tx.record(rec, p.version, event, now)
            }
            None => tx.insert(rec, self.audit_base.get() + 1, event, now),
        }
    }

    /// An insert lost: usually to a concurrent writer (decide again). When no
    /// record and no tombstone exist, it collided with the audit trail of an
    /// earlier record whose tombstone expired; continue that trail.
    fn after_insert_conflict(&self, h: &impl Host) -> LedgerError {
        // A derived key's tombstone (left by earlier versions) does not hold it back.
        let gone = matches!(load(h, &self.req.scope, &self.key), Ok(None))
            && (self.key_source == KeySource::Derived
                || matches!(load_tombstone(h, &self.req.scope, &self.key), Ok(None)));
        if gone {
            match h.audit(&self.req.scope, &self.key) {
                Ok(trail) => self.audit_base.set(trail.last().map_or(0, |e| e.version)),
                Err(e) => return LedgerError::Storage(e),
            }
        }
        LedgerError::Conflict
    }

    fn new_record(
        &self,
        h: &impl Host,
        (provider_key, key_secret): (String, String),
        args: String,
        reservation: Option<crate::record::Reservation>,
    ) -> NewRecord {
        NewRecord {
            scope: self.req.scope.clone(),
            key: self.key.clone(),
            key_source: self.key_source,
            tool: self.req.tool.clone(),
            fingerprint: self.payload.fingerprint.clone(),
            args,
            provider_key,
            key_secret: Some(key_secret),
            key_in_args: self.payload.carries_key(),
            owner: h.settings().owner,
            spend: self.payload.spend,
            reservation,
            approval_reason: self.payload.approval.clone(),
            supersedes: self.req.supersedes.clone(),
            policy: self.req.policy.clone(),
        }
    }

    /// Check the original this call supersedes; stage its move to `superseded`
    /// when it is failed or absent. Returns an answer when the call must stop here.
    fn supersede(&self, h: &impl Host, tx: &mut Tx, original: &str, now: u64) -> Result<Option<Decision>, LedgerError> {
        let Some(Loaded { rec: mut orig, version }) = load(h, &self.req.scope, original)? else {
            return Ok(Some(blocked(
                BlockReason::SupersedesMissing,
                format!("supersedes {original}, which has no record in this scope"),
            )));
        };
        // Another account's operation is not this account's to replace (nor to show its receipt).
        if account::foreign(h, &orig) {
            return Ok(Some(account::refusal(h, &orig)));
        }
        let now = now.max(orig.updated_at);
        match orig.state {
            State::InFlight | State::Unknown => Ok(Some(blocked(
                BlockReason::SupersededUnresolved,
                format!(
                    "the original {original} is {}: resolve it first",
                    state_name(orig.state)
                ),
            ))),
            State::Superseded => Ok(Some(blocked(
                BlockReason::Superseded,
                format!(
                    "the original {original} was already superseded by {}",
                    orig.superseded_by.unwrap_or_default()
                ),
            ))),
            State::Confirmed if self.req.acknowledge_confirmed => {
                let event = orig.link_successor(&self.key);
                tx.record(&mut orig, version, event, now);
                Ok(None)
            }
            State::Confirmed => Ok(Some(Decision::Blocked(Blocked {
                reason: BlockReason::SupersededConfirmed,
                detail: format!("the original {original} is confirmed; acknowledge it to proceed"),
                receipt: orig.receipt.clone(),
            }))),
            State::Failed | State::Absent | State::AwaitingApproval | State::Denied if !self.settled(h, &orig) => {
                Ok(Some(blocked(
                    BlockReason::SupersededUnresolved,
                    format!(
                        "the original {original} was sent again meanwhile, and a request of it may still take effect"
                    ),
                )))
            }
            State::Failed | State::Absent | State::AwaitingApproval | State::Denied => {
                let (event, released) = orig.supersede(&self.key, now);
                if let Some(reservation) = released {
                    tx.release(h, &self.req.scope, &reservation)?;
                }
                tx.record(&mut orig, version, event, now);
                self.superseded.replace(Some((orig, now)));
                Ok(None)
            }
        }
    }

    /// "Failed or absent: no effect, none possible." An earlier request of the original may have
    /// committed unseen when its absence was proven before `max-in-flight` had passed (by the
    /// provider's claim on the key, which stops a second effect under that key, not a late first
    /// one, or by an operator); the successor's new provider key would make that a second effect.
    /// Such an original is superseded only once no request of it can still commit and a read of
    /// the provider after that time found none (or, where nothing can read the provider, an
    /// operator forced the absence: the risk they took on). What the read finds is recorded on
    /// the original in a write of its own, before anything else of this call is decided: the
    /// absence read after that time (the supersede then goes ahead), or the effect (the original
    /// is confirmed, and answered as one). So the call needs this read once, also when
    /// verify-first reads next. Returns the refusal while it is not settled.
    fn settle_original(&self, h: &impl Host, original: &str) -> Result<Option<Decision>, LedgerError> {
        let Some(Loaded { rec: mut orig, version }) = load(h, &self.req.scope, original)? else {
            return Ok(None);
        };
        // Another account's original is refused by `supersede`, unread: this host's read may not see it.
        if account::foreign(h, &orig) && !mutant::on(Mutant::OtherAccountReadProvesAbsent) {
            return Ok(None);
        }
        let skew = h.settings().clock_skew_ms;
        let settled_at = match orig.late_effect_settles_at(skew) {
            Some(at)
                if matches!(
                    orig.state,
                    State::Failed | State::Absent | State::AwaitingApproval | State::Denied
                ) =>
            {
                at
            }
            _ => return Ok(None),
        };
        if mutant::on(Mutant::SupersedeDespiteLateEffect) {
            return Ok(None);
        }
        let now = now_for(h, Some(&orig));
        let state = state_name(orig.state);
        let readable = super::reconcile::provider_readable(h, &orig);
        let unresolved = |why: String| {
            Ok(Some(blocked(
                BlockReason::SupersededUnresolved,
                format!("the original {original} is {state}, but {why}"),
            )))
        };
        if now <= settled_at {
            return unresolved(format!(
                "an earlier request of it may still take effect until {settled_at}: the same call after then \
                 reads the provider"
            ));
        }
        if mutant::on(Mutant::SupersedeUnreadAfterMaxInFlight) {
            return Ok(None);
        }
        if orig.owner != h.settings().owner {
            // Its owner's hosts read its provider; this host's lookup may reach another account.
            return unresolved(format!(
                "an earlier request of it may have taken effect unseen, and it is owner {}'s to read",
                orig.owner
            ));
        }
        if !readable {
            if orig.absence_forced {
                // An operator forced the absence, taking on a late effect (flagged if it is reported):
                // their word stands for what no read can tell, as it does for the original's own key.
                return Ok(None);
            }
            return unresolved(
                "an earlier request of it may have taken effect unseen, and nothing can read the provider for it \
                 (its tool has no lookup)"
                    .into(),
            );
        }
        let (_, evidence) = crate::reads::read(h, &orig.scope, &orig.key, &orig.tool, &orig.provider_key, &orig.args)?;
        let mut tx = Tx::new();
        let event = match evidence {
            Evidence::Absent(position) if position.min(now) > settled_at => orig.absence_read(position.min(now)),
            Evidence::Absent(position) => {
                return unresolved(format!(
                    "the provider's read is as of {position}, not after {settled_at}, when an earlier request of \
                     it could last take effect"
                ));
            }
            Evidence::Confirmed(receipt) => {
                tx.count_spend(h, &mut orig, now)?;
                orig.confirm_unseen(crate::input::provider_receipt(receipt, &h.settings()), now)
            }
            Evidence::Unknown(why) => {
                return unresolved(format!(
                    "an earlier request of it may have taken effect unseen, and the provider could not tell: {why}"
                ));
            }
        };
        tx.record(&mut orig, version, event, now);
        tx.commit(h)?;
        if orig.state == State::Confirmed && !self.req.acknowledge_confirmed {
            return Ok(Some(Decision::Blocked(Blocked {
                reason: BlockReason::SupersededConfirmed,
                detail: format!(
                    "the original {original} took effect after all (the provider has it); acknowledge it to proceed"
                ),
                receipt: orig.receipt.clone(),
            })));
        }
        Ok(None)
    }

    /// Whether `orig`, as `supersede` loads it to move it, may be superseded: no earlier request
    /// of it can have committed unseen, or (where nothing can read the provider) an operator
    /// forced its absence. [`Claim::settle_original`] made it so on an earlier load; this holds
    /// it to that on the load the move is written against (another call may have sent it again
    /// in between).
    fn settled(&self, h: &impl Host, orig: &OpRecord) -> bool {
        !orig.late_effect_possible(h.settings().clock_skew_ms)
            || (orig.absence_forced && !super::reconcile::provider_readable(h, orig))
            || mutant::on(Mutant::SupersedeDespiteLateEffect)
            || mutant::on(Mutant::SupersedeUnreadAfterMaxInFlight)
    }

    /// A record exists for this key.
    fn existing(&self, h: &impl Host, loaded: Loaded) -> Result<Decision, LedgerError> {
        let Loaded { mut rec, version } = loaded;
        let now = now_for(h, Some(&rec));
        if rec.tool != self.req.tool || rec.fingerprint != self.payload.fingerprint {
            let summary = rec.summary();
            let event = rec.note_conflict(&self.req.tool, &self.payload.fingerprint);
            record_observation(h, &mut rec, version, event, now)?;
            return Ok(Decision::Conflict(summary));
        }
        let finished = matches!(
            rec.state,
            State::Confirmed | State::Failed | State::Superseded | State::Denied
        );
        // A pending escalation (a possible duplicate) keeps the operation until the sink has it.
        if finished && rec.window_until().is_some_and(|until| now >= until) && !rec.escalation_pending() {
            // Past the window, identical arguments are a new operation.
            return self.fresh(h, Some(&Loaded { rec, version }), false);
        }
        // Another provider account's operation is neither replayed nor sent through this one.
        if !account::answers(h, &rec) {
            return Ok(account::refusal(h, &rec));
        }
        let ours = rec.owner == h.settings().owner;
        match rec.state {
            State::Confirmed => {
                let via = match rec.key_source {
                    KeySource::Application => ReplayVia::Key,
                    KeySource::Derived => ReplayVia::DerivedArgs,
                };
                let event = rec.note_replay();
                // Confirmed is final and its receipt never changes: losing the race to count this
                // replay loses only the count, never the answer.
                let _ = record_observation(h, &mut rec, version, event, now);
                Ok(replay_of(&rec, via))
            }
            State::InFlight if rec.lease_ended(now) => {
                let event = rec.expire_lease(now);
                let mut tx = Tx::new();
                tx.record(&mut rec, version, event, now);
                tx.commit(h)?;
                Ok(unknown(&rec))
            }
            State::InFlight if crate::mutant::on(crate::mutant::Mutant::GrantWhileLeaseLive) => {
                grant(h, rec, version, now)
            }
            State::InFlight => Ok(Decision::InFlight(InFlightInfo {
                lease_until: rec.current().map_or(now, |a| a.lease_until),
            })),
            State::Unknown => {
                let mut info = unknown_info(&rec);
                // Begun while no lookup was configured and never read: this host has one now.
                // (Only its owner reads it: another host's caller is told no read is coming.)
                if ours && rec.next_check.is_none() && super::reconcile::provider_readable(h, &rec) {
                    info.next_read = Some(now);
                }
                Ok(Decision::Unknown(info))
            }
            State::Superseded => Ok(superseded(&rec)),
            State::AwaitingApproval if rec.approval_wait_until().is_some_and(|until| now >= until) => {
                end_approval_wait(h, rec, version, now)
            }
            State::AwaitingApproval => Ok(awaiting_approval(&rec)),
            State::Denied => Ok(denied(&rec)),
            State::Failed | State::Absent if !ours => Ok(other_owner(&rec, &h.settings().owner)),
            State::Failed | State::Absent => grant(h, rec, version, now),
        }
    }
}

/// A record this host must not dispatch: another owner sends it.
pub(super) fn other_owner(rec: &OpRecord, me: &str) -> Decision {
    blocked(
        BlockReason::OtherOwner,
        format!(
            "{} is {} and dispatched by owner {:?}; this host ({me:?}) never sends another host's operation",
            rec.key,
            state_name(rec.state),
            rec.owner
        ),
    )
}

/// failed or absent -> in_flight, within the attempt budget (and, from failed, the quota); or
/// -> awaiting_approval while the tool's approval rule holds the attempt for a person.
pub(super) fn grant(h: &impl Host, mut rec: OpRecord, version: u64, now: u64) -> Result<Decision, LedgerError> {
    // Every attempt goes out through the account the operation was begun under (a sweep's owed
    // dispatch and a resumed call's included), or not at all.
    if account::foreign(h, &rec) {
        return Ok(account::refusal(h, &rec));
    }
    // A restored ledger's record may lack attempts its newer history sent: put them back and
    // decide again on the whole history (after their lease, a read settles them).
    if let Some(kept) = witness::lost(h, &rec.scope, &rec.key, Some(&rec))? {
        witness::restore(h, kept, Some(&Loaded { rec, version }), version + 1, now)?;
        return Err(LedgerError::Conflict);
    }
    if !rec.budget_left() {
        let not_sent = rec
            .attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("not-sent"))
            .count();
        let sent = match not_sent {
            0 => String::new(),
            n if n == rec.attempts.len() => "; none of them was sent, so nothing happened".to_string(),
            n => format!("; {n} of them were not sent"),
        };
        return Ok(blocked(
            BlockReason::AttemptBudget,
            format!("{} has used all {} attempts{sent}", rec.key, rec.policy.attempt_budget),
        ));
    }
    let mut tx = Tx::new();
    // An owed redispatch reuses its reservation; a retry after failure reserves again.
    let reservation = match (&rec.policy.quota, &rec.spend, &rec.reservation) {
        (Some(quota), Some(spend), None) => {
            let units: u128 = spend.parse().unwrap_or(0);
            match tx.reserve(h, &rec.scope, &rec.tool, quota, units, now, true)? {
                Reserved::Yes(reservation) => Some(reservation),
                Reserved::OverCeiling => {
                    return refuse_over_quota(h, &rec.scope, &rec.key, Some(version), quota, units);
                }
                Reserved::OtherUnit(why) => return Ok(blocked(BlockReason::Quota, why)),
            }
        }
        _ => None,
    };
    if !rec.approved_for_dispatch(now) {
        // Before its first attempt, after a rejection, and before an owed redispatch after a
        // lost reply alike: no attempt that may reach the provider goes out without a person.
        // The spend is held while a person decides (a denial releases it), so an approved call
        // is not then refused for a ceiling others reached meanwhile.
        let event = rec.ask_approval(now, reservation);
        tx.record(&mut rec, version, event, now);
        tx.commit(h)?;
        return Ok(awaiting_approval(&rec));
    }
    let fence = fence(&rec.scope, &rec.key, rec.attempts.len() as u32 + 1, rec.created_at, now);
    let event = rec.grant(fence, now, reservation);
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok(granted(h, rec))
}

/// The grant of the attempt `rec` has just committed. When that commit took a
/// good part of the attempt's send window (on a loaded ledger the write queues
/// behind others: at 1197540, 128 callers on one PostgreSQL quota bucket), the
/// lease starts again now, before the grant leaves the engine: nothing of the
/// attempt can have been sent, and its host gets the whole window to start
/// sending instead of finding `send-by` past and ending the attempt "not
/// sent", a grant of the budget spent because the ledger was busy. Best effort:
/// a renewal that cannot be written hands out the grant as committed.
///
/// The witness keeps the record the grant leaves with (renewed or not) first:
/// a grant it could not keep does not leave ([`witness`]).
fn granted(h: &impl Host, rec: OpRecord) -> Decision {
    let settings = h.settings();
    let rec = renewed(h, rec, &settings);
    match witness::keep(h, &rec) {
        Ok(()) => execute(&rec, &settings),
        Err(why) => witness::unkept(h, &rec, &why),
    }
}

/// `rec`, its lease started again if committing its grant took a good part of the send window.
fn renewed(h: &impl Host, rec: OpRecord, settings: &crate::types::Settings) -> OpRecord {
    let Some(attempt) = rec.current() else {
        return rec;
    };
    let send_by = attempt.send_by(&rec.policy, settings.clock_skew_ms);
    let window = send_by.saturating_sub(attempt.granted_at);
    let taken = h.now().saturating_sub(attempt.granted_at);
    if taken <= window / 4 || mutant::on(Mutant::NoLeaseRenewal) {
        return rec;
    }
    renew(h, &rec.scope, &rec.key, &attempt.fence).unwrap_or(rec)
}

/// Renew the lease of attempt `fence` if it is still the record's current
/// attempt, in flight and not ended (the write is a compare-and-set on the
/// version read: anything else written since wins).
fn renew(h: &impl Host, scope: &str, key: &str, fence: &str) -> Option<OpRecord> {
    let Loaded { mut rec, version } = load(h, scope, key).ok()??;
    if rec.current().is_none_or(|a| a.fence != fence) {
        return None;
    }
    let now = now_for(h, Some(&rec));
    let event = rec.renew_lease(now)?;
    let mut tx = Tx::new();
    tx.record(&mut rec, version, event, now);
    tx.commit(h).ok()?;
    Some(rec)
}

/// Write a counter-only change (replay, conflict). The answer does not depend
/// on it, so a failing store is not an error; a lost race is.
fn record_observation(
    h: &impl Host,
    rec: &mut OpRecord,
    version: u64,
    event: crate::record::Event,
    now: u64,
) -> Result<(), LedgerError> {
    let mut tx = Tx::new();
    // A count of replays or conflicts: losing it loses nothing a caller relies on.
    tx.defer();
    tx.record(rec, version, event, now);
    match tx.commit(h) {
        Err(LedgerError::Conflict) => Err(LedgerError::Conflict),
        _ => Ok(()),
    }
}

/// The grant of the record's current attempt.
pub(super) fn execute(rec: &OpRecord, settings: &crate::types::Settings) -> Decision {
    Decision::Execute(grant_of(rec, settings))
}

/// Permission to send the record's current attempt.
pub fn grant_of(rec: &OpRecord, settings: &crate::types::Settings) -> Grant {
    let attempt = rec.current().expect("an in-flight record has an attempt");
    // A send started by then ends (reply or timeout) inside the lease, on any host's clock.
    let send_by = attempt.send_by(&rec.policy, settings.clock_skew_ms);
    Grant {
        scope: rec.scope.clone(),
        key: rec.key.clone(),
        tool: rec.tool.clone(),
        attempt: attempt.n,
        fence: attempt.fence.clone(),
        provider_key: rec.provider_key.clone(),
        args: rec.args.clone(),
        lease_until: attempt.lease_until,
        send_by,
        timeout_ms: rec.policy.dispatch_timeout_ms,
    }
}

/// An unknown record, as its caller is told.
pub fn unknown_info(rec: &OpRecord) -> UnknownInfo {
    UnknownInfo {
        since: rec.since.unwrap_or(rec.transitioned_at),
        deadline: rec.deadline.unwrap_or(rec.transitioned_at),
        reason: rec
            .unknown_reason
            .clone()
            .unwrap_or_else(|| "an earlier attempt's outcome was not reported".to_string()),
        next_read: if rec.policy.lookup { rec.next_check } else { None },
    }
}

pub(super) fn unknown(rec: &OpRecord) -> Decision {
    Decision::Unknown(unknown_info(rec))
}

/// What a confirmed record tells its caller.
pub fn confirmed_info(rec: &OpRecord, via: Option<ReplayVia>) -> ConfirmedInfo {
    // Every dispatch before the confirming one ended without an effect, or was
    // proven absent before the next was granted, unless evidence says otherwise.
    let earlier_attempts = if rec.possible_duplicate {
        Effect::Happened
    } else if rec.absence_forced {
        Effect::Unknown
    } else {
        Effect::None
    };
    let confirmed_by = rec.confirmed_via.unwrap_or(
        if rec.attempts.iter().any(|a| a.outcome.as_deref() == Some("success")) {
            Confirmation::Answer
        } else {
            Confirmation::Provider
        },
    );
    ConfirmedInfo {
        receipt: rec.receipt.clone().unwrap_or_default(),
        replayed: via.is_some(),
        via,
        confirmed_by,
        at: rec.transitioned_at,
        window_until: rec.window_until(),
        attempt: rec.confirmed_by,
        earlier_attempts,
        possible_duplicate: rec.possible_duplicate,
    }
}

/// The stored receipt of a confirmed record.
pub(super) fn replay_of(rec: &OpRecord, via: ReplayVia) -> Decision {
    Decision::Replay(confirmed_info(rec, Some(via)))
}

/// A receipt the provider answered for a key whose record is gone (a tombstone).
fn replay(receipt: String, at: u64) -> Decision {
    Decision::Replay(ConfirmedInfo {
        receipt,
        replayed: true,
        via: Some(ReplayVia::Provider),
        confirmed_by: Confirmation::Provider,
        at,
        window_until: None,
        attempt: None,
        earlier_attempts: Effect::None,
        possible_duplicate: false,
    })
}

/// A record awaiting a person's approval, as its caller is told.
pub fn approval_info(rec: &OpRecord) -> ApprovalInfo {
    ApprovalInfo {
        asked_at: rec.since.unwrap_or(rec.transitioned_at),
        reason: rec.approval_reason.clone().unwrap_or_default(),
        valid_ms: rec.policy.approval_valid_ms,
        wait_until: rec.approval_wait_until().unwrap_or(rec.transitioned_at),
    }
}

/// awaiting_approval -> denied once its wait for a person is over: its spend released, the
/// caller told it was not approved.
pub(super) fn end_approval_wait(
    h: &impl Host,
    mut rec: OpRecord,
    version: u64,
    now: u64,
) -> Result<Decision, LedgerError> {
    let mut tx = Tx::new();
    let (event, released) = rec.expire_approval_wait(now);
    if let Some(reservation) = released {
        tx.release(h, &rec.scope, &reservation)?;
    }
    tx.record(&mut rec, version, event, now);
    tx.commit(h)?;
    Ok(denied(&rec))
}

pub(super) fn awaiting_approval(rec: &OpRecord) -> Decision {
    Decision::AwaitingApproval(approval_info(rec))
}

/// A denied record refuses every later begin.
pub(super) fn denied(rec: &OpRecord) -> Decision {
    blocked(
        BlockReason::ApprovalDenied,
        format!(
            "{} was not approved ({}; it needed approval because {}); nothing more is sent for it",
            rec.key,
            rec.error.as_deref().unwrap_or("denied"),
            rec.approval_reason.as_deref().unwrap_or("of the tool's rule")
        ),
    )
}

/// A superseded record refuses every later begin.
pub(super) fn superseded(rec: &OpRecord) -> Decision {
    let by = rec.superseded_by.as_deref().unwrap_or_default();
    match &rec.receipt {
        // A late success arrived after all: say so, with its receipt.
        Some(receipt) => Decision::Blocked(Blocked {
            reason: BlockReason::Superseded,
            detail: format!(
                "{} was superseded by {by}, but an earlier attempt's effect arrived late (flagged possible duplicate)",
                rec.key
            ),
            receipt: Some(receipt.clone()),
        }),
        None => blocked(BlockReason::Superseded, format!("{} was superseded by {by}", rec.key)),
    }
}

pub(super) fn blocked(reason: BlockReason, detail: String) -> Decision {
    Decision::Blocked(Blocked {
        reason,
        detail,
        receipt: None,
    })
}

/// Refuse a spend over the ceiling, but only if the record it was decided from
/// is still current. The record and the quota bucket are read at different
/// moments: a concurrent claim of this same key may have committed in between,
/// and its reservation must not make the duplicate look like new spend (the
/// duplicate's answer is in-flight or a replay, decided again).
fn refuse_over_quota(
    h: &impl Host,
    scope: &str,
    key: &str,
    seen_version: Option<u64>,
    quota: &Quota,
    units: u128,
) -> Result<Decision, LedgerError> {
    let now_version = h
        .get(crate::types::Table::Operation, scope, key)
        .map_err(LedgerError::Storage)?
        .map(|row| row.version);
    if now_version != seen_version {
        return Err(LedgerError::Conflict);
    }
    Ok(over_quota(quota, units))
}

fn over_quota(quota: &Quota, units: u128) -> Decision {
    blocked(
        BlockReason::Quota,
        format!(
            "spending {} would pass the ceiling of {} per {} ms window",
            crate::amount::format_minor_units(units, quota.decimals),
            quota.ceiling,
            quota.window_ms
        ),
    )
}

/// The WIT name of a state.
pub fn state_name(state: State) -> &'static str {
    match state {
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
