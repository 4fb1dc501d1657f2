//! SHA-256 over canonical JSON, as lower-case hex.

use alloc::string::String;
use sha2::{Digest, Sha256};

use crate::canon::{Value, write_canonical};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Lower-case hex SHA-256 of the RFC 8785 form of `value`.
pub fn sha256_jcs(value: &Value) -> String {
    let mut text = String::new();
    write_canonical(value, &mut text);
    sha256_hex(text.as_bytes())
}

/// Whether `s` looks like a lower-case hex SHA-256.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const HEX: &[u8; 16] = b"0123456789abcdef";
