//! `once gateway --listen ADDR`: MCP over Streamable HTTP (rmcp's server
//! transport, stateless: every POST is answered on its own, so any replica
//! can answer any request), mounted in axum beside `GET /healthz` and
//! `GET /metrics`. Every `/mcp` request passes the front door first: its
//! credentials name its tenant (`crate::access`), or it is answered 401 and
//! goes no further; its body is then read within `[http] body_timeout` and
//! `body_limit`, and a body that is not JSON is answered a JSON-RPC parse
//! error. Connections are accepted by `once_serve` (header timeout,
//! the cap on unauthenticated connections). SIGTERM (or Ctrl-C) stops accepting, lets the calls in
//! flight finish (within `shutdown_grace`), drains the worker as stdio does,
//! and returns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use once::Once;
use once::types::QueueFilter;
use once_serve::{Admission, Connection, Limits};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::GatewayError;
use crate::access::Refusal;
use crate::handler::{Gateway, Shared};

/// The tenant the front door found for a request, handed to the MCP handler in the request's extensions.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

/// The path MCP is served on.
pub const MCP_PATH: &str = "/mcp";
/// How long `/healthz` waits for the ledger before it says it did not answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);
/// The scope `/healthz` reads (nothing is ever written there).
const HEALTH_SCOPE: &str = "once/healthz";
/// How many pending records `/metrics` examines, as `once ui` does.
const METRICS_QUEUE_LIMIT: u32 = once::metrics::DEFAULT_QUEUE_LIMIT;

struct Front {
    shared: Arc<Shared>,
    once: Arc<Once>,
    refused: AtomicU64,
    admission: Arc<Admission>,
}

