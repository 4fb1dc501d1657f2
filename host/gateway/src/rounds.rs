//! MCP 2026-07-28's multi-round-trip requests through a protected tool.
//!
//! An upstream may answer `tools/call` with an `InputRequiredResult`: a
//! question for the client (an elicitation, a sampling request, a roots
//! list) and an opaque `requestState`, instead of running the call. The
//! client answers by calling again, with `inputResponses` and the
//! `requestState` echoed. Each round is a request of its own (new id, no
//! session), and the upstream has done nothing until a round completes.
//!
//! How once keeps the operation's identity across the rounds:
//!
//! - **The arguments are effect-bearing; the rounds' fields are not.** The
//!   operation key (from `_meta`, or derived from the effect fields of the
//!   arguments) and the payload fingerprint are the same in every round, so
//!   the rounds are one operation, never a conflict. `inputResponses` says
//!   whether and how the client lets the call go on (a confirmation, a
//!   choice), and `requestState` is the upstream's own state, which it must
//!   verify; neither names another effect. Were they in the fingerprint, the
//!   answering round would be a conflict with the asking one.
//! - **A question is an answer that did nothing.** The attempt that got it
//!   is reported `rejected` (the provider answered and did nothing), with the
//!   question as its error: the call ends there, nothing is recorded as
//!   unknown, its quota is released, and the answering round is the next
//!   attempt of the same operation. (`not-sent` would be wrong twice over:
//!   the request did leave, and the engine re-grants a not-sent attempt at
//!   once, within the same call, which would ask again until the attempts
//!   ran out.) Each round therefore uses one of the tool's attempts.
//! - **The answers go with the attempt the client waits on, only**, as does
//!   the client's 2026-07-28 envelope (its capabilities: the upstream asks
//!   only a client that can answer). An owed dispatch the background worker
//!   sends has no client to ask: if the upstream asks again, that attempt too
//!   is a rejection, and the client's next call answers.
//!
//! The gateway relays the question to the client as the upstream wrote it.
//! A client on an older revision cannot receive one: it is told in a tool
//! result that the tool asked for input and nothing was done.

use rmcp::model::{CallToolRequestParams, InputResponses};

/// A client's answers to an upstream's question of an earlier round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answers {
    responses: Option<InputResponses>,
    state: Option<String>,
}

impl Answers {
    /// The answers `request` carries, taken out of it (they are not part of the operation); none if it
    /// carries neither field.
    pub fn take(request: &mut CallToolRequestParams) -> Option<Answers> {
        let answers = Answers {
            responses: request.input_responses.take(),
            state: request.request_state.take(),
        };
        (answers != Answers::default()).then_some(answers)
    }

    /// `params`, carrying these answers to the upstream.
    pub fn apply(self, params: &mut CallToolRequestParams) {
        params.input_responses = self.responses;
        params.request_state = self.state;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_answers_leave_the_request_and_go_with_the_dispatch_as_they_came() {
        let mut request: CallToolRequestParams = serde_json::from_value(json!({
            "name": "refund_order",
            "arguments": {"order_id": 1},
            "inputResponses": {"confirm": {"action": "accept", "content": {"ok": true}}},
            "requestState": "opaque"
        }))
        .unwrap();
        let answers = Answers::take(&mut request).expect("answers");
        let rest = serde_json::to_value(&request).unwrap();
        assert_eq!(rest, json!({"name": "refund_order", "arguments": {"order_id": 1}}));

        let mut dispatch = CallToolRequestParams::new("refund_order");
        answers.apply(&mut dispatch);
        let sent = serde_json::to_value(&dispatch).unwrap();
        assert_eq!(sent["requestState"], "opaque");
        assert_eq!(sent["inputResponses"]["confirm"]["action"], "accept");
    }

    #[test]
    fn a_first_round_carries_no_answers() {
        let mut request = CallToolRequestParams::new("refund_order");
        assert_eq!(Answers::take(&mut request), None);
    }
}
