//! The refund API as an MCP server over stdio or Streamable HTTP (`refund-mcp`): `get_order`, `refund_order` and `find_refund_by_key`,
//! in front of a [`Service`] on the same effect ledger, with the demo's faults acted out on the MCP connection.
//!
//! A fault acts on the first `refund_order` call against a ledger, once: a marker file beside the ledger records that
//! it fired, so a server restarted after a disconnect (as a gateway does) behaves normally from then on.
//!
//! | fault | what the caller sees on the first `refund_order` |
//! | --- | --- |
//! | `pre_effect_disconnect` | the server exits before sending the refund: no reply, no effect |
//! | `post_commit_disconnect` | the refund commits, then the server exits: no reply, one effect |
//! | `reject_502` | a JSON-RPC internal error ("502 Bad Gateway") without sending: ambiguous to the caller, no effect |
//! | `late_reply` | the refund commits; the reply comes after `late_reply` |
//! | `crash_after_dispatch` | the refund commits; the reply never comes (the caller is expected to die) |
//! | `stale_read` | the refund commits but its reply is lost (JSON-RPC error), and the next read comes from a snapshot older than the refund ([`FaultProxy`]'s own fault) |
//! | `concurrent_duplicate`, `none` | nothing: a duplicate comes from the callers, not the server |
//!
//! Error convention: an `isError` result is a definite refusal (the service answered 4xx, or nothing was sent);
//! a JSON-RPC error means the outcome is unknown (timeout, 5xx, broken exchange).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam, ContentBlock, ErrorData,
    Implementation, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{CallError, Client, Error, Fault, FaultProxy, Mode, ProxyOptions, Service, now_ms};

/// How to run the MCP server.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The effect ledger (created and seeded if missing).
    pub db: PathBuf,
    /// Whether the service dedupes by key.
    pub mode: Mode,
    /// The fault acted out on the first `refund_order` against this ledger.
    pub fault: Fault,
    /// How late the reply comes under `late_reply`.
    pub late_reply: Duration,
    /// Timeout of the server's own HTTP calls to the service.
    pub http_timeout: Duration,
}

impl McpOptions {
    /// Defaults: idempotent mode, no fault, a 3 s late reply, 1 s HTTP timeout.
    pub fn new(db: impl Into<PathBuf>) -> McpOptions {
        McpOptions {
            db: db.into(),
            mode: Mode::Idempotent,
            fault: Fault::None,
            late_reply: Duration::from_secs(3),
            http_timeout: Duration::from_secs(1),
        }
    }
}

/// The marker file whose existence means the fault has fired for the ledger at `db`.
pub fn fault_marker(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(".fault-fired");
    PathBuf::from(name)
}

/// The file beside the ledger at `db` where the server appends every `notifications/cancelled` it receives,
/// one line each (the request id, a tab, the reason): what a test reads to see that a caller told it to stop.
pub fn cancellations(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push(".cancelled");
    PathBuf::from(name)
}

/// The refund service, the fault proxy in front of it (if any), and the MCP face of both:
/// dropping it stops the service.
struct Running {
    server: RefundMcp,
    _proxy: Option<FaultProxy>,
    _service: Service,
}

/// Serve MCP on stdin/stdout until the client hangs up, then exit the process.
pub async fn serve_stdio(options: McpOptions) -> Result<(), Error> {
    let running = start(options)?;
    let session = running
        .server
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    let _ = session.waiting().await;
    drop(running);
    Ok(())
}

/// The path the Streamable HTTP endpoint is served under.
pub const HTTP_PATH: &str = "/mcp";

/// Serve MCP over Streamable HTTP on `listener` (at [`HTTP_PATH`]), one session per client,
/// until the process is stopped; `ready` is told the address once connections are accepted.
pub async fn serve_http(
    options: McpOptions,
    listener: tokio::net::TcpListener,
    ready: impl FnOnce(std::net::SocketAddr),
) -> Result<(), Error> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

    let running = start(options)?;
    let server = running.server.clone();
    // Local only: the allowed hosts stay rmcp's loopback names, against DNS rebinding.
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service(HTTP_PATH, service);
    ready(listener.local_addr()?);
    axum::serve(listener, router).await?;
    drop(running);
    Ok(())
}

