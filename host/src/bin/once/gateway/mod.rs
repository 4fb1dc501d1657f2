//! `once gateway`: an MCP proxy that puts an MCP server's tools behind once.
//!
//! The client speaks MCP to the gateway on stdin/stdout; the gateway starts
//! the upstream server as a child process and speaks MCP to it over its stdio.
//! `tools/list` passes through unchanged. Every `tools/call` goes through the
//! engine with the tool's policy (from `once.toml`, else the engine reads the
//! tool's annotations): DIRECT calls are forwarded, PROTECT calls are claimed
//! in the ledger before they are sent, BLOCK calls are answered and never sent.
//! A background loop reconciles unknown outcomes through the configured lookup
//! tool and sends owed dispatches itself.

mod config;
mod handler;
mod reply;
mod upstream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use once::storage::memory::MemoryStorage;
use once::types::Route;
use once::{Once, default_settings};
use rmcp::ServiceExt;

use self::config::{Config, ProviderKey, ScopeMode};
use self::handler::{Gateway, LookupProvider, Shared, descriptor_of, settle_round};
use self::upstream::Upstream;
use crate::Failure;

/// `once gateway [--config once.toml] [--db PATH] [--check-config] -- <upstream command…>`
#[derive(clap::Args)]
pub struct GatewayArgs {
    /// The gateway's configuration (TOML, e.g. examples/refund/once.toml); without it, annotations and derived keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Ledger: an SQLite file or a postgres:// URL [default: the config's `db`, else once.db].
    #[arg(long, env = "ONCE_DB")]
    db: Option<String>,
    /// Check the config (against the upstream, when one is given), print each tool's route, and exit.
    #[arg(long)]
    check_config: bool,
    /// The upstream MCP server's command and arguments, after `--`.
    #[arg(last = true, value_name = "UPSTREAM")]
    upstream: Vec<String>,
}

fn bad_config(message: String) -> Failure {
    Failure { code: 2, message }
}

fn failed(message: String) -> Failure {
    Failure { code: 1, message }
}

/// Run the gateway until the client hangs up and unsettled operations are settled (or the grace ends).
pub fn run(args: GatewayArgs) -> Result<(), Failure> {
    let config = match &args.config {
        Some(path) => Config::load(path).map_err(bad_config)?,
        None => Config::default(),
    };
    if args.upstream.is_empty() {
        if args.check_config {
            return check_static(&config);
        }
        return Err(bad_config(
            "no upstream command: once gateway [--config FILE] -- <command> [args…]".to_string(),
        ));
    }
    let db = args
        .db
        .clone()
        .or_else(|| config.db.as_ref().map(|p| p.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "once.db".to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| failed(format!("starting the async runtime: {e}")))?;
    let result = runtime.block_on(serve(config, db, args));
    // The stdin reader of a finished session may still be parked in a blocking read.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn serve(config: Config, db: String, args: GatewayArgs) -> Result<(), Failure> {
    let upstream = Upstream::start(args.upstream.clone()).await.map_err(failed)?;
    let names: Vec<String> = upstream.tools().iter().map(|t| t.name.to_string()).collect();
    if let Err(e) = config.check_tools(&names) {
        upstream.shutdown().await;
        return Err(bad_config(e));
    }
    let shared = Arc::new(Shared::new(config, upstream, tokio::runtime::Handle::current()));
    let opened = {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || open(&shared, &db))
            .await
            .map_err(|e| failed(format!("opening the ledger: {e}")))?
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
            tokio::task::spawn_blocking(move || print_routes(&shared, &once)).await
        };
        shared.upstream.shutdown().await;
        return printed.map_err(|e| failed(e.to_string()))?;
    }

    let worker = {
        let (shared, once) = (shared.clone(), once.clone());
        tokio::spawn(async move {
            loop {
                let (s, o) = (shared.clone(), once.clone());
                let _ = tokio::task::spawn_blocking(move || settle_round(&s, &o)).await;
                tokio::time::sleep(shared.config.sweep_interval).await;
            }
        })
    };
    if shared.config.scope == ScopeMode::Session {
        tracing::warn!(target: "once::gateway", "{SESSION_SCOPE_WARNING}");
    }
    let gateway = Gateway::new(shared.clone(), once.clone(), session_scope(), instructions(&shared));
    let served = match gateway.serve(rmcp::transport::stdio()).await {
        Ok(running) => {
            let _ = running.waiting().await;
            Ok(())
        }
        Err(e) => Err(failed(format!("the client did not initialize: {e}"))),
    };
    // The client is gone; operations it left unsettled are still ours to finish.
    let grace = Instant::now() + shared.config.shutdown_grace;
    while shared.has_pending() && Instant::now() < grace {
        tokio::time::sleep(shared.config.sweep_interval).await;
    }
    if shared.has_pending() {
        tracing::warn!(target: "once::gateway", "exiting with unsettled operations; the next gateway or `once sweep` continues them");
    }
    worker.abort();
    shared.upstream.shutdown().await;
    served
}

