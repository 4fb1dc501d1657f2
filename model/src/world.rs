//! One explored state: the ledger, the provider's truth, every caller's
//! position in the call protocol, and what is left to inject.
//!
//! Everything is a plain value (`Clone + Hash + Eq`): the checker keeps one
//! per state and tells states apart by hashing them.

use std::collections::{BTreeMap, BTreeSet};

use once_guest::testing::{Ledger, Witness};
use once_guest::types::{Evidence, Reading};

/// A time on the world's true clock (ms). Hosts read it with their skew.
pub type Time = u64;

/// One explored state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct World {
    /// True time.
    pub now: Time,
    /// The shared ledger: rows and audit trail.
    pub ledger: Ledger,
    /// Callers (fixed, first) and couriers (a host's background sends, appended).
    pub agents: Vec<Agent>,
    /// Every request that left a host, in order.
    pub requests: Vec<Request>,
    /// Each host's current owner name.
    pub owners: Vec<String>,
    /// Whether the escalation sink acknowledges.
    pub sink_up: bool,
    /// Escalation ids the sink acknowledged.
    pub acked: BTreeSet<String>,
    /// Possible-duplicate escalations marked and not yet acknowledged: (scope, key, id).
    pub pending_duplicates: BTreeSet<(String, String, String)>,
    /// Provider keys an operator resolved absent by force.
    pub forced: BTreeSet<String>,
    /// Per provider key, the receipts callers reported as successes.
    pub heard: BTreeMap<String, BTreeSet<String>>,
    /// The first receipt each record stored, by (scope, key, provider key).
    pub receipts: BTreeMap<(String, String, String), String>,
    /// An armed failure of the next commit: `Some(applied)`.
    pub fault: Option<bool>,
    /// An armed slow commit: the next commit that applies takes this long (a
    /// loaded ledger where the write queued behind others).
    pub slow_commit: Option<Time>,
    /// What is left to inject.
    pub budget: Budget,
    /// The first broken rule a step observed (an answer, a grant, a touch), if any.
    pub violation: Option<String>,
    /// Every approval an operator gave, oldest first.
    pub approvals: Vec<Approved>,
    /// The first request granted or sent without an approval it needed, if any.
    pub unapproved: Option<String>,
    /// The ledger's witness, kept apart from it (beside one SQLite file, every host's): a
    /// restore of the ledger leaves it as it is.
    pub witness: Witness,
    /// A copy of the ledger an operator took, to put back later (an older backup).
    pub backup: Option<Ledger>,
}

/// One approval an operator gave (`resolve … approve`), as the model saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Approved {
    /// Scope.
    pub scope: String,
    /// Key.
    pub key: String,
    /// The fingerprint of the payload the person approved: the operation's own args.
    pub fingerprint: String,
    /// When it was given (the operator's host clock).
    pub at: Time,
    /// A request was sent on it: it lets no other go out.
    pub spent: bool,
}

/// Faults and steps left to inject (each bounded, so the state space is finite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Budget {
    /// Time jumps.
    pub ticks: u8,
    /// Host crashes.
    pub crashes: u8,
    /// Commit failures (not applied, or applied with the answer lost).
    pub commit_faults: u8,
    /// Owner renames.
    pub owner_changes: u8,
    /// Operator adoptions of an orphaned owner's records.
    pub adoptions: u8,
    /// Sink outages.
    pub sink_outages: u8,
    /// Operator resolutions.
    pub resolves: u8,
    /// Prunes.
    pub prunes: u8,
    /// Sweeps.
    pub sweeps: u8,
    /// Commits that take a grant's whole send window.
    pub slow_commits: u8,
    /// Copies of the ledger taken (each restored at most once, at any later moment).
    pub backups: u8,
}

/// One caller (an application call with its operation) or courier (a
/// host's background sender of one owed dispatch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Agent {
    /// The host it runs on.
    pub host: usize,
    /// The operation it calls (none: a courier).
    pub op: Option<usize>,
    /// Calls it may still start (a retry, a restart's new connection).
    pub starts_left: u8,
    /// Where it is in the call protocol.
    pub pos: Pos,
}

