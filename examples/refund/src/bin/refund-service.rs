//! Runs a refund service (optionally behind a fault proxy) until killed, for poking at by hand.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use refund::{Fault, FaultProxy, Mode, ProxyOptions, Service};

/// Serve the example refund API on a SQLite ledger.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// Ledger file; created and seeded with order 1234 ($500.00) if missing.
    #[arg(long)]
    db: PathBuf,
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// `unsafe` (never dedupes) or `idempotent`.
    #[arg(long, default_value = "idempotent", value_parser = |s: &str| s.parse::<Mode>().map_err(|e| e.to_string()))]
    mode: Mode,
    /// Also start a fault proxy in front, injecting this fault into the first POST /refunds.
    #[arg(long, value_parser = |s: &str| s.parse::<Fault>().map_err(|e| e.to_string()))]
    fault: Option<Fault>,
}

fn main() -> Result<(), refund::Error> {
    let args = Args::parse();
    let service = Service::bind(&args.db, args.mode, SocketAddr::from(([127, 0, 0, 1], args.port)))?;
    println!(
        "service {} mode={} db={}",
        service.base_url(),
        service.mode(),
        args.db.display()
    );
    let _proxy = match args.fault {
        Some(fault) => {
            let proxy = FaultProxy::start(service.addr(), fault, ProxyOptions::default())?;
            println!("proxy {} fault={fault}", proxy.base_url());
            Some(proxy)
        }
        None => None,
    };
    // Serve until the process is killed; the threads do the work.
    loop {
        std::thread::park();
    }
}
