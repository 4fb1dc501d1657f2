//! A client calling the tool server itself, as the study's clients did: its policy decides every retry and
//! every identifier.

use refund::CallError;
use refund::tool_server::ToolClient;

use super::policy::ClientPolicy;
use super::request;
use super::trial::Knowledge;

/// Run the policy's attempts; what the client knows at the end.
pub fn run(policy: ClientPolicy, trial: u64, client: &ToolClient) -> Knowledge {
    let args = request::args();
    let mut unsure = false;
    for attempt in 1..=1 + policy.retries() {
        let body = request::body(&policy.call_id(trial, attempt), &args, attempt > 1);
        match client.call(&body, &policy.idempotency_key(trial, attempt)) {
            Ok(_) => return Knowledge::Effect,
            // The server answered and did nothing.
            Err(CallError::Rejected { .. }) => return Knowledge::Absence,
            // A timeout, a 5xx or a dropped connection: the client cannot tell; its policy says whether to retry.
            Err(CallError::Ambiguous(_)) => unsure = true,
            Err(CallError::NotSent(_)) => {}
        }
    }
    if unsure { Knowledge::Unknown } else { Knowledge::Absence }
}
