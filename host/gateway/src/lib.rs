//! `once gateway`: an MCP proxy that puts an MCP server's tools behind once.
//!
//! The client speaks MCP to the gateway on stdin/stdout (or, with `--listen`,
//! many clients over Streamable HTTP: `http`, their tenants `access`); the gateway starts
//! the upstream server as a child process and speaks MCP to it over its stdio,
//! or connects to it at a URL over Streamable HTTP (`remote`). Each request
//! upstream is sent in a revision chosen for it, never one another client's
//! request switched: a child's in the revision its `initialize` settled; at
//! a URL that answers `server/discover` with MCP 2026-07-28, the gateway's own
//! requests (protected dispatches, lookups) in 2026-07-28 with the gateway's
//! envelope (or, for the attempt a 2026-07-28 client waits on, its own, so
//! the upstream may ask it for input: `rounds`), a client's in the revision
//! its own `_meta` envelope names
//! (`upstream` says how, and why on two connections).
//! Everything but `tools/call` passes through in both directions (prompts,
//! resources, completions, logging, progress, sampling, elicitation, roots,
//! list changes; see docs/gateway.md). Every `tools/call` runs the engine's
//! call protocol (`Once::call_async`, in a task of its own) with the tool's policy (from `once.toml`,
//! filled in and checked by the engine, which also routes by the tool's
//! annotations): DIRECT calls are forwarded, PROTECT calls are claimed in the
//! ledger before they are sent, BLOCK calls are answered and never sent. A
//! background worker runs the engine's sweep and sends the owed dispatches it
//! grants.
//!
//! Modules: `config` (`once.toml`), `lookup` (a tool's lookup templates and
//! evidence), `server` (the MCP methods the client calls), `handler` (a
//! protected call and the provider lookup), `shaped` (every result as the
//! request's protocol revision requires it), `rounds` (MCP 2026-07-28's
//! multi-round-trip input through a protected tool), `reply` (what the model is shown,
//! from the engine's account), `upstream` (the MCP client of the real
//! server), `remote` (a URL upstream: which HTTP failures prove a request
//! never left), `relay` (what the upstream sends the client), `wire` (the raw
//! JSON-RPC layer on the stdio connections, for what rmcp cannot carry),
//! `tasks` (MCP 2025-11-25 tasks: what is declared and refused), `worker` (the
//! background settle rounds) and `check` (`--check-config`).
#![deny(missing_docs)]

mod access;
mod check;
mod config;
mod error;
mod handler;
mod http;
mod identity;
mod lookup;
mod relay;
mod remote;
mod reply;
mod rounds;
mod server;
mod shaped;
mod tasks;
mod upstream;
mod wire;
mod worker;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use once::{Once, OnceError};
use rmcp::ServiceExt;

pub use self::access::AccessConfigError;
use self::access::Tenancy;
use self::config::{Config, ScopeMode};
pub use self::error::GatewayError;
use self::handler::{Gateway, Shared};
use self::relay::Relay;
use self::remote::UpstreamUrl;
use self::upstream::{Target, Upstream};

/// What `once gateway` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The configuration file (TOML); without it, annotations and derived keys.
    pub config: Option<PathBuf>,
    /// The ledger: an SQLite file or a postgres:// URL (default: the config's `db`, else `once.db`).
    pub db: Option<String>,
    /// Check the config (against the upstream, when one is given), print each tool's route, and exit.
    pub check_config: bool,
    /// The upstream MCP server's command and arguments.
    pub upstream: Vec<String>,
    /// Serve MCP over Streamable HTTP on this address (`127.0.0.1:8080`) instead of stdio.
    pub listen: Option<String>,
    /// Listen on an address other than loopback although the gateway names no tenant by a credential
    /// (no `[http] tenants`): whoever reaches it calls every tool in the file's scope.
    pub public: bool,
    /// The upstream MCP server's URL (Streamable HTTP), instead of a command; wins over the config's `upstream_url`.
    pub upstream_url: Option<String>,
}

