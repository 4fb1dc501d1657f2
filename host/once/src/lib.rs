//! once host: runs the once component under wasmtime and supplies its I/O.
//!
//! ```ignore
//! use once::{Called, Once, Sent};
//!
//! let once = Once::sqlite("once.db")?.build()?;
//! let called = once.call("tenant-1", Some("refund-1234"), "refund_order", r#"{"order":1234,"amount":200}"#, |d| {
//!     // send d.args with d.provider_key as the idempotency key
//!     Sent::Success(r#"{"refund_id":"r_1"}"#.to_string())
//! })?;
//! assert!(matches!(called, Called::Confirmed { .. }));
//! # Ok::<(), once::OnceError>(())
//! ```
//!
//! Cargo features: `postgres` (off by default) adds the PostgreSQL ledger
//! (`storage::postgres`, `postgres://…` locations).
#![warn(missing_docs)]

mod bindings;
mod display;
pub mod io;
pub(crate) mod once;
pub mod runtime;
pub mod storage;

pub use crate::bindings::types;
pub use crate::io::{Clock, LogOperator, ManualClock, NoProvider, Operator, Provider, SystemClock};
pub use crate::once::{
    Builder, Called, DEFAULT_OWNER, Dispatch, ListedRecord, Once, OnceError, Sent, default_settings,
};
pub use crate::runtime::{GuestLimit, GuestLimits};
pub use crate::storage::Stats;
