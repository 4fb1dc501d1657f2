//! The upstream MCP server: a child process spoken to over stdio with rmcp,
//! or a server at a URL spoken to over Streamable HTTP ([`crate::remote`]),
//! restarted (reconnected: a new session) when it dies (a disconnect or crash
//! mid-call must not leave the gateway unable to reconcile or to send an owed
//! dispatch), and restarted once when the client connects, so that the
//! upstream sees the client's capabilities (sampling, elicitation, roots) as
//! its own client's.
//!
//! Which revision each request is sent in (MCP 2026-07-28 has no handshake:
//! each request names its revision and the client's capabilities in its
//! `_meta` envelope, where the 2025 revisions settle both once, at
//! `initialize`):
//!
//! - A command upstream is one stdio connection, opened with `initialize`
//!   (a server pins a connection to the revision it opened with), so every
//!   request on it is in that revision, 2025-11-25 at most. A 2026-07-28
//!   client's envelope is not passed on there: its revision is not the
//!   connection's.
//! - A URL upstream is asked `server/discover` (with the gateway's envelope)
//!   whenever the gateway connects. If it answers with 2026-07-28 among its
//!   versions, the gateway keeps a second connection that speaks only
//!   2026-07-28, beside the `initialize`d one that speaks only the older
//!   revision. The gateway's own requests (a protected call's dispatch, an
//!   owed dispatch the worker sends, a lookup) go on the 2026-07-28
//!   connection with the gateway's envelope (what it declares upstream:
//!   [`Upstream::declare`]), never a client's `_meta`, but for the attempt a
//!   2026-07-28 client waits on, which carries that client's envelope (less
//!   the tasks extension: [`envelope_of`]) so that the upstream may ask it
//!   for input ([`crate::rounds`]); a client's
//!   pass-through or DIRECT request goes there with the client's own
//!   envelope when it came with one naming 2026-07-28, and on the older
//!   connection, without envelope keys, when it did not. A URL upstream that
//!   does not answer `server/discover` gets every request on the older
//!   connection, as before.
//!
//! Why two connections: rmcp's Streamable HTTP client sends each request
//! with the revision its `_meta` names, else the session's, and takes a
//! named revision as the session's from then on (its worker's
//! `inline_version`), which a 2025-era request cannot name. On one
//! connection, one 2026-07-28 request would switch every later request of
//! every client to 2026-07-28. Here no request on the older connection names
//! a revision, and every request on the other names the one it speaks, so
//! nothing one client sends changes what another's request is sent with.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientNotification, ClientRequest,
    ErrorCode, ErrorData, Implementation, InputRequiredResult, ProgressToken, ProtocolVersion, Request,
    RequestMetaObject, ServerPeerInfo, ServerResult, Tool,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, Peer, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::{RoleClient, RoleServer, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::relay::{self, Followers, Following, Relay, RelayHandler};
use crate::remote::{self, UpstreamUrl};
use crate::wire::upstream::{Answer, UpstreamWire};

/// How long before its deadline an answer in hand stops waiting for its progress to reach the client.
const ANSWER_MARGIN: Duration = Duration::from_millis(50);
/// How long the gateway waits for an upstream to acknowledge `tasks/cancel` of a task it gave up on.
const TASK_CANCEL_WAIT: Duration = Duration::from_secs(2);
/// How long starting the upstream (spawn + initialize + tools/list) may take.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The first pause before restarting an upstream that died; it doubles up to `MAX_RESTART_PAUSE`.
const MIN_RESTART_PAUSE: Duration = Duration::from_millis(50);
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(5);
/// How long asking a URL upstream `server/discover` may take; no answer in time: it does not speak 2026-07-28.
const DISCOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// The revision without a handshake that the gateway speaks to an upstream that offers it.
pub const MODERN: ProtocolVersion = ProtocolVersion::V_2026_07_28;
/// The `_meta` keys of MCP 2026-07-28's per-request envelope: the revision and the client's identity,
/// capabilities and log level. They mean nothing in an older revision.
pub const ENVELOPE_KEYS: [&str; 4] = [
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientInfo",
    "io.modelcontextprotocol/clientCapabilities",
    "io.modelcontextprotocol/logLevel",
];

/// When a `tools/call` may still be sent, and until when its answer is waited for.
#[derive(Debug, Clone, Copy)]
pub enum Due {
    /// A protected dispatch: the engine's deadlines on this host's monotonic clock
    /// ([`once::Dispatch::send_before`] and [`once::Dispatch::answer_by`]), so that the wait ends with
    /// the attempt's lease (less the declared clock skew) however long the upstream took to be ready;
    /// `timeout` from the send only if the deadline is beyond the clock's range.
    Engine {
        /// Send nothing at or after this (none: no limit).
        send_before: Option<Instant>,
        /// Wait for the answer until this.
        answer_by: Option<Instant>,
        /// The tool's dispatch timeout: named when the answer misses its deadline.
        timeout: Duration,
    },
    /// A DIRECT call: sent whenever the upstream is ready, and answered by the engine's `answer_by` (its
    /// timeout from the hand-over, when the engine's loop stops it), else within `timeout` from the send.
    Direct {
        /// When the engine's loop stops the call (none: beyond the clock's range).
        answer_by: Option<Instant>,
        /// The tool's timeout: named when the answer misses its deadline.
        timeout: Duration,
    },
    /// A call of the gateway's own that holds no lease (a lookup): sent whenever the upstream is ready,
    /// and answered within this timeout from the send.
    After(Duration),
}

impl Due {
    /// Whether it may still be sent.
    fn may_send(&self) -> bool {
        match self {
            Due::Engine { send_before, .. } => send_before.is_none_or(|end| Instant::now() < end),
            Due::Direct { .. } | Due::After(_) => true,
        }
    }

    /// When the answer to a request sent at `sent` is due (none: beyond the clock's range).
    fn deadline(&self, sent: Instant) -> Option<Instant> {
        match *self {
            Due::Engine {
                answer_by: Some(by), ..
            }
            | Due::Direct {
                answer_by: Some(by), ..
            } => Some(by),
            Due::Engine { timeout, .. } | Due::Direct { timeout, .. } | Due::After(timeout) => {
                sent.checked_add(timeout)
            }
        }
    }

    /// How long the answer to a request sent at `sent` may still take (none: no limit).
    fn left(&self, sent: Instant) -> Option<Duration> {
        self.deadline(sent)
            .map(|by| by.saturating_duration_since(Instant::now()))
    }

    /// What a call whose answer did not come in time is told.
    pub(crate) fn missed(&self) -> String {
        match self {
            Due::Engine { timeout, .. } => format!(
                "no reply by the engine's deadline (send-by plus the {} ms timeout)",
                timeout.as_millis()
            ),
            Due::Direct { timeout, .. } => format!(
                "no reply within {} ms of being handed to the upstream",
                timeout.as_millis()
            ),
            Due::After(timeout) => format!("no reply within {} ms", timeout.as_millis()),
        }
    }
}

/// A request sent to the upstream and not answered yet. Dropped before its answer (the wait given up, or the
/// wait's own future dropped: the engine's loop stops a dispatch at its deadline), it tells the upstream to
/// stop, from a task of its own, so that no caller waits for the notification to go out.
struct Awaited {
    handle: Option<RequestHandle<RoleClient>>,
    /// Why the upstream is told to stop.
    reason: &'static str,
}

impl Drop for Awaited {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let reason = self.reason.to_string();
        detach(async move {
            let _ = handle.cancel(Some(reason)).await;
        });
    }
}

