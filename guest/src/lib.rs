//! The rules of once, as a plain `no_std` library.
//!
//! Everything DESIGN.md decides lives here: canonical JSON, fingerprints,
//! routing, identity, quotas, the record state machine ([`engine`]) and the
//! call protocol that drives it for hosts ([`protocol`]). The crate does no
//! I/O of its own: every read, write, clock tick, provider lookup and
//! escalation goes through the [`host::Host`] trait, which the wasm shell
//! ([`component`], on `wasm32` only) implements with the WIT imports and
//! tests implement in memory ([`testing`]).
#![no_std]
#![deny(missing_docs)]

extern crate alloc;
#[cfg(not(target_arch = "wasm32"))]
extern crate std;

pub mod amount;
pub mod bindings;
pub mod body;
pub mod canon;
pub mod config;
pub mod digest;
pub mod engine;
pub mod host;
pub mod identity;
pub mod input;
mod json_out;
pub mod mutant;
pub mod payload;
pub mod policy;
pub mod protocol;
pub mod reads;
pub mod record;
pub mod secret;
pub mod store;
pub mod wire;

#[cfg(target_arch = "wasm32")]
mod component;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

/// Every WIT type (decisions, states, evidence, errors, rows).
pub mod types {
    pub use crate::bindings::once::core::types::*;
}
