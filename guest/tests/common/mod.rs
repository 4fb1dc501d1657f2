//! Helpers shared by the native state-machine tests: requests, answers,
//! and a record view whose audit trail is checked on every look.
#![allow(dead_code)]

use once_guest::engine::BeginRequest;
use once_guest::engine::{begin, finish, inspect};
use once_guest::policy::Policy;
use once_guest::policy::Quota;
use once_guest::policy::default_policy;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    Account, BlockReason, Blocked, ConfirmedInfo, Decision, FinishAck, Grant, Outcome, Reading, RecordView, State,
    Step, Table, UnknownInfo, Waiting,
};

// ---------------------------------------------------------------- constants

/// `MemoryHost::new()` starts its clock here.
pub const T0: u64 = 1_000_000;
pub const SECOND: u64 = 1_000;
pub const DAY: u64 = 24 * 3_600 * SECOND;
/// Default policy values (checked in `default_policy_is_what_the_tests_assume`).
pub const LEASE: u64 = 35 * SECOND;
pub const MAX_IN_FLIGHT: u64 = 60 * SECOND;
pub const DEADLINE: u64 = 15 * 60 * SECOND;
pub const RETENTION: u64 = 7 * DAY;

pub const ARGS: &str = r#"{"order":1234,"amount":200}"#;
pub const ARGS_CANON: &str = r#"{"amount":200,"order":1234}"#;
pub const RECEIPT: &str = r#"{"refund_id":"r-1","status":"done"}"#;
pub const RECEIPT2: &str = r#"{"refund_id":"r-2","status":"done"}"#;

// ---------------------------------------------------------------- helpers

/// The grant a protocol step hands out.
pub fn dispatch(step: Step) -> Grant {
    match step {
        Step::Dispatch(g) => g,
        other => panic!("expected dispatch, got {other:?}"),
    }
}

/// The account a protocol step ends with.
pub fn done(step: Step) -> Account {
    match step {
        Step::Done(a) => a,
        other => panic!("expected done, got {other:?}"),
    }
}

/// The wait a protocol step asks for.
pub fn wait(step: Step) -> Waiting {
    match step {
        Step::Wait(w) => w,
        other => panic!("expected wait, got {other:?}"),
    }
}

/// The provider read a protocol step asks for (`reads: steps`).
pub fn read_step(step: Step) -> Reading {
    match step {
        Step::Read(r) => r,
        other => panic!("expected read, got {other:?}"),
    }
}

pub fn policy() -> Policy {
    default_policy()
}

pub fn req(scope: &str, key: Option<&str>, tool: &str, args: &str, policy: Policy) -> BeginRequest {
    BeginRequest {
        scope: scope.to_string(),
        keys: key
            .map(|k| vec![("api".to_string(), k.to_string())])
            .unwrap_or_default(),
        tool: tool.to_string(),
        args: args.to_string(),
        policy,
        descriptor: None,
        supersedes: None,
        acknowledge_confirmed: false,
    }
}

/// `refund` in scope `s` with the default policy.
pub fn refund(key: &str, args: &str) -> BeginRequest {
    req("s", Some(key), "refund", args, policy())
}

pub fn with_policy(mut r: BeginRequest, policy: Policy) -> BeginRequest {
    r.policy = policy;
    r
}

pub fn go(h: &MemoryHost, r: BeginRequest) -> Decision {
    begin(h, r).expect("begin returns a decision")
}

pub fn execute_of(d: Decision) -> Grant {
    match d {
        Decision::Execute(e) => e,
        other => panic!("expected execute, got {other:?}"),
    }
}

pub fn replay_of(d: Decision) -> ConfirmedInfo {
    match d {
        Decision::Replay(r) => r,
        other => panic!("expected replay, got {other:?}"),
    }
}

pub fn unknown_of(d: Decision) -> UnknownInfo {
    match d {
        Decision::Unknown(u) => u,
        other => panic!("expected unknown, got {other:?}"),
    }
}

pub fn blocked_of(d: Decision, reason: BlockReason) -> Blocked {
    match d {
        Decision::Blocked(b) if b.reason == reason => b,
        other => panic!("expected blocked({reason:?}), got {other:?}"),
    }
}

pub fn fin(h: &MemoryHost, key: &str, fence: &str, outcome: Outcome) -> FinishAck {
    finish(h, "s", key, fence, outcome).expect("finish returns an ack")
}

pub fn success(receipt: &str) -> Outcome {
    Outcome::Success(receipt.to_string())
}