/// Run the gateway until the client hangs up and unsettled operations are settled (or the grace ends).
pub fn run(args: Options) -> Result<(), GatewayError> {
    let config = match &args.config {
        Some(path) => Config::load(path).map_err(GatewayError::Config)?,
        None => Config::default(),
    };
    if args.listen.is_some() && config.scope == ScopeMode::Session {
        return Err(GatewayError::Config(format!(
            "{}: scope = \"session\" cannot be served over HTTP: each request stands alone there, so every call \
             would be a new operation; use a fixed scope or [http] tenants",
            config.source
        )));
    }
    if let Some(listen) = &args.listen
        && let Some(refused) = open_beyond_loopback(listen, &loopback_or_not(listen), args.public, &config)
    {
        return Err(refused);
    }
    let Some(target) = target(&config, &args)? else {
        if args.check_config {
            return check::check_static(&config);
        }
        return Err(GatewayError::Config(
            "no upstream: once gateway [--config FILE] -- <command> [args…], or --upstream-url URL (or upstream_url \
             in the config)"
                .to_string(),
        ));
    };
    let db = args
        .db
        .clone()
        .or_else(|| config.db.as_ref().map(|p| p.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "once.db".to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // Four (two before the calls were async): with two, the async gateway measured lower at 128 clients
        // on two cores (BENCHMARKS.md, "the async gateway loop"); why was not measured.
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| GatewayError::Runtime(format!("starting the async runtime: {e}")))?;
    let result = runtime.block_on(serve(config, db, target, args));
    // The stdin reader of a finished session may still be parked in a blocking read.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Where the upstream is: exactly one of a command and a URL (`--upstream-url` wins over `upstream_url`).
fn target(config: &Config, args: &Options) -> Result<Option<Target>, GatewayError> {
    let url = match &args.upstream_url {
        Some(text) => Some(UpstreamUrl::parse(text).map_err(|e| GatewayError::Config(format!("--upstream-url: {e}")))?),
        None => config.upstream_url.clone(),
    };
    match (url, args.upstream.is_empty()) {
        (Some(_), false) => Err(GatewayError::Config(format!(
            "both an upstream command (after `--`) and an upstream URL ({}) are given: name one",
            if args.upstream_url.is_some() {
                "--upstream-url".to_string()
            } else {
                format!("upstream_url in {}", config.source)
            }
        ))),
        (Some(url), true) => Ok(Some(Target::Url(url))),
        (None, false) => Ok(Some(Target::Command(args.upstream.clone()))),
        (None, true) => Ok(None),
    }
}

async fn serve(config: Config, db: String, target: Target, args: Options) -> Result<(), GatewayError> {
    let relay = Arc::new(Relay::default());
    let upstream = Upstream::start(target, relay.clone())
        .await
        .map_err(GatewayError::Runtime)?;
    let names: Vec<String> = upstream.tools().iter().map(|t| t.name.to_string()).collect();
    if let Err(e) = config.check_tools(&names) {
        upstream.shutdown().await;
        return Err(GatewayError::Config(e));
    }
    let shared = Arc::new(Shared::new(config, upstream));
    let opened = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || open(&shared, &db))
            .await
            .map_err(|e| GatewayError::Runtime(format!("opening the ledger: {e}")))?
    };
    let once = match opened {
        Ok(once) => Arc::new(once),
        Err(f) => {
            shared.upstream.shutdown().await;
            return Err(f);
        }
    };
    if args.check_config {
        let printed = {
            let (shared, once) = (shared.clone(), once.clone());
            tokio::task::spawn_blocking(move || check::print_routes(&shared, &once)).await
        };
        shared.upstream.shutdown().await;
        return printed.map_err(|e| GatewayError::Runtime(e.to_string()))?;
    }

    // The scopes known at start are checked now, so a second upstream on the ledger stops here: the
    // tenants' over HTTP with tokens, else the fixed one. Scopes named per call are checked at their first.
    let known_scopes: Vec<String> = match (&args.listen, &shared.config.http.tenancy, &shared.config.scope) {
        (Some(_), Tenancy::Tokens(tenants), _) => {
            tenants.values().cloned().collect::<BTreeSet<_>>().into_iter().collect()
        }
        (Some(_), Tenancy::Header(_), _) => Vec::new(),
        (_, _, ScopeMode::Fixed(scope)) => vec![scope.clone()],
        _ => Vec::new(),
    };
    if !known_scopes.is_empty() {
        let admitted = {
            let (shared, once) = (shared.clone(), once.clone());
            tokio::task::spawn_blocking(move || {
                known_scopes.iter().try_for_each(|s| shared.admit_scope(&once, s))?;
                warn_of_orphans(&shared, &once, known_scopes);
                Ok::<(), String>(())
            })
            .await
        };
        let refused = match admitted {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(GatewayError::Config(format!("{}: {why}", shared.config.source))),
            Err(e) => Some(GatewayError::Runtime(e.to_string())),
        };
        if let Some(e) = refused {
            shared.upstream.shutdown().await;
            return Err(e);
        }
    }
    if shared.config.scope == ScopeMode::Session {
        tracing::warn!(target: "once::gateway", "{SESSION_SCOPE_WARNING}");
    }
    if let Some(warning) = account_warning(&shared.config, &shared.account) {
        tracing::warn!(target: "once::gateway", "{warning}");
    }
    for tool in shared.upstream.tools() {
        if let Some(warning) = check::identity_warning(&once, &tool.name) {
            tracing::warn!(target: "once::gateway", "{warning}");
        }
    }
    let gateway = Gateway::new(shared.clone(), once.clone(), session_scope(), instructions(&shared));
    if let Some(listen) = &args.listen {
        // One upstream for every client, started with no client capabilities (see `Gateway::initialize`).
        let worker = worker::spawn(shared.clone(), once.clone());
        // It drains the worker itself, within the grace its shutdown began.
        let served = http::serve(listen, args.public, shared.clone(), once.clone(), gateway.over_http()).await;
        worker.abort();
        shared.upstream.shutdown().await;
        return served;
    }
    // The client's stdio runs through the raw layer that carries what rmcp 3.11 cannot (MCP 2025-11-25 tasks).
    let stdio = wire::front::splice(tokio::io::stdin(), tokio::io::stdout(), shared.clone());
    let running = match gateway.serve(stdio).await {
        Ok(running) => running,
        Err(e) => {
            shared.upstream.shutdown().await;
            return Err(GatewayError::Runtime(format!("the client did not initialize: {e}")));
        }
    };
    relay.connect(running.peer().clone());
    // The client declared its capabilities: the upstream is restarted with them now, before the worker
    // sends anything on it (a restart under a call in flight would make its outcome unknown).
    if let Err(e) = shared.upstream.ready().await {
        tracing::warn!(target: "once::gateway", "restarting the upstream with the client's capabilities: {e}");
    }
    let worker = worker::spawn(shared.clone(), once.clone());
    let _ = running.waiting().await;
    worker::drain(&shared).await;
    worker.abort();
    shared.upstream.shutdown().await;
    Ok(())
}

