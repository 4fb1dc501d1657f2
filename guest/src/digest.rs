//! SHA-256 over canonical JSON, as lower-case hex.

use alloc::string::String;
use sha2::{Digest, Sha256};

use crate::canon::{Value, format_number, write_canonical};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
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

/// One member of a hashed JSON array (fences, provider keys, escalation ids).
#[derive(Debug, Clone, Copy)]
pub enum Part<'a> {
    /// A string.
    Str(&'a str),
    /// An integer, written as the double it denotes (as a tree's number would be).
    Int(u64),
}

/// [`sha256_jcs`] of a JSON array of strings and integers, written straight
/// into the hashed text: the same bytes as the tree, without building one
/// (a call hashes three such arrays; BENCHMARKS.md row 2).
pub fn sha256_jcs_array(parts: &[Part<'_>]) -> String {
    sha256_hex(jcs_array(parts).as_bytes())
}

/// Lower-case hex HMAC-SHA-256 (RFC 2104), keyed by `key`, of the same
/// array text [`sha256_jcs_array`] hashes: what provider keys are now, so
/// nobody without the ledger's secret can compute one (DESIGN.md "Provider
/// keys are not guessable").
pub fn hmac_sha256_jcs_array(key: &[u8], parts: &[Part<'_>]) -> String {
    use hmac::{Hmac, Mac};
    // HMAC takes a key of any length (a long one is hashed first): nothing fails here.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts every key length");
    mac.update(jcs_array(parts).as_bytes());
    hex(&mac.finalize().into_bytes())
}

/// The RFC 8785 text of a JSON array of strings and integers.
fn jcs_array(parts: &[Part<'_>]) -> String {
    let mut text = String::with_capacity(
        parts
            .iter()
            .map(|p| match p {
                Part::Str(s) => s.len() + 3,
                Part::Int(_) => 21,
            })
            .sum::<usize>()
            + 2,
    );
    text.push('[');
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        match *part {
            Part::Str(s) => crate::canon::write_string(s, &mut text),
            // Below 2^53 the double is exact and ES6 writes its digits; above, its shortest form.
            Part::Int(n) if n <= 1 << 53 => {
                use core::fmt::Write as _;
                let _ = write!(text, "{n}");
            }
            Part::Int(n) => format_number(n as f64, &mut text),
        }
    }
    text.push(']');
    text
}

/// Whether `s` looks like a lower-case hex SHA-256.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canon::Number;
    use alloc::string::ToString;
    use alloc::vec::Vec;

    fn tree(parts: &[Part<'_>]) -> Value {
        Value::Array(
            parts
                .iter()
                .map(|p| match *p {
                    Part::Str(s) => Value::String(s.to_string()),
                    Part::Int(n) => Value::Number(Number {
                        value: n as f64,
                        raw: n.to_string(),
                    }),
                })
                .collect(),
        )
    }

    #[test]
    fn array_hash_is_the_trees() {
        let strings = [
            "",
            "once-fence",
            "tenant",
            "k\"ey\\\n\u{1}",
            "café \u{1f600}",
            "\u{7f}\u{2028}",
        ];
        let ints = [
            0,
            1,
            9,
            10,
            1_796_227_784_478,
            (1 << 53) - 1,
            1 << 53,
            (1 << 53) + 1,
            1 << 60,
            10u64.pow(19),
            u64::MAX,
        ];
        for s in strings {
            for n in ints {
                for parts in [
                    alloc::vec![Part::Str(s), Part::Int(n)],
                    alloc::vec![Part::Int(n), Part::Str(s), Part::Int(n), Part::Str("x")],
                    Vec::new(),
                ] {
                    assert_eq!(sha256_jcs_array(&parts), sha256_jcs(&tree(&parts)), "{parts:?}");
                }
            }
        }
    }
}
