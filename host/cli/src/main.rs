//! `once`: the command line over the once component and its ledger.

mod demo;
mod ledger;
mod ui;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use once::storage::memory::MemoryStorage;
use once::{Once, OnceError};
use once_gateway::GatewayError;

/// Exactly-once execution for side-effecting tool calls.
#[derive(Parser)]
#[command(name = "once", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the ledger lives.
#[derive(clap::Args, Clone)]
struct Db {
    /// The ledger: an SQLite file, or a PostgreSQL URL (postgres://user@host:5432/db, optionally ?schema=NAME).
    #[arg(long, env = "ONCE_DB", default_value = "once.db", global = true)]
    db: String,
}

#[derive(Subcommand)]
enum Command {
    /// The published studies, reproduced: the refund fault matrix (default), or `--study retry-cost`.
    Demo(demo::DemoArgs),
    /// One demo agent as its own process (used by `once demo`).
    #[command(hide = true)]
    DemoAgent(demo::AgentArgs),
    /// Read JSON on stdin, print its RFC 8785 canonical form (no trailing newline).
    Canon,
    /// Read a tool's args (JSON) on stdin, print sha256(JCS({"tool":…,"args":…})) in hex.
    Fingerprint {
        /// Tool name.
        #[arg(long)]
        tool: String,
    },
    /// Inspect and resolve the ledger.
    Ledger {
        #[command(flatten)]
        db: Db,
        #[command(subcommand)]
        command: ledger::LedgerCommand,
    },
    /// Expire leases, reconcile due unknowns, escalate past deadlines: for one owner's records.
    Sweep {
        #[command(flatten)]
        db: Db,
        /// Whose records (a gateway's `owner`; hosts that name none are `default`).
        #[arg(long, default_value = once::DEFAULT_OWNER)]
        owner: String,
        /// Most records to look at.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
    /// An MCP proxy: serve an upstream MCP server's tools over stdio (or Streamable HTTP), protected by once.
    Gateway(GatewayArgs),
    /// The operator's page: the queue of unknown records, audit trails, audited resolution, /metrics.
    Ui(ui::UiArgs),
    /// Prune confirmed, failed and superseded records past retention to tombstones.
    Prune {
        #[command(flatten)]
        db: Db,
        /// Most records to prune.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
    },
}

/// `once gateway [--config once.toml] [--db PATH] [--check-config] [--listen ADDR [--public]] (-- <upstream command…> | --upstream-url URL)`
#[derive(clap::Args)]
struct GatewayArgs {
    /// The gateway's configuration (TOML, e.g. examples/refund/once.toml); without it, annotations and derived keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Ledger: an SQLite file or a postgres:// URL [default: the config's `db`, else once.db].
    #[arg(long, env = "ONCE_DB")]
    db: Option<String>,
    /// Check the config (against the upstream, when one is given), print each tool's route, and exit.
    #[arg(long)]
    check_config: bool,
    /// Serve MCP over Streamable HTTP on this address (e.g. 127.0.0.1:8080; port 0 picks one and prints it)
    /// at /mcp, with /healthz and /metrics, instead of stdio.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Allow --listen on an address other than loopback with no [http] tenants (something in front of the
    /// gateway authenticates every caller).
    #[arg(long, requires = "listen")]
    public: bool,
    /// The upstream MCP server's command and arguments, after `--`.
    #[arg(last = true, value_name = "UPSTREAM")]
    upstream: Vec<String>,
    /// The upstream MCP server's URL (Streamable HTTP, http://), instead of a command [default: the config's `upstream_url`].
    #[arg(long, value_name = "URL")]
    upstream_url: Option<String>,
}

impl From<GatewayArgs> for once_gateway::Options {
    fn from(args: GatewayArgs) -> Self {
        once_gateway::Options {
            config: args.config,
            db: args.db,
            check_config: args.check_config,
            upstream: args.upstream,
            listen: args.listen,
            public: args.public,
            upstream_url: args.upstream_url,
        }
    }
}

/// A CLI failure: the message and the exit code (2 for bad input).
struct Failure {
    code: u8,
    message: String,
}

impl From<GatewayError> for Failure {
    fn from(e: GatewayError) -> Self {
        Failure {
            code: e.exit_code(),
            message: e.to_string(),
        }
    }
}

impl From<OnceError> for Failure {
    fn from(e: OnceError) -> Self {
        let code = match &e {
            OnceError::Json(_)
            | OnceError::Engine(
                once::types::Error::InvalidJson(_)
                | once::types::Error::InvalidRequest(_)
                | once::types::Error::InvalidPolicy(_)
                | once::types::Error::InvalidTransition(_)
                | once::types::Error::NotFound,
            ) => 2,
            _ => 1,
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    // Warnings by default: the gateway's start warnings (a session scope, keyless calls identified by every
    // argument, orphaned records) and its exit with operations unsettled are for the user who never sets
    // ONCE_LOG.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .with_env_var("ONCE_LOG")
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("once: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Demo(args) => demo::run(args),
        Command::DemoAgent(args) => demo::run_agent(args),
        Command::Gateway(args) => Ok(once_gateway::run(args.into())?),
        Command::Ui(args) => ui::run(args),
        Command::Canon => {
            let input = read_stdin()?;
            let canonical = engine_only()?.canonicalize(&input)?;
            print_raw(&canonical)
        }
        Command::Fingerprint { tool } => {
            let input = read_stdin()?;
            let args = String::from_utf8(input).map_err(|e| Failure {
                code: 2,
                message: format!("stdin is not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
            })?;
            let fingerprint = engine_only()?.fingerprint(&tool, &args)?;
            print_raw(&format!("{fingerprint}\n"))
        }
        Command::Ledger { db, command } => ledger::run(&open(&db)?, command),
        Command::Sweep { db, owner, limit } => {
            // This CLI has no provider lookup: it expires leases and escalates, and reads nothing
            // (the owner's gateway makes the due reads and sends the owed dispatches).
            let report = Once::open(&db.db)?.owner(owner).build()?.sweep(limit)?;
            println!(
                "expired {}  due reads {}  owed {}  escalated {}",
                report.expired,
                report.reads.len(),
                report.owed.len(),
                report.escalated
            );
            for (scope, key) in report.reads {
                println!("due read: {scope} {key}");
            }
            for (scope, key) in report.owed {
                println!("owed dispatch: {scope} {key}");
            }
            Ok(())
        }
        Command::Prune { db, limit } => {
            let report = open(&db)?.prune(limit)?;
            println!(
                "pruned {}  tombstones removed {}",
                report.pruned, report.tombstones_removed
            );
            Ok(())
        }
    }
}

/// The engine over an in-memory ledger: for commands that never touch records.
fn engine_only() -> Result<Once, Failure> {
    Ok(Once::builder(MemoryStorage::new()).build()?)
}

fn open(db: &Db) -> Result<Once, Failure> {
    Ok(Once::open(&db.db)?.build()?)
}

fn read_stdin() -> Result<Vec<u8>, Failure> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).map_err(|e| Failure {
        code: 1,
        message: format!("reading stdin: {e}"),
    })?;
    Ok(input)
}

fn print_raw(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failure {
            code: 1,
            message: format!("writing stdout: {e}"),
        })
}
