//! Types and imports generated from `wit/once.wit`.
//!
//! The rules use these types directly, so the wasm shell stays a thin
//! adapter and the WIT file is the only definition of every decision,
//! state and error.
#![allow(missing_docs, clippy::all)]

wit_bindgen::generate!({
    path: "../wit",
    world: "once",
    additional_derives: [PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize],
    // `step`, `batch` and the other types whose JSON form crosses as text are in no signature.
    generate_unused_types: true,
});
