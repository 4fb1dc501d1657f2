//! The configurations the checker explores: several small ones rather than
//! one huge one. [`small`] runs in CI (`cargo test -p once-model`); [`deep`]
//! widens each (more starts, faults and time) for a documented longer run
//! (`cargo run --release -p once-model -- deep`).

use once_guest::mutant::Mutant;
use once_guest::policy::{ApprovalRule, Policy, Quota, default_lease, default_policy};
use once_guest::types::{IdentityMode, Route};

use crate::host::Read;
use crate::model::{Action, Said, Settle};
use crate::world::Budget;

/// One second, in ms.
pub const SECOND: u64 = 1_000;
/// The declared clock skew between hosts (each host's clock is off by at most this).
pub const SKEW_MS: u64 = 1_000;

/// One operation a caller may call.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Scope.
    pub scope: &'static str,
    /// The application key; none: derived from the arguments.
    pub key: Option<&'static str>,
    /// The amount, as JSON number text.
    pub amount: &'static str,
    /// The op (index) this one supersedes.
    pub supersedes: Option<usize>,
}

/// One host sharing the ledger.
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// Its owner name (who dispatches its records).
    pub owner: &'static str,
    /// Its clock's offset from true time, within the declared skew.
    pub skew: i64,
    /// The provider account it sends and reads through (`provider-account`); none: it names none.
    /// The provider shows a read only the effects of requests sent through the reader's account.
    pub account: Option<&'static str>,
}

/// One configuration of the model.
#[derive(Debug, Clone)]
pub struct Config {
    /// Its name, as reported.
    pub name: &'static str,
    /// The tool's policy (tool `refund`).
    pub policy: Policy,
    /// Operations.
    pub ops: Vec<OpSpec>,
    /// Hosts.
    pub hosts: Vec<HostSpec>,
    /// Callers: (host, op, calls it may start).
    pub callers: Vec<(usize, usize, u8)>,
    /// How provider reads may see the provider.
    pub reads: Vec<Read>,
    /// Whether the protocol's provider reads are steps of their own (configuration `reads:
    /// steps`, the Rust host's and the gateway's), which other steps may interleave with; else
    /// they happen inside the step that needs them (`reads: import`, the Python and Node hosts').
    pub read_steps: bool,
    /// Faults and steps to inject.
    pub budget: Budget,
    /// Whether `report` may also claim "ambiguous" when it knows better (a lost reply).
    pub lose_replies: bool,
    /// Whether the fair-continuation liveness check runs on every state.
    pub liveness: bool,
    /// The deliberate bug switched on, if any.
    pub mutant: Option<Mutant>,
    /// The longest path explored (the budgets bound each kind of step; this
    /// bounds their interleavings).
    pub depth: usize,
    /// Steps taken before the exploration starts: a configuration that
    /// explores from a state deep in the protocol (the budgets apply after it).
    pub prefix: Vec<Action>,
}

/// The policy every configuration starts from: protected, an application
/// key, a lookup, short times (only their order matters to the checker).
pub fn base_policy() -> Policy {
    let mut p = default_policy();
    p.route = Some(Route::Protect);
    p.identity = IdentityMode::Required;
    p.dispatch_timeout_ms = 5 * SECOND;
    p.lease_ms = default_lease(p.dispatch_timeout_ms, SKEW_MS);
    p.max_in_flight_ms = 20 * SECOND;
    p.attempt_budget = 2;
    p.reconcile_interval_ms = 4 * SECOND;
    p.resolve_deadline_ms = 30 * SECOND;
    p.derived_window_ms = 60 * SECOND;
    p.retention_ms = 120 * SECOND;
    p.tombstone_retention_ms = 240 * SECOND;
    p
}

fn op(scope: &'static str, key: &'static str, amount: &'static str) -> OpSpec {
    OpSpec {
        scope,
        key: Some(key),
        amount,
        supersedes: None,
    }
}

fn one_host() -> Vec<HostSpec> {
    vec![HostSpec {
        owner: "a",
        skew: 0,
        account: None,
    }]
}

fn base(name: &'static str) -> Config {
    Config {
        name,
        policy: base_policy(),
        ops: vec![op("s", "k0", "3.00")],
        hosts: one_host(),
        callers: vec![(0, 0, 2)],
        reads: vec![Read::Now],
        read_steps: true,
        budget: Budget {
            ticks: 6,
            crashes: 0,
            commit_faults: 0,
            owner_changes: 0,
            adoptions: 0,
            sink_outages: 0,
            resolves: 0,
            prunes: 0,
            sweeps: 3,
            slow_commits: 0,
            backups: 0,
        },
        lose_replies: true,
        liveness: true,
        mutant: None,
        depth: 11,
        prefix: Vec::new(),
    }
}