/// The address `listen` names, as far as it can be told before binding: an address as written, a loopback
/// one for `localhost:PORT` (checked again once bound), else the unspecified address (not loopback).
fn loopback_or_not(listen: &str) -> std::net::SocketAddr {
    use std::net::{Ipv4Addr, SocketAddr};
    listen.parse::<SocketAddr>().unwrap_or_else(|_| {
        let local = listen
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"));
        let ip = if local {
            Ipv4Addr::LOCALHOST
        } else {
            Ipv4Addr::UNSPECIFIED
        };
        SocketAddr::from((ip, 0))
    })
}

/// The refusal of an HTTP gateway at `addr` (what `listen` names) that anyone who reaches it could call:
/// not on loopback, no tenant named by a bearer token, and no `--public`.
pub(crate) fn open_beyond_loopback(
    listen: &str,
    addr: &std::net::SocketAddr,
    public: bool,
    config: &Config,
) -> Option<GatewayError> {
    if public || addr.ip().is_loopback() || matches!(config.http.tenancy, Tenancy::Tokens(_)) {
        return None;
    }
    Some(GatewayError::Config(format!(
        "--listen {listen} is not a loopback address, and {} names no tenant by a bearer token ([http] \
         tenants): anyone who can reach it would call its tools, replay others' results and spend their \
         quota{}; add tenants, listen on 127.0.0.1, or pass --public if something in front of it \
         authenticates every caller",
        config.source,
        match config.http.tenancy {
            Tenancy::Header(_) => ", choosing any tenant by the tenant header",
            _ => "",
        }
    )))
}

/// The engine over the ledger, with `[defaults]` and
/// every tool's policy checked by the engine now, not at the first call.
fn open(shared: &Arc<Shared>, db: &str) -> Result<Once, GatewayError> {
    let builder = Once::open(db).map_err(|e| GatewayError::Runtime(format!("ledger {db}: {e}")))?;
    shared.set_ledger_clock(builder.ledger_clock());
    let descriptors = shared.descriptors();
    // No `Provider`: every read is a `read` step the gateway's sender awaits ([`handler::read_upstream`]).
    let builder = builder.reads_in_dispatcher().owner(shared.owner.clone());
    let once = shared
        .config
        .apply(builder, &descriptors, Some(&shared.account))
        .build()
        .map_err(|e| match e {
            OnceError::Engine(once::types::Error::InvalidPolicy(_)) => GatewayError::Config(shared.config.refused(&e)),
            e => GatewayError::Runtime(format!("ledger {db}: {e}")),
        })?;
    shared.configured_with(&descriptors);
    Ok(once)
}

