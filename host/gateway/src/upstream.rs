//! The upstream MCP server: a child process spoken to over stdio with rmcp,
//! restarted when it dies (a disconnect or crash mid-call must not leave the
//! gateway unable to reconcile or to send an owed dispatch).

use std::sync::RwLock;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ErrorCode, ErrorData, Implementation,
    ListToolsResult, PaginatedRequestParams, Tool,
};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceError, ServiceExt};
use tokio::process::Command;
use tokio::sync::Mutex;

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
    service: RunningService<RoleClient, ClientConfig>,
    generation: u64,
}

struct Restarts {
    last: Option<Instant>,
    pause: Duration,
}

/// A supervised upstream server.
pub struct Upstream {
    command: Vec<String>,
    conn: Mutex<Option<Conn>>,
    generations: std::sync::atomic::AtomicU64,
    restarts: Mutex<Restarts>,
    tools: RwLock<Vec<Tool>>,
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("once-gateway", env!("CARGO_PKG_VERSION")),
    )
}

impl Upstream {
    /// Start `command` and read its tools; a failure here is a failure at start.
    pub async fn start(command: Vec<String>) -> Result<Upstream, String> {
        let upstream = Upstream {
            command,
            conn: Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
            restarts: Mutex::new(Restarts {
                last: None,
                pause: MIN_RESTART_PAUSE,
            }),
            tools: RwLock::new(Vec::new()),
        };
        upstream.peer().await?;
        Ok(upstream)
    }

    /// The upstream command as one line, for messages.
    pub fn command_line(&self) -> String {
        self.command.join(" ")
    }

    /// The tools as last listed.
    pub fn tools(&self) -> Vec<Tool> {
        self.tools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// One tool's definition as last listed.
    pub fn tool(&self, name: &str) -> Option<Tool> {
        self.tools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// A live connection and its generation, starting (or restarting) the process when there is none.
    async fn peer(&self) -> Result<(Peer<RoleClient>, u64), String> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref()
            && !c.service.is_transport_closed()
        {
            return Ok((c.service.peer().clone(), c.generation));
        }
        if let Some(mut old) = conn.take() {
            let _ = old.service.close_with_timeout(Duration::from_secs(1)).await;
        }
        self.pace_restart().await;
        let started = tokio::time::timeout(START_TIMEOUT, self.spawn()).await.map_err(|_| {
            format!(
                "the upstream ({}) did not start within {START_TIMEOUT:?}",
                self.command_line()
            )
        })??;
        let found = (started.service.peer().clone(), started.generation);
        *conn = Some(started);
        Ok(found)
    }

    /// Drop a connection that broke mid-call; the next call starts a fresh process.
    // The SDK may not have noticed the closed pipe yet, so its own "closed" flag is not enough.
    async fn forget(&self, generation: u64) {
        let mut conn = self.conn.lock().await;
        if conn.as_ref().is_some_and(|c| c.generation == generation)
            && let Some(mut old) = conn.take()
        {
            let _ = old.service.close_with_timeout(Duration::from_secs(1)).await;
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

    async fn spawn(&self) -> Result<Conn, String> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| "no upstream command: put it after `--`".to_string())?;
        let mut command = Command::new(program);
        command.args(args);
        let transport = TokioChildProcess::new(command)
            .map_err(|e| format!("starting the upstream {:?}: {e}", self.command_line()))?;
        let service = client_config()
            .serve(transport)
            .await
            .map_err(|e| format!("the upstream ({}) did not initialize: {e}", self.command_line()))?;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("the upstream ({}) did not list its tools: {e}", self.command_line()))?;
        *self.tools.write().unwrap_or_else(|p| p.into_inner()) = tools;
        let generation = self.generations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Conn { service, generation })
    }

    /// Start (or restart) the upstream now if it is down, so a protected call
    /// claims only once its send can follow at once.
    pub async fn ready(&self) -> Result<(), String> {
        self.peer().await.map(|_| ())
    }

    /// `tools/list`, passed through.
    pub async fn list_tools(&self, params: Option<PaginatedRequestParams>) -> Result<ListToolsResult, String> {
        let (peer, _) = self.peer().await?;
        peer.list_tools(params).await.map_err(|e| e.to_string())
    }

    /// Send one `tools/call`, unless `may_send` says it is too late by the time the upstream is up.
    pub async fn call(
        &self,
        params: CallToolRequestParams,
        timeout: Duration,
        may_send: impl FnOnce() -> bool,
    ) -> Reply {
        let (peer, generation) = match self.peer().await {
            Ok(found) => found,
            Err(e) => return Reply::NotSent(e),
        };
        if !may_send() {
            return Reply::NotSent("the lease ran out before the upstream was ready".to_string());
        }
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => Reply::Lost(format!("no reply within {} ms", timeout.as_millis())),
            Ok(Ok(result)) => Reply::Result(result),
            Ok(Err(ServiceError::McpError(e))) => Reply::Error(e),
            // Anything else happened after the request was handed to the transport.
            Ok(Err(ServiceError::TransportClosed)) => {
                self.forget(generation).await;
                Reply::Lost("the upstream closed the connection before replying".to_string())
            }
            Ok(Err(e)) => {
                self.forget(generation).await;
                Reply::Lost(format!("the exchange with the upstream broke: {e}"))
            }
        }
    }

    /// Stop the process.
    pub async fn shutdown(&self) {
        if let Some(mut conn) = self.conn.lock().await.take() {
            let _ = conn.service.close_with_timeout(Duration::from_secs(2)).await;
        }
    }
}