/// k1 (a changed payload) supersedes k0: one caller starts k0 once, another k1 twice.
fn supersede(name: &'static str) -> Config {
    let mut c = base(name);
    c.ops = vec![
        op("s", "k0", "3.00"),
        OpSpec {
            supersedes: Some(0),
            ..op("s", "k1", "4.00")
        },
    ];
    c.callers = vec![(0, 0, 1), (0, 1, 2)];
    c
}

/// k0 (8.00) above the tool's approval threshold (5.00); an approval is valid for 10 s.
fn approval(name: &'static str) -> Config {
    let mut c = base(name);
    c.policy.approval = ApprovalRule::Above {
        field: "/amount".into(),
        above: "5.00".into(),
    };
    c.policy.approval_valid_ms = 10 * SECOND;
    c.ops = vec![op("s", "k0", "8.00")];
    c.budget.resolves = 2;
    c
}

/// Caller 0's first attempt sent and its reply lost; the read that follows made at once and brought
/// back (it finds nothing, too early to prove anything): the record unknown, the caller waiting.
fn lost_reply_read() -> Vec<Action> {
    vec![
        Action::Start(0, Read::Now),
        Action::Send(0),
        Action::Report(0, Said::Ambiguous),
        Action::Read(0, Read::Now),
        Action::ReadBack(0),
    ]
}

