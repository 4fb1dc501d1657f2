//! What the model is shown for each call. Every result the gateway makes
//! carries text (what a model reads) and structured content (what a program
//! reads), and `_meta["once/outcome"]` says the same for hosts. Both are
//! rendered from the engine's account of the call alone — whether the effect
//! happened, what the same call again would do, how a replay was matched —
//! plus what the upstream itself answered; nothing here infers more.

use once::types::{
    Account, BlockReason, Blocked, Confirmation, ConfirmedInfo, Effect, Ending, RecordSummary, RejectedInfo, Repeat,
    ReplayVia, UnknownInfo,
};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use once::{Called, OnceError};
use rmcp::model::{CallToolResult, ContentBlock, ErrorData, MetaObject};
use serde_json::{Value, json};

use crate::upstream::{Link, Reply};

/// The `_meta` field of a result that describes what once did.
pub const OUTCOME_META: &str = "once/outcome";

/// What the dispatcher saw of the upstream during one call.
#[derive(Debug, Default)]
pub struct Capture {
    /// The upstream's last reply to a dispatch.
    pub last: Option<Reply>,
    /// The operation key of the last protected dispatch.
    pub key: Option<String>,
    /// Whether any dispatch left the gateway (a reply that was not `NotSent`).
    pub sent: bool,
    /// Whether the current dispatch was handed to the upstream's connection ([`Link::handed`]).
    pub handed: Arc<AtomicBool>,
    /// The client's progress token and cancellation (none for the background worker's dispatches).
    pub link: Link,
    /// The client cannot follow a task (it came over HTTP, where the gateway declares none): a DIRECT call
    /// of a tool the upstream runs only as a task is run as one by the gateway, and its result waited for.
    pub runs_tasks: bool,
    /// The client's answers to the upstream's question of an earlier round ([`crate::rounds`]): sent with
    /// the attempt the client waits on, and with no other.
    pub answers: Option<crate::rounds::Answers>,
}

/// Everything a text needs besides the engine's account.
pub struct Context<'a> {
    /// The tool called.
    pub tool: &'a str,
    /// The call's scope.
    pub scope: &'a str,
    /// The lookup tool reconciliation reads, if configured.
    pub lookup: Option<&'a str>,
    /// The `_meta` field that carries operation keys, for advice.
    pub key_meta: &'a str,
    /// Whether the caller named the operation key in `_meta` (else it was derived from the arguments).
    pub keyed: bool,
    /// The tool's declared effect fields (JSON pointers): a derived key covers only these; `None`, every
    /// argument but the provider key's.
    pub effect_fields: Option<Vec<String>>,
    /// Whether the tool declares an output schema (its structured content must then be the upstream's).
    pub output_schema: bool,
    /// What the dispatcher saw.
    pub capture: Capture,
}

