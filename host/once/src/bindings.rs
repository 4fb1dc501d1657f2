//! Host-side bindings generated from `wit/once.wit`. Private: the world and
//! the export handles take wasmtime types, so only `types` (the WIT data
//! types) is public, as `once::types`; [`crate::runtime`] wraps the rest.
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "once",
    additional_derives: [PartialEq, Eq, serde::Serialize, serde::Deserialize],
});

// `self::`: in a doctest the crate `once` is in scope too.
pub use self::once::core::types;