/// The small configurations, each a different corner of the protocol.
pub fn small() -> Vec<Config> {
    let mut all = Vec::new();

    // One key, two callers: the core race, lost replies, a crash, a failed commit.
    let mut c = base("one key, two callers");
    c.callers = vec![(0, 0, 1), (0, 0, 1)];
    c.budget.crashes = 1;
    c.budget.commit_faults = 1;
    c.budget.ticks = 4;
    all.push(c);

    // The same, read as the Python and Node hosts read: inside the step that needs the read.
    let mut c = base("one key, two callers inside the steps");
    c.callers = vec![(0, 0, 1), (0, 0, 1)];
    c.read_steps = false;
    c.budget.crashes = 1;
    c.budget.commit_faults = 1;
    c.budget.ticks = 4;
    all.push(c);

    // A loaded ledger: a grant's commit takes its whole send window (renewed before it is handed out),
    // beside a lost reply and a second caller.
    let mut c = base("slow ledger");
    c.callers = vec![(0, 0, 1), (0, 0, 1)];
    c.budget.slow_commits = 2;
    c.budget.ticks = 4;
    all.push(c);

    // Reads that lag or cannot tell, and a provider that claims keys.
    let mut c = base("lagging reads");
    c.reads = vec![Read::Now, Read::Lagging, Read::CannotTell];
    c.budget.ticks = 8;
    all.push(c);

    // The same, read as the Python and Node hosts read: inside the step that needs the read.
    let mut c = base("lagging reads inside the steps");
    c.reads = vec![Read::Now, Read::Lagging, Read::CannotTell];
    c.read_steps = false;
    c.budget.ticks = 8;
    all.push(c);

    let mut c = base("provider claims the key");
    c.policy.provider_claims_key = true;
    c.policy.key_sent_by_host = true;
    c.callers = vec![(0, 0, 2), (0, 0, 1)];
    all.push(c);

    // Supersede: a changed payload is a new operation naming the original.
    let mut c = supersede("supersede");
    c.budget.ticks = 5;
    all.push(c);

    // Supersede an original whose absence only the provider's claim proved, before max-in-flight:
    // its first request may still commit, and the successor carries a new provider key.
    let mut c = supersede("supersede after a claimed absence");
    c.policy.provider_claims_key = true;
    c.policy.key_sent_by_host = true;
    // From k0 absent with its attempts spent: its first attempt's reply lost, a read after it found
    // nothing (the claim makes that absent at once), the owed attempt not sent; the first request is
    // still out there. The successor waits out max-in-flight, then reads the provider for k0.
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Send(0),
        Action::Report(0, Said::Ambiguous),
        Action::Read(0, Read::Now),
        Action::ReadBack(0),
        Action::Tick,
        Action::Resume(0, Read::Now),
        Action::Read(0, Read::Now),
        Action::ReadBack(0),
        Action::Report(0, Said::NotSent),
    ];
    c.budget.sweeps = 1;
    c.budget.ticks = 4;
    c.depth = 10;
    all.push(c);

    // A quota pair: two operations on one bucket, only one fits.
    let mut c = base("quota pair");
    c.policy.quota = Some(Quota {
        spend_field: "/amount".into(),
        ceiling: "5.00".into(),
        decimals: 2,
        window_ms: 3_600 * SECOND,
        bucket: None,
    });
    c.ops = vec![op("s", "k0", "3.00"), op("s", "k1", "3.00")];
    c.callers = vec![(0, 0, 1), (0, 1, 1)];
    c.budget.ticks = 5;
    all.push(c);

    // A derived key across its window.
    let mut c = base("derived key across its window");
    c.policy.identity = IdentityMode::Derived;
    c.ops = vec![OpSpec {
        key: None,
        ..op("s", "", "3.00")
    }];
    c.callers = vec![(0, 0, 3)];
    c.budget.ticks = 10;
    all.push(c);

    // Prune and reuse: a key asked again after its record was pruned.
    let mut c = base("prune and reuse");
    c.budget.prunes = 2;
    c.budget.ticks = 10;
    all.push(c);

    // Two hosts sharing a ledger, clocks skewed; one renames its owner; the sink goes down.
    let mut c = base("two hosts");
    c.hosts = vec![
        HostSpec {
            owner: "a",
            skew: SKEW_MS as i64,
            account: None,
        },
        HostSpec {
            owner: "b",
            skew: -(SKEW_MS as i64),
            account: None,
        },
    ];
    c.callers = vec![(0, 0, 1), (1, 0, 1)];
    c.budget.owner_changes = 1;
    c.budget.sink_outages = 1;
    c.budget.ticks = 8;
    all.push(c);

    // A host renamed with its operation unsettled; an operator adopts the orphaned
    // records to the new name, whose background work then settles them.
    let mut c = base("renamed and adopted");
    c.budget.owner_changes = 1;
    c.budget.adoptions = 1;
    c.budget.ticks = 6;
    all.push(c);

    // An operator settles what nothing else can (with and without force).
    let mut c = base("operator");
    c.policy.lookup = false;
    c.budget.resolves = 1;
    c.budget.ticks = 6;
    all.push(c);

    // An operator forces an absence too early: the late effect must be
    // flagged, and its escalation kept until the sink has it.
    let mut c = base("forced absence");
    c.policy.lookup = false;
    c.callers = vec![(0, 0, 1)];
    c.lose_replies = false;
    c.budget.resolves = 1;
    c.budget.sink_outages = 1;
    c.budget.prunes = 1;
    c.budget.ticks = 8;
    c.budget.sweeps = 2;
    c.depth = 15;
    all.push(c);

    // From a possible duplicate whose escalation the sink has not taken (it
    // is down): retention passes, prune and sweep run, the sink comes back.
    let mut c = base("pending possible duplicate");
    c.policy.lookup = false;
    c.callers = vec![(0, 0, 1)];
    c.lose_replies = false;
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Tick,
        Action::Send(0),
        Action::Tick,
        Action::Tick,
        Action::Resolve("s".into(), "k0".into(), Settle::Absent { force: true }),
        Action::Sweep(0, Read::Now),
        Action::Tick,
        Action::Send(1),
        Action::Commit(0),
        Action::Commit(1),
        Action::SinkDown,
        Action::Report(1, Said::Success(r#"{"refund":"s/k0#1"}"#.into())),
        Action::Report(0, Said::Success(r#"{"refund":"s/k0#0"}"#.into())),
    ];
    c.budget.ticks = 8;
    c.budget.prunes = 2;
    c.budget.sweeps = 3;
    c.depth = 12;
    all.push(c);

    // From a holder left behind: its lease ended unsent, an operator
    // resolved the record absent once no request could still commit, and the
    // sweep granted the owed dispatch. The holder then reports with its stale
    // fence; a third attempt is in the budget.
    let mut c = base("stale holder");
    c.policy.lookup = false;
    c.policy.attempt_budget = 3;
    c.callers = vec![(0, 0, 2)];
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Tick,
        Action::Tick,
        Action::Tick,
        Action::Tick,
        Action::Resolve("s".into(), "k0".into(), Settle::Absent { force: false }),
        Action::Sweep(0, Read::Now),
    ];
    c.budget.ticks = 4;
    c.depth = 10;
    all.push(c);

    // From an owed dispatch of owner "a" whose attempt was not sent (a back-off, attempts left),
    // a caller on host "b" asks for the same operation: "a" sends it, so b's answer must not say
    // "no effect, use a new key".
    let mut c = base("another owner's owed dispatch");
    c.policy.attempt_budget = 3;
    c.hosts = vec![
        HostSpec {
            owner: "a",
            skew: 0,
            account: None,
        },
        HostSpec {
            owner: "b",
            skew: 0,
            account: None,
        },
    ];
    c.callers = vec![(0, 0, 1), (1, 0, 1)];
    c.prefix = lost_reply_read();
    c.prefix.extend([
        Action::Tick,
        Action::Tick,
        Action::Tick,
        Action::Tick,
        Action::Sweep(0, Read::Now),
        Action::Read(2, Read::Now),
        Action::ReadBack(2),
        Action::Report(2, Said::NotSent),
    ]);
    c.budget.ticks = 4;
    c.depth = 8;
    all.push(c);

    // From a lost reply whose first read found nothing yet: reads made and brought back with other
    // steps between (a late commit, time passing, a second caller's reads, the sweep's).
    let mut c = base("reads beside a lost reply");
    c.policy.attempt_budget = 3;
    c.callers = vec![(0, 0, 1), (0, 0, 1)];
    c.prefix = lost_reply_read();
    c.budget.ticks = 5;
    c.budget.sweeps = 2;
    all.push(c);

    // A person approves calls above a threshold: k0 (above) waits for an approval of its payload,
    // valid for a short while; k1 (below) is sent at once. The operator approves or denies.
    let mut c = approval("approval above a threshold");
    c.ops.push(op("s", "k1", "3.00"));
    c.callers = vec![(0, 0, 2), (0, 1, 1)];
    c.budget.ticks = 4;
    c.depth = 9;
    all.push(c);

    // From an approved k0 whose first attempt's reply was lost (the first read, too early, found
    // nothing): proven absent later, the owed redispatch needs a person again.
    let mut c = approval("approval of an owed redispatch");
    c.callers = vec![(0, 0, 3)];
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Resolve("s".into(), "k0".into(), Settle::Approve),
    ];
    c.prefix.extend(lost_reply_read());
    c.budget.ticks = 4;
    c.budget.resolves = 1;
    c.depth = 10;
    all.push(c);

    // The upstream's credential is rotated while k0's outcome is unknown: host 1 (the same owner,
    // through the new account, which cannot see what the old one sent) reads and is called; host 0
    // (the old account) can still read it. The new account never sends k0, nor replays it.
    let mut c = base("credential rotation while unknown");
    c.hosts = vec![
        HostSpec {
            owner: "a",
            skew: 0,
            account: Some("old"),
        },
        HostSpec {
            owner: "a",
            skew: 0,
            account: Some("new"),
        },
    ];
    c.callers = vec![(0, 0, 2), (1, 0, 1)];
    // Read inside the steps (as the Python and Node hosts do): the host's reads are no steps of their own.
    c.read_steps = false;
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Send(0),
        Action::Report(0, Said::Ambiguous),
    ];
    c.budget.ticks = 4;
    c.budget.sweeps = 2;
    c.depth = 9;
    all.push(c);

    // Older history: a copy of the ledger is taken at any moment (before k0 is called, after a
    // rejection, while an attempt is out) and put back at any later one (the file restored from
    // an older backup, the hosts running on). The witness, kept apart, gives back every attempt
    // the copy lacks: k0 is never sent again on its strength.
    let mut c = base("a ledger restored from an older backup");
    c.callers = vec![(0, 0, 3)];
    c.budget.backups = 1;
    c.budget.ticks = 4;
    c.budget.sweeps = 1;
    c.depth = 10;
    all.push(c);

    // The same, from a copy taken after k0's first attempt was refused: the restored record is
    // short of the second attempt the newer history sent, and no third may follow on its strength.
    let mut c = base("a ledger restored to before the last attempt");
    c.callers = vec![(0, 0, 3)];
    c.prefix = vec![
        Action::Start(0, Read::Now),
        Action::Send(0),
        Action::Refuse(0),
        Action::Report(0, Said::Rejected),
        Action::Backup,
    ];
    c.budget.ticks = 4;
    c.budget.sweeps = 1;
    c.depth = 10;
    all.push(c);

    // Two scopes naming the same key: two operations.
    let mut c = base("two scopes");
    c.ops = vec![op("s", "k0", "3.00"), op("t", "k0", "3.00")];
    c.callers = vec![(0, 0, 1), (0, 1, 1)];
    c.budget.ticks = 5;
    c.depth = 10;
    all.push(c);

    all
}

/// The deep configurations: the small ones two steps deeper, with every
/// kind of provider read and one more sweep. (Each extra step of depth
/// roughly doubles the distinct states, and each one holds its ledger: on a
/// machine of 24 GiB, three more steps, or more faults, do not fit the
/// widest configurations.)
pub fn deep() -> Vec<Config> {
    small()
        .into_iter()
        .map(|mut c| {
            c.budget.sweeps += 1;
            c.reads = vec![Read::Now, Read::Lagging, Read::CannotTell];
            c.depth += 2;
            c
        })
        .collect()
}