impl Context<'_> {
    /// What a result without an account says of itself.
    fn info(&self, decision: &str) -> Value {
        json!({"decision": decision, "tool": self.tool, "operation": Value::Null, "scope": self.scope})
    }

    /// What the result of a protected call says: the decision and the engine's facts. A keyless call's
    /// says what made its identity: `identity_fields` lists the argument pointers its derived key covers,
    /// `null` when every argument does (but the provider key's).
    fn account_info(&self, decision: &str, a: &Account) -> Value {
        let mut info = json!({
            "decision": decision, "tool": self.tool, "operation": a.key, "scope": self.scope,
            "effect": a.effect.to_string(), "repeat": a.repeat.to_string(), "awaits_operator": a.awaits_operator,
        });
        if !self.keyed {
            info["identity_fields"] = json!(self.effect_fields);
        }
        info
    }

    /// What a derived key covers, in words: "order_id and amount", or "arguments" when it is all of them.
    fn identity_words(&self) -> String {
        match &self.effect_fields {
            None => "arguments".to_string(),
            Some(fields) => {
                let names: Vec<&str> = fields.iter().map(|f| f.strip_prefix('/').unwrap_or(f)).collect();
                match names.split_last() {
                    Some((last, [])) => (*last).to_string(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                    None => "arguments".to_string(),
                }
            }
        }
    }

    /// How the model calls this same operation again: a derived key is the same for the same identity
    /// fields (every argument unless the tool declares its effect fields), a key from `_meta` only for the
    /// same key.
    fn again(&self, key: &str) -> String {
        if self.keyed {
            format!(
                "Calling {} again with operation key {key} in _meta \"{}\"",
                self.tool, self.key_meta
            )
        } else {
            format!("Calling {} again with the same {}", self.tool, self.identity_words())
        }
    }

    /// The reconciliation read, by name.
    fn read_by(&self) -> &str {
        self.lookup.unwrap_or("the provider")
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
    let t = once::UtcTime::from_ms(ms);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// The result the model sees for a protected (or direct) call.
pub fn render(called: Called, cx: &Context<'_>) -> Result<CallToolResult, ErrorData> {
    Ok(match called {
        Called::Done(account) => protected(&account, cx),
        Called::Unreported { response, error } => {
            let key = cx.capture.key.as_deref().unwrap_or("(none)");
            let mut info = cx.info("unrecorded");
            info["operation"] = json!(key);
            info["effect"] = json!(Effect::Happened.to_string());
            info["repeat"] = json!(Repeat::Waits.to_string());
            info["error"] = json!(error);
            happened_unrecorded(&response, key, &info, cx)
        }
        Called::Direct(_) => return direct(cx),
    })
}

/// A protected call, from the engine's account.
fn protected(a: &Account, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, a.key.as_deref().unwrap_or("(none)"));
    match &a.ending {
        Ending::Confirmed(c) if !c.replayed => executed(a, c, cx),
        Ending::Confirmed(c) => replayed(a, c, cx),
        Ending::Unknown(u) => unknown(a, u, cx),
        Ending::InFlight(i) => {
            let mut info = cx.account_info("in-flight", a);
            info["lease_until"] = json!(i.lease_until);
            // The holder may be this call itself: its outcome came back and could not be recorded yet.
            let who = if cx.capture.sent {
                "was sent, and the outcome of its attempt in flight is not recorded yet"
            } else {
                "is being sent by another call right now and its outcome is not known yet. Nothing was sent for \
                 this call"
            };
            made(
                format!(
                    "IN PROGRESS: {tool} (operation {key}) {who}. {} returns that outcome; it will not be sent twice.",
                    cx.again(key)
                ),
                info,
                true,
            )
        }
        Ending::Conflict(summary) => conflict(a, summary, cx),
        Ending::Blocked(b) => blocked(a, b, cx),
        Ending::Rejected(r) => rejected(a, r, cx),
        Ending::NotSent(n) => {
            let mut info = cx.account_info("not-sent", a);
            info["attempts"] = json!(n.attempts);
            // Only a spent budget is final; while attempts are left (a retry's back-off) the same call goes on.
            let text = match a.repeat {
                Repeat::Retries => format!(
                    "NOT SENT YET: {tool} (operation {key}): attempt {} did not reach the upstream. {} sends it as \
                     the next attempt of this same operation; a new operation key would make it a second one.",
                    n.attempts,
                    cx.again(key)
                ),
                _ => format!(
                    "NOT SENT: {tool} (operation {key}) did not happen: none of its {} attempts reached the \
                     upstream, and it has none left. {} is refused; a new call needs a new operation key.",
                    n.attempts,
                    cx.again(key)
                ),
            };
            made(format!("{text}{}", unsettled(a)), info, true)
        }
        Ending::Unrecorded(u) => happened_unrecorded(&u.response, key, &cx.account_info("unrecorded", a), cx),
        Ending::AwaitsApproval(p) => {
            let mut info = cx.account_info("awaits-approval", a);
            info["asked_at"] = json!(p.asked_at);
            info["approval_reason"] = json!(p.reason);
            info["approval_valid_ms"] = json!(p.valid_ms);
            info["approval_wait_until"] = json!(p.wait_until);
            made(
                format!(
                    "AWAITING APPROVAL: {tool} (operation {key}) is held for a person: nothing more is sent for it \
                     until an operator approves this exact call ({}; waiting since {}). That can take minutes or \
                     hours; if nobody approves it by {}, it is denied and never sent. {} answers with what was \
                     decided: the outcome once it is sent (it is never sent twice), or a refusal if it was denied. \
                     Do not send it again with changed arguments or under a new operation key: that would be \
                     another operation.{}",
                    p.reason,
                    utc(p.asked_at),
                    utc(p.wait_until),
                    cx.again(key),
                    unsettled(a)
                ),
                info,
                true,
            )
        }
    }
}

/// Sent by this call, and its answer is the receipt.
fn executed(a: &Account, c: &ConfirmedInfo, cx: &Context<'_>) -> CallToolResult {
    let key = a.key.as_deref().unwrap_or("(none)");
    let mut info = cx.account_info("executed", a);
    info["attempt"] = json!(c.attempt);
    info["possible_duplicate"] = json!(c.possible_duplicate);
    let result = match &cx.capture.last {
        Some(Reply::Result(r)) => r.clone(),
        _ => stored_result(&c.receipt),
    };
    let mut said = Vec::new();
    // A later attempt follows one the model may have been told was UNKNOWN: say what the engine knows of it.
    if let Some(n) = c.attempt.filter(|n| *n > 1) {
        let earlier = match c.earlier_attempts {
            Effect::None => "no earlier attempt had an effect",
            Effect::Unknown => "whether an earlier attempt had an effect is not known",
            Effect::Happened => "an earlier attempt had an effect too",
        };
        said.push(format!("Sent now as attempt {n} of operation {key}; {earlier}."));
    }
    if c.possible_duplicate {
        said.push(format!(
            "WARNING: another attempt of operation {key} reported success too, so there may be two effects; an \
             operator was alerted."
        ));
    }
    if said.is_empty() {
        cx.annotate(result, &info)
    } else {
        prefixed(result, said.join(" "), &info, cx)
    }
}

/// Answered from the ledger (or the provider's read) instead of being sent by this call.
fn replayed(a: &Account, c: &ConfirmedInfo, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, a.key.as_deref().unwrap_or("(none)"));
    let via = c.via.unwrap_or(ReplayVia::Key);
    let mut info = cx.account_info("replayed", a);
    info["via"] = json!(via.to_string());
    info["confirmed_by"] = json!(c.confirmed_by.to_string());
    info["at"] = json!(c.at);
    info["window_until"] = json!(c.window_until);
    info["possible_duplicate"] = json!(c.possible_duplicate);
    // Who settled it, when not an attempt's own answer: one set of words for both texts below.
    let confirmer = match c.confirmed_by {
        Confirmation::Answer => None,
        Confirmation::Provider => Some(format!("once confirmed it by reading {}", cx.read_by())),
        Confirmation::Operator => Some("an operator confirmed that it happened".to_string()),
    };
    let how = match (&confirmer, c.confirmed_by) {
        (Some(words), Confirmation::Provider) => format!(" ({words} after its reply was lost)"),
        (Some(words), _) => format!(" ({words})"),
        (None, _) => String::new(),
    };
    let same = cx.identity_words();
    let until = c
        .window_until
        .filter(|_| via == ReplayVia::DerivedArgs)
        .map_or_else(String::new, |t| {
            format!(
                " Until {}, calls with the same {same} are this same operation; after that they are new.",
                utc(t)
            )
        });
    let mut text = match via {
        // This call sent an attempt of it and heard nothing back; another attempt (another process's, or
        // one sent while this call waited) or an operator settled it. Its own operation, never a repeat:
        // the words for a repeat ("already ran", "a deliberate second") would invite a second one.
        ReplayVia::Key | ReplayVia::DerivedArgs if cx.capture.sent && cx.capture.key == a.key => {
            let settled = confirmer.unwrap_or_else(|| {
                c.attempt.map_or_else(
                    || "another attempt of the same operation reported success".to_string(),
                    |n| format!("attempt {n} of the same operation reported success"),
                )
            });
            format!(
                "Replay of operation {key}: {tool} happened. This call sent it and got no reply; {settled}, and \
                 below is its stored result. Nothing more was sent.{until}"
            )
        }
        ReplayVia::Provider => format!(
            "Replay of operation {key}: {tool} did happen, but its reply was lost; once confirmed it by reading {}, \
             and below is what that read returned. Nothing was sent again.",
            cx.read_by()
        ),
        ReplayVia::Key => format!(
            "Replay of operation {key}: {tool} already ran under this operation key{how}; below is its stored \
             result. Nothing was sent again."
        ),
        ReplayVia::DerivedArgs => {
            format!(
                "Replay: a {tool} call with the same {same} already ran at {} as operation {key}{how}; below is \
                 its stored result. Nothing was sent again. For a deliberate second {tool} with the same {same}, \
                 give it its own operation key in _meta \"{}\".{until}",
                utc(c.at),
                cx.key_meta
            )
        }
    };
    if c.possible_duplicate {
        text.push_str(
            " WARNING: another attempt reported success too, so there may be two effects; an operator was alerted.",
        );
    }
    prefixed(stored_result(&c.receipt), text, &info, cx)
}

