//! `tools/call` run through the engine's call protocol (`Once::call_async`: it
//! says when to send, what to wait for and how the call ended), and the
//! provider lookup over the upstream. The MCP methods the client calls are
//! [`crate::server`]; the background worker is [`crate::worker`]; what the
//! model is shown is [`crate::reply`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use once::types::{BlockReason, Call, Ending, Evidence, Reading, Repeat, Route, ToolDescriptor};
use once::{Called, Clock, Dispatch, Dispatcher, Once, OnceError, Sent};
#[allow(deprecated)] // logging: deprecated by a newer protocol revision, used by clients on the older ones
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, JsonObject, LoggingLevel,
    LoggingMessageNotificationParam, Notification, ServerNotification, Tool,
};
use serde_json::Value;

use crate::config::{ACKNOWLEDGE_META, Config, OnToolError, ProviderKey, SUPERSEDES_META, ScopeMode};
use crate::reply::{self, Capture, Context};
use crate::upstream::{Due, Link, Reply, Upstream};

/// What the handler, the provider lookup and the worker share.
pub struct Shared {
    /// The configuration.
    pub config: Config,
    /// The upstream server.
    pub upstream: Upstream,
    /// The ledger's clock (the database's for PostgreSQL): read positions are stamped in it.
    ledger_clock: OnceLock<Arc<dyn Clock>>,
    /// The definition the engine was configured with for each tool, to notice one that changed.
    configured: Mutex<HashMap<String, Option<ToolDescriptor>>>,
    /// Operations this gateway answered as not yet settled: drained before exit.
    pending: Mutex<HashSet<(String, String)>>,
    /// Calls the engine is still working on (shutdown waits for them).
    in_flight: Arc<AtomicUsize>,
    /// Calls the engine blocked, by reason, since this process started (a block writes no record).
    blocked: Mutex<BTreeMap<String, u64>>,
    /// Who dispatches this gateway's operations: the configured `owner`, else the upstream's name and
    /// identity digest (`gateway refund-mcp #3fa2c19e0b7d`: [`crate::identity::default_owner`]).
    /// Gateways with one owner settle each other's records; others never touch them.
    pub owner: String,
    /// The provider account its upstream acts for: the configured `account`, else the upstream's
    /// identity digest ([`crate::identity::default_account`]). Every record it begins names it; it
    /// neither answers nor sends another account's, and its reads never prove theirs absent.
    pub account: String,
    /// Scopes this gateway may serve (bound to its owner in the ledger), as far as this process has seen.
    admitted: Mutex<HashSet<String>>,
    /// The upstream's tasks this gateway stopped waiting for while they may still run, by the attempt that
    /// started them (tool, provider key, args): the provider is read through them first ([`task_evidence`]).
    tasks: Mutex<HashMap<(String, String, String), TaskRun>>,
    /// The seal on the `requestState`s this gateway relays, under the ledger's secret (read at first use).
    seal: OnceLock<crate::rounds::Seal>,
}

/// A task of the upstream's that ran a protected call and was given up on before it ended.
#[derive(Debug, Clone)]
struct TaskRun {
    /// The upstream's task id.
    id: String,
    /// The tool's `max_in_flight` (ms): how long after the task ended an effect it started may still commit.
    max_in_flight_ms: u64,
    /// When (ledger clock) the task was first seen ended (or gone), if it was.
    ended_at: Option<u64>,
}

/// Scopes remembered as this gateway's before the cache starts over (each costs one ledger read again).
const MAX_ADMITTED: usize = 10_000;

