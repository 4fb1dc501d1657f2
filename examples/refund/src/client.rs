//! A small client for the refund API that says honestly what a failure means.

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use ureq::http::Response;
use ureq::{Agent, Body, Timeout};

use crate::http::percent_encode;

/// Why a call did not produce a usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The service answered 4xx: a definite refusal, nothing was done.
    #[error("rejected with status {status}: {body}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The raw response body (JSON `{"error":…}` from the service).
        body: String,
    },
    /// No complete answer (timeout, connection closed or reset mid-exchange, 5xx, garbled reply): the effect may or
    /// may not exist.
    #[error("ambiguous: {0}")]
    Ambiguous(String),
    /// Nothing left the client (connection refused, bad address, unusable argument): certainly no effect.
    #[error("not sent: {0}")]
    NotSent(String),
}

/// An order as the service reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Order {
    /// The order id.
    pub order_id: i64,
    /// Order total in dollars.
    pub total: f64,
    /// Refunded so far in dollars (as of `read_position`).
    pub refunded: f64,
    /// Ms since the Unix epoch; every commit before it is reflected.
    pub read_position: u64,
    /// The response body as received.
    pub raw: String,
}

/// A committed refund as the service reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundReceipt {
    /// The refund's row id in the service's ledger.
    pub refund_id: i64,
    /// The order refunded.
    pub order_id: i64,
    /// Amount in dollars.
    pub amount: f64,
    /// The key the refund was recorded under.
    pub idempotency_key: String,
    /// Commit stamp, ms since the Unix epoch.
    pub created_at: u64,
    /// The receipt JSON as received (for a lookup, the nested `refund` object).
    pub raw: String,
}

/// The answer to a lookup by operation key.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// Whether a refund with the key exists as of `read_position`.
    pub found: bool,
    /// The first refund recorded under the key, when found.
    pub refund: Option<RefundReceipt>,
    /// Ms since the Unix epoch at or before which every commit is reflected.
    pub read_position: u64,
    /// The response body as received.
    pub raw: String,
}

/// A client of one refund service (or of a proxy in front of it).
#[derive(Debug, Clone)]
pub struct Client {
    base_url: String,
    agent: Agent,
}

#[derive(Deserialize)]
struct OrderWire {
    order_id: i64,
    total: f64,
    refunded: f64,
    read_position: u64,
}

#[derive(Deserialize)]
struct ReceiptWire {
    refund_id: i64,
    order_id: i64,
    amount: f64,
    idempotency_key: String,
    created_at: u64,
}

#[derive(Deserialize)]
struct LookupWire {
    found: bool,
    refund: Option<Box<RawValue>>,
    read_position: u64,
}

impl Client {
    /// A client for `base_url` (e.g. `http://127.0.0.1:4000`) whose every call ends within `timeout`.
    pub fn new(base_url: impl Into<String>, timeout: Duration) -> Client {
        Client {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            agent: agent(timeout),
        }
    }

    /// The base URL calls go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `GET /orders/{id}`.
    pub fn get_order(&self, order_id: i64) -> Result<Order, CallError> {
        let raw = self.call(|a| a.get(format!("{}/orders/{order_id}", self.base_url)).call())?;
        let w: OrderWire = parse(&raw)?;
        Ok(Order {
            order_id: w.order_id,
            total: w.total,
            refunded: w.refunded,
            read_position: w.read_position,
            raw,
        })
    }

    /// `POST /refunds` of `amount` dollars (at most 2 decimals) under `key`.
    pub fn refund_order(&self, order_id: i64, amount: f64, key: &str) -> Result<RefundReceipt, CallError> {
        if !amount.is_finite() {
            return Err(CallError::NotSent(format!("amount {amount} is not a number")));
        }
        // f64's Display is the shortest text that reads back as the same number, never exponent notation.
        let key_json = serde_json::to_string(key).expect("strings serialize");
        let body = format!(r#"{{"order_id":{order_id},"amount":{amount},"idempotency_key":{key_json}}}"#);
        let raw = self.call(|a| {
            a.post(format!("{}/refunds", self.base_url))
                .header("Content-Type", "application/json")
                .send(&body)
        })?;
        receipt(raw)
    }

    /// `GET /refunds?key=…`: the read path a reconciler uses.
    pub fn find_refund_by_key(&self, key: &str) -> Result<Lookup, CallError> {
        let url = format!("{}/refunds?key={}", self.base_url, percent_encode(key));
        let raw = self.call(|a| a.get(url).call())?;
        let w: LookupWire = parse(&raw)?;
        let refund = w.refund.map(|r| receipt(r.get().to_string())).transpose()?;
        Ok(Lookup {
            found: w.found,
            refund,
            read_position: w.read_position,
            raw,
        })
    }

    fn call(&self, send: impl FnOnce(&Agent) -> Result<Response<Body>, ureq::Error>) -> Result<String, CallError> {
        exchange(&self.agent, send)
    }
}

/// An HTTP agent whose every call ends within `timeout`, for the clients of this crate's servers.
pub(crate) fn agent(timeout: Duration) -> Agent {
    Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        // Environment proxies must not reroute loopback traffic; pooling and redirects would blur what one call
        // did on the wire.
        .proxy(None)
        .max_idle_connections(0)
        .max_redirects(0)
        .user_agent("once-refund-example")
        .build()
        .into()
}

/// One exchange, its body on a 2xx, and otherwise what the failure means (4xx definite, the rest ambiguous).
pub(crate) fn exchange(
    agent: &Agent,
    send: impl FnOnce(&Agent) -> Result<Response<Body>, ureq::Error>,
) -> Result<String, CallError> {
    let mut response = send(agent).map_err(classify)?;
    let status = response.status().as_u16();
    // A status without its whole body is still an unfinished exchange: call it ambiguous, not a refusal.
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| CallError::Ambiguous(format!("status {status}, body cut off: {e}")))?;
    match status {
        200..=299 => Ok(body),
        400..=499 => Err(CallError::Rejected { status, body }),
        _ => Err(CallError::Ambiguous(format!("status {status}: {body}"))),
    }
}

fn classify(e: ureq::Error) -> CallError {
    match e {
        ureq::Error::Io(ref io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            CallError::NotSent(e.to_string())
        }
        ureq::Error::Timeout(Timeout::Resolve | Timeout::Connect)
        | ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed
        | ureq::Error::BadUri(_)
        | ureq::Error::Http(_) => CallError::NotSent(e.to_string()),
        // Anything after the connection opened may have delivered the request.
        other => CallError::Ambiguous(other.to_string()),
    }
}

pub(crate) fn parse<'a, T: Deserialize<'a>>(raw: &'a str) -> Result<T, CallError> {
    // A 2xx we cannot read may still have done the work.
    serde_json::from_str(raw).map_err(|e| CallError::Ambiguous(format!("unreadable reply: {e}")))
}

fn receipt(raw: String) -> Result<RefundReceipt, CallError> {
    let w: ReceiptWire = parse(&raw)?;
    Ok(RefundReceipt {
        refund_id: w.refund_id,
        order_id: w.order_id,
        amount: w.amount,
        idempotency_key: w.idempotency_key,
        created_at: w.created_at,
        raw,
    })
}