fn rejected(a: &Account, r: &RejectedInfo, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, a.key.as_deref().unwrap_or("(none)"));
    let mut info = cx.account_info("rejected", a);
    info["attempt"] = json!(r.attempt);
    let next = match a.repeat {
        Repeat::Retries => format!(
            "{} tries it again as the next attempt of this operation.",
            cx.again(key)
        ),
        // A corrected call is a new operation only once nothing of this one can still happen.
        _ if a.effect == Effect::Unknown => format!("{} will be refused again.", cx.again(key)),
        _ => format!(
            "{} will be refused again; a corrected call is a new operation.",
            cx.again(key)
        ),
    };
    let text = format!(
        "Rejected: the upstream refused {tool} (operation {key}) and did nothing. {next}{}",
        unsettled(a)
    );
    match &cx.capture.last {
        Some(Reply::Result(result)) => prefixed(result.clone(), text, &info, cx),
        Some(Reply::Error(e)) => made(format!("{text} The upstream said: {}", e.message), info, true),
        _ => {
            let mut result = prefixed(stored_result(&r.error), text, &info, cx);
            result.is_error = Some(true);
            result
        }
    }
}

/// The effect happened and once could not record it yet.
fn happened_unrecorded(response: &str, key: &str, info: &Value, cx: &Context<'_>) -> CallToolResult {
    let tool = cx.tool;
    // Without a lookup, nothing reads the provider: the record turns unknown and an operator settles it.
    let settles = match cx.lookup {
        Some(read) => format!("once reconciles it by reading {read}"),
        None => format!(
            "no lookup is configured for {tool}, so an operator records it (once ledger resolve {key} --scope {} \
             --confirmed RECEIPT --note WHY), and until then calling it again answers that its outcome is unknown",
            cx.scope
        ),
    };
    let text = format!(
        "Note: {tool} (operation {key}) did happen (below), but once could not record it yet. Do not call it again \
         to make sure: {settles}."
    );
    match &cx.capture.last {
        Some(Reply::Result(r)) => prefixed(r.clone(), text, info, cx),
        _ => prefixed(stored_result(response), text, info, cx),
    }
}