fn start(options: McpOptions) -> Result<Running, Error> {
    let service = Service::start(&options.db, options.mode)?;
    let marker = fault_marker(&options.db);
    // The proxy's stale read must follow the first write against this ledger, not the first of this process.
    let proxy = match options.fault {
        Fault::StaleRead if !marker.exists() => Some(FaultProxy::start(
            service.addr(),
            Fault::StaleRead,
            ProxyOptions::default(),
        )?),
        _ => None,
    };
    let base_url = proxy.as_ref().map_or_else(|| service.base_url(), FaultProxy::base_url);
    let server = RefundMcp {
        client: Client::new(base_url, options.http_timeout),
        fault: options.fault,
        marker,
        cancellations: cancellations(&options.db),
        late_reply: options.late_reply,
    };
    Ok(Running {
        server,
        _proxy: proxy,
        _service: service,
    })
}

/// The MCP face of one refund service.
#[derive(Clone)]
struct RefundMcp {
    client: Client,
    fault: Fault,
    marker: PathBuf,
    cancellations: PathBuf,
    late_reply: Duration,
}

#[derive(Deserialize)]
struct OrderArgs {
    order_id: i64,
}

#[derive(Deserialize)]
struct RefundArgs {
    order_id: i64,
    amount: f64,
    idempotency_key: Option<String>,
}

#[derive(Deserialize)]
struct LookupArgs {
    idempotency_key: String,
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("schemas are objects"),
    }
}

/// The three tools, with the annotations a gateway routes by.
pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "get_order",
            "Read an order: its total and how much has been refunded so far (in dollars).",
            schema(json!({
                "type": "object",
                "properties": {"order_id": {"type": "integer", "description": "The order, e.g. 1234."}},
                "required": ["order_id"]
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "refund_order",
            "Refund part of an order. An error result means the refund was refused and nothing was refunded; \
             a protocol error means the outcome is unknown.",
            schema(json!({
                "type": "object",
                "properties": {
                    "order_id": {"type": "integer", "description": "The order, e.g. 1234."},
                    "amount": {"type": "number", "description": "Dollars, at most 2 decimals."},
                    "idempotency_key": {
                        "type": "string",
                        "description": "Optional; a fresh one is minted when absent (so a retry refunds again)."
                    }
                },
                "required": ["order_id", "amount"]
            })),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(false),
        ),
        Tool::new(
            "find_refund_by_key",
            "Find the refund recorded under an idempotency key, as of read_position (ms since the Unix epoch).",
            schema(json!({
                "type": "object",
                "properties": {"idempotency_key": {"type": "string"}},
                "required": ["idempotency_key"]
            })),
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
    ]
}

fn parse_args<T: for<'de> Deserialize<'de>>(arguments: Option<JsonObject>) -> Result<T, ErrorData> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| ErrorData::invalid_params(format!("bad arguments: {e}"), None))
}

/// A key for a call that brought none: unique, and never reused, like the study's server.
fn minted_key() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "minted-{}-{}-{}",
        now_ms(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The service's JSON answer as a tool result: the text and the same value as structured content.
fn answer(raw: String) -> CallToolResult {
    let value = serde_json::from_str(&raw).unwrap_or(Value::String(raw.clone()));
    let mut result = CallToolResult::success(vec![ContentBlock::text(raw)]);
    result.structured_content = Some(value);
    result
}

/// A call's failure: definite ones are error results the model can read, unknown ones protocol errors.
fn failure(what: &str, e: CallError) -> Result<CallToolResult, ErrorData> {
    match e {
        CallError::Rejected { status, body } => {
            let error = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .unwrap_or(body);
            let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
                "{what} refused (HTTP {status}): {error}; nothing was done"
            ))]);
            result.structured_content = Some(json!({"error": error, "status": status}));
            Ok(result)
        }
        CallError::NotSent(why) => {
            let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
                "{what} not sent: {why}; nothing was done"
            ))]);
            result.structured_content = Some(json!({"error": why, "sent": false}));
            Ok(result)
        }
        CallError::Ambiguous(why) => Err(ErrorData::internal_error(
            format!("{what}: outcome unknown: {why}"),
            None,
        )),
    }
}

