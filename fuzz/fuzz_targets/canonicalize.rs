//! Canonicalize arbitrary bytes. Never a panic; a success is a fixed point,
//! means the same value as the input, agrees with the tree path (`parse` +
//! `write_canonical`), and agrees with `serde_json_canonicalizer` whenever
//! that crate accepts the input too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use once_fuzz::canon::check_canonicalize;

fuzz_target!(|data: &[u8]| check_canonicalize(data));
