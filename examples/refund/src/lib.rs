//! A refund service for the `once demo` fault-injection trials: an effect ledger (SQLite), a tiny HTTP API in two
//! modes (unsafe: never dedupes; idempotent: dedupes by key), a fault-injecting proxy that loses, delays or rejects
//! the first refund request, and a small client that classifies failures as definite or ambiguous. The second
//! study's [`tool_server`] (one `POST /tool`, effects and responses tables, server-side stalls) lives here too.
//!
//! Everything binds to 127.0.0.1 on ephemeral ports and stops on `Drop`, joining every thread it started, so a demo
//! can run thousands of fresh service + proxy pairs in one process.

#![deny(missing_docs)]

mod client;
mod http;
mod ledger;
pub mod mcp;
mod money;
mod proxy;
mod server;
mod service;
pub mod tool_server;

pub use client::{CallError, Client, Lookup, Order, RefundReceipt};
pub use ledger::{EffectLedger, ORDER_ID, ORDER_TOTAL_CENTS, Refund};
pub use proxy::{Fault, FaultProxy, ProxyOptions, ProxyStats};
pub use service::{Mode, Service};

use std::time::{SystemTime, UNIX_EPOCH};

/// Errors from starting a service or proxy, reading the ledger, or parsing a name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The SQLite ledger could not be opened, created or read.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A socket or thread could not be set up.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The name is not one of [`Fault::ALL`].
    #[error("unknown fault {0:?}")]
    UnknownFault(String),
    /// The name is not one of [`Mode::ALL`].
    #[error("unknown mode {0:?}")]
    UnknownMode(String),
}

/// Milliseconds since the Unix epoch by the system clock, the one clock the service, proxy and ledger share.
pub fn now_ms() -> u64 {
    // A clock before 1970 is a broken machine, not a case to model: report the epoch.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