/// A position in the call protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Pos {
    /// Not in a call.
    Idle,
    /// Holds a grant: send it (before `send_by`), then report.
    Holding(Held),
    /// Told to wait: resume at `next` (host clock), or give up.
    Waiting {
        /// Scope.
        scope: String,
        /// Key.
        key: String,
        /// When to resume (host clock).
        next: Time,
    },
    /// Told to read the provider (a `read` step): it reads ([`crate::model::Action::Read`]),
    /// then brings back what it found ([`crate::model::Action::ReadBack`]), and other steps
    /// may run between the two.
    Reading {
        /// What the engine asked.
        reading: Reading,
        /// Whether `start` asked (its call is brought back with the evidence).
        starting: bool,
        /// What the read found, once it was made.
        found: Option<Evidence>,
    },
}

/// A grant a caller holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held {
    /// Scope.
    pub scope: String,
    /// Key.
    pub key: String,
    /// Fence.
    pub fence: String,
    /// Provider key.
    pub provider_key: String,
    /// Attempt number.
    pub attempt: u32,
    /// Last moment to start sending (host clock).
    pub send_by: Time,
    /// Lease end (host clock).
    pub lease_until: Time,
    /// The request it sent, if any (index into `requests`).
    pub sent: Option<usize>,
    /// The approval it was granted on, where its operation needs one (index into `approvals`).
    pub approval: Option<usize>,
}

/// One request at the provider.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// Scope of the operation that sent it.
    pub scope: String,
    /// Key of the operation that sent it.
    pub key: String,
    /// Provider key it carried.
    pub provider_key: String,
    /// Fence of the attempt that sent it.
    pub fence: String,
    /// Host that sent it.
    pub host: usize,
    /// When it left the host (true time).
    pub sent_at: Time,
    /// What the provider did with it.
    pub fate: Fate,
}

/// What the provider did with one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Still in the network or the provider: it may commit until
    /// `sent_at + max_in_flight`.
    Pending,
    /// Committed: an effect, with its receipt, at a true time.
    Effect {
        /// The provider's receipt.
        receipt: String,
        /// When it committed.
        at: Time,
    },
    /// A duplicate of a claimed key: no effect; answered with the original's receipt.
    Deduped {
        /// The original's receipt.
        receipt: String,
    },
    /// Refused: no effect.
    Refused,
    /// Never arrived (or arrived after `max_in_flight` and was dropped): no effect.
    Dropped,
}

impl World {
    /// Effects (receipt, commit time) of the requests that carried `provider_key`.
    pub fn effects(&self, provider_key: &str) -> Vec<(String, Time)> {
        self.effects_through(provider_key, |_| true)
    }

    /// [`World::effects`] of the requests sent by hosts `through` says a read sees (the provider
    /// shows an account only what was sent through it).
    pub fn effects_through(&self, provider_key: &str, through: impl Fn(usize) -> bool) -> Vec<(String, Time)> {
        self.requests
            .iter()
            .filter(|r| r.provider_key == provider_key && through(r.host))
            .filter_map(|r| match &r.fate {
                Fate::Effect { receipt, at } => Some((receipt.clone(), *at)),
                _ => None,
            })
            .collect()
    }

    /// Whether a request carrying `provider_key` can still commit.
    pub fn pending(&self, provider_key: &str) -> bool {
        self.requests
            .iter()
            .any(|r| r.provider_key == provider_key && r.fate == Fate::Pending)
    }

    /// Every provider key a (scope, key) ever sent with.
    pub fn provider_keys_of(&self, scope: &str, key: &str) -> BTreeSet<String> {
        self.requests
            .iter()
            .filter(|r| r.scope == scope && r.key == key)
            .map(|r| r.provider_key.clone())
            .collect()
    }

    /// Note the first broken rule (later ones are consequences).
    pub fn violate(&mut self, why: String) {
        if self.violation.is_none() {
            self.violation = Some(why);
        }
    }
}
