//! Scripted agents (no model) mirroring the study's policies, run unprotected
//! (direct calls, a fresh request id per attempt) or protected (through once
//! with an app-minted key, reconciling via the service's lookup by key).

use std::time::{Duration, Instant};

use once::types::{Effect, Error, PolicyInput, Repeat};
use once::{Called, Dispatch, Once, OnceError, Sent};
use refund::{CallError, Client, ORDER_ID};

use super::classify::{evidence, sent};

/// The tool once protects.
pub const TOOL: &str = "refund_order";
/// The task: refund $200 on order 1234.
pub const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;
const AMOUNT: f64 = 200.0;
/// The agent's HTTP timeout; the late-reply fault answers after 400 ms.
pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(150);
/// How many times a retrying agent tries.
const RETRIES: u32 = 6;
/// How long a retrying agent waits between tries.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// An agent's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// Retry every failure.
    AlwaysRetry,
    /// Never retry.
    NeverRetry,
    /// After a failure, read the order and refund again only if no refund shows.
    ReadThenDecide,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 3] = [Policy::AlwaysRetry, Policy::NeverRetry, Policy::ReadThenDecide];

    /// The report name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::AlwaysRetry => "always_retry",
            Policy::NeverRetry => "never_retry",
            Policy::ReadThenDecide => "read_then_decide",
        }
    }

    /// Parse a report name.
    pub fn parse(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// What the agent finally tells its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// "I refunded it."
    Refunded,
    /// "It may or may not have happened."
    Unknown,
    /// "It did not happen."
    Failed,
}