/// Serve `gateway` on `listen` until SIGTERM, then shut down gracefully.
pub(crate) async fn serve(
    listen: &str,
    public: bool,
    shared: Arc<Shared>,
    once: Arc<Once>,
    gateway: Gateway,
) -> Result<(), GatewayError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| GatewayError::Runtime(format!("listening on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| GatewayError::Runtime(format!("listening on {listen}: {e}")))?;
    // Checked again on the address bound: a name (`localhost`) resolves where the system says.
    if let Some(refused) = crate::open_beyond_loopback(listen, &addr, public, &shared.config) {
        return Err(refused);
    }
    // Two stops: `stopping` closes the listener at the signal; `abandon` cuts rmcp's open streams only
    // when the grace is over (cutting them earlier would lose the answers of calls that finish in time).
    let (stopping, abandon) = (CancellationToken::new(), CancellationToken::new());
    let mcp = mcp_service(gateway, &shared, addr, abandon.clone());
    let front = Arc::new(Front {
        shared: shared.clone(),
        once,
        refused: AtomicU64::new(0),
        admission: Arc::new(Admission::default()),
    });
    let app = axum::Router::new()
        .route_service(MCP_PATH, mcp)
        .route_layer(middleware::from_fn_with_state(front.clone(), front_door))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(front.clone());
    let mut stop = Stop::listen();
    // Printed on stdout, which HTTP mode does not otherwise use: a supervisor (or a test) that asked for port 0
    // learns the port here.
    println!("once gateway: listening on http://{addr}{MCP_PATH}");
    tracing::info!(target: "once::gateway", "listening on http://{addr}{MCP_PATH}");
    let limits = Limits {
        header_timeout: shared.config.http.header_timeout,
        max_unauthenticated: shared.config.http.max_unauthenticated,
    };
    let mut server = tokio::spawn(once_serve::serve(
        listener,
        app,
        limits,
        front.admission.clone(),
        stopping.clone(),
    ));
    tokio::select! {
        _ = stop.received() => {}
        ended = &mut server => {
            return Err(GatewayError::Runtime(format!("the HTTP server stopped: {}", match ended {
                Ok(()) => "without a signal".to_string(),
                Err(e) => e.to_string(),
            })));
        }
    }
    tracing::info!(target: "once::gateway", "stopping: no new requests; letting the calls in flight finish");
    // The listener closes now; connections finish the requests they carry.
    stopping.cancel();
    let grace = Instant::now() + shared.config.shutdown_grace;
    let finished = tokio::time::timeout_at(grace.into(), &mut server).await.is_ok();
    while shared.calls_in_flight() > 0 && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !finished || shared.calls_in_flight() > 0 {
        abandon.cancel();
        server.abort();
        tracing::warn!(
            target: "once::gateway",
            "shutdown_grace ended with {} call(s) in flight: {}",
            shared.calls_in_flight(),
            crate::worker::who_continues(&shared)
        );
    }
    // What the calls left unsettled, within what is left of the same grace.
    crate::worker::drain_until(&shared, grace).await;
    Ok(())
}

/// rmcp's Streamable HTTP server, stateless, over clones of `gateway`.
fn mcp_service(
    gateway: Gateway,
    shared: &Shared,
    addr: SocketAddr,
    ct: CancellationToken,
) -> StreamableHttpService<Gateway, NeverSessionManager> {
    let access = &shared.config.http;
    let hosts = access.allowed_hosts.clone().unwrap_or_else(|| {
        // DNS-rebinding protection: loopback names, and the address the gateway was told to listen on.
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        if !addr.ip().is_unspecified() {
            hosts.push(addr.ip().to_string());
        }
        hosts
    });
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(access.body_limit)
        .with_allowed_hosts(hosts)
        // The Streamable HTTP transport's rule: a request whose Origin is present and not allowed is 403
        // (a page in the user's browser, not an MCP client). An empty list refuses every Origin.
        .with_allowed_origins(access.allowed_origins.clone())
        .enforce_origin_validation()
        .with_cancellation_token(ct);
    StreamableHttpService::new(
        move || Ok(gateway.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// Every MCP request: its tenant from its credentials, or 401 before anything else sees it; then its body,
/// whole, in time, and JSON.
async fn front_door(State(front): State<Arc<Front>>, mut request: Request, next: Next) -> Response {
    match front.shared.config.http.tenant_of(request.headers()) {
        Ok(tenant) => {
            if let Some(connection) = request.extensions().get::<Connection>() {
                connection.authenticated();
            }
            if let Some(tenant) = tenant {
                request.extensions_mut().insert(Tenant(tenant));
            }
            let request = match whole_body(&front.shared.config.http, request).await {
                Ok(request) => request,
                Err(response) => return response,
            };
            next.run(request).await
        }
        Err(refusal) => {
            front.refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!(target: "once::gateway", outcome = "unauthorized", "request refused: {}", text(&refusal));
            refused(refusal)
        }
    }
}

/// A POST's body read whole within `body_timeout` and `body_limit`, and checked as JSON-RPC the way rmcp
/// will read it. rmcp answers a body it cannot read 415, as if the content type were wrong; a body that is
/// not JSON is a JSON-RPC parse error (-32700), and JSON that is no JSON-RPC message an invalid request
/// (-32600), both 400 as the Streamable HTTP transport says. A wrong content type is still rmcp's 415.
async fn whole_body(access: &crate::access::HttpAccess, request: Request) -> Result<Request, Response> {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/json")
        });
    if request.method() != axum::http::Method::POST || !json {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let bytes = once_serve::body::read(body, access.body_limit, access.body_timeout).await?;
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        return Err(jsonrpc_error(
            serde_json::Value::Null,
            -32700,
            format!("Parse error: the request body is not JSON ({e})"),
        ));
    }
    if let Err(e) = serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(&bytes) {
        let id = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("id").filter(|id| id.is_string() || id.is_number()).cloned())
            .unwrap_or(serde_json::Value::Null);
        return Err(jsonrpc_error(
            id,
            -32600,
            format!("Invalid Request: the body is JSON but not a JSON-RPC message this server takes ({e})"),
        ));
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A JSON-RPC error response with no result, answered 400.
fn jsonrpc_error(id: serde_json::Value, code: i64, message: String) -> Response {
    tracing::info!(target: "once::gateway", "request refused: {message}");
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn text(refusal: &Refusal) -> &str {
    match refusal {
        Refusal::Unauthorized(why) | Refusal::Forbidden(why) => why,
        Refusal::BadRequest(why) => why,
    }
}

fn refused(refusal: Refusal) -> Response {
    let status = match refusal {
        Refusal::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
        Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
    };
    let mut response = (status, format!("{}\n", text(&refusal))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"once gateway\""),
        );
    }
    response
}

/// `GET /healthz`: 200 when the ledger answers a read, 503 with the reason when it does not.
async fn healthz(State(front): State<Arc<Front>>) -> Response {
    let once = front.once.clone();
    let read = tokio::task::spawn_blocking(move || once.inspect(HEALTH_SCOPE, "probe").map(|_| ()));
    match tokio::time::timeout(HEALTH_TIMEOUT, read).await {
        Ok(Ok(Ok(()))) => (StatusCode::OK, "ok: the ledger answers\n").into_response(),
        Ok(Ok(Err(e))) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the ledger does not answer: {e}\n"),
        )
            .into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the ledger read failed: {e}\n"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the ledger did not answer within {HEALTH_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

/// `GET /metrics`: the ledger's figures as `once ui` serves them, and this process's own counters.
async fn metrics(State(front): State<Arc<Front>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = front.shared.config.http.may_read_metrics(&headers) {
        return refused(refusal);
    }
    let once = front.once.clone();
    let read = tokio::task::spawn_blocking(move || {
        let filter = QueueFilter {
            scopes: None,
            tool: None,
            key_prefix: None,
        };
        let queue = once.queue(&filter, METRICS_QUEUE_LIMIT)?;
        let stats = once.stats(None)?;
        Ok::<_, once::OnceError>(once::metrics::render(&stats, &queue))
    })
    .await;
    match read {
        Ok(Ok(mut text)) => {
            text.push_str(&process_counters(&front));
            ([(header::CONTENT_TYPE, once::metrics::CONTENT_TYPE)], text).into_response()
        }
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the ledger does not answer: {e}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the ledger failed: {e}\n"),
        )
            .into_response(),
    }
}

/// What only this process knows: a blocked call and a refused request write nothing to the ledger.
fn process_counters(front: &Front) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP once_gateway_blocked_total Calls this gateway process blocked, by reason (a block writes no record).\n\
         # TYPE once_gateway_blocked_total counter"
    );
    for (reason, n) in front.shared.blocked() {
        let _ = writeln!(out, "once_gateway_blocked_total{{reason=\"{reason}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP once_gateway_unauthorized_total MCP requests this process refused for missing or unknown credentials.\n\
         # TYPE once_gateway_unauthorized_total counter\n\
         once_gateway_unauthorized_total {}",
        front.refused.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP once_gateway_connections_evicted_total Connections closed because more than [http] max_unauthenticated had not yet authenticated.\n\
         # TYPE once_gateway_connections_evicted_total counter\n\
         once_gateway_connections_evicted_total {}",
        front.admission.evicted()
    );
    let _ = writeln!(
        out,
        "# HELP once_gateway_calls_in_flight Tool calls this process is working on now.\n\
         # TYPE once_gateway_calls_in_flight gauge\n\
         once_gateway_calls_in_flight {}",
        front.shared.calls_in_flight()
    );
    out
}

/// SIGTERM or SIGINT (Ctrl-C), listened for from before the gateway names its address: a supervisor that
/// stops it as soon as it is up gets a shutdown with its drain, never the signal's default (an exit).
struct Stop {
    term: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Stop {
    fn listen() -> Stop {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| {
            signal(kind)
                .map_err(|e| tracing::warn!(target: "once::gateway", "cannot listen for {name}: {e}"))
                .ok()
        };
        Stop {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            interrupt: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// The first of them.
    async fn received(&mut self) {
        async fn one(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = one(&mut self.term) => {}
            _ = one(&mut self.interrupt) => {}
        }
    }
}