/// Counts one call in flight until dropped.
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// Shared state over a started upstream.
    pub fn new(config: Config, upstream: Upstream) -> Shared {
        let target = upstream.target();
        let identity = crate::identity::identity(target);
        let owner = config
            .owner
            .clone()
            .unwrap_or_else(|| crate::identity::default_owner(target, &identity));
        let account = config
            .account
            .clone()
            .unwrap_or_else(|| crate::identity::default_account(&identity));
        Shared {
            config,
            upstream,
            ledger_clock: OnceLock::new(),
            configured: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashSet::new()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            blocked: Mutex::new(BTreeMap::new()),
            owner,
            account,
            admitted: Mutex::new(HashSet::new()),
            tasks: Mutex::new(HashMap::new()),
            seal: OnceLock::new(),
        }
    }

    /// The seal on relayed `requestState`s ([`crate::rounds::Seal`]): its secret is bound in the ledger
    /// first come, so every gateway on it (and this one after a restart) opens what another sealed.
    fn seal(&self, once: &Once) -> Result<&crate::rounds::Seal, String> {
        if let Some(seal) = self.seal.get() {
            return Ok(seal);
        }
        let offered = crate::rounds::Seal::fresh_secret()?;
        let secret = once
            .bind(crate::rounds::SEAL_BINDING, &offered)
            .map_err(|e| format!("reading the request-state seal's secret from the ledger: {e}"))?;
        Ok(self.seal.get_or_init(|| crate::rounds::Seal::new(&secret)))
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, String), TaskRun>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this gateway may serve `scope` on its ledger: the scope is bound to the first owner that
    /// served it (see [`once::storage::Storage::bind`]), and a gateway serves only scopes bound to its own
    /// owner. Two upstreams on one ledger (two accounts, the default `once.db`) would otherwise answer each
    /// other's calls with each other's receipts; replicas of one upstream share an owner, so they share
    /// its scopes. A session's scope is its own and needs no binding. One ledger write per scope per process.
    pub fn admit_scope(&self, once: &Once, scope: &str) -> Result<(), String> {
        if self.admitted(scope) {
            return Ok(());
        }
        let holder = once
            .bind(&format!("scope:{scope}"), &self.owner)
            .map_err(|e| format!("binding scope {scope:?} to this gateway in the ledger: {e}"))?;
        if holder != self.owner {
            let source = &self.config.source;
            // The old upstream's default account, when its owner was the default (the same digits).
            let same_account = holder
                .rsplit_once(" #")
                .filter(|_| self.config.account.is_none())
                .filter(|(_, digits)| digits.len() == 12 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
                .map_or_else(String::new, |(_, digits)| {
                    format!(
                        " If it also acts for the same provider account (no credential changed), set account = \
                         {:?} as well; otherwise the operations begun through the old account are neither replayed \
                         nor sent by this gateway, and its reads never prove them absent.",
                        crate::identity::default_account(digits)
                    )
                });
            return Err(format!(
                "scope {scope:?} on this ledger belongs to another upstream (owner {holder:?}); this gateway is \
                 {:?}. Two upstreams on one ledger would answer each other's calls from each other's records. Give \
                 this gateway a ledger of its own (--db, or db = \"…\" in {source}), or a scope and owner of its \
                 own in {source} (scope = \"fixed:NAME\", owner = \"NAME\", a NAME no other gateway on the ledger \
                 uses). If it is the same upstream and only its command line or environment changed, set owner = \
                 {holder:?} in {source} (gateways with one owner are replicas of one upstream), or move the old \
                 name's operations to this one: once ledger adopt --from {holder:?} --to {:?}.{same_account}",
                self.owner, self.owner
            ));
        }
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        // Scopes named per call come from clients: the cache is a shortcut, not a set that grows for ever.
        if admitted.len() >= MAX_ADMITTED {
            admitted.clear();
        }
        admitted.insert(scope.to_string());
        Ok(())
    }

    /// Whether this gateway serves `scope` without asking the ledger ([`Shared::admit_scope`]).
    fn admitted(&self, scope: &str) -> bool {
        self.config.scope == ScopeMode::Session
            || self.admitted.lock().unwrap_or_else(|p| p.into_inner()).contains(scope)
    }

    /// Count a call in flight until the guard drops.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.in_flight.clone())
    }

    /// How many calls the engine is working on now.
    pub fn calls_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Calls blocked since start, by reason.
    pub fn blocked(&self) -> BTreeMap<String, u64> {
        self.blocked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn count_blocked(&self, called: &Called) {
        if let Called::Done(account) = called
            && let Ending::Blocked(b) = &account.ending
        {
            *self
                .blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(b.reason.to_string())
                .or_default() += 1;
        }
    }

    /// The upstream's tool definitions as the engine routes and pins them.
    pub fn descriptors(&self) -> Vec<ToolDescriptor> {
        self.upstream.tools().iter().map(descriptor_of).collect()
    }

    /// Remember the definitions the engine was built with.
    pub fn configured_with(&self, descriptors: &[ToolDescriptor]) {
        let mut configured = self.configured.lock().unwrap_or_else(|p| p.into_inner());
        for name in self.config.named_tools() {
            configured.insert(name.to_string(), None);
        }
        for d in descriptors {
            configured.insert(d.name.clone(), Some(d.clone()));
        }
    }

    /// Keep the engine's view of `tool` current: a tool it was never told of, or
    /// whose definition the upstream changed (a restart with a new version), is
    /// configured again, so routing by annotations and pinning see what is sent.
    pub fn keep_configured(&self, once: &Once, tool: &str) -> Result<(), OnceError> {
        let mut configured = self.configured.lock().unwrap_or_else(|p| p.into_inner());
        let Some(current) = self.changed(&configured, tool) else {
            return Ok(());
        };
        // Only a tool the engine had a plan for (listed, or named in the config) can lose its route.
        let before = configured.contains_key(tool).then(|| once.plan(tool).route);
        let after = once.set_tool(tool, self.config.policy(tool), current.clone())?.route;
        // A route taken from the upstream's annotations follows its new definition; one that stops
        // protecting a tool is said, since nothing else shows it (`pin` makes it a block instead).
        if before == Some(Route::Protect) && after == Route::Direct {
            tracing::warn!(
                target: "once::gateway",
                "{tool}: its new definition from the upstream routes it DIRECT (it was protected): its calls are \
                 no longer recorded or deduplicated; set its route in the config, or pin it"
            );
        }
        configured.insert(tool.to_string(), current);
        Ok(())
    }

    /// Whether the engine's view of `tool` is the upstream's definition now ([`Shared::keep_configured`]).
    fn is_configured(&self, tool: &str) -> bool {
        let configured = self.configured.lock().unwrap_or_else(|p| p.into_inner());
        self.changed(&configured, tool).is_none()
    }

    /// The upstream's definition of `tool` now (none: it lists no such tool), when the engine was
    /// configured with another; `None` when the engine's view is current.
    fn changed(
        &self,
        configured: &HashMap<String, Option<ToolDescriptor>>,
        tool: &str,
    ) -> Option<Option<ToolDescriptor>> {
        let current = self.upstream.tool(tool).as_ref().map(descriptor_of);
        (configured.get(tool) != Some(&current)).then_some(current)
    }

    /// Stamp read positions with the ledger's clock from now on.
    pub fn set_ledger_clock(&self, clock: Arc<dyn Clock>) {
        let _ = self.ledger_clock.set(clock);
    }

    /// Now on the ledger's clock.
    fn ledger_now(&self) -> u64 {
        match self.ledger_clock.get() {
            Some(clock) => clock.now(),
            None => once::SystemClock::default().now(),
        }
    }

    /// Whether any operation this gateway answered is still unsettled.
    pub fn has_pending(&self) -> bool {
        !self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    fn track(&self, scope: &str, key: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((scope.to_string(), key.to_string()));
    }

    /// The operations this gateway answered as not yet settled.
    pub fn pending(&self) -> Vec<(String, String)> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Forget an operation whose outcome is known.
    pub fn settled(&self, scope: String, key: String) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(scope, key));
    }

    /// Keep `called` for the drain before exit while the same call again would wait for it and
    /// this gateway can still settle it: an unknown no read can settle is the operator's, and a
    /// dispatch another owner owes is that owner's to send.
    fn track_unsettled(&self, scope: &str, called: &Called, capture: &Capture) {
        let key = match called {
            Called::Done(account)
                if account.repeat == Repeat::Waits
                    && !account.awaits_operator
                    && !matches!(&account.ending, Ending::Blocked(b) if b.reason == BlockReason::OtherOwner) =>
            {
                account.key.as_deref()
            }
            Called::Unreported { .. } => capture.key.as_deref(),
            _ => None,
        };
        if let Some(key) = key {
            self.track(scope, key);
        }
    }
}

/// Run `f` on tokio's blocking pool: the engine and the ledger are synchronous.
async fn off_loop<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Result<R, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the gateway's worker failed: {e}"))
}

/// The tool's definition as the engine routes and pins it.
pub fn descriptor_of(tool: &Tool) -> ToolDescriptor {
    ToolDescriptor {
        name: tool.name.to_string(),
        input_schema: serde_json::to_string(&*tool.input_schema).unwrap_or_else(|_| "{}".to_string()),
        annotations: tool.annotations.as_ref().and_then(|a| serde_json::to_string(a).ok()),
    }
}

/// The JSON a tool result carries: its structured content, else its first text parsed as JSON.
fn payload(result: &CallToolResult) -> Option<Value> {
    if let Some(v) = &result.structured_content {
        return Some(v.clone());
    }
    result
        .content
        .iter()
        .find_map(|c| c.as_text())
        .and_then(|t| serde_json::from_str(&t.text).ok())
}

