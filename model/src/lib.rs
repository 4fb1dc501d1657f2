//! An exhaustive model check of the once engine against a truthful world.
//!
//! The engine under check is the real one: `once-guest`'s native build, the
//! same code the component runs, driven through its call protocol (`start`,
//! `report`, `resume`, `sweep`) and its operator exports (`resolve`,
//! `prune`). Nothing here re-implements a rule. What this crate adds is the
//! world around the engine, as a [`stateright`] model:
//!
//! - [`world`]: one explored state — the ledger's rows and audit trail (the
//!   in-memory host's [`once_guest::testing::Ledger`]), the provider's
//!   requests and effects, each caller's position in the call protocol,
//!   the hosts' owners and clock skews, the escalation sink, and the budget
//!   of faults left to inject.
//! - [`host`]: the I/O one action lends the engine: the ledger, a host's
//!   clock, a truthful provider lookup, the sink, and injected commit
//!   failures. It records which scopes the action touched.
//! - [`model`]: the actions (each one atomic step) and the properties.
//! - [`truth`]: what makes an answer true against the world.
//! - [`fair`]: the liveness check, a fair continuation from a state.
//! - [`configs`]: the small configurations CI runs and the deep ones.
//!
//! A counterexample prints as a trace ([`trace`]): the actions in order and
//! the property they broke. docs/design.md says what is checked and what
//! the model does not cover.
#![deny(missing_docs)]

pub mod configs;
pub mod fair;
pub mod host;
pub mod model;
pub mod trace;
pub mod truth;
pub mod world;

pub use configs::Config;
pub use model::{Action, OnceModel};
pub use world::World;
