//! The same client through once: its policy still decides when to call again, but every call goes through
//! [`Once::call`], so the operation key is fixed before the first attempt whatever the client regenerates, a
//! lost reply is reconciled against the server's effects table, and the attempt budget ends a loop that cannot
//! succeed.

use std::path::Path;
use std::time::{Duration, Instant};

use once::types::{Effect, PolicyInput, Repeat};
use once::{Called, Dispatch, Once, OnceError, Sent};
use refund::tool_server::ToolClient;

use super::CLIENT_TIMEOUT;
use super::policy::ClientPolicy;
use super::request::{self, TOOL};
use super::trial::Knowledge;
use crate::demo::classify::{evidence, sent};

/// How long a client waits for an answer once says is coming.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// Run the policy's calls through once; what the client knows at the end.
pub fn run(policy: ClientPolicy, trial: u64, client: &ToolClient, ledger: &Path) -> Result<Knowledge, OnceError> {
    let once = protected_once(ledger, client)?;
    let scope = format!("retry-cost-trial-{trial}");
    let key = policy.operation_key(trial);
    let args = request::args();
    let mut knows = Knowledge::Unknown;
    for turn in 1..=1 + policy.retries() {
        let call_id = policy.call_id(trial, turn);
        // The client's own retry re-sends its transcript; once's redispatches inside one call are the host's.
        let mut send = |d: &Dispatch<'_>| dispatch(client, d, &call_id, turn > 1);
        let called = once.call(&scope, key.as_deref(), TOOL, &args, &mut send)?;
        let called = wait_for_answer(&once, &scope, called, &mut send)?;
        knows = knowledge_of(&called);
        if knows == Knowledge::Effect {
            break;
        }
    }
    Ok(knows)
}

/// While the account says the outcome is still coming (`repeat: waits`), ask for it again ([`Once::resume`]):
/// the answer once owes the caller, never an attempt of the client's own (whatever is sent meanwhile is an
/// attempt once grants). A call can end so when its read found the effect absent a moment before the last
/// request could no longer land: the next read is due at once, but a step reads at most once.
fn wait_for_answer(
    once: &Once,
    scope: &str,
    mut called: Called,
    send: &mut impl FnMut(&Dispatch<'_>) -> Sent,
) -> Result<Called, OnceError> {
    let give_up = Instant::now() + ANSWER_WITHIN;
    loop {
        let waits = called.account().filter(|a| a.repeat == Repeat::Waits);
        let Some(key) = waits.and_then(|a| a.key.clone()) else {
            return Ok(called);
        };
        if Instant::now() >= give_up {
            return Ok(called);
        }
        std::thread::sleep(Duration::from_millis(20));
        called = once.resume(scope, &key, &mut *send)?;
    }
}

/// The study's once handle: the trial's SQLite ledger, the server's lookup by key as the authoritative read, and
/// the tool's policy (what is not set here is the engine's default, including the attempt budget of 3).
fn protected_once(ledger: &Path, client: &ToolClient) -> Result<Once, OnceError> {
    let lookup = client.clone();
    Once::sqlite(ledger)?
        .provider(move |_tool: &str, provider_key: &str, _args: &str| {
            evidence(lookup.find_effect(provider_key).map(|f| (f.receipt, f.read_position)))
        })
        // The longest path (three attempts, each followed by a read after max_in_flight) takes about 1.6 s; a
        // loaded machine may take longer, and a call that gives up waiting answers "unknown".
        .wait_up_to(Duration::from_secs(30))
        .policy(
            TOOL,
            PolicyInput {
                // The client's timeout.
                dispatch_timeout_ms: Some(CLIENT_TIMEOUT.as_millis() as u64),
                // A grant must be sent before its lease less the timeout; the derived lease (0.32 s) leaves
                // 0.2 s, which a busy machine used up between grant and send in a few of 1,300 trials (the
                // grant went unsent and spent an attempt). A longer lease costs nothing here: every attempt's
                // end is reported, so no read waits for a lease to run out.
                lease_ms: Some(1_000),
                // The provider key travels in the Idempotency-Key header.
                key_sent_by_host: Some(true),
                // The server commits a request as it arrives or never (a stall before the commit writes
                // nothing), and its stalls last 0.35 s: no old request can commit later than this.
                max_in_flight_ms: Some(400),
                reconcile_interval_ms: Some(25),
                resolve_deadline_ms: Some(10_000),
                ..once::policy_input()
            },
        )
        .build()
}

/// Send one granted attempt: the grant's args in the client's body, the provider key as the Idempotency-Key.
fn dispatch(client: &ToolClient, d: &Dispatch<'_>, call_id: &str, retry: bool) -> Sent {
    sent(client.call(&request::body(call_id, d.args, retry), d.provider_key))
}

/// What the client knows: whether the engine says the effect happened.
fn knowledge_of(called: &Called) -> Knowledge {
    match called.effect() {
        Effect::Happened => Knowledge::Effect,
        Effect::None => Knowledge::Absence,
        Effect::Unknown => Knowledge::Unknown,
    }
}
