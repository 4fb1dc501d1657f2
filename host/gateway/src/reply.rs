//! What the model is shown for each decision. Every result the gateway makes
//! carries text (what a model reads) and structured content (what a program
//! reads), and `_meta["once/outcome"]` says the same for hosts. A text says what
//! is known, what calling again would do, and what once is doing about it.

use once::types::{BlockReason, Blocked, RecordSummary, ReplayVia, UnknownInfo};
use once::{Called, OnceError};
use rmcp::model::{CallToolResult, ContentBlock, ErrorData, MetaObject};
use serde_json::{Value, json};

use crate::upstream::Reply;

/// The `_meta` field of a result that describes what once did.
pub const OUTCOME_META: &str = "once/outcome";

/// What the dispatcher saw of the upstream during one call.
#[derive(Debug, Default)]
pub struct Capture {
    /// The upstream's last reply to a dispatch.
    pub last: Option<Reply>,
    /// The attempt number of the last dispatch.
    pub attempt: Option<u32>,
    /// The operation key of the last dispatch.
    pub key: Option<String>,
    /// Why the last dispatch's outcome is unknown, if it is.
    pub lost: Option<String>,
}

/// Everything a text needs besides the decision.
pub struct Context<'a> {
    /// The tool called.
    pub tool: &'a str,
    /// The operation key, when the engine named one.
    pub key: Option<&'a str>,
    /// The call's scope.
    pub scope: &'a str,
    /// The lookup tool reconciliation reads, if configured.
    pub lookup: Option<&'a str>,
    /// The `_meta` field that carries operation keys, for advice.
    pub key_meta: &'a str,
    /// Whether the caller named the operation key in `_meta` (else it was derived from the arguments).
    pub keyed: bool,
    /// Whether the tool declares an output schema (its structured content must then be the upstream's).
    pub output_schema: bool,
    /// What the dispatcher saw.
    pub capture: Capture,
}

impl Context<'_> {
    fn key(&self) -> &str {
        self.key.unwrap_or("(none)")
    }

    fn info(&self, decision: &str) -> Value {
        json!({"decision": decision, "tool": self.tool, "operation": self.key, "scope": self.scope})
    }

    /// How the model calls this same operation again: a derived key is the same for the same arguments,
    /// a key from `_meta` only for the same key.
    fn again(&self) -> String {
        if self.keyed {
            format!(
                "Calling {} again with operation key {} in _meta \"{}\"",
                self.tool,
                self.key(),
                self.key_meta
            )
        } else {
            format!("Calling {} again with the same arguments", self.tool)
        }
    }

    /// `result` with once's account in `_meta` and, where the upstream gave none and no schema constrains
    /// it, as structured content too.
    fn annotate(&self, mut result: CallToolResult, info: &Value) -> CallToolResult {
        if result.structured_content.is_none() && !self.output_schema {
            result.structured_content = Some(json!({ "once": info.clone() }));
        }
        with_meta(result, info)
    }
}

fn with_meta(mut result: CallToolResult, info: &Value) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.insert(OUTCOME_META.to_string(), info.clone());
    result.meta = Some(meta);
    result
}

/// A result the gateway writes itself.
fn made(text: String, info: Value, is_error: bool) -> CallToolResult {
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(json!({ "once": info.clone() }));
    with_meta(result, &info)
}

/// A stored receipt as a tool result: the upstream's own result when that is what was stored.
fn stored_result(receipt: &str) -> CallToolResult {
    if let Ok(result) = serde_json::from_str::<CallToolResult>(receipt)
        && !result.content.is_empty()
    {
        return result;
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(receipt.to_string())]);
    result.structured_content = serde_json::from_str(receipt).ok();
    result
}