fn first_text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .find_map(|c| c.as_text())
        .map_or_else(|| "(no text)".to_string(), |t| t.text.clone())
}

/// The engine's authoritative read (a `read` step: verify-first, reconciliation): the configured lookup
/// tool on the upstream, awaited like a dispatch, so no thread waits for the upstream's answer.
pub async fn read_upstream(shared: &Shared, reading: &Reading) -> Evidence {
    let (tool, provider_key, args) = (
        reading.tool.as_str(),
        reading.provider_key.as_str(),
        reading.args.as_str(),
    );
    if let Some(evidence) = task_evidence(shared, tool, provider_key, args).await {
        return evidence;
    }
    let Some(lookup) = shared.config.upstream_tool(tool).lookup.clone() else {
        return Evidence::Unknown(format!("no lookup is configured for {tool}"));
    };
    let call_args = match serde_json::from_str::<Value>(args).map(|a| lookup.render(provider_key, &a)) {
        Ok(Ok(Value::Object(map))) => map,
        Ok(Ok(_)) => return Evidence::Unknown(format!("the {} arguments are not an object", lookup.tool)),
        Ok(Err(e)) => return Evidence::Unknown(format!("cannot build the {} arguments: {e}", lookup.tool)),
        Err(e) => return Evidence::Unknown(format!("the stored args are not JSON: {e}")),
    };
    let params = CallToolRequestParams::new(lookup.tool.clone()).with_arguments(call_args);
    // Taken before sending, on the ledger's clock: every commit the answer reflects is at or
    // before it, never after, in the domain the engine compares it with.
    let sent_at = shared.ledger_now();
    let reply = shared
        .upstream
        .call_to_end(params, Due::After(lookup.timeout), &Link::own())
        .await;
    let answer = match reply {
        Reply::Result(r) if r.is_error != Some(true) => match payload(&r) {
            Some(answer) => answer,
            None => return Evidence::Unknown(format!("{} answered no JSON", lookup.tool)),
        },
        Reply::Result(r) => return Evidence::Unknown(format!("{} failed: {}", lookup.tool, first_text(&r))),
        Reply::Error(e) => return Evidence::Unknown(format!("{} failed: {}", lookup.tool, e.message)),
        Reply::Lost(why) | Reply::NotSent(why) => return Evidence::Unknown(format!("{}: {why}", lookup.tool)),
        Reply::Task(_) => return Evidence::Unknown(format!("{} answered with a task", lookup.tool)),
        Reply::InputRequired(_) => return Evidence::Unknown(format!("{} asked for input", lookup.tool)),
    };
    match lookup.evidence(&answer, sent_at) {
        Evidence::Confirmed(receipt) => {
            // Stored as a tool result, so a replay shows it like any other; a tool with an output schema
            // gets it as text only, since the lookup's shape need not match that schema.
            let value: Value = serde_json::from_str(&receipt).unwrap_or(Value::Null);
            let mut result = CallToolResult::success(vec![ContentBlock::text(receipt)]);
            let schema = shared.upstream.tool(tool).and_then(|t| t.output_schema);
            if schema.is_none() {
                result.structured_content = Some(value);
            }
            Evidence::Confirmed(serde_json::to_string(&result).unwrap_or_default())
        }
        other => other,
    }
}

/// How long a read of the upstream's task (`tasks/get`, `tasks/result` of a completed one) may take.
const TASK_READ_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What the upstream's task that ran this attempt says, when the gateway gave up waiting for it while it
/// may still have been running; `None` when there is no such task, or it ended long enough ago that the
/// configured lookup may decide. A task still working is UNKNOWN, never absent: its effect may come at any
/// time before it ends, however long after the dispatch (`tasks/cancel` is only a request). A completed
/// task's result is the outcome. A task that ended otherwise (failed, cancelled, an error result, or gone
/// from the upstream) is treated as a request sent at its end: UNKNOWN until `max_in_flight` after it.
async fn task_evidence(shared: &Shared, tool: &str, provider_key: &str, args: &str) -> Option<Evidence> {
    let of = (tool.to_string(), provider_key.to_string(), args.to_string());
    let run = shared.tasks().get(&of).cloned()?;
    let id = &run.id;
    let ended = |at: u64, how: &str| {
        let until = at.saturating_add(run.max_in_flight_ms);
        Evidence::Unknown(format!(
            "the upstream's task {id} that ran this call {how}; an effect it started may still commit until {} \
             (max_in_flight after its end), so the provider is not read before then",
            reply::utc(until)
        ))
    };
    if let Some(at) = run.ended_at {
        if shared.ledger_now() < at.saturating_add(run.max_in_flight_ms) {
            return Some(ended(at, "has ended"));
        }
        // Its window has passed: from now on the configured lookup alone decides.
        shared.tasks().remove(&of);
        return None;
    }
    let state = shared.upstream.task_state(id, TASK_READ_WAIT).await;
    let now = shared.ledger_now();
    let end = |how: &str| {
        if let Some(run) = shared.tasks().get_mut(&of) {
            run.ended_at = Some(now);
        }
        Some(ended(now, how))
    };
    match state {
        Err(why) => Some(Evidence::Unknown(format!(
            "the upstream's task {id} that ran this call may still be working, and it could not be read: {why}"
        ))),
        Ok(None) => end("is no longer known to the upstream"),
        Ok(Some((status, None))) if matches!(status.as_str(), "failed" | "cancelled") => {
            end(&format!("ended {status}"))
        }
        Ok(Some((status, None))) => Some(Evidence::Unknown(format!(
            "the upstream's task {id} that ran this call is still {status}: its effect may yet happen, so it is \
             not read as absent"
        ))),
        Ok(Some((_, Some(result)))) => match serde_json::from_value::<CallToolResult>(result) {
            Ok(result) if result.is_error != Some(true) => {
                shared.tasks().remove(&of);
                Some(Evidence::Confirmed(serde_json::to_string(&result).unwrap_or_default()))
            }
            Ok(_) => end("completed with an error result"),
            Err(_) => end("completed with a result that is not a tool result"),
        },
    }
}

