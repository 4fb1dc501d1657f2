//! What the demo clients' answers mean to once: a send's outcome, and a lookup's evidence.

use once::Sent;
use once::types::Evidence;
use refund::CallError;

/// A send as once classifies it: a 2xx's body is the receipt, a definite refusal a rejection, anything that may
/// have arrived ambiguous.
pub fn sent(result: Result<String, CallError>) -> Sent {
    match result {
        Ok(receipt) => Sent::Success(receipt),
        Err(CallError::Rejected { body, .. }) => Sent::Rejected(body),
        Err(CallError::Ambiguous(why)) => Sent::Ambiguous(why),
        Err(CallError::NotSent(_)) => Sent::NotSent,
    }
}

/// A lookup by key as evidence: the receipt found, or absence as of the read's position.
pub fn evidence(lookup: Result<(Option<String>, u64), CallError>) -> Evidence {
    match lookup {
        Ok((Some(receipt), _)) => Evidence::Confirmed(receipt),
        Ok((None, read_position)) => Evidence::Absent(read_position),
        Err(e) => Evidence::Unknown(e.to_string()),
    }
}
