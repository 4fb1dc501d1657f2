//! The model: its actions, each one atomic step of the engine or the world,
//! and the properties every reachable state must have.

use std::collections::{BTreeMap, BTreeSet};

use once_guest::engine::{self, BeginRequest};
use once_guest::mutant;
use once_guest::policy::ApprovalRule;
use once_guest::protocol;
use once_guest::store::decode;
use once_guest::testing::default_settings;
use once_guest::types::{
    Account, BlockReason, Ending, Error, Grant, Outcome, Resolution, Settings, State, Step, Table,
};
use stateright::{Model, Property};

use crate::configs::{Config, SKEW_MS};
use crate::host::{Accounts, ModelHost, Read};
use crate::truth::{check_account, describe};
use crate::world::{Agent, Approved, Budget, Fate, Held, Pos, Request, Time, World};
use once_guest::host::Host;

/// The tool every configuration protects.
pub const TOOL: &str = "refund";
/// Rows one sweep or prune takes.
pub const SCAN_LIMIT: u32 = 4;
/// The world's clock when a run starts.
pub const START: Time = 1_000_000;

/// What a holder tells `report`, as its knowledge allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Said {
    /// The provider's receipt.
    Success(String),
    /// The provider refused.
    Rejected,
    /// A lost reply, a timeout, a crash: it may have happened.
    Ambiguous,
    /// Nothing was sent.
    NotSent,
}

/// How an operator resolves a record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Settle {
    /// It happened, with the provider's receipt.
    Confirmed(String),
    /// It did not; `force` before `max_in_flight` has passed.
    Absent {
        /// Resolve absent although an earlier request may still commit.
        force: bool,
    },
    /// A person approves a call awaiting approval.
    Approve,
    /// A person refuses it.
    Deny,
}

/// One atomic step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// A caller starts its call (`start`).
    Start(usize, Read),
    /// A holder sends its grant to the provider.
    Send(usize),
    /// A holder reports what happened (`report`).
    Report(usize, Said),
    /// A waiting caller asks again (`resume`).
    Resume(usize, Read),
    /// A waiting caller stops waiting.
    GiveUp(usize),
    /// A caller told to read the provider reads it, as the read says it sees the provider.
    Read(usize, Read),
    /// A caller that has read brings back what it found (`read-back`).
    ReadBack(usize),
    /// The provider commits a request (a duplicate of a claimed key is answered, not applied).
    Commit(usize),
    /// The provider refuses a request.
    Refuse(usize),
    /// A host's background work (`sweep` with dispatch).
    Sweep(usize, Read),
    /// `prune`.
    Prune,
    /// A host dies: its callers' memory is gone, the ledger and the network stay.
    Crash(usize),
    /// The next commit that applies takes a grant's whole send window (a loaded ledger).
    SlowCommit,
    /// The next commit fails: not applied, or applied with its answer lost.
    FailCommit {
        /// Whether the batch applies before the failure.
        applied: bool,
    },
    /// A host's owner name changes (a changed command line, a new config).
    RenameOwner(usize),
    /// An operator hands the records of an owner no host has any more to a host (`adopt`).
    Adopt {
        /// The orphaned owner.
        from: String,
        /// The host whose owner takes them.
        to: usize,
    },
    /// The escalation sink stops acknowledging.
    SinkDown,
    /// The escalation sink recovers.
    SinkUp,
    /// An operator resolves a record (`resolve`), truthfully.
    Resolve(String, String, Settle),
    /// An operator copies the ledger (a backup).
    Backup,
    /// The copy is put back in place of the ledger (a restore of an older backup); the witness,
    /// kept apart, stays as it is.
    Restore,
    /// Time jumps to the next moment anything can change.
    Tick,
}

/// What a host's sweep may change only on its own owner's records: state, reads, attempts, the next
/// read, the receipt and the owner itself (its escalation is any owner's to deliver).
type Work = (State, u32, usize, Option<u64>, Option<String>, String);

/// The engine and its world, as a stateright model of one configuration.
pub struct OnceModel {
    /// The configuration.
    pub config: Config,
}

impl OnceModel {
    /// The model of `config`.
    pub fn new(config: Config) -> Self {
        OnceModel { config }
    }

    /// Host `host`'s settings.
    pub fn settings(&self, world: &World, host: usize) -> Settings {
        let mut s = default_settings();
        s.clock_skew_ms = SKEW_MS;
        s.owner = world.owners[host].clone();
        s
    }

    /// Host `host`'s clock.
    pub fn clock(&self, world: &World, host: usize) -> Time {
        world.now.saturating_add_signed(self.config.hosts[host].skew)
    }

    /// The provider account host `host` goes through, and every host's.
    fn accounts(&self, host: usize) -> Accounts {
        let hosts: Vec<Option<String>> = self.config.hosts.iter().map(|h| h.account.map(String::from)).collect();
        Accounts {
            mine: hosts[host].clone(),
            hosts,
        }
    }