/// Map the upstream's reply to what the engine records.
fn classify(reply: &Reply, on_tool_error: OnToolError) -> Sent {
    match reply {
        Reply::Result(r) if r.is_error == Some(true) => match on_tool_error {
            OnToolError::Rejected => Sent::Rejected(serde_json::to_string(r).unwrap_or_default()),
            OnToolError::Ambiguous => Sent::Ambiguous(format!(
                "the upstream answered an error result, which may follow a partial effect: {}",
                first_text(r)
            )),
        },
        Reply::Result(r) => Sent::Success(serde_json::to_string(r).unwrap_or_default()),
        Reply::Error(e) if Reply::refused_before_running(e) => {
            Sent::Rejected(serde_json::to_string(e).unwrap_or_default())
        }
        Reply::Error(e) => Sent::Ambiguous(format!("the upstream answered a protocol error: {}", e.message)),
        Reply::Lost(why) => Sent::Ambiguous(why.clone()),
        Reply::Task(_) => Sent::Ambiguous(
            "the upstream answered with a task instead of the call's result, so the call may still be running"
                .to_string(),
        ),
        Reply::NotSent(_) => Sent::NotSent,
        // The upstream answered, and did nothing: a definite rejection of this attempt, which ends the call
        // (the client answers the question in a call of its own) and leaves the next one to it ([`crate::rounds`]).
        Reply::InputRequired(asked) => Sent::Rejected(serde_json::to_string(asked).unwrap_or_default()),
    }
}

/// What sends the engine's grants to the upstream, for [`Once::call_async`]: [`dispatch`] with the call's
/// capture (the client's link, and what the upstream answered).
pub struct Sender<'a> {
    /// The gateway's shared state.
    pub shared: &'a Shared,
    /// The engine.
    pub once: &'a Once,
    /// What the call's dispatches answered, for its reply.
    pub capture: &'a mut Capture,
}

impl Dispatcher for Sender<'_> {
    fn dispatch(&mut self, d: &Dispatch<'_>) -> impl Future<Output = Sent> + Send {
        dispatch(self.shared, self.once, d, self.capture)
    }

    async fn read(&mut self, r: &Reading) -> Option<Evidence> {
        Some(read_upstream(self.shared, r).await)
    }

    /// The engine's loop stopped the dispatch at its deadline before the dispatch said what happened (the
    /// same instant the gateway's own wait ends, [`due_of`]): lost if it was handed to the connection, since
    /// it may have acted;
    /// not sent if it never was (the upstream was still starting, or its connection busy).
    fn stopped(&mut self, d: &Dispatch<'_>) -> Sent {
        let reply = if self.capture.handed.load(Ordering::SeqCst) {
            Reply::Lost(due_of(d).missed())
        } else {
            Reply::NotSent("the engine's deadline came before the upstream could take the call".to_string())
        };
        let tool = self.shared.config.upstream_tool(d.tool);
        answered(d, reply, tool.on_tool_error, self.capture)
    }
}

/// The deadlines of a dispatch as the engine's `d` gives them. A protected dispatch keeps to the engine's,
/// on this host's monotonic clock as the loop took them at the hand-over (read before the ledger's clock,
/// so early, never late): send-by is checked again once the upstream is ready (a connection or a process
/// start may come first), and the answer is waited for until send-by plus the timeout, inside the lease,
/// as every host waits. A direct call is waited for until the engine's loop stops it, its timeout after
/// the hand-over (the send follows at once unless a restart holds the connection), so an answer in hand
/// stops waiting for its progress before the loop's deadline, not the send's.
fn due_of(d: &Dispatch<'_>) -> Due {
    if d.direct {
        Due::Direct {
            answer_by: d.answer_by,
            timeout: d.timeout,
        }
    } else {
        Due::Engine {
            send_before: d.send_before,
            answer_by: d.answer_by,
            timeout: d.timeout,
        }
    }
}

/// Send one granted attempt (or a direct call) to the upstream, as the engine's `d` says.
pub async fn dispatch(shared: &Shared, once: &Once, d: &Dispatch<'_>, capture: &mut Capture) -> Sent {
    let tool = shared.config.upstream_tool(d.tool);
    let arguments: JsonObject = match serde_json::from_str(d.args) {
        Ok(Value::Object(map)) => map,
        _ => JsonObject::new(),
    };
    let mut params = CallToolRequestParams::new(d.tool.to_string()).with_arguments(arguments);
    if let ProviderKey::Meta(field) = &tool.provider_key
        && !d.direct
    {
        params.meta = Some(reply::meta_of(field, d.provider_key).into());
    }
    // The client's cancellation concerns the attempt it was waiting on: a dispatch the engine grants
    // later in the same call (an owed one) is the engine's, sent like the worker's.
    let mut link = if capture.sent {
        Link::default()
    } else {
        // So are the client's answers to a question of an earlier round: this is that attempt, and so is
        // the attempt re-granted after one that never left (kept until one is sent: `capture.sent`).
        if let Some(answers) = capture.answers.clone() {
            answers.apply(&mut params);
        }
        capture.link.clone()
    };
    // A protected dispatch is the engine's request, the same whoever sends it (the worker has no client), in
    // the upstream's newest revision: never the client's `_meta`; only its progress and cancellation follow
    // it, and its 2026-07-28 envelope, so that the upstream may ask the client it would act for
    // (`crate::rounds`; the worker's carry the gateway's). A direct call is the client's: its `_meta`,
    // envelope and revision.
    if !d.direct {
        link.meta = link.meta.as_ref().and_then(crate::upstream::envelope_of);
        link.own = true;
    }
    capture.handed = Arc::new(AtomicBool::new(false));
    link.handed = Some(capture.handed.clone());
    let due = due_of(d);
    let reply = if link.ct.is_cancelled() {
        Reply::NotSent("the client cancelled the call before it was sent".to_string())
    } else if !d.direct || capture.runs_tasks {
        let of = (d.tool.to_string(), d.provider_key.to_string(), d.args.to_string());
        // Remembered for this attempt's reconciliation from the moment the task exists: it may act long
        // after the lease ends, and the lease may end (and a read come) before this wait is over.
        let created = |id: &str| {
            if !d.direct {
                let max_in_flight_ms = once.policy(d.tool).max_in_flight_ms;
                let run = TaskRun {
                    id: id.to_string(),
                    max_in_flight_ms,
                    ended_at: None,
                };
                shared.tasks().insert(of.clone(), run);
            }
        };
        let reply = shared.upstream.run_to_end(params, due, &link, created).await;
        // Answered: the task (if any) ended with this answer, and has nothing more to say.
        if !d.direct && matches!(reply, Reply::Result(_) | Reply::Error(_)) {
            shared.tasks().remove(&of);
        }
        reply
    } else {
        shared.upstream.call(params, due, &link).await
    };
    answered(d, reply, tool.on_tool_error, capture)
}