/// Put `text` before a stored or upstream result's own content.
fn prefixed(mut result: CallToolResult, text: String, info: &Value, cx: &Context<'_>) -> CallToolResult {
    result.content.insert(0, ContentBlock::text(text));
    cx.annotate(result, info)
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// The result the model sees for a finished protected (or direct) call.
pub fn render(called: Called, cx: &Context<'_>) -> Result<CallToolResult, ErrorData> {
    let (tool, key) = (cx.tool, cx.key());
    Ok(match called {
        Called::Confirmed {
            receipt,
            replayed: false,
            ..
        } => {
            let mut info = cx.info("executed");
            info["attempt"] = json!(cx.capture.attempt);
            let result = match &cx.capture.last {
                Some(Reply::Result(r)) => r.clone(),
                _ => stored_result(&receipt),
            };
            match cx.capture.attempt {
                // A later attempt follows one the model may have been told was UNKNOWN: say what changed.
                Some(n) if n > 1 => prefixed(
                    result,
                    format!("Sent now as attempt {n} of operation {key}; no earlier attempt had an effect."),
                    &info,
                    cx,
                ),
                _ => cx.annotate(result, &info),
            }
        }
        Called::Confirmed {
            receipt,
            via,
            at,
            window_until,
            ..
        } => {
            let via = via.unwrap_or(ReplayVia::Key);
            let mut info = cx.info("replayed");
            info["via"] = json!(via.to_string());
            info["at"] = json!(at);
            info["window_until"] = json!(window_until);
            // This very call sent it and lost the reply: however the record got confirmed meanwhile (this
            // call's reconcile, or the background one), what the model needs is that it did happen.
            let lost_here = cx.capture.lost.is_some();
            let text = if lost_here || via == ReplayVia::Provider {
                format!(
                    "Replay of operation {key}: {tool} did happen, but its reply was lost; once confirmed it by \
                     reading {}, and below is what that read returned. Nothing was sent again.",
                    cx.lookup.unwrap_or("the provider")
                )
            } else if via == ReplayVia::Key {
                format!(
                    "Replay of operation {key}: {tool} already ran under this operation key; below is its stored \
                     result. Nothing was sent again."
                )
            } else {
                let ran = at.map_or_else(String::new, |t| format!(" at {}", utc(t)));
                let until = window_until.map_or_else(String::new, |t| {
                    format!(
                        " Until {}, identical calls are this same operation; after that they are new.",
                        utc(t)
                    )
                });
                format!(
                    "Replay: an identical {tool} call (same arguments) already ran{ran} as operation {key}; below is \
                     its stored result. Nothing was sent again. For a deliberate second {tool} with the same \
                     arguments, give it its own operation key in _meta \"{}\".{until}",
                    cx.key_meta
                )
            };
            prefixed(stored_result(&receipt), text, &info, cx)
        }
        Called::Unknown(u) => unknown(&u, cx),
        Called::InFlight(i) => {
            let mut info = cx.info("in-flight");
            info["lease_until"] = json!(i.lease_until);
            made(
                format!(
                    "IN PROGRESS: {tool} (operation {key}) is being sent by another call right now and its outcome \
                     is not known yet. Nothing was sent for this call. {} returns that outcome; it will not be \
                     sent twice.",
                    cx.again()
                ),
                info,
                true,
            )
        }
        Called::Conflict(summary) => conflict(&summary, cx),
        Called::Blocked(b) => blocked(&b, cx),
        Called::Rejected { error } => {
            let info = cx.info("rejected");
            let text = format!(
                "Rejected: the upstream refused {tool} (operation {key}) and did nothing. {} will be refused \
                 again; a corrected call is a new operation.",
                cx.again()
            );
            match &cx.capture.last {
                Some(Reply::Result(r)) => prefixed(r.clone(), text, &info, cx),
                Some(Reply::Error(e)) => made(format!("{text} The upstream said: {}", e.message), info, true),
                _ => {
                    let mut result = prefixed(stored_result(&error), text, &info, cx);
                    result.is_error = Some(true);
                    result
                }
            }
        }
        Called::Unrecorded { response } => {
            let info = cx.info("unrecorded");
            let text = format!(
                "Note: {tool} (operation {key}) did happen (below), but once could not record it yet. Do not call \
                 it again to make sure: once reconciles it from the provider."
            );
            match &cx.capture.last {
                Some(Reply::Result(r)) => prefixed(r.clone(), text, &info, cx),
                _ => prefixed(stored_result(&response), text, &info, cx),
            }
        }
        Called::Direct(_) => return direct(cx),
    })
}

fn unknown(u: &UnknownInfo, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, cx.key());
    let mut info = cx.info("unknown");
    info["since"] = json!(u.since);
    info["deadline"] = json!(u.deadline);
    let why = cx
        .capture
        .lost
        .clone()
        .unwrap_or_else(|| "an earlier attempt's reply was lost".to_string());
    info["reason"] = json!(why);
    let doing = match cx.lookup {
        Some(lookup) => format!(
            "once is checking with {lookup} in the background; if that proves it did not happen, once sends it \
             itself, exactly once, with the same idempotency key. If it is still unsettled by {}, an operator is \
             alerted.",
            utc(u.deadline)
        ),
        None => format!(
            "No automatic check is configured for {tool}, so an operator must settle it (once ledger resolve \
             {key}); they are alerted at {} if it is still open.",
            utc(u.deadline)
        ),
    };
    made(
        format!(
            "UNKNOWN: {tool} (operation {key}) may or may not have happened: {why}. Do not report it as done or \
             as failed yet. {} will not send it again: it returns the outcome once it is known. {doing}",
            cx.again()
        ),
        info,
        true,
    )
}