fn unknown(a: &Account, u: &UnknownInfo, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, a.key.as_deref().unwrap_or("(none)"));
    let mut info = cx.account_info("unknown", a);
    info["since"] = json!(u.since);
    info["deadline"] = json!(u.deadline);
    info["reason"] = json!(u.reason);
    info["next_read"] = json!(u.next_read);
    // The engine says whether only an operator can settle it; a next read is then shown as it states it.
    let doing = match u.next_read.filter(|_| !a.awaits_operator) {
        Some(next) => format!(
            "once is checking with {} in the background (next read {}); if that proves it did not happen, once \
             sends it itself, exactly once, with the same idempotency key. If it is still unsettled by {}, an \
             operator is alerted.",
            cx.read_by(),
            utc(next),
            utc(u.deadline)
        ),
        None => format!(
            "No read can settle it (no lookup is configured for {tool}), so an operator must (once ledger \
             resolve {key}); they are alerted at {} if it is still open.",
            utc(u.deadline)
        ),
    };
    made(
        format!(
            "UNKNOWN: {tool} (operation {key}) may or may not have happened: {}. Do not report it as done or as \
             failed yet. {} will not send it again: it returns the outcome once it is known. {doing}",
            u.reason,
            cx.again(key)
        ),
        info,
        true,
    )
}