/// What the upstream's `reply` to `d` means for the engine, kept in the call's capture and logged.
fn answered(d: &Dispatch<'_>, reply: Reply, on_tool_error: OnToolError, capture: &mut Capture) -> Sent {
    if !d.direct {
        capture.key = Some(d.key.to_string());
    }
    let sent = classify(&reply, on_tool_error);
    capture.sent |= sent != Sent::NotSent;
    // Why an attempt went unanswered or never left: what an operator needs to tell the two apart.
    let why = match &reply {
        Reply::Lost(why) | Reply::NotSent(why) => why.as_str(),
        Reply::InputRequired(_) => "the upstream asked for input first, and did nothing",
        _ => "",
    };
    tracing::info!(target: "once::gateway", tool = d.tool, key = d.key, attempt = d.attempt, sent = sent_name(&sent), why, "dispatched");
    capture.last = Some(reply);
    sent
}

fn sent_name(sent: &Sent) -> &'static str {
    match sent {
        Sent::Success(_) => "success",
        Sent::Rejected(_) => "rejected",
        Sent::Ambiguous(_) => "ambiguous",
        Sent::NotSent => "not-sent",
    }
}

/// How a call ended, for logs.
pub fn called_name(called: &Called) -> &'static str {
    match called {
        Called::Done(account) => account.ending.name(),
        Called::Unreported { .. } => "unreported",
        Called::Direct(_) => "direct",
    }
}

/// The gateway's MCP server.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
    once: Arc<Once>,
    session_scope: String,
    instructions: String,
    over_http: bool,
}

impl Gateway {
    /// A server for one client connection.
    pub fn new(shared: Arc<Shared>, once: Arc<Once>, session_scope: String, instructions: String) -> Gateway {
        Gateway {
            shared,
            once,
            session_scope,
            instructions,
            over_http: false,
        }
    }

    /// The same server for every HTTP request: many clients share the one upstream.
    pub fn over_http(mut self) -> Gateway {
        self.over_http = true;
        self
    }

    /// Whether this server answers HTTP requests (many clients) rather than one stdio client.
    pub(crate) fn is_over_http(&self) -> bool {
        self.over_http
    }

    /// The state shared with the provider lookup and the worker (the upstream among it).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The instructions once adds to the upstream's.
    pub(crate) fn instructions(&self) -> &str {
        &self.instructions
    }

    /// Whether the engine sends `tool` DIRECT now (its route, not blocked). Blocking: the engine decides.
    pub(crate) fn routes_direct(&self, tool: &str) -> bool {
        if self.shared.keep_configured(&self.once, tool).is_err() {
            return false;
        }
        let plan = self.once.plan(tool);
        plan.route == Route::Direct && plan.blocked.is_none()
    }

    /// [`Shared::seal`], read from the ledger on the blocking pool the first time.
    async fn seal(&self) -> Result<&crate::rounds::Seal, String> {
        if let Some(seal) = self.shared.seal.get() {
            return Ok(seal);
        }
        let (shared, once) = (self.shared.clone(), self.once.clone());
        off_loop(move || shared.seal(&once).map(|_| ())).await??;
        self.shared.seal(&self.once)
    }

    /// [`Shared::admit_scope`], whose first ledger write for a scope is made on the blocking pool.
    async fn admit_scope(&self, scope: &str) -> Result<(), String> {
        if self.shared.admitted(scope) {
            return Ok(());
        }
        let (shared, once, scope) = (self.shared.clone(), self.once.clone(), scope.to_string());
        off_loop(move || shared.admit_scope(&once, &scope)).await?
    }

    /// [`Shared::keep_configured`], configuring the engine on the blocking pool when it must.
    async fn keep_configured(&self, tool: &str) -> Result<(), OnceError> {
        if self.shared.is_configured(tool) {
            return Ok(());
        }
        let (shared, once, tool) = (self.shared.clone(), self.once.clone(), tool.to_string());
        off_loop(move || shared.keep_configured(&once, &tool))
            .await
            .map_err(OnceError::Component)?
    }

    /// A client that cancelled a protected call gets no answer to it; if it still reads log messages,
    /// it is told what once's record says (never "rejected" for a call that was sent: it may have acted).
    async fn tell_cancelled(&self, result: &CallToolResult) {
        let logging = self
            .shared
            .upstream
            .info()
            .is_some_and(|i| i.capabilities.logging.is_some());
        if !logging {
            return;
        }
        let text = result
            .content
            .first()
            .and_then(|c| c.as_text())
            .map_or("", |t| t.text.as_str());
        let outcome = result.meta.as_ref().and_then(|m| m.get(reply::OUTCOME_META)).cloned();
        let data = serde_json::json!({ "text": format!("cancelled by the client: {text}"), "once/outcome": outcome });
        #[allow(deprecated)] // logging is deprecated by a newer protocol revision; this client's uses it
        let notification = ServerNotification::LoggingMessageNotification(Notification::new(
            LoggingMessageNotificationParam::new(LoggingLevel::Warning, data).with_logger("once"),
        ));
        self.shared.upstream.relay().tell(notification).await;
    }

    /// The call's scope, or why the call is refused (a scope from `_meta` that is missing). A tenant from
    /// the HTTP request is the scope; the config then sets none (`crate::access` refuses both).
    fn scope_of(&self, meta: &JsonObject, tenant: Option<String>) -> Result<String, String> {
        if let Some(tenant) = tenant {
            return Ok(tenant);
        }
        if self.over_http && self.shared.config.http.tenancy != crate::access::Tenancy::Open {
            return Err("this gateway takes each call's scope from its credentials, and this call has none".into());
        }
        match &self.shared.config.scope {
            ScopeMode::Session => Ok(self.session_scope.clone()),
            ScopeMode::Fixed(name) => Ok(name.clone()),
            ScopeMode::Meta(field) => meta
                .get(field)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .ok_or_else(|| {
                    format!("this gateway takes each call's scope from _meta \"{field}\", and this call has none")
                }),
        }
    }