    /// Op `i` as host `host` calls it: its key (none: derived), args, and the policy with the
    /// host's provider account.
    fn request(&self, i: usize, host: usize) -> BeginRequest {
        let op = &self.config.ops[i];
        let mut policy = self.config.policy.clone();
        policy.provider_account = self.config.hosts[host].account.map(String::from);
        BeginRequest {
            scope: op.scope.into(),
            keys: op
                .key
                .map(|k| vec![("app".to_string(), k.to_string())])
                .unwrap_or_default(),
            tool: TOOL.into(),
            args: format!(r#"{{"amount":{},"order":"o-{i}"}}"#, op.amount),
            policy,
            descriptor: None,
            supersedes: op.supersedes.and_then(|j| self.config.ops[j].key).map(String::from),
            acknowledge_confirmed: false,
        }
    }

    /// Run `f` against host `host`'s view of `world` and fold what it did back in.
    /// `scope`: the one scope this step may touch (none: background work).
    fn with_host<T>(
        &self,
        world: &mut World,
        host: usize,
        read: Read,
        scope: Option<&str>,
        f: impl FnOnce(&ModelHost<'_>) -> T,
    ) -> T {
        let settings = self.settings(world, host);
        let clock = self.clock(world, host);
        let snapshot = world.clone();
        let h = ModelHost::new(
            &snapshot,
            settings,
            clock,
            read,
            self.config.read_steps,
            self.accounts(host),
        );
        let out = mutant::with(self.config.mutant, || f(&h));
        let (ledger, fault, acked, touched, slow_commit, witness) = h.finish();
        world.ledger = ledger;
        world.witness = witness;
        world.fault = fault;
        world.acked = acked;
        // A slow commit took its time on every clock.
        if let (Some(took), None) = (world.slow_commit, slow_commit) {
            world.now = world.now.saturating_add(took);
        }
        world.slow_commit = slow_commit;
        if let Some(scope) = scope {
            let foreign: BTreeSet<&String> = touched.iter().filter(|s| s.as_str() != scope).collect();
            if !foreign.is_empty() {
                world.violate(format!("a step for scope {scope} touched scope(s) {foreign:?}"));
            }
        }
        out
    }

    /// Put agent `i` where `step` says, checking what it was told. `starting`: the step answers
    /// the agent's `start` (a read it asks for is brought back with the call).
    fn take_step(&self, world: &mut World, i: usize, step: Result<Step, Error>, starting: bool) {
        let pos = match step {
            Ok(Step::Read(reading)) => {
                if !self.config.read_steps {
                    world.violate("a read step was asked for by a host that reads inside its steps".into());
                }
                Pos::Reading {
                    reading,
                    starting,
                    found: None,
                }
            }
            Ok(Step::Dispatch(grant)) => {
                self.check_grant(world, i, &grant.scope, &grant.key);
                // The engine renews a grant whose commit took the window; in this model (steps
                // atomic, one slow commit at a time) nothing else can make its renewal fail.
                let now = self.clock(world, world.agents[i].host);
                if grant.send_by <= now {
                    world.violate(format!(
                        "{}/{} attempt {} handed out at {now} with its send window closed (send-by {})",
                        grant.scope, grant.key, grant.attempt, grant.send_by
                    ));
                }
                let approval = self.check_approval(world, i, &grant);
                Pos::Holding(Held {
                    approval,
                    scope: grant.scope,
                    key: grant.key,
                    fence: grant.fence,
                    provider_key: grant.provider_key,
                    attempt: grant.attempt,
                    send_by: grant.send_by,
                    lease_until: grant.lease_until,
                    sent: None,
                })
            }
            Ok(Step::Wait(waiting)) => {
                if let Err(why) = check_account(world, &waiting.meanwhile) {
                    world.violate(format!("false answer while waiting: {why}"));
                }
                Pos::Waiting {
                    scope: waiting.scope,
                    key: waiting.key,
                    next: waiting.next,
                }
            }
            Ok(Step::Done(account)) => {
                if let Err(why) = check_account(world, &account) {
                    world.violate(format!("false answer: {why}"));
                }
                // A replay hands out the record's receipt: only to a caller on the record's account.
                if let (Ending::Confirmed(_), Some(key)) = (&account.ending, &account.key) {
                    let rec = Self::record(world, &account.scope, key);
                    self.check_same_account(
                        world,
                        world.agents[i].host,
                        rec.as_ref(),
                        "answered with the receipt of",
                    );
                }
                if let Some(op) = world.agents[i].op
                    && let Err(why) = self.check_quota_refusal(world, op, &account)
                {
                    world.violate(format!("false answer: {why}"));
                }
                Pos::Idle
            }
            Ok(Step::Direct) => {
                world.violate("a protected call was answered direct".into());
                Pos::Idle
            }
            // An error is no claim about the effect: the caller is back where it started.
            Err(_) => Pos::Idle,
        };
        if world.agents[i].op.is_none() && pos == Pos::Idle {
            // A courier's work ends with its send.
            world.agents[i].starts_left = 0;
        }
        world.agents[i].pos = pos;
    }

    /// `blocked(quota)` is true only if the spend does not fit beside what
    /// the other operations of the scope hold reserved.
    fn check_quota_refusal(&self, world: &World, op: usize, account: &Account) -> Result<(), String> {
        let (Ending::Blocked(b), Some(quota)) = (&account.ending, &self.config.policy.quota) else {
            return Ok(());
        };
        if b.reason != BlockReason::Quota {
            return Ok(());
        }
        let units = |amount: &str| once_guest::amount::parse_minor_units(amount, quota.decimals).unwrap_or(0);
        let spec = &self.config.ops[op];
        let held: u128 = world
            .ledger
            .rows
            .values()
            .filter(|r| r.table == Table::Operation && r.scope == spec.scope && Some(r.key.as_str()) != spec.key)
            .filter_map(|r| decode(r).ok()?.rec.reservation)
            .map(|res| res.units.parse::<u128>().unwrap_or(0))
            .sum();
        let ceiling = units(&quota.ceiling);
        if held + units(spec.amount) <= ceiling {
            return Err(format!(
                "{}/{}: {} refused although {} held + {} fits the ceiling {}",
                spec.scope,
                spec.key.unwrap_or("derived"),
                describe(account),
                held,
                units(spec.amount),
                ceiling
            ));
        }
        Ok(())
    }

    /// Whether a person must approve op (scope, key) before it is sent: the tool's rule, judged
    /// by the model on the operation's own amount.
    fn needs_approval(&self, scope: &str, key: &str) -> bool {
        if self.config.policy.approval.is_never() {
            return false;
        }
        // A configuration with an approval rule names its keys: the property would check nothing of a derived one.
        let spec = self
            .config
            .ops
            .iter()
            .find(|o| o.scope == scope && o.key == Some(key))
            .unwrap_or_else(|| panic!("{}: {scope}/{key} is no operation it names", self.config.name));
        match &self.config.policy.approval {
            ApprovalRule::Never => false,
            ApprovalRule::Always => true,
            ApprovalRule::Above { above, .. } => {
                let decimal = |t: &str| once_guest::amount::parse_decimal(t).expect("the model's amounts are decimals");
                decimal(spec.amount) > decimal(above)
            }
        }
    }

    /// The fingerprint of op (scope, key)'s own payload, as a person is shown it.
    fn op_fingerprint(&self, scope: &str, key: &str) -> Option<String> {
        let i = self
            .config
            .ops
            .iter()
            .position(|o| o.scope == scope && o.key == Some(key))?;
        Some(fingerprint(&self.request(i, 0).args))
    }

    /// A grant of an operation the approval rule holds needs an approval of exactly the payload
    /// it sends, given within `approval_valid_ms` before the grant (on the host clocks, give or
    /// take the skew), on which no request was sent yet. Returns the approval it was granted on.
    fn check_approval(&self, world: &mut World, i: usize, grant: &Grant) -> Option<usize> {
        if !self.needs_approval(&grant.scope, &grant.key) {
            return None;
        }
        let now = self.clock(world, world.agents[i].host);
        let sent = fingerprint(&grant.args);
        let valid = self.config.policy.approval_valid_ms;
        // The approval's time is the operator's host clock, the grant's its own host's: they differ by
        // at most the configured hosts' spread (none with one host).
        let slack = self.clock_spread();
        let found = world.approvals.iter().position(|a| {
            a.scope == grant.scope
                && a.key == grant.key
                && a.fingerprint == sent
                && !a.spent
                && a.at <= now.saturating_add(slack)
                && now < a.at.saturating_add(valid).saturating_add(slack)
        });
        if found.is_none() && world.unapproved.is_none() {
            world.unapproved = Some(format!(
                "{}/{} attempt {} granted at {now} with no unused approval of its payload valid then ({:?})",
                grant.scope, grant.key, grant.attempt, world.approvals
            ));
        }
        found
    }

    /// How far apart two hosts' clocks are, at most.
    fn clock_spread(&self) -> u64 {
        let skews = self.config.hosts.iter().map(|h| h.skew);
        let (lo, hi) = (skews.clone().min().unwrap_or(0), skews.max().unwrap_or(0));
        hi.abs_diff(lo)
    }

    /// A host is granted only operations its owner dispatches, begun through its own provider
    /// account (if the operation names one).
    fn check_grant(&self, world: &mut World, i: usize, scope: &str, key: &str) {
        let host = world.agents[i].host;
        let owner = &world.owners[host];
        let rec = Self::record(world, scope, key);
        let rec_owner = rec.as_ref().map(|r| r.owner.clone());
        if rec_owner.as_ref() != Some(owner) {
            let why = format!("host owner {owner:?} was granted {scope}/{key}, owned by {rec_owner:?}");
            world.violate(why);
        }
        self.check_same_account(world, host, rec.as_ref(), "granted");
    }

    /// The operation (scope, key) as the ledger holds it.
    fn record(world: &World, scope: &str, key: &str) -> Option<once_guest::record::OpRecord> {
        world
            .ledger
            .row(Table::Operation, scope, key)
            .and_then(|row| decode(row).ok())
            .map(|l| l.rec)
    }

    /// Host `host` was `what` an operation: it must have been begun through the host's account,
    /// if it names one.
    fn check_same_account(
        &self,
        world: &mut World,
        host: usize,
        rec: Option<&once_guest::record::OpRecord>,
        what: &str,
    ) {
        let mine = self.config.hosts[host].account;
        if let Some(rec) = rec
            && let Some(theirs) = rec.policy.provider_account.as_deref()
            && Some(theirs) != mine
        {
            let why = format!(
                "a host on provider account {mine:?} was {what} {}/{}, begun through account {theirs:?}",
                rec.scope, rec.key
            );
            world.violate(why);
        }
    }

    /// What a host's background work could change of the records other owners hold ([`Work`]), by
    /// (scope, key). Escalation is left out: deadlines escalate whoever owns a record.
    fn others_work(world: &World, host: usize) -> BTreeMap<(String, String), Work> {
        let owner = &world.owners[host];
        world
            .ledger
            .rows
            .values()
            .filter(|row| row.table == Table::Operation)
            .filter_map(|row| decode(row).ok())
            .filter(|l| &l.rec.owner != owner)
            .map(|l| {
                let r = l.rec;
                let work = (r.state, r.checks, r.attempts.len(), r.next_check, r.receipt, r.owner);
                ((r.scope, r.key), work)
            })
            .collect()
    }

    /// A host's sweep expires, reads and dispatches only its own owner's records.
    fn check_sweep_kept_to_its_own(&self, world: &mut World, host: usize, before: BTreeMap<(String, String), Work>) {
        // Taken over by this owner, it is gone from the other owners' records: a change too.
        let after = Self::others_work(world, host);
        for (id, was) in before {
            let now = after.get(&id);
            if now != Some(&was) {
                let why = format!(
                    "the sweep of host owner {:?} changed {}/{} of another owner: {was:?} to {now:?}",
                    world.owners[host], id.0, id.1
                );
                world.violate(why);
            }
        }
    }

    /// A call's own next attempt after one that was not sent (or a sweep's
    /// owed dispatch) is granted only once that attempt's back-off is over (a
    /// new call may try at once).
    fn check_back_off(&self, world: &mut World, host: usize, grant: &Grant) {
        let Some(mut rec) = world
            .ledger
            .row(Table::Operation, &grant.scope, &grant.key)
            .and_then(|row| decode(row).ok())
            .map(|l| l.rec)
        else {
            return;
        };
        // The record as it was before this grant: its retry time.
        rec.attempts.pop();
        let now = self.clock(world, host);
        if let Some(at) = rec.retry_at().filter(|&at| at > now) {
            let why = format!(
                "{}/{} attempt {} granted at {now}, within the back-off of a not-sent attempt (until {at})",
                grant.scope, grant.key, grant.attempt
            );
            world.violate(why);
        }
    }

    /// What a holder may truthfully report.
    fn sayable(&self, world: &World, held: &Held) -> Vec<Said> {
        let lose = self.config.lose_replies;
        let mut said = match held.sent.map(|r| &world.requests[r].fate) {
            None => vec![Said::NotSent],
            Some(Fate::Effect { receipt, .. } | Fate::Deduped { receipt }) => vec![Said::Success(receipt.clone())],
            Some(Fate::Refused) => vec![Said::Rejected],
            Some(Fate::Pending | Fate::Dropped) => vec![Said::Ambiguous],
        };
        if lose && !said.contains(&Said::Ambiguous) {
            said.push(Said::Ambiguous);
        }
        said
    }

    /// Bookkeeping after every step: receipts never change, and an
    /// unacknowledged possible-duplicate escalation is never dropped.
    fn observe(&self, world: &mut World) {
        let mut records = Vec::new();
        let mut unreadable = Vec::new();
        for row in world.ledger.rows.values().filter(|r| r.table == Table::Operation) {
            match decode(row) {
                Ok(loaded) => records.push(loaded.rec),
                Err(e) => unreadable.push(format!(
                    "row {}/{} does not decode: {}",
                    row.scope,
                    row.key,
                    e.message()
                )),
            }
        }
        for why in unreadable {
            world.violate(why);
        }
        for rec in &records {
            if let Some(receipt) = &rec.receipt {
                let id = (rec.scope.clone(), rec.key.clone(), rec.provider_key.clone());
                match world.receipts.get(&id) {
                    Some(first) if first != receipt => {
                        let why = format!(
                            "{}/{}: the stored receipt changed from {first} to {receipt}",
                            rec.scope, rec.key
                        );
                        world.violate(why);
                    }
                    Some(_) => {}
                    None => {
                        world.receipts.insert(id, receipt.clone());
                    }
                }
            }
            if rec.possible_duplicate && rec.escalated && !rec.escalation_acked {
                let id = rec.escalation_id.clone().unwrap_or_default();
                world
                    .pending_duplicates
                    .insert((rec.scope.clone(), rec.key.clone(), id));
            }
        }
        let pending: Vec<_> = world.pending_duplicates.iter().cloned().collect();
        for (scope, key, id) in pending {
            if world.acked.contains(&id) {
                world.pending_duplicates.remove(&(scope, key, id));
                continue;
            }
            let kept = records
                .iter()
                .any(|r| r.scope == scope && r.key == key && r.possible_duplicate && r.escalated);
            if !kept {
                world.violate(format!(
                    "{scope}/{key}: an unacknowledged possible-duplicate escalation was dropped"
                ));
            }
        }
    }

    /// The next moment (true time) anything can change, after now.
    pub fn next_threshold(&self, world: &World) -> Option<Time> {
        let mut at: Vec<Time> = Vec::new();
        for row in world.ledger.rows.values() {
            at.extend(row.due_at);
            if let Ok(rec) = decode(row).map(|l| l.rec) {
                at.extend(rec.window_until());
                at.extend(rec.deadline);
                at.extend(rec.next_check);
                // When no earlier request can still commit: past it, a resolve needs no force
                // and a read proves absence (the engine compares with and without the skew).
                if let Some(last) = rec.last_dispatch() {
                    let settled = last.saturating_add(rec.policy.max_in_flight_ms);
                    at.extend([settled + 1, settled + SKEW_MS + 1]);
                }
                // Retention, even while a re-delivery keeps the row due sooner (only prune reads it).
                let finished = matches!(
                    rec.state,
                    State::Confirmed | State::Failed | State::Superseded | State::Denied
                );
                // An approval's end, on the engine's clock and on the model's.
                at.extend(rec.approval.map(|a| a.valid_until));
                if finished && world.budget.prunes > 0 {
                    at.push(rec.transitioned_at.saturating_add(rec.policy.retention_ms));
                }
            }
        }
        for agent in &world.agents {
            match &agent.pos {
                Pos::Holding(h) => at.extend([h.send_by, h.lease_until]),
                Pos::Waiting { next, .. } => at.push(*next),
                Pos::Idle | Pos::Reading { .. } => {}
            }
        }
        let max_in_flight = self.config.policy.max_in_flight_ms;
        let mut times: Vec<Time> = Vec::new();
        // Ledger and grant times are host clocks: each host reaches them at its own true time.
        // Every comparison but one changes as a time is reached; a send is allowed up to
        // and including `send_by`, so what changes there comes a moment later.
        for agent in &world.agents {
            if let Pos::Holding(h) = &agent.pos {
                at.push(h.send_by + 1);
            }
        }
        for t in at.into_iter().filter(|t| *t < i64::MAX as u64) {
            for host in &self.config.hosts {
                times.push(t.saturating_add_signed(-host.skew));
            }
        }
        for r in world.requests.iter().filter(|r| r.fate == Fate::Pending) {
            times.push(r.sent_at + max_in_flight + 1);
        }
        for a in world.approvals.iter().filter(|a| !a.spent) {
            times.push(a.at + self.config.policy.approval_valid_ms + self.clock_spread());
        }
        times.into_iter().filter(|t| *t > world.now).min()
    }

    /// Apply one action to a copy of `world`.
    pub fn step(&self, world: &World, action: &Action) -> Option<World> {
        let mut w = world.clone();
        match action.clone() {
            Action::Start(i, read) => {
                let op = w.agents[i].op?;
                w.agents[i].starts_left -= 1;
                let req = self.request(op, w.agents[i].host);
                let scope = req.scope.clone();
                let host = w.agents[i].host;
                let step = self.with_host(&mut w, host, read, Some(&scope), |h| protocol::start_request(h, req));
                self.take_step(&mut w, i, step, true);
            }
            Action::Send(i) => {
                let Pos::Holding(held) = &w.agents[i].pos else {
                    return None;
                };
                let (host, mut held) = (w.agents[i].host, held.clone());
                w.requests.push(Request {
                    scope: held.scope.clone(),
                    key: held.key.clone(),
                    provider_key: held.provider_key.clone(),
                    fence: held.fence.clone(),
                    host,
                    sent_at: w.now,
                    fate: Fate::Pending,
                });
                held.sent = Some(w.requests.len() - 1);
                if let Some(a) = held.approval {
                    if w.approvals[a].spent && w.unapproved.is_none() {
                        w.unapproved = Some(format!(
                            "{}/{} attempt {} sent on an approval another request was sent on",
                            held.scope, held.key, held.attempt
                        ));
                    }
                    w.approvals[a].spent = true;
                }
                w.agents[i].pos = Pos::Holding(held);
            }
            Action::Report(i, said) => {
                let Pos::Holding(held) = w.agents[i].pos.clone() else {
                    return None;
                };
                let outcome = match &said {
                    Said::Success(receipt) => {
                        w.heard
                            .entry(held.provider_key.clone())
                            .or_default()
                            .insert(receipt.clone());
                        Outcome::Success(receipt.clone())
                    }
                    Said::Rejected => Outcome::Rejected("declined".into()),
                    Said::Ambiguous => Outcome::Ambiguous("no reply".into()),
                    Said::NotSent => Outcome::NotSent,
                };
                let host = w.agents[i].host;
                let step = self.with_host(&mut w, host, Read::Now, Some(&held.scope), |h| {
                    protocol::report(h, &held.scope, &held.key, &held.fence, outcome)
                });
                if let Ok(Step::Dispatch(grant)) = &step {
                    self.check_back_off(&mut w, host, grant);
                }
                self.take_step(&mut w, i, step, false);
            }
            Action::Resume(i, read) => {
                let Pos::Waiting { scope, key, .. } = w.agents[i].pos.clone() else {
                    return None;
                };
                let host = w.agents[i].host;
                let step = self.with_host(&mut w, host, read, Some(&scope), |h| protocol::resume(h, &scope, &key));
                if let Ok(Step::Dispatch(grant)) = &step {
                    self.check_back_off(&mut w, host, grant);
                }
                self.take_step(&mut w, i, step, false);
            }
            Action::GiveUp(i) => w.agents[i].pos = Pos::Idle,
            Action::Read(i, read) => {
                let Pos::Reading {
                    reading,
                    starting,
                    found: None,
                } = w.agents[i].pos.clone()
                else {
                    return None;
                };
                let host = w.agents[i].host;
                let h = ModelHost::new(
                    &w,
                    self.settings(&w, host),
                    self.clock(&w, host),
                    read,
                    true,
                    self.accounts(host),
                );
                let found = h.lookup(&reading.tool, &reading.provider_key, &reading.args);
                w.agents[i].pos = Pos::Reading {
                    reading,
                    starting,
                    found: Some(found),
                };
            }
            Action::ReadBack(i) => {
                let Pos::Reading {
                    reading,
                    starting,
                    found: Some(found),
                } = w.agents[i].pos.clone()
                else {
                    return None;
                };
                let agent = &w.agents[i];
                let (host, request) = (
                    agent.host,
                    agent.op.filter(|_| starting).map(|op| self.request(op, agent.host)),
                );
                let scope = reading.scope.clone();
                let step = self.with_host(&mut w, host, Read::Now, Some(&scope), |h| {
                    protocol::read_back(h, request, reading, found)
                });
                // A read brought back for a `start` goes on as that start (a caller's new call, which
                // a not-sent attempt's back-off does not hold: only the loop's own retries wait).
                if let (Ok(Step::Dispatch(grant)), false) = (&step, starting) {
                    self.check_back_off(&mut w, host, grant);
                }
                self.take_step(&mut w, i, step, starting);
            }
            Action::Commit(r) => {
                let pk = w.requests[r].provider_key.clone();
                let original = w.effects(&pk).into_iter().next();
                w.requests[r].fate = match original {
                    Some((receipt, _)) if self.config.policy.provider_claims_key => Fate::Deduped { receipt },
                    _ => Fate::Effect {
                        receipt: format!(r#"{{"refund":"{}/{}#{r}"}}"#, w.requests[r].scope, w.requests[r].key),
                        at: w.now,
                    },
                };
            }
            Action::Refuse(r) => w.requests[r].fate = Fate::Refused,
            Action::Sweep(host, read) => {
                w.budget.sweeps -= 1;
                let others = Self::others_work(&w, host);
                let result = self.with_host(&mut w, host, read, None, |h| protocol::sweep(h, SCAN_LIMIT, true));
                self.check_sweep_kept_to_its_own(&mut w, host, others);
                if let Ok(result) = result {
                    for grant in result.dispatches {
                        self.check_back_off(&mut w, host, &grant);
                        let i = Self::courier(&mut w, host);
                        self.take_step(&mut w, i, Ok(Step::Dispatch(grant)), false);
                    }
                    // Each due read the sweep listed is resumed at once, as a settling host does:
                    // its first step is the read.
                    for (scope, key) in result.reads {
                        let step = self.with_host(&mut w, host, Read::Now, Some(&scope), |h| {
                            protocol::resume(h, &scope, &key)
                        });
                        let i = Self::courier(&mut w, host);
                        self.take_step(&mut w, i, step, false);
                    }
                }
            }
            Action::Prune => {
                w.budget.prunes -= 1;
                let _ = self.with_host(&mut w, 0, Read::Now, None, |h| engine::prune(h, SCAN_LIMIT));
            }
            Action::Crash(host) => {
                w.budget.crashes -= 1;
                for agent in w.agents.iter_mut().filter(|a| a.host == host) {
                    agent.pos = Pos::Idle;
                    if agent.op.is_none() {
                        agent.starts_left = 0;
                    }
                }
            }
            Action::FailCommit { applied } => {
                w.budget.commit_faults -= 1;
                w.fault = Some(applied);
            }
            Action::SlowCommit => {
                w.budget.slow_commits -= 1;
                let policy = &self.config.policy;
                w.slow_commit = Some(policy.lease_ms.saturating_sub(policy.dispatch_timeout_ms));
            }
            Action::RenameOwner(host) => {
                w.budget.owner_changes -= 1;
                w.owners[host] = format!("{}-renamed", w.owners[host]);
            }
            Action::Adopt { from, to } => {
                w.budget.adoptions -= 1;
                let owner = w.owners[to].clone();
                let adopted = self.with_host(&mut w, to, Read::Now, None, |h| {
                    engine::adopt(h, &from, &owner, "checked by the model", SCAN_LIMIT)
                });
                if let Err(e) = adopted {
                    w.violate(format!("adopting {from}'s records as {owner} failed: {e:?}"));
                }
            }
            Action::SinkDown => {
                w.budget.sink_outages -= 1;
                w.sink_up = false;
            }
            Action::SinkUp => w.sink_up = true,
            Action::Backup => {
                w.budget.backups -= 1;
                w.backup = Some(w.ledger.clone());
            }
            Action::Restore => w.ledger = w.backup.take().expect("restored only when a copy was taken"),
            Action::Resolve(scope, key, settle) => {
                w.budget.resolves -= 1;
                let (resolution, force) = match &settle {
                    Settle::Confirmed(receipt) => (Resolution::Confirmed(receipt.clone()), false),
                    Settle::Absent { force } => (Resolution::Absent, *force),
                    Settle::Approve => (Resolution::Approve, false),
                    Settle::Deny => (Resolution::Deny, false),
                };
                let at = self.clock(&w, 0);
                let pk = self.record_provider_key(&w, &scope, &key);
                let done = self.with_host(&mut w, 0, Read::Now, Some(&scope), |h| {
                    engine::resolve(h, &scope, &key, resolution, "checked by the model", force)
                });
                if done.is_ok()
                    && force
                    && let Some(pk) = pk
                {
                    w.forced.insert(pk);
                }
                // The person approved the operation as they were shown it: its own payload.
                if done.is_ok()
                    && settle == Settle::Approve
                    && let Some(fingerprint) = self.op_fingerprint(&scope, &key)
                {
                    w.approvals.push(Approved {
                        scope,
                        key,
                        fingerprint,
                        at,
                        spent: false,
                    });
                }
            }
            Action::Tick => {
                w.budget.ticks -= 1;
                w.now = self.next_threshold(&w)?;
                let max_in_flight = self.config.policy.max_in_flight_ms;
                for r in w.requests.iter_mut() {
                    if r.fate == Fate::Pending && r.sent_at + max_in_flight < w.now {
                        r.fate = Fate::Dropped;
                    }
                }
            }
        }
        // Couriers that are done leave.
        w.agents.retain(|a| a.op.is_some() || a.pos != Pos::Idle);
        self.observe(&mut w);
        // A step that changed nothing but its own budget is no step: the
        // checker would otherwise count each idle sweep as a new state.
        let mut same = w.clone();
        same.budget = world.budget;
        if same == *world { None } else { Some(w) }
    }

    /// A new agent of `host` that carries one operation of its background work to its end.
    fn courier(world: &mut World, host: usize) -> usize {
        world.agents.push(Agent {
            host,
            op: None,
            starts_left: 0,
            pos: Pos::Idle,
        });
        world.agents.len() - 1
    }

    fn record_provider_key(&self, world: &World, scope: &str, key: &str) -> Option<String> {
        let row = world.ledger.row(Table::Operation, scope, key)?;
        decode(row).ok().map(|l| l.rec.provider_key)
    }

    /// Owners of operation records that no host has now (a rename left them behind).
    fn orphaned_owners(&self, world: &World) -> BTreeSet<String> {
        world
            .ledger
            .rows
            .values()
            .filter(|r| r.table == Table::Operation)
            .filter_map(|r| r.owner.clone())
            .filter(|o| !world.owners.contains(o))
            .collect()
    }

    /// The records an operator may resolve, truthfully: (scope, key, how).
    fn resolutions(&self, world: &World) -> Vec<(String, String, Settle)> {
        let mut out = Vec::new();
        for row in world.ledger.rows.values().filter(|r| r.table == Table::Operation) {
            let Ok(loaded) = decode(row) else { continue };
            let rec = loaded.rec;
            if rec.state == State::AwaitingApproval {
                out.push((rec.scope.clone(), rec.key.clone(), Settle::Approve));
                out.push((rec.scope, rec.key, Settle::Deny));
                continue;
            }
            if !matches!(
                rec.state,
                State::Unknown | State::InFlight | State::Absent | State::Failed
            ) {
                continue;
            }
            match world.effects(&rec.provider_key).into_iter().next() {
                Some((receipt, _)) => out.push((rec.scope, rec.key, Settle::Confirmed(receipt))),
                None if matches!(rec.state, State::Unknown | State::InFlight) => {
                    out.push((rec.scope.clone(), rec.key.clone(), Settle::Absent { force: false }));
                    out.push((rec.scope, rec.key, Settle::Absent { force: true }));
                }
                None => {}
            }
        }
        out
    }

    /// The initial world: empty, then the configuration's prefix taken.
    pub fn initial(&self) -> World {
        let mut world = self.empty();
        world.budget = Budget {
            ticks: u8::MAX,
            crashes: u8::MAX,
            commit_faults: u8::MAX,
            owner_changes: u8::MAX,
            adoptions: u8::MAX,
            sink_outages: u8::MAX,
            resolves: u8::MAX,
            prunes: u8::MAX,
            sweeps: u8::MAX,
            slow_commits: u8::MAX,
            backups: u8::MAX,
        };
        for action in &self.config.prefix {
            let mut enabled = Vec::new();
            self.enabled(&world, &mut enabled);
            assert!(
                enabled.contains(action),
                "{}: prefix step {action:?} is not enabled",
                self.config.name
            );
            world = self.step(&world, action).expect("an enabled step changes the world");
        }
        world.budget = self.config.budget;
        world
    }

    fn empty(&self) -> World {
        World {
            now: START,
            ledger: ledger_with_secret(),
            agents: self
                .config
                .callers
                .iter()
                .map(|&(host, op, starts)| Agent {
                    host,
                    op: Some(op),
                    starts_left: starts,
                    pos: Pos::Idle,
                })
                .collect(),
            requests: Vec::new(),
            owners: self.config.hosts.iter().map(|h| h.owner.to_string()).collect(),
            sink_up: true,
            acked: Default::default(),
            pending_duplicates: Default::default(),
            forced: Default::default(),
            heard: Default::default(),
            receipts: Default::default(),
            fault: None,
            slow_commit: None,
            budget: self.config.budget,
            violation: None,
            approvals: Vec::new(),
            unapproved: None,
            witness: Default::default(),
            backup: None,
        }
    }

    /// Every action enabled in `world`, in a fixed order.
    pub fn enabled(&self, world: &World, actions: &mut Vec<Action>) {
        if world.violation.is_some() {
            return;
        }
        // Reads made inside a step see the provider as each read kind does; a step that only asks
        // for a read is the same step whichever way that read will see it.
        let reads = &self.config.reads;
        let in_steps: &[Read] = if self.config.read_steps { &[Read::Now] } else { reads };
        for (i, agent) in world.agents.iter().enumerate() {
            let clock = self.clock(world, agent.host);
            match &agent.pos {
                Pos::Idle if agent.starts_left > 0 && agent.op.is_some() => {
                    if self.config.policy.verify_first {
                        actions.extend(in_steps.iter().map(|r| Action::Start(i, *r)));
                    } else {
                        actions.push(Action::Start(i, Read::Now));
                    }
                }
                Pos::Idle => {}
                Pos::Holding(held) => {
                    if held.sent.is_none() && clock <= held.send_by {
                        actions.push(Action::Send(i));
                    }
                    actions.extend(self.sayable(world, held).into_iter().map(|s| Action::Report(i, s)));
                }
                Pos::Waiting { next, .. } => {
                    if clock >= *next {
                        actions.extend(in_steps.iter().map(|r| Action::Resume(i, *r)));
                    }
                }
                Pos::Reading { found: None, .. } => actions.extend(reads.iter().map(|r| Action::Read(i, *r))),
                Pos::Reading { found: Some(_), .. } => actions.push(Action::ReadBack(i)),
            }
        }
        for (r, request) in world.requests.iter().enumerate() {
            if request.fate == Fate::Pending {
                actions.push(Action::Commit(r));
                actions.push(Action::Refuse(r));
            }
        }
        let b = &world.budget;
        for host in 0..self.config.hosts.len() {
            if b.sweeps > 0 {
                actions.extend(in_steps.iter().map(|r| Action::Sweep(host, *r)));
            }
            if b.crashes > 0 && world.agents.iter().any(|a| a.host == host && a.pos != Pos::Idle) {
                actions.push(Action::Crash(host));
            }
            if b.owner_changes > 0 {
                actions.push(Action::RenameOwner(host));
            }
            if b.adoptions > 0 {
                for from in self.orphaned_owners(world) {
                    actions.push(Action::Adopt { from, to: host });
                }
            }
        }
        if b.prunes > 0 && !world.ledger.rows.is_empty() {
            actions.push(Action::Prune);
        }
        if b.commit_faults > 0 && world.fault.is_none() {
            actions.push(Action::FailCommit { applied: false });
            actions.push(Action::FailCommit { applied: true });
        }
        if b.slow_commits > 0 && world.slow_commit.is_none() {
            actions.push(Action::SlowCommit);
        }
        if b.sink_outages > 0 && world.sink_up {
            actions.push(Action::SinkDown);
        }
        if !world.sink_up {
            actions.push(Action::SinkUp);
        }
        if b.backups > 0 && world.backup.is_none() {
            actions.push(Action::Backup);
        }
        if world.backup.is_some() {
            actions.push(Action::Restore);
        }
        if b.resolves > 0 {
            for (scope, key, settle) in self.resolutions(world) {
                actions.push(Action::Resolve(scope, key, settle));
            }
        }
        if b.ticks > 0 && self.next_threshold(world).is_some() {
            actions.push(Action::Tick);
        }
    }
}

/// At most one effect per operation, unless an operator forced an absence; and an original and
/// the successor that superseded it are one intent (a changed payload), so not both take effect
/// (unless an operator forced the original's absence).
pub fn at_most_one_effect(model: &OnceModel, world: &World) -> Result<(), String> {
    let keys: BTreeSet<&String> = world.requests.iter().map(|r| &r.provider_key).collect();
    for pk in keys {
        let effects = world.effects(pk);
        if effects.len() > 1 && !world.forced.contains(pk) {
            return Err(format!("provider key {pk}: {} effects {effects:?}", effects.len()));
        }
    }
    let any_request = |scope: &str, key: &str, what: &dyn Fn(&Request) -> bool| {
        world
            .requests
            .iter()
            .any(|r| r.scope == scope && r.key == key && what(r))
    };
    let took_effect = |scope: &str, key: &str| any_request(scope, key, &|r| matches!(r.fate, Fate::Effect { .. }));
    let forced = |scope: &str, key: &str| any_request(scope, key, &|r| world.forced.contains(&r.provider_key));
    for successor in &model.config.ops {
        let Some(original) = successor.supersedes.map(|j| &model.config.ops[j]) else {
            continue;
        };
        if let (Some(key), Some(original_key)) = (successor.key, original.key)
            && took_effect(successor.scope, key)
            && took_effect(original.scope, original_key)
            && !forced(original.scope, original_key)
        {
            return Err(format!(
                "{}/{key} superseded {}/{original_key}, and both took effect",
                successor.scope, original.scope
            ));
        }
    }
    Ok(())
}

/// Audit versions are contiguous from 1, and a record's version is its trail's last.
pub fn audit_contiguous(world: &World) -> Result<(), String> {
    let mut trails: std::collections::BTreeMap<(&str, &str), Vec<u64>> = Default::default();
    for (scope, key, version) in world.ledger.audit.keys() {
        trails.entry((scope, key)).or_default().push(*version);
    }
    for ((scope, key), versions) in trails {
        for (n, v) in versions.iter().enumerate() {
            if *v != n as u64 + 1 {
                return Err(format!("{scope}/{key}: audit versions {versions:?} are not 1..n"));
            }
        }
        if let Some(row) = world.ledger.row(Table::Operation, scope, key)
            && Some(&row.version) != versions.last()
        {
            return Err(format!(
                "{scope}/{key}: row version {} but trail {versions:?}",
                row.version
            ));
        }
    }
    Ok(())
}

/// No quota bucket is over its ceiling.
pub fn quota_within_ceiling(model: &OnceModel, world: &World) -> Result<(), String> {
    let Some(quota) = &model.config.policy.quota else {
        return Ok(());
    };
    let ceiling = once_guest::amount::parse_minor_units(&quota.ceiling, quota.decimals).unwrap_or(0);
    for row in world.ledger.rows.values().filter(|r| r.table == Table::Quota) {
        let body: serde_json::Value = serde_json::from_str(&row.body).map_err(|e| e.to_string())?;
        let used: u128 = body["used"].as_str().and_then(|u| u.parse().ok()).unwrap_or(0);
        if used > ceiling {
            return Err(format!(
                "bucket {} holds {used} minor units; the ceiling is {ceiling}",
                row.key
            ));
        }
    }
    Ok(())
}

/// A second success reported for one operation leaves its record flagged possible-duplicate.
pub fn second_success_flagged(world: &World) -> Result<(), String> {
    for (pk, receipts) in &world.heard {
        if receipts.len() < 2 {
            continue;
        }
        for row in world.ledger.rows.values().filter(|r| r.table == Table::Operation) {
            if let Ok(l) = decode(row)
                && &l.rec.provider_key == pk
                && !l.rec.possible_duplicate
            {
                return Err(format!(
                    "{}/{}: two successes reported, not flagged",
                    row.scope, row.key
                ));
            }
        }
    }
    Ok(())
}

/// Every request of an operation the approval rule holds was granted on an approval of its exact
/// payload, valid then, and no two requests were sent on one approval.
pub fn approved_before_sent(world: &World) -> Result<(), String> {
    match &world.unapproved {
        Some(why) => Err(why.clone()),
        None => Ok(()),
    }
}

/// The fingerprint of the tool's call with `args`, as the engine binds a key to it.
fn fingerprint(args: &str) -> String {
    once_guest::payload::fingerprint_of_text(TOOL, args.as_bytes(), &once_guest::canon::Limits::default())
        .expect("the model's args are JSON")
}

/// The properties, by name.
pub const PROPERTIES: [&str; 7] = [
    "every answer is true and every step keeps the rules",
    "at most one effect per operation",
    "audit versions are contiguous",
    "quota never passes its ceiling",
    "a second success is flagged",
    "every operation settles under a fair schedule",
    "no request above the approval threshold without a person's approval of its exact payload",
];

impl Model for OnceModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![self.initial()]
    }

    fn actions(&self, state: &World, actions: &mut Vec<Action>) {
        self.enabled(state, actions);
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        self.step(last, &action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(PROPERTIES[0], |_, s: &World| s.violation.is_none()),
            Property::always(PROPERTIES[1], |m: &OnceModel, s: &World| {
                at_most_one_effect(m, s).is_ok()
            }),
            Property::always(PROPERTIES[2], |_, s: &World| audit_contiguous(s).is_ok()),
            Property::always(PROPERTIES[3], |m: &OnceModel, s: &World| {
                quota_within_ceiling(m, s).is_ok()
            }),
            Property::always(PROPERTIES[4], |_, s: &World| second_success_flagged(s).is_ok()),
            Property::always(PROPERTIES[5], |m: &OnceModel, s: &World| {
                !m.config.liveness || crate::fair::settles(m, s).is_ok()
            }),
            Property::always(PROPERTIES[6], |_, s: &World| approved_before_sent(s).is_ok()),
        ]
    }
}

/// Which property `world` breaks, and why (for traces).
pub fn broken(model: &OnceModel, world: &World) -> Option<(&'static str, String)> {
    if let Some(v) = &world.violation {
        return Some((PROPERTIES[0], v.clone()));
    }
    let checks: [(&'static str, Result<(), String>); 5] = [
        (PROPERTIES[1], at_most_one_effect(model, world)),
        (PROPERTIES[2], audit_contiguous(world)),
        (PROPERTIES[3], quota_within_ceiling(model, world)),
        (PROPERTIES[4], second_success_flagged(world)),
        (PROPERTIES[6], approved_before_sent(world)),
    ];
    for (name, result) in checks {
        if let Err(why) = result {
            return Some((name, why));
        }
    }
    if model.config.liveness
        && let Err(why) = crate::fair::settles(model, world)
    {
        return Some((PROPERTIES[5], why));
    }
    None
}

/// An empty ledger that already holds its provider-key secret: creating it
/// is one insert-if-absent before any operation (guest/src/secret.rs), not a
/// transition of the engine's, so the explored actions begin after it and
/// every injected fault lands on a transition.
fn ledger_with_secret() -> once_guest::testing::Ledger {
    use once_guest::secret::{KeySecret, creation};
    let mut ledger = once_guest::testing::Ledger::default();
    ledger
        .commit(&creation(&KeySecret::from_bytes(
            once_guest::testing::TEST_ENTROPY.to_vec(),
        )))
        .expect("an empty ledger takes its secret");
    ledger
}