pub fn rejected() -> Outcome {
    Outcome::Rejected(r#"{"error":"card declined"}"#.to_string())
}

pub fn ambiguous() -> Outcome {
    Outcome::Ambiguous("timeout after send".to_string())
}

/// The record, with its audit trail checked (see [`check_audit`]).
pub fn view_in(h: &MemoryHost, scope: &str, key: &str) -> RecordView {
    let v = inspect(h, scope, key)
        .expect("inspect")
        .unwrap_or_else(|| panic!("no record {scope}/{key}"));
    check_audit(&v);
    v
}

pub fn view(h: &MemoryHost, key: &str) -> RecordView {
    view_in(h, "s", key)
}

pub fn kinds(v: &RecordView) -> Vec<&str> {
    v.audit.iter().map(|e| e.kind.as_str()).collect()
}

pub fn body(v: &RecordView) -> serde_json::Value {
    serde_json::from_str(&v.body).expect("record body is JSON")
}

/// DESIGN.md "One atomic write per transition": one audit event per write,
/// keyed by version, contiguous 1..=version, chained from state to state,
/// and the last one lands in the record's current state.
pub fn check_audit(v: &RecordView) {
    let versions: Vec<u64> = v.audit.iter().map(|e| e.version).collect();
    let expected: Vec<u64> = (1..=v.version).collect();
    assert_eq!(
        versions, expected,
        "audit versions of {}/{} are not 1..=version",
        v.scope, v.key
    );
    for pair in v.audit.windows(2) {
        assert_eq!(
            pair[1].from_state, pair[0].to_state,
            "event {} ({}) does not start where event {} ({}) ended",
            pair[1].version, pair[1].kind, pair[0].version, pair[0].kind
        );
        assert!(pair[1].at >= pair[0].at, "audit time runs backwards");
    }
    let first = v.audit.first().expect("a record has at least one event");
    assert_eq!(first.from_state, None, "the first event creates the record");
    assert_eq!(
        v.audit.last().unwrap().to_state,
        Some(v.state),
        "last event does not match the record state"
    );
    for e in &v.audit {
        assert_eq!((e.scope.as_str(), e.key.as_str()), (v.scope.as_str(), v.key.as_str()));
        serde_json::from_str::<serde_json::Value>(&e.detail).expect("audit detail is JSON");
    }
}

/// Follows one record and checks that every write between two looks added
/// exactly one audit event per version.
pub struct Tracker {
    scope: String,
    key: String,
    version: u64,
}

impl Tracker {
    pub fn new(scope: &str, key: &str) -> Self {
        Tracker {
            scope: scope.to_string(),
            key: key.to_string(),
            version: 0,
        }
    }

    /// Asserts the number of writes since the last look, returns the record.
    pub fn step(&mut self, h: &MemoryHost, writes: u64) -> RecordView {
        let v = view_in(h, &self.scope, &self.key);
        assert_eq!(
            v.version,
            self.version + writes,
            "{}/{}: expected {writes} write(s) since version {}, audit: {:?}",
            self.scope,
            self.key,
            self.version,
            kinds(&v)
        );
        self.version = v.version;
        v
    }
}

pub fn quota_policy(ceiling: &str) -> Policy {
    let mut p = policy();
    p.quota = Some(Quota {
        spend_field: "/amount".to_string(),
        ceiling: ceiling.to_string(),
        decimals: 2,
        window_ms: DAY,
        bucket: None,
    });
    p
}

pub fn pay(key: &str, amount: &str, policy: &Policy) -> BeginRequest {
    req(
        "s",
        Some(key),
        "pay",
        &format!(r#"{{"amount":{amount},"to":"acct-9"}}"#),
        policy.clone(),
    )
}

/// Sum of `used` over every quota bucket row, in minor units.
pub fn quota_used(h: &MemoryHost) -> u128 {
    h.rows()
        .iter()
        .filter(|r| r.table == Table::Quota && r.scope != once_guest::secret::SECRET_SCOPE)
        .map(|r| {
            let b: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            b["used"].as_str().unwrap().parse::<u128>().unwrap()
        })
        .sum()
}

pub fn operation_rows(h: &MemoryHost) -> usize {
    h.rows().iter().filter(|r| r.table == Table::Operation).count()
}

pub fn assert_nothing_written(h: &MemoryHost) {
    // The ledger's provider-key secret is made before the first operation's claim and is no
    // operation's row: it may exist whatever became of the claim.
    let rows: Vec<_> = h
        .rows()
        .into_iter()
        .filter(|r| {
            (r.scope.as_str(), r.key.as_str()) != (once_guest::secret::SECRET_SCOPE, once_guest::secret::SECRET_KEY)
        })
        .collect();
    assert!(rows.is_empty(), "rows were written: {rows:?}");
    assert_eq!(h.event_count(), 0, "audit events were written");
}

/// Drive a fresh key into `unknown` by an ambiguous finish at T0 + 1s.
pub fn unknown_record(h: &MemoryHost, key: &str, policy: Policy) -> Grant {
    let e = execute_of(go(h, with_policy(refund(key, ARGS), policy)));
    h.advance(SECOND);
    assert_eq!(fin(h, key, &e.fence, ambiguous()), FinishAck::Recorded(State::Unknown));
    e
}

/// The default policy, with a person's approval before every attempt.
pub fn always_approved() -> Policy {
    let mut p = policy();
    p.approval = once_guest::policy::ApprovalRule::Always;
    p
}

/// `quota_policy`'s tool, with a person's approval above `above` on `/amount`.
pub fn approval_above(above: &str) -> Policy {
    let mut p = quota_policy("10000.00");
    p.approval = once_guest::policy::ApprovalRule::Above {
        field: "/amount".into(),
        above: above.into(),
    };
    p
}

/// The operator's queue with no filter: every scope, tool and key.
pub fn everything() -> once_guest::types::QueueFilter {
    once_guest::types::QueueFilter {
        scopes: None,
        tool: None,
        key_prefix: None,
    }
}
