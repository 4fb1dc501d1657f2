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
//! - **An answer belongs to the call it answers.** A `requestState` goes to
//!   the client sealed ([`Seal`]): an HMAC-SHA-256, under a secret the
//!   ledger keeps (one for every gateway sharing it, across restarts), over
//!   the call it was asked for (scope, tool, arguments, operation keys) and
//!   the upstream's own state. An answering round whose seal is not that of
//!   its own call is refused before anything is claimed or sent: an upstream
//!   may keep what it will do in its state (the SDKs seal it, but bind it to
//!   a user, not to the arguments), and a client that mixed up two calls'
//!   states would otherwise run one operation's effect under another's key,
//!   and then again under its own.
//!
//! The gateway relays the question to a client on 2026-07-28 as the upstream
//! wrote it, but for that seal. A client on an older revision cannot take one, but over stdio
//! it takes the same questions as server-to-client requests: the gateway asks
//! them ([`ask`]), holding no attempt while the client (or its human)
//! answers, and runs the answering round itself, up to [`MAX_ROUNDS`]. A
//! client that declared no capability for a question, or one over HTTP
//! (where a request from the gateway has no stream to travel on), is told in
//! a tool result that the tool asked for input and nothing was done.

use hmac::{Hmac, Mac};
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, InputRequest, InputRequiredResult, InputResponses, ServerRequest,
};
use rmcp::service::Peer;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

/// The ledger binding that holds the sealing secret (first come: every gateway on the ledger shares it).
pub const SEAL_BINDING: &str = "gateway:request-state-seal";

/// What a sealed `requestState` starts with: the seal's version.
const SEALED: &str = "once1.";

/// The seal on a `requestState` the gateway relays: whose call an answering round answers.
pub struct Seal {
    secret: Vec<u8>,
}

impl Seal {
    /// A seal under `secret` (the ledger's: [`SEAL_BINDING`]).
    pub fn new(secret: &str) -> Seal {
        Seal {
            secret: secret.as_bytes().to_vec(),
        }
    }

    /// A fresh secret to offer the ledger: 32 random bytes, in hex.
    pub fn fresh_secret() -> Result<String, String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes for the request-state seal: {e}"))?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    fn mac(&self, call: &str, state: Option<&str>) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes a key of any length");
        // Lengths first: no two (call, state) pairs feed the same bytes.
        mac.update(&(call.len() as u64).to_be_bytes());
        mac.update(call.as_bytes());
        match state {
            Some(state) => {
                mac.update(&[1]);
                mac.update(state.as_bytes());
            }
            None => mac.update(&[0]),
        }
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The `requestState` a client gets with a question the upstream asked `call` (its identity: [`Seal`]),
    /// the upstream's own `state` inside it.
    pub fn seal(&self, call: &str, state: Option<&str>) -> String {
        let mac = self.mac(call, state);
        match state {
            Some(state) => format!("{SEALED}{mac}.{state}"),
            None => format!("{SEALED}{mac}"),
        }
    }

    /// The upstream's state inside `sealed`, the `requestState` a client answered `call` with; an error
    /// says why it is not `call`'s (none, not a seal of this gateway's, or another call's).
    pub fn open(&self, call: &str, sealed: Option<&str>) -> Result<Option<String>, String> {
        let sealed = sealed.ok_or("it carries no requestState, and the gateway relayed one with its question")?;
        let rest = sealed
            .strip_prefix(SEALED)
            .ok_or("its requestState is not the one the gateway relayed")?;
        let (mac, state) = match rest.split_once('.') {
            Some((mac, state)) => (mac, Some(state)),
            None => (rest, None),
        };
        let expected = self.mac(call, state);
        // Compared in constant time: the seal is a secret's work.
        let matches =
            mac.len() == expected.len() && mac.bytes().zip(expected.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0;
        if !matches {
            return Err("its requestState was relayed for another call (other arguments, key or scope)".into());
        }
        Ok(state.map(str::to_string))
    }
}