/// Run `work` in a task of its own, on the runtime this runs on (none: at shutdown, it is not run).
fn detach(work: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(work);
    }
}

/// An upstream's task the gateway waits on. Dropped before the task's end was heard of, it asks the upstream
/// to cancel the task, from a task of its own: the attempt's deadline has come, and its report must not
/// wait for the upstream's acknowledgement.
struct RunningTask {
    /// The connection's wire and the `tasks/cancel` params; none once the task's end was heard of.
    stop: Option<(Arc<UpstreamWire>, Value)>,
}

impl Drop for RunningTask {
    fn drop(&mut self) {
        let Some((wire, params)) = self.stop.take() else {
            return;
        };
        detach(async move {
            let never = CancellationToken::new();
            let _ = wire
                .request("tasks/cancel", Some(params), &never, Some(TASK_CANCEL_WAIT))
                .await;
        });
    }
}

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
    /// The server asked for input before it would run the call (MCP 2026-07-28's multi-round-trip
    /// `InputRequiredResult`): it answered, and did nothing; the client answers in a new call ([`crate::rounds`]).
    InputRequired(InputRequiredResult),
}

impl Reply {
    /// Whether the server refused the request before running anything, by JSON-RPC's own codes and MCP
    /// 2026-07-28's: a request whose headers do not match its body, one that needs a client capability the
    /// request did not declare (a tool that would have asked its client for input), one in a revision the
    /// server does not speak.
    pub fn refused_before_running(e: &ErrorData) -> bool {
        [
            ErrorCode::PARSE_ERROR,
            ErrorCode::INVALID_REQUEST,
            ErrorCode::METHOD_NOT_FOUND,
            ErrorCode::INVALID_PARAMS,
            ErrorCode::HEADER_MISMATCH,
            ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
            ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
        ]
        .contains(&e.code)
    }
}

