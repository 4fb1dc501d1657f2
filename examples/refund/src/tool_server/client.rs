//! A client of the tool server that says honestly what a failure means (as the refund client does).

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use ureq::Agent;

use crate::CallError;
use crate::client::{agent, exchange, parse};
use crate::http::percent_encode;

/// The answer to `GET /effects?key=…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectLookup {
    /// The stored response of the effect recorded under the key, as the server sent it.
    pub receipt: Option<String>,
    /// Ms since the Unix epoch at or before which every commit is reflected.
    pub read_position: u64,
}

#[derive(Deserialize)]
struct LookupWire<'a> {
    found: bool,
    #[serde(borrow)]
    effect: Option<&'a RawValue>,
    read_position: u64,
}

/// A client of one tool server whose every call ends within its timeout.
#[derive(Debug, Clone)]
pub struct ToolClient {
    base_url: String,
    agent: Agent,
}

impl ToolClient {
    /// A client for `base_url` (e.g. `http://127.0.0.1:4000`) whose every call ends within `timeout`.
    pub fn new(base_url: impl Into<String>, timeout: Duration) -> ToolClient {
        ToolClient {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            agent: agent(timeout),
        }
    }

    /// `POST /tool` with this body and `Idempotency-Key`; the response body on a 2xx.
    pub fn call(&self, body: &str, idempotency_key: &str) -> Result<String, CallError> {
        exchange(&self.agent, |a| {
            a.post(format!("{}/tool", self.base_url))
                .header("Content-Type", "application/json")
                .header("Idempotency-Key", idempotency_key)
                .send(body)
        })
    }

    /// `GET /effects?key=…`: the read path a reconciler uses.
    pub fn find_effect(&self, key: &str) -> Result<EffectLookup, CallError> {
        let url = format!("{}/effects?key={}", self.base_url, percent_encode(key));
        let raw = exchange(&self.agent, |a| a.get(url).call())?;
        let wire: LookupWire<'_> = parse(&raw)?;
        Ok(EffectLookup {
            receipt: wire.effect.filter(|_| wire.found).map(|e| e.get().to_string()),
            read_position: wire.read_position,
        })
    }
}
