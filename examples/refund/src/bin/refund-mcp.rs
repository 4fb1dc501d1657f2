//! The refund API as an MCP server on stdin/stdout (or over Streamable HTTP with `--listen`), in front of its own
//! refund service on a SQLite ledger.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use refund::mcp::{HTTP_PATH, McpOptions, serve_http, serve_stdio};
use refund::{Fault, Mode};

/// Serve `get_order`, `refund_order` and `find_refund_by_key` over MCP (stdio, or Streamable HTTP with `--listen`).
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
    /// Serve Streamable HTTP on this address (e.g. 127.0.0.1:8931; port 0 picks one) at /mcp instead of stdio;
    /// the address is printed on stderr once it accepts connections.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut options = McpOptions::new(args.db);
    options.mode = args.mode;
    options.fault = args.fault;
    options.late_reply = Duration::from_millis(args.late_reply_ms);
    let served = match args.listen {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                serve_http(options, listener, |at| {
                    eprintln!("refund-mcp: listening on http://{at}{HTTP_PATH}")
                })
                .await
            }
            Err(e) => Err(e.into()),
        },
        None => serve_stdio(options).await,
    };
    let code = match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("refund-mcp: {e}");
            1
        }
    };
    // A held reply (crash_after_dispatch) or the blocking stdin reader must not keep the process alive.
    std::process::exit(code)
}