/// One connection to the upstream, and the calls on it whose progress is relayed ([`Following`]).
struct Served {
    service: RunningService<RoleClient, RelayHandler>,
    followers: Arc<Followers>,
}

impl Served {
    fn peer(&self) -> Connected {
        Connected {
            peer: self.service.peer().clone(),
            followers: self.followers.clone(),
        }
    }
}

/// A connection's peer, and the calls on it whose progress is relayed.
#[derive(Clone)]
struct Connected {
    peer: Peer<RoleClient>,
    followers: Arc<Followers>,
}

struct Conn {
    /// The connection opened with `initialize`: a 2025 revision (or older), and every command upstream's.
    service: Served,
    /// A URL upstream's 2026-07-28 connection, when it answered `server/discover` with that revision.
    modern: Option<Served>,
    generation: u64,
    /// The capabilities this connection declared to the upstream.
    capabilities: ClientCapabilities,
    /// A command upstream's process (killed if dropped).
    child: Option<Child>,
    /// A command upstream's raw layer: what rmcp cannot carry ([`crate::wire`]).
    wire: Option<Arc<UpstreamWire>>,
}

impl Conn {
    fn peers(&self) -> Peers {
        Peers {
            legacy: self.service.peer(),
            modern: self.modern.as_ref().map(Served::peer),
            generation: self.generation,
        }
    }

    /// Close the connection; a process that has not exited `grace` after its stdin closed is killed.
    async fn close(mut self, grace: Duration) {
        if let Some(mut modern) = self.modern.take() {
            let _ = modern.service.close_with_timeout(grace).await;
        }
        let _ = self.service.service.close_with_timeout(grace).await;
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
    /// The gateway's own request (a protected dispatch, a lookup), not a client's: it is sent in the newest
    /// revision the upstream speaks, never with a client's `_meta`; its envelope is the gateway's, or, for
    /// the attempt a 2026-07-28 client waits on, that client's ([`envelope_of`], all `meta` then holds).
    pub own: bool,
    /// Set once the request is handed to the connection: from then on it may reach the upstream, and a
    /// wait given up is a lost reply, never "not sent".
    pub handed: Option<Arc<AtomicBool>>,
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
            own: false,
            handed: None,
        }
    }

    /// The link of a request of the gateway's own: no client `_meta`, nobody's cancellation.
    pub fn own() -> Link {
        Link {
            own: true,
            ..Link::default()
        }
    }

    /// The revision a client's request names in its envelope, if it came with one.
    fn claims(&self) -> Option<ProtocolVersion> {
        self.meta.as_ref().and_then(RequestMetaObject::protocol_version)
    }
}

/// The live connections of one generation.
#[derive(Clone)]
struct Peers {
    legacy: Connected,
    modern: Option<Connected>,
    generation: u64,
}

impl Peers {
    /// The connection `link`'s request goes on, and the `_meta` it carries there (see the module doc).
    fn route(&self, link: &Link) -> (&Connected, Option<RequestMetaObject>) {
        match self.modern.as_ref().filter(|_| goes_modern(link)) {
            Some(peer) => (peer, meta_on(link, true)),
            None => (&self.legacy, meta_on(link, false)),
        }
    }
}

/// Whether `link`'s request goes on the 2026-07-28 connection, where the upstream has one: the gateway's
/// own always, a client's when its envelope names that revision.
fn goes_modern(link: &Link) -> bool {
    link.own || link.claims().as_ref() == Some(&MODERN)
}

/// The `_meta` `link`'s request carries on the 2026-07-28 connection (`modern`) or the older one. On the
/// first rmcp puts the gateway's envelope on every request, and a client's own envelope replaces it; the
/// gateway's own request carries none of a client's `_meta` but, for the attempt a client waits on, its
/// envelope ([`envelope_of`]). On the older one no envelope key travels.
fn meta_on(link: &Link, modern: bool) -> Option<RequestMetaObject> {
    if modern {
        return link.meta.clone();
    }
    link.meta.clone().map(without_envelope).filter(|m| !m.is_empty())
}

