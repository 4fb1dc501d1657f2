//! The record state machine under an arbitrary sequence of operations
//! against the in-memory ledger: the invariants of the core's property test
//! hold after every step.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use once_fuzz::machine::{decode, run};

fuzz_target!(|data: &[u8]| {
    let Ok((knobs, ops)) = decode(&mut Unstructured::new(data)) else {
        return;
    };
    if let Err(violation) = run(knobs, ops) {
        panic!("{violation}");
    }
});