/// How many rounds the gateway runs for a client on an older revision before it gives up (as the SDKs do
/// for their own clients); each round is also one of the tool's attempts, which usually ends it sooner.
pub const MAX_ROUNDS: usize = 10;

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

    /// Whether these answers came with a `requestState`.
    pub fn request_state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// These answers with `state` as their `requestState` (the upstream's own, out of its seal).
    pub fn with_state(self, state: Option<String>) -> Answers {
        Answers { state, ..self }
    }

    /// `params`, carrying these answers to the upstream.
    pub fn apply(self, params: &mut CallToolRequestParams) {
        params.input_responses = self.responses;
        params.request_state = self.state;
    }
}

/// Whether a client that declared `capabilities` can take `question` as a server-to-client request.
fn can_take(capabilities: &ClientCapabilities, question: &InputRequest) -> bool {
    match question {
        InputRequest::Elicitation(_) => capabilities.elicitation.is_some(),
        InputRequest::CreateMessage(_) => capabilities.sampling.is_some(),
        InputRequest::ListRoots(_) => capabilities.roots.is_some(),
        _ => false,
    }
}

/// Ask a client on an older revision (`peer`, connected with `initialize`) the upstream's questions, one by
/// one, as the server-to-client requests they are; its answers to all of them, or why there are none (it
/// declared no capability for one, refused one, went away, or cancelled its call: `ct`).
pub async fn ask(
    peer: &Peer<RoleServer>,
    asked: &InputRequiredResult,
    ct: &CancellationToken,
) -> Result<Answers, String> {
    let capabilities = peer
        .peer_info()
        .map(|info| info.capabilities.clone())
        .ok_or("the client has not initialized")?;
    let mut responses = InputResponses::new();
    for (id, question) in asked.input_requests.iter().flatten() {
        if !can_take(&capabilities, question) {
            return Err(format!("the client declared no capability for the question {id:?}"));
        }
        let request = match question.clone() {
            InputRequest::Elicitation(r) => ServerRequest::ElicitRequest(r),
            InputRequest::CreateMessage(r) => ServerRequest::CreateMessageRequest(r),
            InputRequest::ListRoots(r) => ServerRequest::ListRootsRequest(r),
            _ => return Err(format!("the question {id:?} is of a kind this gateway does not know")),
        };
        let answered = tokio::select! {
            answered = peer.send_request(request) => answered.map_err(|e| format!("the client did not answer {id:?}: {e}"))?,
            _ = ct.cancelled() => return Err("the client cancelled the call".to_string()),
        };
        let answer = serde_json::to_value(answered).map_err(|e| format!("the client's answer to {id:?}: {e}"))?;
        responses.insert(id.clone(), answer);
    }
    Ok(Answers {
        responses: Some(responses),
        state: asked.request_state.clone(),
    })
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
    fn a_seal_opens_only_for_the_call_it_was_made_for() {
        let seal = Seal::new("secret");
        let sealed = seal.seal("call A", Some("state.with.dots"));
        assert_eq!(
            seal.open("call A", Some(&sealed)),
            Ok(Some("state.with.dots".to_string()))
        );
        assert!(seal.open("call B", Some(&sealed)).is_err(), "another call's state");
        assert!(
            Seal::new("other").open("call A", Some(&sealed)).is_err(),
            "another ledger's seal"
        );
        assert!(
            seal.open("call A", Some("state.with.dots")).is_err(),
            "an unsealed state"
        );
        assert!(seal.open("call A", None).is_err(), "no state");
        let bare = seal.seal("call A", None);
        assert_eq!(seal.open("call A", Some(&bare)), Ok(None));
        let forged = format!("{bare}.smuggled");
        assert!(
            seal.open("call A", Some(&forged)).is_err(),
            "a state added to a seal made for none"
        );
        assert_eq!(Seal::fresh_secret().unwrap().len(), 64);
    }

    #[test]
    fn a_first_round_carries_no_answers() {
        let mut request = CallToolRequestParams::new("refund_order");
        assert_eq!(Answers::take(&mut request), None);
    }
}