/// What of a client's `_meta` goes with a protected dispatch the client waits on: its 2026-07-28 envelope
/// (its revision, identity and capabilities: the upstream may then ask it for input, [`crate::rounds`]),
/// less the tasks extension (a protected call's outcome must be the call's own answer, never a task's).
/// Nothing when it named no 2026-07-28 revision: the gateway's envelope goes instead, as with the worker's
/// dispatches. The rest of its `_meta` is the client's, not the operation's.
pub fn envelope_of(meta: &RequestMetaObject) -> Option<RequestMetaObject> {
    if meta.protocol_version().as_ref() != Some(&MODERN) {
        return None;
    }
    let mut envelope = RequestMetaObject::new();
    for key in ENVELOPE_KEYS {
        if let Some(value) = meta.get(key) {
            envelope.insert(key.to_string(), value.clone());
        }
    }
    if let Some(Value::Object(capabilities)) = envelope.get_mut("io.modelcontextprotocol/clientCapabilities")
        && let Some(Value::Object(extensions)) = capabilities.get_mut("extensions")
    {
        extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
    }
    Some(envelope)
}

/// `meta` without the 2026-07-28 envelope keys: on the older connection, a named revision would
/// be taken as the connection's (see the module doc), and the others mean nothing there.
fn without_envelope(mut meta: RequestMetaObject) -> RequestMetaObject {
    for key in ENVELOPE_KEYS {
        meta.remove(key);
    }
    meta
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
    /// Whether the connection of the last start speaks 2026-07-28 beside the older revision (a URL upstream's):
    /// said in the log when it changes.
    modern: std::sync::atomic::AtomicBool,
    /// Set by [`Upstream::shutdown`]: the process is never started again, so work still running at
    /// shutdown (a settle round, a late call) cannot leave a child behind the gateway.
    stopped: AtomicBool,
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
            modern: std::sync::atomic::AtomicBool::new(false),
            stopped: AtomicBool::new(false),
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
    async fn peer(&self) -> Result<Peers, String> {
        let mut conn = self.conn.lock().await;
        // Read under the lock `shutdown` takes, so no start can slip in after it.
        if self.stopped.load(Ordering::Acquire) {
            return Err(format!(
                "the gateway is shutting down and has stopped the upstream ({})",
                self.shown()
            ));
        }
        let wanted = self.wanted();
        if let Some(c) = conn.as_ref()
            && !c.service.service.is_transport_closed()
            && c.modern.as_ref().is_none_or(|m| !m.service.is_transport_closed())
            && c.capabilities == wanted.capabilities
        {
            return Ok(c.peers());
        }
        if let Some(old) = conn.take() {
            old.close(Duration::from_secs(1)).await;
        }
        self.pace_restart().await;
        let started = tokio::time::timeout(START_TIMEOUT, self.spawn(wanted))
            .await
            .map_err(|_| format!("the upstream ({}) did not start within {START_TIMEOUT:?}", self.shown()))??;
        let found = started.peers();
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
        let handler_config = config.clone();
        let handler = RelayHandler {
            relay: self.relay.clone(),
            config,
        };
        let (mut child, mut wire) = (None, None);
        let followers = Arc::new(Followers::new(self.relay.clone()));
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
                let (read, write) = io;
                let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(read, write);
                handler.serve(Following::new(transport, followers.clone())).await
            }
            Target::Url(url) => handler.serve(Following::new(url.transport()?, followers.clone())).await,
        };
        let service =
            served.map_err(|e| self.redact(format!("the upstream ({}) did not initialize: {e}", self.shown())))?;
        let service = Served { service, followers };
        let modern = match &self.target {
            Target::Url(url) => self.discover(url, handler_config).await,
            Target::Command(_) => None,
        };
        let tools = service
            .service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| self.redact(format!("the upstream ({}) did not list its tools: {e}", self.shown())))?;
        self.relay.set_tools(tools);
        *self.info.write().unwrap_or_else(|p| p.into_inner()) =
            service.service.peer().peer_info().map(|i| (*i).clone());
        *self.tasks.write().unwrap_or_else(|p| p.into_inner()) = wire.as_ref().and_then(|w| w.tasks());
        let was = self.modern.swap(modern.is_some(), std::sync::atomic::Ordering::SeqCst);
        if was != modern.is_some() || self.generations.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tracing::info!(
                target: "once::gateway",
                "the upstream ({}) {}",
                self.shown(),
                if modern.is_some() {
                    "speaks MCP 2026-07-28: the gateway's own requests, and clients' requests in 2026-07-28, are sent in it"
                } else {
                    "does not answer server/discover with MCP 2026-07-28: every request is sent in the revision it was initialized with"
                }
            );
        }
        let generation = self.generations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Conn {
            service,
            modern,
            generation,
            capabilities,
            child,
            wire,
        })
    }

    /// A second connection to the URL upstream in MCP 2026-07-28, opened with `server/discover` and the
    /// gateway's envelope (`config`: what it declares upstream); `None` when the upstream does not offer
    /// that revision (a 2025-era server answers the probe with an error, or not in time).
    async fn discover(&self, url: &UpstreamUrl, config: ClientConfig) -> Option<Served> {
        let handler = RelayHandler {
            relay: self.relay.clone(),
            config,
        };
        let lifecycle = ClientLifecycleMode::Discover {
            preferred_versions: vec![MODERN],
        };
        let followers = Arc::new(Followers::new(self.relay.clone()));
        let transport = Following::new(url.transport().ok()?, followers.clone());
        match tokio::time::timeout(DISCOVER_TIMEOUT, handler.serve_with_lifecycle(transport, lifecycle)).await {
            Ok(Ok(service)) => {
                // rmcp puts a tool's `x-mcp-header` arguments in `Mcp-Param-*` headers from the tool lists seen
                // on this connection: listed here, every dispatch on it carries them, whoever listed tools
                // through the gateway and whenever it reconnected (a server refuses a call without them).
                match tokio::time::timeout(DISCOVER_TIMEOUT, service.peer().list_all_tools()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(target: "once::gateway", "tools/list on the 2026-07-28 connection: {}", self.redact(e.to_string()))
                    }
                    Err(_) => {
                        tracing::warn!(target: "once::gateway", "tools/list on the 2026-07-28 connection: no answer within {DISCOVER_TIMEOUT:?}")
                    }
                }
                Some(Served { service, followers })
            }
            Ok(Err(e)) => {
                let why = self.redact(e.to_string());
                tracing::debug!(target: "once::gateway", "server/discover: {why}");
                None
            }
            Err(_) => {
                tracing::debug!(target: "once::gateway", "server/discover: no answer within {DISCOVER_TIMEOUT:?}");
                None
            }
        }
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
        let peers = self.peer().await.map_err(|e| ErrorData::internal_error(e, None))?;
        match self
            .exchange(&peers, request, link, None)
            .await
            .map_err(relay::error_of)?
        {
            Exchanged::Answered(answer) => answer.map_err(relay::error_of),
            Exchanged::Closed => Err(relay::error_of(ServiceError::TransportClosed)),
            Exchanged::Cancelled => Err(ErrorData::internal_error("cancelled by the client", None)),
            Exchanged::TimedOut => Err(ErrorData::internal_error("the upstream did not answer in time", None)),
        }
    }

    /// Send `request` on the connection and with the `_meta` that `link` calls for ([`Peers::route`]),
    /// relay its progress, and wait for the answer, the client's cancellation or the answer's deadline
    /// (`due`, taken once the request is sent; none: no limit), whichever comes first; the upstream is
    /// told to stop when the gateway stops waiting. An error: the request never entered the connection.
    async fn exchange(
        &self,
        peers: &Peers,
        request: ClientRequest,
        link: &Link,
        due: Option<Due>,
    ) -> Result<Exchanged, ServiceError> {
        let (connected, meta) = peers.route(link);
        // The SDK gives the request a progress token of its own; the relay maps it back to the client's. The
        // call is followed before it is sent, and its request marked so that the connection binds the two.
        let mut progress = link
            .progress
            .clone()
            .map(|token| connected.followers.follow(token, link.client.clone()));
        let mut meta = meta;
        // Only the gateway marks a call: a client's mark could take another call's progress.
        if let Some(meta) = meta.as_mut() {
            meta.remove(relay::FOLLOW_META);
        }
        if let Some(followed) = &progress {
            meta.get_or_insert_default()
                .insert(relay::FOLLOW_META.to_string(), followed.mark().into());
        }
        let meta = meta.filter(|m| !m.is_empty());
        let options = match meta {
            Some(meta) => PeerRequestOptions::no_options().with_meta(meta),
            None => PeerRequestOptions::no_options(),
        };
        if let Some(handed) = &link.handed {
            handed.store(true, Ordering::SeqCst);
        }
        let mut handle = connected.peer.send_request_with_option(request, options).await?;
        let (_, unused) = tokio::sync::oneshot::channel();
        let mut answered = std::mem::replace(&mut handle.rx, unused);
        let mut awaited = Awaited {
            handle: Some(handle),
            reason: "the gateway stopped waiting for the answer",
        };
        let deadline = due
            .and_then(|due| due.deadline(Instant::now()))
            .map(tokio::time::Instant::from_std);
        let wait = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        // Biased: an answer that has arrived is the outcome, even if the deadline or the client's cancellation
        // is also ready by the time this runs (a busy machine polls it late); a random pick would call it lost.
        let (exchanged, stop) = tokio::select! {
            biased;
            answer = &mut answered => {
                awaited.handle = None;
                // Progress the upstream sent before its answer reaches the client before the answer does. A client
                // that takes none (a wedged connection) holds the answer no longer than the call may take: the
                // answer is the call's outcome, which the engine records, whoever hears of it.
                if let Some(progress) = progress.take() {
                    match deadline {
                        // Handed back a little before the deadline: the engine's loop stops the dispatch at
                        // the same instant, and must find the answer already here.
                        Some(d) => {
                            let by = d.checked_sub(ANSWER_MARGIN).unwrap_or(d);
                            let _ = tokio::time::timeout_at(by, progress.settle()).await;
                        }
                        None => progress.settle().await,
                    }
                }
                (answer.map_or(Exchanged::Closed, Exchanged::Answered), None)
            }
            _ = link.ct.cancelled() => (Exchanged::Cancelled, Some("cancelled by the gateway's client")),
            _ = wait => (Exchanged::TimedOut, Some("request timeout")),
        };
        if let Some(reason) = stop {
            awaited.reason = reason;
        }
        Ok(exchanged)
    }

    /// A client notification the upstream needs (roots changed), passed on.
    pub async fn notify(&self, notification: ClientNotification) {
        match self.peer().await {
            Ok(peers) => {
                if let Err(e) = peers.legacy.peer.send_notification(notification).await {
                    tracing::debug!(target: "once::gateway", "a notification did not reach the upstream: {e}");
                }
            }
            Err(e) => tracing::debug!(target: "once::gateway", "a notification did not reach the upstream: {e}"),
        }
    }

    /// Send one `tools/call`, unless it is too late by the time the upstream is up, and wait for its
    /// answer until it is `due`. The client's progress is relayed; its cancellation, when it comes
    /// first, stops the wait and is passed on, and the call is then answered as lost (it was sent: it
    /// may have acted).
    pub async fn call(&self, params: CallToolRequestParams, due: Due, link: &Link) -> Reply {
        let peers = match self.peer().await {
            Ok(found) => found,
            Err(e) => return Reply::NotSent(e),
        };
        let generation = peers.generation;
        if !due.may_send() {
            return Reply::NotSent("the lease ran out before the upstream was ready".to_string());
        }
        let request = ClientRequest::CallToolRequest(Request::new(params));
        let exchanged = match self.exchange(&peers, request, link, Some(due)).await {
            Ok(exchanged) => exchanged,
            // The request never entered the connection.
            Err(e) => {
                self.forget(generation).await;
                return Reply::NotSent(format!("the connection to the upstream was closed: {e}"));
            }
        };
        match exchanged {
            Exchanged::TimedOut => Reply::Lost(due.missed()),
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
            Exchanged::Answered(Ok(ServerResult::InputRequiredResult(asked))) => Reply::InputRequired(asked),
            // Anything else is not the call's outcome: it may have started, so it is not "not sent".
            Exchanged::Answered(Ok(_)) => Reply::Lost(
                "the upstream answered with something other than a tool result or an input request (a task it was \
                 not asked for?), which the gateway does not follow"
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
    /// "required"`), as a task of the gateway's own whose result is waited for until it is `due`. For a
    /// protected call the intent was recorded before the task is created, and the task's result is the outcome.
    pub async fn call_to_end(&self, params: CallToolRequestParams, due: Due, link: &Link) -> Reply {
        self.run_to_end(params, due, link, |_| {}).await
    }

    /// [`Upstream::call_to_end`], telling `created` the id of the upstream's task as soon as it exists,
    /// before its result is waited for: a task may act long after the gateway stops waiting for it (and
    /// after the attempt's lease), so whoever reads the provider for this call must be able to ask the
    /// task first from that moment on.
    pub async fn run_to_end(
        &self,
        mut params: CallToolRequestParams,
        due: Due,
        link: &Link,
        created: impl FnOnce(&str),
    ) -> Reply {
        let as_task = self.runs_tasks()
            && self
                .tool(&params.name)
                .is_some_and(|t| crate::tasks::task_support(&t) == Some("required"));
        if !as_task {
            return self.call(params, due, link).await;
        }
        let started = Instant::now();
        params
            .meta
            .get_or_insert_with(RequestMetaObject::new)
            .insert(crate::wire::OWN_TASK_META.to_string(), serde_json::json!({}));
        match self.call(params, due, link).await {
            Reply::Task(handle) => self.task_outcome(&handle, due.left(started), link, created).await,
            other => other,
        }
    }

    /// The outcome of the task `handle` names: its result, waited for within `timeout` (none: no limit;
    /// or until the client's cancellation). Anything but a tool result may follow an effect: lost, never
    /// failed.
    async fn task_outcome(
        &self,
        handle: &CallToolResult,
        timeout: Option<Duration>,
        link: &Link,
        created: impl FnOnce(&str),
    ) -> Reply {
        let meta = handle.meta.as_ref().and_then(|m| m.get(crate::wire::CREATED_TASK_META));
        let Some(id) = meta.and_then(|c| c.pointer("/task/taskId")).and_then(Value::as_str) else {
            return Reply::Lost("the upstream answered with a task that has no id".to_string());
        };
        created(id);
        let params = serde_json::json!({ "taskId": id });
        // Stopped, as a call that is given up is told to stop, however the wait ends without the task's
        // end (given up, or this future dropped at the engine's deadline); whether it acted is not known,
        // and the upstream may go on (`tasks/cancel` is a request, which it may refuse or be slow to honour).
        let wire = self.conn.lock().await.as_ref().and_then(|c| c.wire.clone());
        let mut running = RunningTask {
            stop: wire.map(|wire| (wire, params.clone())),
        };
        let answer = self
            .raw_request("tasks/result", Some(params.clone()), &link.ct, timeout)
            .await;
        if answer.is_ok() {
            running.stop = None;
        }
        match answer {
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
            Err(why) => Reply::Lost(format!(
                "the upstream's task {id} did not finish: {why}; it was asked to stop"
            )),
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

    /// Stop the process for good: nothing starts it again (a call or read after this is not sent).
    pub async fn shutdown(&self) {
        let mut conn = self.conn.lock().await;
        self.stopped.store(true, Ordering::Release);
        if let Some(conn) = conn.take() {
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
    /// No answer by its deadline.
    TimedOut,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn client_meta(pairs: Value) -> Link {
        let meta: RequestMetaObject = serde_json::from_value(pairs).unwrap();
        Link::of(meta, CancellationToken::new())
    }

    #[test]
    fn the_gateways_own_requests_go_modern_without_a_clients_meta() {
        let own = Link::own();
        assert!(goes_modern(&own));
        assert_eq!(meta_on(&own, true), None);
        assert_eq!(meta_on(&own, false), None);
    }

    #[test]
    fn a_clients_request_goes_in_the_revision_its_envelope_names_and_only_there_with_it() {
        let modern = client_meta(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"sampling": {}},
            "trace": "t1",
        }));
        assert!(goes_modern(&modern));
        // Its own envelope, as it sent it, on the 2026-07-28 connection.
        let sent = serde_json::to_value(meta_on(&modern, true)).unwrap();
        assert_eq!(
            sent["io.modelcontextprotocol/clientCapabilities"],
            json!({"sampling": {}})
        );
        assert_eq!(sent["io.modelcontextprotocol/protocolVersion"], "2026-07-28");
        // On the older connection (an upstream without 2026-07-28) no envelope key, the rest kept.
        let sent = serde_json::to_value(meta_on(&modern, false)).unwrap();
        assert_eq!(sent, json!({"trace": "t1"}));

        let legacy = client_meta(json!({"trace": "t2"}));
        assert!(!goes_modern(&legacy));
        assert_eq!(
            serde_json::to_value(meta_on(&legacy, false)).unwrap(),
            json!({"trace": "t2"})
        );
        // A revision other than the one the connection speaks is not sent there.
        let older = client_meta(json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25"}));
        assert!(!goes_modern(&older));
        assert_eq!(meta_on(&older, false), None);
    }
}

/// Progress through the relay against a real connection: an rmcp server at a URL, and a client that is slow
/// to take progress (a loaded machine, a slow link), as seen by the gateway's side of the relay.
#[cfg(test)]
mod progress_tests {
    use std::sync::Mutex as StdMutex;

    use rmcp::model::{
        CallToolResponse, ContentBlock, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
        ServerCapabilities, ServerConfig, ServerJsonRpcMessage,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::Transport;
    use rmcp::{RoleServer, ServerHandler};
    use serde_json::json;

    use super::*;

    /// How many progress notifications the upstream sends before its answer.
    const STEPS: u32 = 3;
    /// How long the slow client takes to take each progress notification: longer than any fixed wait for it.
    const SLOW: Duration = Duration::from_millis(400);

    /// An upstream whose one tool reports each step and answers at once after the last.
    #[derive(Clone)]
    struct Stepper;

    impl ServerHandler for Stepper {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn list_tools(
            &self,
            _request: Option<PaginatedRequestParams>,
            _context: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let schema = serde_json::from_value(json!({"type": "object"})).unwrap();
            Ok(ListToolsResult::with_all_items(vec![Tool::new(
                "steps",
                "Reports its steps.",
                Arc::new(schema),
            )]))
        }

        async fn call_tool(
            &self,
            _request: CallToolRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let token = context
                .meta
                .get_progress_token()
                .expect("the gateway asks for progress");
            for step in 1..=STEPS {
                let mut progress = ProgressNotificationParam::new(token.clone(), f64::from(step));
                progress.total = Some(f64::from(STEPS));
                context.peer.notify_progress(progress).await.unwrap();
            }
            Ok(CallToolResult::success(vec![ContentBlock::text("done")]).into())
        }
    }

    /// Serve `Stepper` at a local URL for as long as the test runs.
    async fn upstream_url() -> String {
        use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
        use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
        let service = StreamableHttpService::new(
            || Ok(Stepper),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let router = axum::Router::new().nest_service("/mcp", service);
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    }

    /// The gateway's client: what reached it, in order ("progress N", or "answer" as the test writes it
    /// when the gateway's exchange returns). It takes `SLOW` to take each progress notification.
    #[derive(Clone, Default)]
    struct SlowClient {
        heard: Arc<StdMutex<Vec<String>>>,
        progressed: Arc<tokio::sync::Notify>,
    }

    impl Transport<RoleServer> for SlowClient {
        type Error = std::io::Error;

        fn send(
            &mut self,
            item: ServerJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            let client = self.clone();
            async move {
                if let rmcp::model::JsonRpcMessage::Notification(n) = &item
                    && let rmcp::model::ServerNotification::ProgressNotification(p) = &n.notification
                {
                    tokio::time::sleep(SLOW).await;
                    let said = format!("progress {}", p.params.progress);
                    client.heard.lock().unwrap().push(said);
                    client.progressed.notify_one();
                }
                Ok(())
            }
        }

        async fn receive(&mut self) -> Option<rmcp::model::ClientJsonRpcMessage> {
            std::future::pending().await
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    #[derive(Clone)]
    struct Nothing;
    impl ServerHandler for Nothing {}

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn progress_the_upstream_sent_before_its_answer_reaches_a_slow_client_before_the_answer() {
        let relay = Arc::new(Relay::default());
        let client = SlowClient::default();
        let serving = rmcp::service::serve_directly(Nothing, client.clone(), None);
        relay.connect(serving.peer().clone());
        let url = UpstreamUrl::parse(&upstream_url().await).unwrap();
        let upstream = Upstream::start(Target::Url(url), relay).await.unwrap();

        let link = Link {
            progress: Some(ProgressToken(rmcp::model::NumberOrString::String("client's".into()))),
            ..Link::default()
        };
        let call = CallToolRequestParams::new("steps");
        let answer = upstream
            .request(ClientRequest::CallToolRequest(Request::new(call)), &link)
            .await
            .unwrap();
        assert!(matches!(answer, ServerResult::CallToolResult(_)), "{answer:?}");
        client.heard.lock().unwrap().push("answer".to_string());

        // Whatever came late would still come: wait for all of it before reading the order.
        let all = (STEPS + 1) as usize;
        while client.heard.lock().unwrap().len() < all {
            let progressed = client.progressed.notified();
            if tokio::time::timeout(SLOW * 10, progressed).await.is_err() {
                break;
            }
        }
        let heard = client.heard.lock().unwrap().clone();
        let mut expected: Vec<String> = (1..=STEPS).map(|s| format!("progress {s}")).collect();
        expected.push("answer".to_string());
        assert_eq!(heard, expected);
        upstream.shutdown().await;
    }
}
