//! The refund API as an MCP server on stdin/stdout, in front of its own refund service on a SQLite ledger.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use refund::mcp::{McpOptions, serve_stdio};
use refund::{Fault, Mode};

/// Serve `get_order`, `refund_order` and `find_refund_by_key` over MCP (stdio).
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Effect ledger; created and seeded with order 1234 ($500.00) if missing.
    #[arg(long)]
    db: PathBuf,
    /// `unsafe` (never dedupes, like the study's server) or `idempotent`.
    #[arg(long, default_value = "idempotent", value_parser = |s: &str| s.parse::<Mode>().map_err(|e| e.to_string()))]
    mode: Mode,
    /// Act out this fault on the first `refund_order` against this ledger (see `refund::mcp`).
    #[arg(long, default_value = "none", value_parser = |s: &str| s.parse::<Fault>().map_err(|e| e.to_string()))]
    fault: Fault,
    /// How late the reply comes under `late_reply`, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    late_reply_ms: u64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut options = McpOptions::new(args.db);
    options.mode = args.mode;
    options.fault = args.fault;
    options.late_reply = Duration::from_millis(args.late_reply_ms);
    let code = match serve_stdio(options).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("refund-mcp: {e}");
            1
        }
    };
    // A held reply (crash_after_dispatch) or the blocking stdin reader must not keep the process alive.
    std::process::exit(code)
}