fn conflict(s: &RecordSummary, cx: &Context<'_>) -> CallToolResult {
    let tool = cx.tool;
    let mut info = cx.info("conflict");
    let stored_args: Value = serde_json::from_str(&s.args).unwrap_or(Value::String(s.args.clone()));
    info["stored"] = json!({
        "tool": s.tool, "args": stored_args, "state": s.state.name(),
        "fingerprint": s.fingerprint, "created_at": s.created_at,
    });
    made(
        format!(
            "CONFLICT: operation key {} was already used for a different call: {}({}), state {}, recorded {}. \
             This {tool} call was NOT sent. A changed payload is a new operation: give it a new operation key in \
             _meta \"{}\" (and name the old key in _meta \"once/supersedes\" if it replaces it).",
            s.key,
            s.tool,
            s.args,
            s.state.name(),
            utc(s.created_at),
            cx.key_meta
        ),
        info,
        true,
    )
}

fn blocked(b: &Blocked, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, cx.key());
    let mut info = cx.info("blocked");
    info["reason"] = json!(b.reason.to_string());
    info["detail"] = json!(b.detail);
    let why = match b.reason {
        BlockReason::RouteBlocked => "the gateway's policy does not allow this tool".to_string(),
        BlockReason::DescriptorChanged => {
            "the tool's definition changed since its policy was pinned; an operator must review it".to_string()
        }
        BlockReason::Quota => "it would pass the spend ceiling for this scope and window".to_string(),
        BlockReason::AttemptBudget => format!("operation {key} has used all its attempts; an operator must look at it"),
        BlockReason::IdentityRequired => format!(
            "this tool needs an operation key from the application in _meta \"{}\"",
            cx.key_meta
        ),
        BlockReason::IdentityConflict => "the call carries two different operation keys".to_string(),
        BlockReason::PayloadRequired => "an argument that defines the effect is missing".to_string(),
        BlockReason::Superseded => format!("operation {key} was replaced by a newer one"),
        BlockReason::SupersededUnresolved => {
            "the operation it replaces may still be happening; wait until that one is settled".to_string()
        }
        BlockReason::SupersededConfirmed => "the operation it replaces already happened".to_string(),
        BlockReason::SupersedesMissing => "the operation it names as replaced does not exist".to_string(),
        BlockReason::Expired => {
            format!("operation {key} is older than the retention window and can no longer be replayed or re-run")
        }
        BlockReason::Unverified => {
            "once could not verify with the provider that it has not already happened".to_string()
        }
        BlockReason::Storage => "once could not durably record the intent, so nothing was sent".to_string(),
        BlockReason::Failed => format!("operation {key} was refused before; a corrected call is a new operation"),
        BlockReason::OtherOwner => format!(
            "operation {key} belongs to another gateway or host on this ledger, which sends it; this one never does"
        ),
    };
    made(
        format!("BLOCKED: {tool} was not sent: {why} ({}: {}).", b.reason, b.detail),
        info,
        true,
    )
}

fn direct(cx: &Context<'_>) -> Result<CallToolResult, ErrorData> {
    let tool = cx.tool;
    let info = cx.info("direct");
    match &cx.capture.last {
        Some(Reply::Result(r)) => Ok(r.clone()),
        Some(Reply::Error(e)) => Err(e.clone()),
        Some(Reply::Lost(why)) => Ok(made(
            format!(
                "{tool} got no answer: {why}. once does not protect {tool} (it is routed DIRECT), so whether it \
                 ran is not known, and calling it again sends it again."
            ),
            info,
            true,
        )),
        Some(Reply::NotSent(why)) => Ok(made(format!("{tool} was not sent: {why}."), info, true)),
        None => Ok(made(format!("{tool} was not sent."), info, true)),
    }
}

/// The engine could not process the call; whether anything was sent decides what the model is told.
pub fn engine_error(e: &OnceError, cx: &Context<'_>) -> CallToolResult {
    let tool = cx.tool;
    let mut info = cx.info("error");
    info["error"] = json!(e.to_string());
    if cx.capture.attempt.is_some() {
        return made(
            format!(
                "UNKNOWN: {tool} was sent, but once could not record what happened ({e}). Do not report it as \
                 done or failed, and do not call it again to make sure: once reconciles it from the ledger."
            ),
            info,
            true,
        );
    }
    made(
        format!("ERROR: once could not process this {tool} call ({e}); nothing was sent."),
        info,
        true,
    )
}

/// A `_meta` object of one field.
pub fn meta_of(field: &str, value: &str) -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert(field.to_string(), Value::String(value.to_string()));
    meta
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
