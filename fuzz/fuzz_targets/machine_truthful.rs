//! The state machine against a provider that tells the truth (with replica
//! lag, lost replies and storage failures): never a second effect for one
//! operation, and a receipt is always the effect's.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use once_fuzz::truthful::{decode, truthful_run};

fuzz_target!(|data: &[u8]| {
    let Ok((verify_first, budget, ops)) = decode(&mut Unstructured::new(data)) else {
        return;
    };
    if let Err(violation) = truthful_run(verify_first, budget, ops) {
        panic!("{violation}");
    }
});