    /// One `tools/call`, on the engine's async loop ([`Once::call_async`]: its steps, and the ledger's
    /// I/O, on the blocking pool). When the upstream asks the client something first (`crate::rounds`), a
    /// client on 2026-07-28 gets the question; one on an older revision is asked by the gateway over stdio,
    /// and its answers go in a round of the gateway's.
    pub(crate) async fn call(
        &self,
        mut request: CallToolRequestParams,
        meta: JsonObject,
        link: Link,
        tenant: Option<String>,
    ) -> Result<CallToolResponse, ErrorData> {
        let revision = link
            .meta
            .as_ref()
            .and_then(rmcp::model::RequestMetaObject::protocol_version);
        let stateless = crate::shaped::is_stateless_revision(revision.as_ref());
        let tool = request.name.to_string();
        let call = self.round_identity(&request, &meta, tenant.as_deref());
        // A client's answers must answer a question relayed for this very call: refused before anything else.
        let mut answers = crate::rounds::Answers::take(&mut request);
        if let Some(given) = answers.take() {
            let seal = self.seal().await.map_err(|e| ErrorData::internal_error(e, None))?;
            match seal.open(&call, given.request_state()) {
                Ok(state) => answers = Some(given.with_state(state)),
                Err(why) => {
                    return Err(ErrorData::invalid_params(
                        format!("this call's answers to {tool}'s question are refused, and nothing was sent: {why}"),
                        None,
                    ));
                }
            }
        }
        for _ in 0..crate::rounds::MAX_ROUNDS {
            let answered = self
                .call_round(
                    request.clone(),
                    answers.take(),
                    meta.clone(),
                    link.clone(),
                    tenant.clone(),
                )
                .await?;
            let CallToolResponse::InputRequired(mut asked) = answered else {
                return Ok(answered);
            };
            if stateless {
                let seal = self.seal().await.map_err(|e| ErrorData::internal_error(e, None))?;
                asked.request_state = Some(seal.seal(&call, asked.request_state.as_deref()));
                return Ok(CallToolResponse::InputRequired(asked));
            }
            let Some(client) = link.client.as_ref().filter(|_| !self.over_http) else {
                let why = "a request from the gateway has no way to a client over HTTP";
                return Ok(reply::input_not_carried(&tool, why).into());
            };
            // Asked and answered here: the state never left the gateway, so it needs no seal.
            match crate::rounds::ask(client, &asked, &link.ct).await {
                Ok(given) => answers = Some(given),
                Err(why) => return Ok(reply::input_not_carried(&tool, &why).into()),
            }
        }
        let why = format!("it asked again after {} answered rounds", crate::rounds::MAX_ROUNDS);
        Ok(reply::input_not_carried(&tool, &why).into())
    }

    /// What a sealed `requestState` binds an answer to: the call's tool, arguments, the fields of its `_meta`
    /// that name its operation and scope, and its tenant or session (`crate::rounds::Seal`).
    fn round_identity(&self, request: &CallToolRequestParams, meta: &JsonObject, tenant: Option<&str>) -> String {
        let config = &self.shared.config;
        let scope_field = match &config.scope {
            ScopeMode::Meta(field) => Some(field.as_str()),
            _ => None,
        };
        let named: BTreeMap<&str, &Value> = config
            .key_meta
            .iter()
            .map(String::as_str)
            .chain([SUPERSEDES_META])
            .chain(scope_field)
            .filter_map(|field| meta.get(field).map(|v| (field, v)))
            .collect();
        serde_json::json!([tenant, request.name, request.arguments, named, self.session_scope]).to_string()
    }

