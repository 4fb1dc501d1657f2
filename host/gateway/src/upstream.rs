//! The upstream MCP server: a child process spoken to over stdio with rmcp,
//! or a server at a URL spoken to over Streamable HTTP ([`crate::remote`]),
//! restarted (reconnected: a new session) when it dies (a disconnect or crash
//! mid-call must not leave the gateway unable to reconcile or to send an owed
//! dispatch), and restarted once when the client connects, so that the
//! upstream sees the client's capabilities (sampling, elicitation, roots) as
//! its own client's.

use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientNotification, ClientRequest,
    ErrorCode, ErrorData, Implementation, ProgressToken, Request, RequestMetaObject, ServerPeerInfo, ServerResult,
    Tool,
};
use rmcp::service::{Peer, PeerRequestOptions, RunningService};
use rmcp::{RoleClient, RoleServer, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::relay::{self, Relay, RelayHandler};
use crate::remote::{self, UpstreamUrl};
use crate::wire::upstream::{Answer, UpstreamWire};

/// How long the gateway waits for an upstream to acknowledge `tasks/cancel` of a task it gave up on.
const TASK_CANCEL_WAIT: Duration = Duration::from_secs(2);
/// How long starting the upstream (spawn + initialize + tools/list) may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The first pause before restarting an upstream that died; it doubles up to `MAX_RESTART_PAUSE`.
const MIN_RESTART_PAUSE: Duration = Duration::from_millis(50);
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(5);

/// What one upstream call came to, before anyone classifies it.
#[derive(Debug)]
pub enum Reply {
    /// The server answered with a tool result (possibly `isError`).
    Result(CallToolResult),
    /// The server answered with a task handle (a `CreateTaskResult`, carried as this result's `_meta` by
    /// [`crate::wire`]): the call goes on as a task, and its outcome is the task's.
    Task(CallToolResult),
    /// The server answered with a JSON-RPC error.
    Error(ErrorData),
    /// No answer: timeout, disconnect, crash. The request may have been acted on.
    Lost(String),
    /// The request never left: the upstream could not be started, or the send deadline passed.
    NotSent(String),
}

impl Reply {
    /// Whether the server refused the request before running anything, by JSON-RPC's own codes.
    pub fn refused_before_running(e: &ErrorData) -> bool {
        [
            ErrorCode::PARSE_ERROR,
            ErrorCode::INVALID_REQUEST,
            ErrorCode::METHOD_NOT_FOUND,
            ErrorCode::INVALID_PARAMS,
        ]
        .contains(&e.code)
    }
}

struct Conn {
    service: RunningService<RoleClient, RelayHandler>,
    generation: u64,
    /// The capabilities this connection declared to the upstream.
    capabilities: ClientCapabilities,
    /// A command upstream's process (killed if dropped).
    child: Option<Child>,
    /// A command upstream's raw layer: what rmcp cannot carry ([`crate::wire`]).
    wire: Option<Arc<UpstreamWire>>,
}

impl Conn {
    /// Close the connection; a process that has not exited `grace` after its stdin closed is killed.
    async fn close(mut self, grace: Duration) {
        let _ = self.service.close_with_timeout(grace).await;
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(grace, child.wait()).await.is_err()
        {
            let _ = child.kill().await;
        }
    }
}

struct Restarts {
    last: Option<Instant>,
    pause: Duration,
}

/// What a client's request brings along to the upstream: the progress token it
/// asked progress under, its other `_meta`, and its cancellation.
#[derive(Debug, Clone, Default)]
pub struct Link {
    /// The client's progress token, if it asked for progress.
    pub progress: Option<ProgressToken>,
    /// The client's `_meta` besides the progress token, passed on.
    pub meta: Option<RequestMetaObject>,
    /// Fires when the client cancels its request.
    pub ct: CancellationToken,
    /// The client connection the request came on: its progress goes there, and to no other client.
    pub client: Option<Peer<RoleServer>>,
}

impl Link {
    /// The link of a client request with this `_meta` and cancellation token.
    pub fn of(mut meta: RequestMetaObject, ct: CancellationToken) -> Link {
        let progress = meta.get_progress_token();
        meta.remove("progressToken");
        Link {
            progress,
            meta: (!meta.is_empty()).then_some(meta),
            ct,
            client: None,
        }
    }
}

/// Where the upstream server is.
#[derive(Debug, Clone)]
pub enum Target {
    /// A command the gateway starts and speaks to over its stdio.
    Command(Vec<String>),
    /// A server the gateway connects to over Streamable HTTP.
    Url(UpstreamUrl),
}

/// A supervised upstream server.
pub struct Upstream {
    target: Target,
    conn: Mutex<Option<Conn>>,
    generations: std::sync::atomic::AtomicU64,
    restarts: Mutex<Restarts>,
    /// The client link every connection relays to (and the tool list it keeps).
    relay: Arc<Relay>,
    /// What the gateway declares to the upstream: its client's capabilities once it has one.
    wanted: RwLock<ClientConfig>,
    /// What the upstream said of itself when it was last started.
    info: RwLock<Option<ServerPeerInfo>>,
    /// The `capabilities.tasks` it declared then, as it wrote them (a command upstream's only: [`crate::wire`]).
    tasks: RwLock<Option<Value>>,
}

fn client_config(capabilities: ClientCapabilities) -> ClientConfig {
    ClientConfig::new(
        capabilities,
        Implementation::new("once-gateway", env!("CARGO_PKG_VERSION")),
    )
}

impl Upstream {
    /// Start (or connect to) `target` and read its tools; a failure here is a failure at start.
    pub async fn start(target: Target, relay: Arc<Relay>) -> Result<Upstream, String> {
        let upstream = Upstream {
            target,
            conn: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
            restarts: Mutex::new(Restarts {
                last: None,
                pause: MIN_RESTART_PAUSE,
            }),
            relay,
            wanted: RwLock::new(client_config(ClientCapabilities::default())),
            info: RwLock::new(None),
            tasks: RwLock::new(None),
        };
        upstream.peer().await?;
        Ok(upstream)
    }

    /// The upstream in messages and logs: the program and its argument count, or the URL without
    /// credentials or query ([`crate::identity::shown`]).
    pub fn shown(&self) -> String {
        crate::identity::shown(&self.target)
    }

    /// Where the upstream is.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The link to the client that this upstream's notifications and requests are relayed to.
    pub fn relay(&self) -> &Arc<Relay> {
        &self.relay
    }

    /// The tools as last listed.
    pub fn tools(&self) -> Vec<Tool> {
        self.relay.tools()
    }

    /// One tool's definition as last listed.
    pub fn tool(&self, name: &str) -> Option<Tool> {
        self.relay.tools().into_iter().find(|t| t.name == name)
    }

    /// What the upstream declared when it was last started: capabilities, instructions.
    pub fn info(&self) -> Option<ServerPeerInfo> {
        self.info.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The tasks the gateway declares to its client: the part of the upstream's it honours
    /// ([`crate::tasks`]); none for a URL upstream, which has no raw layer to carry them.
    pub fn declared_tasks(&self) -> Option<Value> {
        let tasks = self.tasks.read().unwrap_or_else(|p| p.into_inner());
        tasks.as_ref().and_then(crate::tasks::honoured)
    }

    /// Whether the gateway can run a `tools/call` as a task on this upstream and wait for its result.
    pub fn runs_tasks(&self) -> bool {
        crate::tasks::runs_calls_as_tasks(self.tasks.read().unwrap_or_else(|p| p.into_inner()).as_ref())
    }

    /// Declare these client capabilities to the upstream from its next connection on
    /// (the next request starts one when they differ from the current connection's),
    /// except the tasks extension: an upstream may then answer a call with a task, and a
    /// protected call's outcome must be the call's own answer.
    pub fn declare(&self, mut capabilities: ClientCapabilities) {
        if let Some(extensions) = capabilities.extensions.as_mut() {
            extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
        }
        *self.wanted.write().unwrap_or_else(|p| p.into_inner()) = client_config(capabilities);
    }

    /// An error's text as it may be shown: a URL upstream's credentials and query never are.
    fn redact(&self, message: String) -> String {
        match &self.target {
            Target::Command(_) => message,
            Target::Url(url) => url.redact(message),
        }
    }

    fn wanted(&self) -> ClientConfig {
        self.wanted.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A live connection and its generation, starting (or restarting) the process when there is none,
    /// or when the one there declared other client capabilities than the client now has.
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64), String> {
        let mut conn = self.conn.lock().await;
        let wanted = self.wanted();
        if let Some(c) = conn.as_ref()
            && !c.service.is_transport_closed()
            && c.capabilities == wanted.capabilities
        {
            return Ok((c.service.peer().clone(), c.generation));
        }
        if let Some(old) = conn.take() {
            old.close(Duration::from_secs(1)).await;
        }
        self.pace_restart().await;
        let started = tokio::time::timeout(START_TIMEOUT, self.spawn(wanted))
            .await
            .map_err(|_| format!("the upstream ({}) did not start within {START_TIMEOUT:?}", self.shown()))??;
        let found = (started.service.peer().clone(), started.generation);
        *conn = Some(started);
        Ok(found)
    }

    /// Drop a connection that broke mid-call; the next call starts a fresh process.
    // The SDK may not have noticed the closed pipe yet, so its own "closed" flag is not enough.
    async fn forget(&self, generation: u64) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|c| c.generation == generation)
            && let Some(old) = conn.take()
        {
            old.close(Duration::from_secs(1)).await;
        }
    }

    /// A process that keeps dying is restarted ever more slowly, never in a tight loop.
    async fn pace_restart(&self) {
        let mut r = self.restarts.lock().await;
        if let Some(last) = r.last {
            // A long healthy run earns a quick restart again.
            if last.elapsed() > MAX_RESTART_PAUSE * 4 {
                r.pause = MIN_RESTART_PAUSE;
            }
            tokio::time::sleep(r.pause.saturating_sub(last.elapsed())).await;
            r.pause = (r.pause * 2).min(MAX_RESTART_PAUSE);
        }
        r.last = Some(Instant::now());
    }

    async fn spawn(&self, config: ClientConfig) -> Result<Conn, String> {
        let capabilities = config.capabilities.clone();
        let handler = RelayHandler {
            relay: self.relay.clone(),
            config,
        };
        let (mut child, mut wire) = (None, None);
        let served = match &self.target {
            Target::Command(command) => {
                let (program, args) = command
                    .split_first()
                    .ok_or_else(|| "no upstream command: put it after `--`".to_string())?;
                let mut command = Command::new(program);
                command
                    .args(args)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true);
                let mut process = command
                    .spawn()
                    .map_err(|e| format!("starting the upstream {:?}: {e}", self.shown()))?;
                let (Some(stdout), Some(stdin)) = (process.stdout.take(), process.stdin.take()) else {
                    return Err(format!("starting the upstream {:?}: no stdio", self.shown()));
                };
                let (io, layer) = UpstreamWire::splice(stdout, stdin, self.relay.clone());
                (child, wire) = (Some(process), Some(layer));
                handler.serve(io).await
            }
            Target::Url(url) => handler.serve(url.transport()?).await,
        };
        let service =
            served.map_err(|e| self.redact(format!("the upstream ({}) did not initialize: {e}", self.shown())))?;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| self.redact(format!("the upstream ({}) did not list its tools: {e}", self.shown())))?;
        self.relay.set_tools(tools);
        *self.info.write().unwrap_or_else(|p| p.into_inner()) = service.peer().peer_info().map(|i| (*i).clone());
        *self.tasks.write().unwrap_or_else(|p| p.into_inner()) = wire.as_ref().and_then(|w| w.tasks());
        let generation = self.generations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Conn {
            service,
            generation,
            capabilities,
            child,
            wire,
        })
    }

    /// Start (or restart) the upstream now if it is down, so a protected call
    /// claims only once its send can follow at once.
    pub async fn ready(&self) -> Result<(), String> {
        self.peer().await.map(|_| ())
    }

    /// Send `method` to the upstream around rmcp (the `tasks/*` methods, which rmcp 3.11 cannot carry) and
    /// wait for its answer, `ct` or `timeout`; the text of the error says why there is none.
    pub async fn raw_request(
        &self,
        method: &str,
        params: Option<Value>,
        ct: &CancellationToken,
        timeout: Option<Duration>,
    ) -> Result<Answer, String> {
        self.peer().await?;
        let wire = self.conn.lock().await.as_ref().and_then(|c| c.wire.clone());
        let wire = wire.ok_or_else(|| format!("{method} is not carried to a URL upstream by this gateway"))?;
        wire.request(method, params, ct, timeout)
            .await
            .map_err(|e| self.redact(e.to_string()))
    }

    /// One client request passed through as it came: its answer or error is the upstream's.
    pub async fn request(&self, request: ClientRequest, link: &Link) -> Result<ServerResult, ErrorData> {
        let (peer, _) = self.peer().await.map_err(|e| ErrorData::internal_error(e, None))?;
        match self
            .exchange(&peer, request, link, None)
            .await
            .map_err(relay::error_of)?
        {
            Exchanged::Answered(answer) => answer.map_err(relay::error_of),
            Exchanged::Closed => Err(relay::error_of(ServiceError::TransportClosed)),
            Exchanged::Cancelled => Err(ErrorData::internal_error("cancelled by the client", None)),
            Exchanged::TimedOut(_) => Err(ErrorData::internal_error("the upstream did not answer in time", None)),
        }
    }

    /// Send `request` with the client's `_meta`, relay its progress, and wait for the answer, the
    /// client's cancellation or `timeout`, whichever comes first; the upstream is told to stop
    /// when the gateway stops waiting. An error: the request never entered the connection.
    async fn exchange(
        &self,
        peer: &Peer<RoleClient>,
        request: ClientRequest,
        link: &Link,
        timeout: Option<Duration>,
    ) -> Result<Exchanged, ServiceError> {
        let options = match &link.meta {
            Some(meta) => PeerRequestOptions::no_options().with_meta(meta.clone()),
            None => PeerRequestOptions::no_options(),
        };
        let mut handle = peer.send_request_with_option(request, options).await?;
        // The SDK gives the request a progress token of its own; the relay maps it back to the client's.
        let _progress = link.progress.clone().map(|token| {
            self.relay
                .follow_progress(handle.progress_token.clone(), token, link.client.clone())
        });
        let wait = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let (exchanged, stop) = tokio::select! {
            answer = &mut handle.rx => {
                if link.progress.is_some() {
                    self.relay.settle_progress().await;
                }
                (answer.map_or(Exchanged::Closed, Exchanged::Answered), None)
            }
            _ = link.ct.cancelled() => (Exchanged::Cancelled, Some("cancelled by the gateway's client")),
            _ = wait => (Exchanged::TimedOut(timeout.unwrap_or_default()), Some("request timeout")),
        };
        if let Some(reason) = stop {
            let _ = handle.cancel(Some(reason.to_string())).await;
        }
        Ok(exchanged)
    }

    /// A client notification the upstream needs (roots changed), passed on.
    pub async fn notify(&self, notification: ClientNotification) {
        match self.peer().await {
            Ok((peer, _)) => {
                if let Err(e) = peer.send_notification(notification).await {
                    tracing::debug!(target: "once::gateway", "a notification did not reach the upstream: {e}");
                }
            }
            Err(e) => tracing::debug!(target: "once::gateway", "a notification did not reach the upstream: {e}"),
        }
    }

    /// Send one `tools/call`, unless `may_send` says it is too late by the time the upstream is up.
    /// The client's progress is relayed; its cancellation, when it comes first, stops the wait and
    /// is passed on, and the call is then answered as lost (it was sent: it may have acted).
    pub async fn call(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        may_send: impl FnOnce() -> bool,
        link: &Link,
    ) -> Reply {
        let (peer, generation) = match self.peer().await {
            Ok(found) => found,
            Err(e) => return Reply::NotSent(e),
        };
        if !may_send() {
            return Reply::NotSent("the lease ran out before the upstream was ready".to_string());
        }
        let request = ClientRequest::CallToolRequest(Request::new(params));
        let exchanged = match self.exchange(&peer, request, link, Some(timeout)).await {
            Ok(exchanged) => exchanged,
            // The request never entered the connection.
            Err(e) => {
                self.forget(generation).await;
                return Reply::NotSent(format!("the connection to the upstream was closed: {e}"));
            }
        };
        match exchanged {
            Exchanged::TimedOut(t) => Reply::Lost(format!("no reply within {} ms", t.as_millis())),
            Exchanged::Cancelled => Reply::Lost(
                "the client cancelled the call after it was sent, so its answer was not awaited".to_string(),
            ),
            Exchanged::Answered(Ok(ServerResult::CallToolResult(result))) => {
                let task = result
                    .meta
                    .as_ref()
                    .is_some_and(|m| m.contains_key(crate::wire::CREATED_TASK_META));
                if task {
                    Reply::Task(result)
                } else {
                    Reply::Result(result)
                }
            }
            // A task or an input request is not the call's outcome: it may have started, so it is not "not sent".
            Exchanged::Answered(Ok(_)) => Reply::Lost(
                "the upstream answered with a task or an input request instead of a tool result, which the gateway \
                 does not follow"
                    .to_string(),
            ),
            // A URL upstream's connection could not even be opened: the request is still here.
            Exchanged::Answered(Err(e)) if remote::never_left(&e) => {
                self.forget(generation).await;
                Reply::NotSent(self.redact(format!("the upstream could not be reached: {e}")))
            }
            Exchanged::Answered(Err(ServiceError::McpError(e))) => Reply::Error(e),
            // Anything else happened after the request was handed to the transport (for a URL upstream:
            // after a connection was made; rmcp reports a response stream cut before its answer as closed).
            Exchanged::Closed | Exchanged::Answered(Err(ServiceError::TransportClosed)) => {
                self.forget(generation).await;
                Reply::Lost("the upstream closed the connection before replying".to_string())
            }
            Exchanged::Answered(Err(e)) => {
                self.forget(generation).await;
                Reply::Lost(self.redact(format!("the exchange with the upstream broke: {e}")))
            }
        }
    }

    /// Send one `tools/call` whose answer must be its result (a protected dispatch, a lookup, a call over
    /// HTTP), as [`Upstream::call`] does; for a tool the upstream runs only as a task (`taskSupport:
    /// "required"`), as a task of the gateway's own whose result is waited for within `timeout`. For a
    /// protected call the intent was recorded before the task is created, and the task's result is the outcome.
    pub async fn call_to_end(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        may_send: impl FnOnce() -> bool,
        link: &Link,
    ) -> Reply {
        self.run_to_end(params, timeout, may_send, link, |_| {}).await
    }

    /// [`Upstream::call_to_end`], telling `created` the id of the upstream's task as soon as it exists,
    /// before its result is waited for: a task may act long after the gateway stops waiting for it (and
    /// after the attempt's lease), so whoever reads the provider for this call must be able to ask the
    /// task first from that moment on.
    pub async fn run_to_end(
        &self,
        mut params: CallToolRequestParams,
        timeout: Duration,
        may_send: impl FnOnce() -> bool,
        link: &Link,
        created: impl FnOnce(&str),
    ) -> Reply {
        let as_task = self.runs_tasks()
            && self
                .tool(&params.name)
                .is_some_and(|t| crate::tasks::task_support(&t) == Some("required"));
        if !as_task {
            return self.call(params, timeout, may_send, link).await;
        }
        let started = Instant::now();
        params
            .meta
            .get_or_insert_with(RequestMetaObject::new)
            .insert(crate::wire::OWN_TASK_META.to_string(), serde_json::json!({}));
        match self.call(params, timeout, may_send, link).await {
            Reply::Task(handle) => {
                self.task_outcome(&handle, timeout.saturating_sub(started.elapsed()), link, created)
                    .await
            }
            other => other,
        }
    }

    /// The outcome of the task `handle` names: its result, waited for within `timeout` (or the client's
    /// cancellation). Anything but a tool result may follow an effect: lost, never failed.
    async fn task_outcome(
        &self,
        handle: &CallToolResult,
        timeout: Duration,
        link: &Link,
        created: impl FnOnce(&str),
    ) -> Reply {
        let meta = handle.meta.as_ref().and_then(|m| m.get(crate::wire::CREATED_TASK_META));
        let Some(id) = meta.and_then(|c| c.pointer("/task/taskId")).and_then(Value::as_str) else {
            return Reply::Lost("the upstream answered with a task that has no id".to_string());
        };
        created(id);
        let params = serde_json::json!({ "taskId": id });
        match self
            .raw_request("tasks/result", Some(params.clone()), &link.ct, Some(timeout))
            .await
        {
            Ok(Answer::Result(result)) => match serde_json::from_value::<CallToolResult>(result) {
                Ok(result) => Reply::Result(result),
                Err(e) => Reply::Lost(format!(
                    "the result of the upstream's task {id} is not a tool result: {e}"
                )),
            },
            Ok(Answer::Error(error)) => Reply::Lost(format!(
                "the upstream's task {id} ended without a result (it may have acted first): {}",
                error.get("message").and_then(Value::as_str).unwrap_or("no message")
            )),
            Err(why) => {
                // Stop it, as a call that is given up is told to stop; whether it acted is not known, and
                // the upstream may go on (`tasks/cancel` is a request, which it may refuse or be slow to honour).
                let stop = CancellationToken::new();
                let _ = self
                    .raw_request("tasks/cancel", Some(params), &stop, Some(TASK_CANCEL_WAIT))
                    .await;
                Reply::Lost(format!(
                    "the upstream's task {id} did not finish: {why}; it was asked to stop"
                ))
            }
        }
    }

    /// Where the upstream's task `id` is now: its status (`working`, `completed`, …) and, once `completed`,
    /// its result. `Ok(None)`: the upstream answered that it does not know the task (it ended and was
    /// deleted, or the process that ran it is gone). An error: nothing could be read.
    pub async fn task_state(&self, id: &str, timeout: Duration) -> Result<Option<(String, Option<Value>)>, String> {
        let params = serde_json::json!({ "taskId": id });
        let stop = CancellationToken::new();
        let task = match self
            .raw_request("tasks/get", Some(params.clone()), &stop, Some(timeout))
            .await?
        {
            Answer::Result(task) => task,
            Answer::Error(_) => return Ok(None),
        };
        let status = task
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("(no status)")
            .to_string();
        if status != "completed" {
            return Ok(Some((status, None)));
        }
        match self
            .raw_request("tasks/result", Some(params), &stop, Some(timeout))
            .await?
        {
            Answer::Result(result) => Ok(Some((status, Some(result)))),
            Answer::Error(e) => Err(format!(
                "tasks/result of the completed task {id} answered an error: {e}"
            )),
        }
    }

    /// Stop the process.
    pub async fn shutdown(&self) {
        if let Some(conn) = self.conn.lock().await.take() {
            conn.close(Duration::from_secs(2)).await;
        }
    }
}

/// How one exchange with the upstream ended.
#[allow(clippy::large_enum_variant)] // one per exchange, matched once: boxing would buy nothing
enum Exchanged {
    /// The upstream answered (a result, or its error).
    Answered(Result<ServerResult, ServiceError>),
    /// The connection closed before an answer.
    Closed,
    /// The client cancelled first.
    Cancelled,
    /// No answer within this long.
    TimedOut(Duration),
}
