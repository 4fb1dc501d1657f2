//! The properties the fuzz targets check, as plain functions so that a
//! finding can be replayed (and turned into a test) without libFuzzer.
//!
//! `machine` and `truthful` decode operation sequences from the fuzzer's
//! bytes and run them through the model that `guest/tests/proptest_machine.rs`
//! drives with proptest (`guest/tests/model/`, included here by path).

#[path = "../../guest/tests/model/mod.rs"]
pub mod model;

pub mod canon;
pub mod machine;
pub mod truthful;