    /// One round of a `tools/call`: the engine's call, and what the upstream answered its dispatch; `answers`
    /// (opened, or asked by the gateway) go with the attempt the client waits on.
    async fn call_round(
        &self,
        request: CallToolRequestParams,
        answers: Option<crate::rounds::Answers>,
        meta: JsonObject,
        link: Link,
        tenant: Option<String>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (shared, once) = (&*self.shared, &*self.once);
        let started = Instant::now();
        let tool = request.name.to_string();
        let (mut meta, mut link) = (meta, link);
        if self.over_http {
            // Only the stdio layer (`crate::wire`) writes these, and only where the gateway declared tasks.
            for field in [crate::wire::TASK_META, crate::wire::OWN_TASK_META] {
                meta.remove(field);
                if let Some(m) = link.meta.as_mut() {
                    m.remove(field);
                }
            }
        }
        let key_meta = shared.config.key_meta.first().map_or("once/key", String::as_str);
        let (scope, refused) = match self.scope_of(&meta, tenant) {
            Ok(scope) => (scope, None),
            Err(why) => (String::new(), Some(why)),
        };
        let mut cx = Context {
            tool: &tool,
            scope: &scope,
            lookup: shared
                .config
                .upstream_tool(&tool)
                .lookup
                .as_ref()
                .map(|l| l.tool.as_str()),
            key_meta,
            keyed: false,
            effect_fields: None,
            output_schema: false,
            capture: Capture::default(),
        };
        if let Some(why) = refused {
            return Ok(reply::engine_error(&OnceError::Component(why), &cx).into());
        }
        if let Err(why) = self.admit_scope(&scope).await {
            return Ok(reply::engine_error(&OnceError::Component(why), &cx).into());
        }
        // Up before the claim: the lease then covers only claim to send, never a restart.
        if let Err(e) = shared.upstream.ready().await {
            let e = OnceError::Component(format!("the upstream is not available: {e}"));
            return Ok(reply::engine_error(&e, &cx).into());
        }
        if let Err(e) = self.keep_configured(&tool).await {
            let e = OnceError::Component(shared.config.refused(&e));
            return Ok(reply::engine_error(&e, &cx).into());
        }
        cx.output_schema = shared.upstream.tool(&tool).is_some_and(|t| t.output_schema.is_some());
        // A task is the upstream's to run; once's record must be the call's own outcome, so only a DIRECT
        // tool is called as one. Refused before the engine: nothing is claimed, recorded or sent.
        if meta.contains_key(crate::wire::TASK_META) {
            let plan = once.plan(&tool);
            if plan.route != Route::Direct || plan.blocked.is_some() {
                tracing::info!(target: "once::gateway", scope, key = "-", tool, outcome = "task-refused", latency_ms = started.elapsed().as_millis() as u64, "call");
                return Err(crate::tasks::refused(&tool, plan.route, plan.blocked.as_deref()));
            }
        }
        let mut keys = Vec::new();
        for field in &shared.config.key_meta {
            match meta.get(field) {
                None => {}
                Some(Value::String(k)) => keys.push((format!("_meta {field}"), k.clone())),
                Some(other) => {
                    let e = OnceError::Component(format!("_meta {field} must be a string, not {other}"));
                    return Ok(reply::engine_error(&e, &cx).into());
                }
            }
        }
        cx.keyed = !keys.is_empty();
        if !cx.keyed {
            cx.effect_fields = once.policy(&tool).effect_fields;
        }
        let call = Call {
            scope: scope.clone(),
            keys,
            tool: tool.clone(),
            args: Value::Object(request.arguments.unwrap_or_default()).to_string(),
            supersedes: meta.get(SUPERSEDES_META).and_then(Value::as_str).map(str::to_string),
            acknowledge_confirmed: meta.get(ACKNOWLEDGE_META).and_then(Value::as_bool).unwrap_or(false),
        };
        // once's own `_meta` fields are for once, not for the upstream.
        if let Some(m) = link.meta.as_mut() {
            for field in shared
                .config
                .key_meta
                .iter()
                .map(String::as_str)
                .chain([SUPERSEDES_META, ACKNOWLEDGE_META])
            {
                m.remove(field);
            }
            if let ScopeMode::Meta(field) = &shared.config.scope {
                m.remove(field);
            }
        }
        link.meta = link.meta.filter(|m| !m.is_empty());
        let mut capture = Capture {
            link,
            runs_tasks: self.over_http,
            answers,
            ..Capture::default()
        };
        // A client that hung up stops its call at the next wait (after a not-sent attempt, the back-off):
        // the key keeps its other attempts for the client's retry.
        let cancelled = capture.link.ct.clone();
        let mut sender = Sender {
            shared,
            once,
            capture: &mut capture,
        };
        let called = self
            .once
            .call_async_while(&call, &|| !cancelled.is_cancelled(), &mut sender)
            .await;
        cx.capture = capture;
        match called {
            Ok(called) => {
                shared.track_unsettled(&scope, &called, &cx.capture);
                shared.count_blocked(&called);
                let key = match &called {
                    Called::Done(account) => account.key.clone(),
                    _ => cx.capture.key.clone(),
                };
                tracing::info!(
                    target: "once::gateway",
                    scope,
                    key = key.as_deref().unwrap_or("-"),
                    tool,
                    outcome = called_name(&called),
                    latency_ms = started.elapsed().as_millis() as u64,
                    "call"
                );
                // The upstream asked the client something before it would run the call: the question is the
                // answer, as the upstream wrote it, once the ledger says so too (a direct call's, or an attempt
                // recorded rejected: never past a record that says otherwise); the client calls again with its
                // answers (`crate::rounds`).
                let recorded = match &called {
                    Called::Direct(_) => true,
                    Called::Done(account) => matches!(account.ending, Ending::Rejected(_)),
                    Called::Unreported { .. } => false,
                };
                if let Some(Reply::InputRequired(asked)) = &cx.capture.last
                    && recorded
                {
                    return Ok(CallToolResponse::InputRequired(asked.clone()));
                }
                let rendered = reply::render(called, &cx);
                if cx.capture.link.ct.is_cancelled()
                    && let Ok(result) = &rendered
                {
                    self.tell_cancelled(result).await;
                }
                rendered.map(CallToolResponse::from)
            }
            Err(e) => {
                // Sent, then the engine failed: the record expires into unknown and is ours to settle.
                if cx.capture.sent
                    && let Some(key) = &cx.capture.key
                {
                    shared.track(&scope, key);
                }
                tracing::info!(
                    target: "once::gateway",
                    scope,
                    key = cx.capture.key.as_deref().unwrap_or("-"),
                    tool,
                    outcome = "engine-error",
                    latency_ms = started.elapsed().as_millis() as u64,
                    "call: {e}"
                );
                Ok(reply::engine_error(&e, &cx).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use once::ManualClock;
    use std::path::{Path, PathBuf};
    use std::time::SystemTime;

    /// `refund-mcp` beside this test binary (built by the workspace's tests; built here if missing).
    fn refund_mcp() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        let path = dir.join("refund-mcp");
        if !path.exists() {
            let release = dir.file_name().is_some_and(|d| d == "release");
            let built = std::process::Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-p", "once-refund-example", "--bin", "refund-mcp"])
                .args(release.then_some("--release"))
                .status()
                .unwrap();
            assert!(built.success());
        }
        path
    }

    /// A gateway's shared state over `refund-mcp` (its effects in `dir`), with `refund_order` protected and
    /// read by `find_refund_by_key`, on a runtime of its own.
    fn started(dir: &Path) -> (tokio::runtime::Runtime, Arc<Shared>) {
        started_with(dir, &[], "")
    }

    /// [`started`], with more arguments for `refund-mcp` and more settings for `refund_order`.
    fn started_with(dir: &Path, flags: &[&str], settings: &str) -> (tokio::runtime::Runtime, Arc<Shared>) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut command = vec![
            refund_mcp().display().to_string(),
            "--db".to_string(),
            dir.join("effects.db").display().to_string(),
        ];
        command.extend(flags.iter().map(|f| f.to_string()));
        let relay = Arc::new(crate::relay::Relay::default());
        let upstream = runtime
            .block_on(Upstream::start(crate::upstream::Target::Command(command), relay))
            .unwrap();
        let config = Config::parse(
            &format!(
                r#"
                [tools.refund_order]
                provider_key = "argument:idempotency_key"
                lookup = {{ tool = "find_refund_by_key", args = {{ idempotency_key = "{{key}}" }}, found = "/found", read_position = "sent" }}
                {settings}
                "#
            ),
            "test.toml",
        )
        .unwrap();
        let shared = Arc::new(Shared::new(config, upstream));
        (runtime, shared)
    }

    /// A `read` step for `tool`'s effect under `provider_key`.
    fn reading(tool: &str, provider_key: &str, args: &str) -> Reading {
        Reading {
            scope: "s".into(),
            key: "k".into(),
            tool: tool.into(),
            provider_key: provider_key.into(),
            args: args.into(),
            asked_at: 0,
        }
    }

    /// Attempt 1 of a 5.00 refund of order 1234 (operation t1/k-1), with the loop's deadlines given.
    fn refund_grant(
        send_before: Option<std::time::Instant>,
        answer_by: Option<std::time::Instant>,
    ) -> Dispatch<'static> {
        Dispatch {
            direct: false,
            scope: "t1",
            key: "k-1",
            tool: "refund_order",
            attempt: 1,
            provider_key: "once-k-1",
            args: r#"{"order_id":1234,"amount":5,"idempotency_key":"once-k-1"}"#,
            send_by: u64::MAX,
            send_before,
            timeout: std::time::Duration::from_secs(30),
            answer_by,
        }
    }

    /// A linearizable lookup's read position ("sent") is stamped on the ledger's clock,
    /// which is what the engine compares it with, never the gateway host's wall clock.
    #[test]
    fn a_sent_read_position_is_on_the_ledger_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, shared) = started(dir.path());
        // A ledger clock a day behind this host's.
        let behind = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            - 86_400_000;
        shared.set_ledger_clock(Arc::new(ManualClock::new(behind)));
        let evidence = runtime.block_on(read_upstream(
            &shared,
            &reading("refund_order", "once-nothing", r#"{"order_id":1234}"#),
        ));
        assert_eq!(evidence, Evidence::Absent(behind));
        runtime.block_on(shared.upstream.shutdown());
    }