/// Drop the MCP connection the hard way: the process ends without another byte.
fn disconnect(fault: Fault) -> ! {
    eprintln!("refund-mcp: fault {fault}: dropping the connection");
    std::process::exit(0)
}

impl RefundMcp {
    /// The fault to act out now: the configured one, the first time against this ledger.
    fn take_fault(&self) -> Fault {
        if self.fault == Fault::None {
            return Fault::None;
        }
        // create_new is atomic, so of two racing calls (or processes) only one fires.
        match OpenOptions::new().write(true).create_new(true).open(&self.marker) {
            Ok(_) => self.fault,
            Err(_) => Fault::None,
        }
    }

    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Client) -> T + Send + 'static) -> Result<T, ErrorData> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || f(&client))
            .await
            .map_err(|e| ErrorData::internal_error(format!("worker failed: {e}"), None))
    }

    async fn refund(&self, args: RefundArgs) -> Result<CallToolResult, ErrorData> {
        let key = args.idempotency_key.unwrap_or_else(minted_key);
        let fault = self.take_fault();
        match fault {
            Fault::PreEffectDisconnect => disconnect(fault),
            Fault::Reject502 => {
                return Err(ErrorData::internal_error(
                    "refund_order: upstream answered 502 Bad Gateway; outcome unknown",
                    None,
                ));
            }
            _ => {}
        }
        let sent = self
            .blocking(move |c| c.refund_order(args.order_id, args.amount, &key))
            .await?;
        match fault {
            Fault::PostCommitDisconnect => disconnect(fault),
            Fault::LateReply => tokio::time::sleep(self.late_reply).await,
            // Never answer: whoever called is expected to be killed meanwhile.
            Fault::CrashAfterDispatch => std::future::pending::<()>().await,
            _ => {}
        }
        match sent {
            Ok(receipt) => Ok(answer(receipt.raw)),
            Err(e) => failure("refund_order", e),
        }
    }
}

impl ServerHandler for RefundMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("refund-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions("Refunds on order 1234 ($500.00). refund_order moves money; the other two only read.")
    }

    async fn on_cancelled(&self, notification: CancelledNotificationParam, _context: NotificationContext<RoleServer>) {
        let id = notification
            .request_id
            .map_or_else(|| "-".to_string(), |id| id.to_string());
        let line = format!("{id}\t{}\n", notification.reason.unwrap_or_default().replace('\n', " "));
        let logged = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.cancellations)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = logged {
            eprintln!(
                "refund-mcp: cannot log a cancellation to {}: {e}",
                self.cancellations.display()
            );
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            "get_order" => {
                let args: OrderArgs = parse_args(request.arguments)?;
                match self.blocking(move |c| c.get_order(args.order_id)).await? {
                    Ok(order) => Ok(answer(order.raw)),
                    Err(e) => failure("get_order", e),
                }
            }
            "refund_order" => self.refund(parse_args(request.arguments)?).await,
            "find_refund_by_key" => {
                let args: LookupArgs = parse_args(request.arguments)?;
                match self
                    .blocking(move |c| c.find_refund_by_key(&args.idempotency_key))
                    .await?
                {
                    Ok(found) => Ok(answer(found.raw)),
                    Err(e) => failure("find_refund_by_key", e),
                }
            }
            other => Err(ErrorData::invalid_params(format!("no tool named {other:?}"), None)),
        }?;
        Ok(result.into())
    }
}
