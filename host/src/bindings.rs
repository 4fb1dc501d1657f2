//! Host-side bindings generated from `wit/once.wit`.
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "once",
    additional_derives: [PartialEq, Eq, serde::Serialize, serde::Deserialize],
});

pub use exports::once::core::engine;
pub use once::core::types;