fn conflict(a: &Account, s: &RecordSummary, cx: &Context<'_>) -> CallToolResult {
    let tool = cx.tool;
    let mut info = cx.account_info("conflict", a);
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

fn blocked(a: &Account, b: &Blocked, cx: &Context<'_>) -> CallToolResult {
    let (tool, key) = (cx.tool, a.key.as_deref().unwrap_or("(none)"));
    let mut info = cx.account_info("blocked", a);
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
            "operation {key} belongs to another gateway or host on this ledger (its owner is named below); this \
             one never sends it"
        ),
        BlockReason::OtherAccount => format!(
            "operation {key} (or the operation it would replace) was made through another provider account than \
             this gateway's upstream now uses (its credential changed, or another account's gateway shares this \
             ledger); it is neither replayed, replaced nor sent through this account, and whatever it did stands"
        ),
        BlockReason::ApprovalDenied => {
            format!(
                "operation {key} was not approved (a person denied it, or nobody approved it in time); it will not \
                 be sent, and calling it again is refused"
            )
        }
    };
    // What the same call again does, when it is not simply refused (a stored outcome, one still coming).
    let next = match a.repeat {
        Repeat::Waits if b.reason == BlockReason::OtherOwner => format!(
            " {} gets its outcome once that one has sent it; a new operation key would make it a second one.",
            cx.again(key)
        ),
        _ => String::new(),
    };
    made(
        format!(
            "BLOCKED: {tool} was not sent: {why} ({}: {}).{next}{}",
            b.reason,
            b.detail,
            unsettled(a)
        ),
        info,
        true,
    )
}

/// What a refusal or a not-sent answer adds when the engine does not know that the operation had no effect
/// (an earlier attempt's may still arrive, or another host is sending it): nothing that claims "did nothing"
/// covers it, so the advice to use a new key does not either.
fn unsettled(a: &Account) -> &'static str {
    match a.effect {
        Effect::Unknown => {
            " Whether this operation has an effect is not known yet (an earlier attempt, or another host, may \
             still make it): do not make it again under a new operation key until it is settled."
        }
        Effect::None | Effect::Happened => "",
    }
}

/// What a client on a revision before MCP 2026-07-28 is told when the upstream asked for input before it
/// would run `tool` and the question could not be put to it (`why`, [`crate::rounds`]): nothing was done.
pub fn input_not_carried(tool: &str, why: &str) -> CallToolResult {
    let info = json!({
        "decision": "input-required", "tool": tool,
        "effect": Effect::None.to_string(), "repeat": Repeat::Retries.to_string(),
    });
    made(
        format!(
            "NOT RUN: {tool} asked for input before it would run (an MCP 2026-07-28 multi-round-trip request), \
             and the question could not be put to this client: {why}. Nothing was done; calling it again asks again."
        ),
        info,
        true,
    )
}

fn direct(cx: &Context<'_>) -> Result<CallToolResult, ErrorData> {
    let tool = cx.tool;
    let info = cx.info("direct");
    match &cx.capture.last {
        // A task handle goes to the client as the upstream sent it (`crate::wire` unwraps it).
        Some(Reply::Result(r) | Reply::Task(r)) => Ok(r.clone()),
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
        // Relayed as the question it is before anything is rendered (`Gateway::call`); here only for a client
        // that cannot take one.
        Some(Reply::InputRequired(_)) => Ok(input_not_carried(tool, "it was not relayed")),
        None => Ok(made(format!("{tool} was not sent."), info, true)),
    }
}