impl Report {
    /// The report word.
    pub fn name(self) -> &'static str {
        match self {
            Report::Refunded => "refunded",
            Report::Unknown => "unknown",
            Report::Failed => "failed",
        }
    }

    /// Parse a report word.
    pub fn parse(name: &str) -> Option<Report> {
        [Report::Refunded, Report::Unknown, Report::Failed]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

/// Where one trial's agent works.
#[derive(Debug, Clone)]
pub struct Env {
    /// Base URL of the refund service, through the fault proxy.
    pub target: String,
    /// The once ledger (protected agents): an SQLite file or a PostgreSQL URL.
    pub ledger: String,
    /// once scope of this trial.
    pub scope: String,
    /// The operation key the application minted before the first attempt.
    pub key: String,
}

/// Run an unprotected agent: direct calls, a fresh request id per attempt.
pub fn run_unprotected(policy: Policy, env: &Env) -> Report {
    let client = Client::new(env.target.clone(), CLIENT_TIMEOUT);
    let mut attempt = 0;
    let mut refund = || {
        attempt += 1;
        let request_id = format!("{}-req-{}-{attempt}", env.key, std::process::id());
        client.refund_order(ORDER_ID, AMOUNT, &request_id)
    };
    match policy {
        Policy::NeverRetry => match refund() {
            Ok(_) => Report::Refunded,
            Err(_) => Report::Failed,
        },
        Policy::AlwaysRetry => {
            for _ in 0..RETRIES {
                match refund() {
                    Ok(_) => return Report::Refunded,
                    Err(CallError::Rejected { .. }) => return Report::Failed,
                    Err(_) => std::thread::sleep(RETRY_PAUSE),
                }
            }
            Report::Failed
        }
        Policy::ReadThenDecide => match refund() {
            Ok(_) => Report::Refunded,
            Err(CallError::Rejected { .. }) => Report::Failed,
            Err(_) => match client.get_order(ORDER_ID) {
                Ok(order) if order.refunded >= AMOUNT => Report::Refunded,
                Ok(_) => match refund() {
                    Ok(_) => Report::Refunded,
                    Err(_) => Report::Failed,
                },
                Err(_) => Report::Unknown,
            },
        },
    }
}

/// Run a protected agent: every refund goes through once with the same key.
pub fn run_protected(policy: Policy, env: &Env) -> Result<Report, OnceError> {
    let client = Client::new(env.target.clone(), CLIENT_TIMEOUT);
    let once = protected_once(&env.ledger, &client)?;
    let call = || -> Result<Report, OnceError> {
        let called = once.call(&env.scope, Some(&env.key), TOOL, ARGS, |d| dispatch(&client, d))?;
        Ok(report_of(&called))
    };
    let keep_trying = || -> Result<Report, OnceError> {
        for _ in 0..RETRIES {
            let report = call()?;
            if report != Report::Unknown {
                return Ok(report);
            }
            std::thread::sleep(RETRY_PAUSE);
        }
        Ok(Report::Unknown)
    };
    match policy {
        Policy::NeverRetry => call(),
        Policy::AlwaysRetry => keep_trying(),
        Policy::ReadThenDecide => match call()? {
            Report::Unknown => match client.get_order(ORDER_ID) {
                Ok(order) if order.refunded >= AMOUNT => Ok(Report::Refunded),
                // The same intent again: once decides whether anything is sent.
                Ok(_) => keep_trying(),
                Err(_) => Ok(Report::Unknown),
            },
            report => Ok(report),
        },
    }
}

/// once's own background work for a trial (what a gateway or worker does):
/// reconcile the operation and, on proven absence, dispatch the owed refund
/// with the same key, so even an agent that never retries ends with one effect.
///
/// It reconciles this trial's key rather than sweeping the whole ledger: every
/// trial has a refund service of its own, so this trial's lookup can answer for
/// this trial's key only, and on a PostgreSQL ledger the trials share one
/// schema. (A real deployment's sweep has one lookup that answers for every key.)
pub fn settle(env: &Env, within: Duration) -> Result<(), OnceError> {
    let client = Client::new(env.target.clone(), CLIENT_TIMEOUT);
    let once = protected_once(&env.ledger, &client)?;
    let give_up = Instant::now() + within;
    loop {
        // The engine reads the provider when a read is due, and grants the owed dispatch
        // once absence is proven; this loop only sends what it is told to.
        let called = match once.resume(&env.scope, &env.key, |d| dispatch(&client, d)) {
            Ok(called) => called,
            // No record: the agent never claimed the operation, so nothing is owed.
            Err(OnceError::Engine(Error::NotFound)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let waits = called.account().is_none_or(|a| a.repeat == Repeat::Waits);
        if !waits || Instant::now() >= give_up {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The demo's once handle: the trial's ledger (SQLite or PostgreSQL), the
/// service's lookup by key as the authoritative read, and the refund tool's policy.
fn protected_once(ledger: &str, client: &Client) -> Result<Once, OnceError> {
    let lookup = client.clone();
    let once = Once::open(ledger)?
        .provider(move |_tool: &str, provider_key: &str, _args: &str| {
            let found = lookup.find_refund_by_key(provider_key);
            evidence(found.map(|f| (f.refund.filter(|_| f.found).map(|r| r.raw), f.read_position)))
        })
        .wait_up_to(Duration::from_secs(5))
        .policy(
            TOOL,
            PolicyInput {
                // The engine derives the lease from it.
                dispatch_timeout_ms: Some(CLIENT_TIMEOUT.as_millis() as u64),
                // The service commits a request within the client's timeout or never: an
                // old request cannot arrive later than this.
                max_in_flight_ms: Some(300),
                reconcile_interval_ms: Some(25),
                attempt_budget: Some(4),
                resolve_deadline_ms: Some(10_000),
                ..once::policy_input()
            },
        )
        .build()?;
    Ok(once)
}

/// Send one granted attempt: the provider key is the refund's idempotency key.
fn dispatch(client: &Client, d: &Dispatch<'_>) -> Sent {
    sent(client.refund_order(ORDER_ID, AMOUNT, d.provider_key).map(|r| r.raw))
}

/// What the agent tells its user: whether the engine says the effect happened.
fn report_of(called: &Called) -> Report {
    match called.effect() {
        Effect::Happened => Report::Refunded,
        Effect::Unknown => Report::Unknown,
        Effect::None => Report::Failed,
    }
}