/// The engine over the ledger, with the lookup provider and every tool's policy checked now, not at the first call.
fn open(shared: &Arc<Shared>, db: &str) -> Result<Once, Failure> {
    let settings = once::types::Settings {
        clock_skew_ms: shared.config.clock_skew_ms,
        owner: owner(shared),
        ..default_settings()
    };
    let once = Once::open(db)
        .and_then(|b| {
            shared.set_ledger_clock(b.ledger_clock());
            b.provider(LookupProvider(shared.clone()))
                .settings(settings)
                .in_flight_wait(shared.config.in_flight_wait)
                .build()
        })
        .map_err(|e| failed(format!("ledger {db}: {e}")))?;
    let mut tools: Vec<String> = shared.upstream.tools().iter().map(|t| t.name.to_string()).collect();
    tools.extend(shared.config.named_tools().map(str::to_string));
    let mut errors = Vec::new();
    for tool in tools {
        if let Err(e) = shared.plan(&once, &tool) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(once)
    } else {
        errors.dedup();
        Err(bad_config(errors.join("\n")))
    }
}

/// Who dispatches this gateway's operations: the configured `owner`, else the upstream's
/// command line. Gateways with one owner settle each other's records; others never touch them.
fn owner(shared: &Shared) -> String {
    shared
        .config
        .owner
        .clone()
        .unwrap_or_else(|| format!("gateway: {}", shared.upstream.command_line()))
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

/// What `scope = "session"` means, said wherever it is chosen.
pub const SESSION_SCOPE_WARNING: &str = "scope = \"session\": each connection is its own scope, so after the \
     gateway or its host restarts, a retry with the same operation key is a NEW operation and may run twice; use \
     the default (one fixed scope) unless that is what you want";

/// `--check-config` without an upstream: every configured tool's policy through the engine's own check.
fn check_static(config: &Config) -> Result<(), Failure> {
    let once = Once::builder(MemoryStorage::new())
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let default = once.default_policy().map_err(|e| failed(e.to_string()))?;
    let mut errors = Vec::new();
    for tool in config.named_tools() {
        let checked = config
            .plan(tool, &default)
            .and_then(|plan| once.set_policy(tool, plan.policy).map_err(|e| e.to_string()));
        if let Err(e) = checked {
            errors.push(format!("{}: [tools.{tool}]: {e}", config.source));
        }
    }
    if !errors.is_empty() {
        return Err(bad_config(errors.join("\n")));
    }
    println!(
        "{}: ok (give the upstream command after `--` to check tool names and print every route)",
        config.source
    );
    if config.scope == ScopeMode::Session {
        println!("  warning: {SESSION_SCOPE_WARNING}");
    }
    for tool in config.named_tools() {
        let how = if config.routes_explicitly(tool) {
            "route set in the config"
        } else {
            "route from the upstream's annotations"
        };
        println!("  {tool}: {how}");
    }
    Ok(())
}

fn print_routes(shared: &Shared, once: &Once) -> Result<(), Failure> {
    let config = &shared.config;
    println!(
        "{}: ok; upstream `{}` lists {} tools; scope {}; owner {:?}",
        config.source,
        shared.upstream.command_line(),
        shared.upstream.tools().len(),
        match &config.scope {
            ScopeMode::Session => "per session".to_string(),
            ScopeMode::Fixed(name) => format!("fixed {name:?}"),
            ScopeMode::Meta(field) => format!("from _meta {field:?} (a call without it is refused)"),
        },
        owner(shared),
    );
    if config.scope == ScopeMode::Session {
        println!("warning: {SESSION_SCOPE_WARNING}");
    }
    for tool in shared.upstream.tools() {
        let name = tool.name.to_string();
        let plan = shared.plan(once, &name).map_err(bad_config)?;
        let route = once
            .route(&name, Some(&descriptor_of(&tool)))
            .map_err(|e| failed(e.to_string()))?;
        let source = if config.routes_explicitly(&name) {
            "config".to_string()
        } else {
            match &tool.annotations {
                Some(a) => format!("annotations {}", serde_json::to_string(a).unwrap_or_default()),
                None => "no annotations: protected by default".to_string(),
            }
        };
        let mut line = format!("{name:<24} {:<8} {source}", route.to_string());
        if route == Route::Protect {
            let p = &plan.policy;
            line.push_str(&format!(
                "; key: _meta {:?} or derived from the arguments; timeout {} ms",
                config.key_meta, p.dispatch_timeout_ms
            ));
            match &plan.provider_key {
                ProviderKey::Argument(a) => line.push_str(&format!("; provider key -> argument {a}")),
                ProviderKey::Meta(m) => line.push_str(&format!("; provider key -> _meta {m}")),
                ProviderKey::Default => {}
            }
            match &plan.lookup {
                Some(l) => line.push_str(&format!("; reconciles via {}", l.tool)),
                None => line.push_str("; no lookup: an unknown outcome waits for an operator"),
            }
            if let Some(q) = &p.quota {
                line.push_str(&format!(
                    "; quota {} per {} ms on {}",
                    q.ceiling, q.window_ms, q.spend_field
                ));
            }
        }
        println!("{line}");
    }
    Ok(())
}