/// Say, at start, which unsettled operations in this gateway's scopes belong to an owner it is not: a
/// ledger written before scopes were bound (whose default owner was the command line), or a gateway
/// renamed since. Nothing reads or sends them until an operator adopts them (their deadlines still
/// escalate); a caller asking for one is answered as the record stands. The owner itself is not logged
/// (an old default owner holds the whole command line): `once ledger show KEY` names it.
fn warn_of_orphans(shared: &Shared, once: &Once, scopes: Vec<String>) {
    let filter = once::types::QueueFilter {
        scopes: Some(scopes),
        tool: None,
        key_prefix: None,
    };
    let Ok(queue) = once.queue(&filter, 1_000) else {
        return;
    };
    let orphans: Vec<_> = queue.entries.iter().filter(|e| e.owner != shared.owner).collect();
    if let Some(first) = orphans.first() {
        tracing::warn!(
            target: "once::gateway",
            "{} unsettled operation(s) in this gateway's scopes belong to another owner, which nothing here reads \
             or sends (e.g. scope {:?} key {:?}: `once ledger show {} --scope {}` names the owner). If they are \
             this gateway's under an earlier name (a build before scopes were bound named it after the command \
             line), move them: once ledger adopt --from <that owner> --to {:?}",
            orphans.len(),
            first.scope,
            first.key,
            first.key,
            first.scope,
            shared.owner
        );
    }
}

/// A fresh scope for this client connection (`scope = "session"` only): keys never collide
/// with another session's, and after a restart the same key is a new operation.
fn session_scope() -> String {
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    let id = if random {
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    } else {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{now:x}-{}", std::process::id())
    };
    format!("session-{id}")
}

fn instructions(shared: &Shared) -> String {
    let key_meta = shared.config.key_meta.first().map_or("once/key", String::as_str);
    let keyless = match shared.config.scope {
        ScopeMode::Session => "identical calls in this session are the same operation".to_string(),
        _ => "identical calls are the same operation for a while after they ran (each replay says until when)"
            .to_string(),
    };
    format!(
        "Tool calls go through once, which makes side-effecting calls happen exactly once. A repeated call is \
         answered from the ledger instead of being sent again. An application can name the operation in \
         _meta \"{key_meta}\"; without one, {keyless}. Read each result's first line: it says whether the call \
         ran, was replayed, is UNKNOWN, or was blocked."
    )
}

/// Said at start (and by `--check-config`) when `owner` is set but `account` is not: the owner says which
/// gateways are replicas of one upstream, but the default account still follows each one's command line and
/// environment, so replicas whose environments differ are different accounts and refuse each other's operations.
pub(crate) fn account_warning(config: &Config, account: &str) -> Option<String> {
    (config.owner.is_some() && config.account.is_none()).then(|| {
        format!(
            "owner is set in {} but account is not: this gateway's provider account is the default {account:?}, \
             from its upstream's command line and environment. Gateways with one owner whose command lines or \
             environments differ (replicas on other machines, a restart with a new flag) are then different \
             accounts, and each refuses the others' operations (other-account). Set account = \"NAME\" (a name \
             for the provider account, never its credential), the same on every gateway of this owner while their \
             credential is the same",
            config.source
        )
    })
}

/// What `scope = "session"` means, said wherever it is chosen.
pub const SESSION_SCOPE_WARNING: &str = "scope = \"session\": each connection is its own scope, so after the \
     gateway or its host restarts, a retry with the same operation key is a NEW operation and may run twice; use \
     the default (one fixed scope) unless that is what you want";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_without_an_account_is_warned_of() {
        let config = |text: &str| Config::parse(text, "once.toml").unwrap();
        let warned = account_warning(&config("owner = \"refunds\""), "upstream #3fa2c19e0b7d").unwrap();
        assert!(
            warned.contains("once.toml") && warned.contains("upstream #3fa2c19e0b7d") && warned.contains("account = "),
            "{warned}"
        );
        assert_eq!(
            account_warning(&config("owner = \"refunds\"\naccount = \"stripe-live\""), "stripe-live"),
            None
        );
        assert_eq!(
            account_warning(&config(""), "upstream #3fa2c19e0b7d"),
            None,
            "the default owner follows the account"
        );
        assert!(
            Config::parse("account = \" \"", "once.toml")
                .unwrap_err()
                .contains("account is empty")
        );
    }
}