    /// The engine's loop stops a dispatch at its deadline wherever it is. Stopped before the request was
    /// handed to the upstream's connection (waiting for the upstream), nothing left: not sent, and the call
    /// counts nothing as sent. Stopped after, the request may have acted: lost (ambiguous), never failed.
    /// The flag is set by the send itself, and only when a send happens.
    #[test]
    fn a_dispatch_stopped_at_its_deadline_is_not_sent_until_handed_to_the_connection_and_lost_after() {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, shared) = started(dir.path());
        let once = Once::builder(once::storage::memory::MemoryStorage::new())
            .build()
            .unwrap();
        let now = std::time::Instant::now();
        let d = refund_grant(
            Some(now + std::time::Duration::from_secs(30)),
            Some(now + std::time::Duration::from_secs(60)),
        );
        let stopped = |handed: bool| {
            let mut capture = Capture::default();
            capture.handed.store(handed, Ordering::SeqCst);
            let mut sender = Sender {
                shared: &shared,
                once: &once,
                capture: &mut capture,
            };
            let sent = sender.stopped(&d);
            (sent, capture.sent, capture.key)
        };
        assert_eq!(stopped(false), (Sent::NotSent, false, Some("k-1".to_string())));
        let (lost, sent, _) = stopped(true);
        assert!(
            matches!(lost, Sent::Ambiguous(ref why) if why.contains("engine's deadline")),
            "{lost:?}"
        );
        assert!(sent, "a request handed to the connection counts as sent");
        // A client that cancelled first: nothing is handed over. A send: handed over, and answered.
        let mut capture = Capture::default();
        capture.link.ct.cancel();
        let sent = runtime.block_on(dispatch(&shared, &once, &d, &mut capture));
        assert_eq!(sent, Sent::NotSent);
        assert!(!capture.handed.load(Ordering::SeqCst));
        let mut capture = Capture::default();
        let sent = runtime.block_on(dispatch(&shared, &once, &d, &mut capture));
        assert!(matches!(sent, Sent::Success(_)), "{sent:?}");
        assert!(capture.handed.load(Ordering::SeqCst));
        runtime.block_on(shared.upstream.shutdown());
    }

    /// A tool routed by the upstream's annotations follows its new definition; one that stops being
    /// protected (the upstream re-lists it read-only) is said in the log, which nothing else would show.
    #[test]
    fn a_protected_tool_that_the_upstream_turns_read_only_is_said() {
        #[derive(Clone, Default)]
        struct Log(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Log {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let (runtime, shared) = started(dir.path());
        let builder = Once::builder(once::storage::memory::MemoryStorage::new());
        let once = shared
            .config
            .apply(builder, &shared.descriptors(), Some(&shared.account))
            .build()
            .unwrap();
        shared.configured_with(&shared.descriptors());
        assert_eq!(once.plan("refund_order").route, Route::Protect);
        let mut tools = shared.upstream.tools();
        for tool in tools.iter_mut().filter(|t| t.name == "refund_order") {
            tool.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(true));
        }
        shared.upstream.relay().set_tools(tools);
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            shared.keep_configured(&once, "refund_order").unwrap();
            // Unchanged since: nothing more is said.
            shared.keep_configured(&once, "refund_order").unwrap();
        });
        assert_eq!(once.plan("refund_order").route, Route::Direct);
        let said = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert_eq!(said.matches("routes it DIRECT (it was protected)").count(), 1, "{said}");
        runtime.block_on(shared.upstream.shutdown());
    }

    /// Once shut down, the upstream is never started again: a settle round or a call still running then
    /// gets no process (which nothing would stop), and a dispatch it makes is not sent, never lost.
    #[test]
    fn a_shut_down_upstream_is_never_started_again() {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, shared) = started(dir.path());
        let once = Once::builder(once::storage::memory::MemoryStorage::new())
            .build()
            .unwrap();
        runtime.block_on(shared.upstream.shutdown());
        let ready = runtime.block_on(shared.upstream.ready());
        assert!(
            ready.as_ref().is_err_and(|why| why.contains("shutting down")),
            "{ready:?}"
        );
        let d = refund_grant(None, None);
        let mut capture = Capture::default();
        let sent = runtime.block_on(dispatch(&shared, &once, &d, &mut capture));
        assert_eq!(sent, Sent::NotSent);
        assert!(!capture.sent && !capture.handed.load(Ordering::SeqCst));
        let evidence = runtime.block_on(read_upstream(&shared, &reading("refund_order", "once-k-1", d.args)));
        assert!(
            matches!(evidence, Evidence::Unknown(ref why) if why.contains("shutting down")),
            "{evidence:?}"
        );
    }

    /// A DIRECT call is stopped by the engine's loop a timeout after the hand-over, before the gateway's own
    /// wait (a timeout from the send) ends: sent, it is ambiguous, never "not sent", since its answer may
    /// yet come. The first refund's reply comes 1.5 s late; the tool is DIRECT with a 300 ms timeout.
    #[test]
    fn a_direct_call_stopped_after_its_send_is_ambiguous_never_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (runtime, shared) = started_with(
            dir.path(),
            &["--fault", "late_reply", "--late-reply-ms", "1500"],
            r#"route = "direct"
                timeout = "300ms""#,
        );
        let builder = Once::builder(once::storage::memory::MemoryStorage::new());
        let once = Arc::new(
            shared
                .config
                .apply(builder, &shared.descriptors(), Some(&shared.account))
                .build()
                .unwrap(),
        );
        let call = Once::call_of("t1", None, "refund_order", r#"{"order_id":1234,"amount":5}"#);
        let mut capture = Capture::default();
        let called = runtime.block_on(once.call_async(
            &call,
            &mut Sender {
                shared: &shared,
                once: &once,
                capture: &mut capture,
            },
        ));
        assert!(
            matches!(called, Ok(Called::Direct(Sent::Ambiguous(ref why))) if why.contains("300 ms")),
            "{called:?}"
        );
        assert!(capture.sent && capture.handed.load(Ordering::SeqCst));
        // And the upstream is told to stop (refund-mcp logs each `notifications/cancelled` beside its ledger).
        let log = dir.path().join("effects.db.cancelled");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let told = loop {
            let told = std::fs::read_to_string(&log).unwrap_or_default();
            if !told.is_empty() || std::time::Instant::now() > until {
                break told;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let lines: Vec<&str> = told.lines().collect();
        assert_eq!(lines.len(), 1, "one cancellation, of the one call sent: {told:?}");
        assert!(!lines[0].starts_with("-\t"), "it names the request: {told:?}");
        runtime.block_on(shared.upstream.shutdown());
    }
}
