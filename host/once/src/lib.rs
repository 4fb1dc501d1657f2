//! once host: runs the once component under wasmtime and supplies its I/O.
//!
//! ```no_run
//! use once::{Once, Sent};
//! use once::types::Effect;
//!
//! let once = Once::sqlite("once.db")?.build()?;
//! let called = once.call("tenant-1", Some("refund-1234"), "refund_order", r#"{"order":1234,"amount":200}"#, |d| {
//!     // send d.args with d.provider_key as the idempotency key, within d.timeout
//!     Sent::Success(r#"{"refund_id":"r_1"}"#.to_string())
//! })?;
//! assert_eq!(called.effect(), Effect::Happened);
//! # Ok::<(), once::OnceError>(())
//! ```
//!
//! [`Once::call`] is the call protocol's loop; the component decides every
//! step. Cargo features, both off by default: `postgres` adds the PostgreSQL
//! ledger (`storage::postgres`, `postgres://…` locations); `tokio` adds the
//! same loop for async hosts (`Once::call_async`, module `call_async`),
//! which stops the sender at its deadline.
#![deny(missing_docs)]

mod bindings;
#[cfg(feature = "tokio")]
pub mod call_async;
mod display;
mod driving;
pub mod io;
pub mod metrics;
pub(crate) mod once;
mod operators;
pub mod runtime;
pub mod storage;
mod turns;

pub use crate::bindings::types;
#[cfg(feature = "tokio")]
pub use crate::call_async::Dispatcher;
pub use crate::display::UtcTime;
pub use crate::io::{
    Clock, Entropy, FixedEntropy, LogOperator, ManualClock, NoProvider, Operator, Provider, SystemClock, SystemEntropy,
};
pub use crate::once::{Builder, Called, DEFAULT_OWNER, Dispatch, Once, OnceError, Sent, Settled, default_settings};
pub use crate::operators::{ListedRecord, Transitions};
pub use crate::runtime::{GuestLimit, GuestLimits};
pub use crate::storage::Stats;

/// A tool policy with nothing set: set the fields the user configured, and
/// the engine fills the rest (`Builder::policy`, `Builder::defaults`).
pub fn policy_input() -> types::PolicyInput {
    types::PolicyInput {
        route: None,
        identity: None,
        key_argument: None,
        key_sent_by_host: None,
        effect_fields: None,
        verify_first: None,
        provider_claims_key: None,
        lookup: None,
        max_in_flight_ms: None,
        dispatch_timeout_ms: None,
        lease_ms: None,
        attempt_budget: None,
        derived_window_ms: None,
        resolve_deadline_ms: None,
        reconcile_interval_ms: None,
        retention_ms: None,
        tombstone_retention_ms: None,
        quota: None,
        descriptor_pin: None,
        approval: None,
        approval_valid_ms: None,
        approval_wait_ms: None,
        provider_account: None,
    }
}