/// The engine could not process the call; whether anything was sent decides what the model is told.
pub fn engine_error(e: &OnceError, cx: &Context<'_>) -> CallToolResult {
    let tool = cx.tool;
    let mut info = cx.info("error");
    info["error"] = json!(e.to_string());
    if cx.capture.sent {
        return made(
            format!(
                "UNKNOWN: {tool} was sent, but once could not record what happened ({e}). Do not report it as \
                 done or failed, and do not call it again to make sure: once reconciles it from the ledger."
            ),
            info,
            true,
        );
    }
    // This call sent nothing, but an earlier one under the same key may have: the same key stays safe.
    made(
        format!(
            "ERROR: once could not process this {tool} call ({e}); nothing was sent by this call. Once that is \
             mended, calling it again the same way (the same operation key, or for a call without one the same \
             arguments) is safe: it is never sent twice, and it answers what an earlier call of it did; a new \
             key would make it another operation."
        ),
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
    use super::*;
    use once::types::{InFlightInfo, KeySource, NotSentInfo};

    fn account(ending: Ending, effect: Effect, repeat: Repeat) -> Account {
        Account {
            scope: "t1".into(),
            key: Some("k-1".into()),
            key_source: Some(KeySource::Application),
            tool: "refund_order".into(),
            ending,
            effect,
            repeat,
            awaits_operator: false,
        }
    }

    /// The text a model reads for `a`, with `capture` as the dispatcher left it.
    fn said(a: &Account, capture: Capture, lookup: Option<&str>) -> String {
        let cx = Context {
            tool: "refund_order",
            scope: "t1",
            lookup,
            key_meta: "once/key",
            keyed: true,
            effect_fields: None,
            output_schema: false,
            capture,
        };
        let result = render(Called::Done(a.clone()), &cx).unwrap();
        result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// "Use a new key" is said only where the engine says the same call is refused and nothing can have an
    /// effect: a retry's interim not-sent answer goes on under the same key, and an operation whose effect is
    /// unknown (another host owes its dispatch, an earlier attempt may still land) is never to be repeated
    /// under a new one.
    #[test]
    fn no_answer_advises_a_new_key_while_the_operation_goes_on_or_may_have_happened() {
        let interim = account(
            Ending::NotSent(NotSentInfo { attempts: 2 }),
            Effect::None,
            Repeat::Retries,
        );
        let text = said(&interim, Capture::default(), None);
        assert!(text.starts_with("NOT SENT YET") && text.contains("attempt 2"), "{text}");
        assert!(
            !text.contains("needs a new operation key") && !text.contains("none left"),
            "{text}"
        );

        let spent = account(
            Ending::NotSent(NotSentInfo { attempts: 3 }),
            Effect::None,
            Repeat::Refused,
        );
        let text = said(&spent, Capture::default(), None);
        assert!(
            text.contains("none left") && text.contains("needs a new operation key"),
            "{text}"
        );

        let blocked = Blocked {
            reason: BlockReason::OtherOwner,
            detail: "k-1 is absent and dispatched by owner \"a\"".into(),
            receipt: None,
        };
        let owed = account(Ending::Blocked(blocked), Effect::Unknown, Repeat::Waits);
        let text = said(&owed, Capture::default(), None);
        assert!(
            text.contains("gets its outcome") && text.contains("not known yet"),
            "{text}"
        );
        assert!(
            text.contains("do not make it again under a new operation key"),
            "{text}"
        );

        let rejected = account(
            Ending::Rejected(RejectedInfo {
                error: "{\"error\":\"closed\"}".into(),
                attempt: 2,
            }),
            Effect::Unknown,
            Repeat::Refused,
        );
        let text = said(&rejected, Capture::default(), None);
        assert!(
            text.contains("do not make it again under a new operation key"),
            "{text}"
        );
    }

    /// A call that sent an attempt (its outcome not recorded yet) is not told that another call sends it and
    /// nothing was sent for it; an unrecorded success without a lookup is not promised a
    /// reconciliation that nothing will make.
    #[test]
    fn a_call_is_told_what_it_did_itself() {
        let held = account(
            Ending::InFlight(InFlightInfo { lease_until: 1 }),
            Effect::Unknown,
            Repeat::Waits,
        );
        let text = said(
            &held,
            Capture {
                sent: true,
                ..Capture::default()
            },
            None,
        );
        assert!(
            text.contains("was sent, and the outcome of its attempt in flight") && !text.contains("Nothing was sent"),
            "{text}"
        );
        let text = said(&held, Capture::default(), None);
        assert!(
            text.contains("another call") && text.contains("Nothing was sent"),
            "{text}"
        );

        let unrecorded = account(
            Ending::Unrecorded(once::types::UnrecordedInfo {
                response: "{\"refund_id\":\"r-1\"}".into(),
            }),
            Effect::Happened,
            Repeat::Waits,
        );
        let text = said(&unrecorded, Capture::default(), None);
        assert!(
            text.contains("an operator records it") && !text.contains("reconciles"),
            "{text}"
        );
        let text = said(&unrecorded, Capture::default(), Some("find_refund_by_key"));
        assert!(text.contains("reconciles it by reading find_refund_by_key"), "{text}");
    }

    /// A call whose own attempt went unanswered, its operation settled by another attempt (another
    /// process's worker came first), is told so: never the words for a repeat, which invite "a deliberate
    /// second" one. A call that sent nothing (a repeat) still is.
    #[test]
    fn a_call_whose_own_attempt_was_settled_elsewhere_is_not_told_it_repeated() {
        let confirmed = |via| ConfirmedInfo {
            receipt: "{\"refund_id\":\"r-1\"}".into(),
            replayed: true,
            via: Some(via),
            confirmed_by: Confirmation::Answer,
            at: 1_700_000_000_000,
            window_until: Some(1_700_086_400_000),
            attempt: Some(2),
            earlier_attempts: Effect::None,
            possible_duplicate: false,
        };
        let mut derived = account(
            Ending::Confirmed(confirmed(ReplayVia::DerivedArgs)),
            Effect::Happened,
            Repeat::Replays,
        );
        derived.key = Some("derived:ab12".into());
        derived.key_source = Some(KeySource::Derived);
        // What the call's own dispatch of `key` left in its capture.
        let sent = |key: &str| Capture {
            sent: true,
            key: Some(key.into()),
            ..Capture::default()
        };
        let text = said(&derived, sent("derived:ab12"), None);
        assert!(
            text.starts_with("Replay of operation derived:ab12: refund_order happened. This call sent it and got no reply; attempt 2 of the same operation reported success"),
            "{text}"
        );
        assert!(
            !text.contains("deliberate second") && !text.contains("already ran"),
            "{text}"
        );
        assert!(
            text.contains("Until 2023-11-15 22:13:20 UTC, calls with the same arguments are this same operation"),
            "{text}"
        );

        let repeat = said(&derived, Capture::default(), None);
        assert!(
            repeat.starts_with("Replay: a refund_order call with the same arguments already ran at ")
                && repeat.contains("deliberate second"),
            "{repeat}"
        );

        let keyed = account(
            Ending::Confirmed(ConfirmedInfo {
                confirmed_by: Confirmation::Operator,
                ..confirmed(ReplayVia::Key)
            }),
            Effect::Happened,
            Repeat::Replays,
        );
        let text = said(&keyed, sent("k-1"), None);
        assert!(
            text.starts_with("Replay of operation k-1: refund_order happened. This call sent it and got no reply; an operator confirmed that it happened"),
            "{text}"
        );
        assert!(!text.contains("Until "), "a key from _meta has no window: {text}");
        // Another operation's dispatch in the same call (an owed one) is not this one's attempt.
        let other = said(&keyed, sent("k-0"), None);
        assert!(other.contains("already ran under this operation key"), "{other}");
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
