//! RFC 8785 canonical JSON over strict I-JSON input.
//!
//! [`parse`] reads bytes as strict I-JSON (RFC 7493 over RFC 8259): invalid
//! UTF-8, duplicate object keys, lone surrogate escapes, `NaN`/`Infinity` and
//! numbers outside the IEEE-754 double range are rejected with a typed
//! [`Error`] that names the [`ErrorKind`], the JSON pointer of the value being
//! read and the byte offset. Nothing is ever silently repaired.
//!
//! [`write_canonical`] produces the RFC 8785 (JCS) form: object members sorted
//! by the UTF-16 code units of their keys, no whitespace, minimal string
//! escaping and ECMAScript `Number::toString` numbers ([`format_number`]).
//! [`canonicalize`] does both without building a tree and gives exactly the
//! same result (output or error) as `parse` followed by `write_canonical`.
//!
//! The parser keeps its own stack, so hostile nesting is bounded by
//! [`Limits::max_depth`] and never by the Rust call stack. Dropping, cloning or
//! comparing a [`Value`] is recursive, so trees built with a very large depth
//! limit should stay within what the call stack can take; `canonicalize`
//! builds no tree and has no such concern.

mod number;
mod parse;
mod pointer;
mod write;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

pub use number::format_number;
pub use pointer::check_pointer;
pub use write::write_canonical;
pub(crate) use write::write_string;

/// Input limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest accepted input in bytes; longer input is [`ErrorKind::TooLarge`].
    pub max_input_bytes: usize,
    /// Deepest accepted nesting of arrays and objects (a scalar at the root is
    /// depth 0, `[]` is depth 1); deeper input is [`ErrorKind::TooDeep`].
    pub max_depth: usize,
}

impl Default for Limits {
    /// 1 MiB of input and a nesting depth of 128.
    fn default() -> Self {
        Limits {
            max_input_bytes: 1_048_576,
            max_depth: 128,
        }
    }
}

/// What was wrong with the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not JSON (RFC 8259 grammar), including raw control characters in strings.
    Syntax,
    /// A complete value followed by something other than whitespace.
    TrailingData,
    /// An object with two members of the same (unescaped) name.
    DuplicateKey,
    /// A `\uD800`-`\uDFFF` escape that is not part of a high+low pair.
    LoneSurrogate,
    /// The input bytes are not UTF-8.
    InvalidUtf8,
    /// `NaN`, `Infinity` or `-Infinity`.
    NonFiniteNumber,
    /// A number whose magnitude rounds to infinity as an IEEE-754 double.
    NumberOutOfRange,
    /// A number whose double denotes a different decimal than its literal
    /// (`9007199254740993` reads as `9007199254740992`); only in the payload
    /// path ([`parse_exact`], [`canonicalize_exact_into`]), never in
    /// [`canonicalize`], which follows RFC 8785 and rounds.
    InexactNumber,
    /// Nesting deeper than [`Limits::max_depth`].
    TooDeep,
    /// Input longer than [`Limits::max_input_bytes`] (checked before
    /// anything else; the offset is the limit).
    TooLarge,
}

impl ErrorKind {
    /// A stable snake_case name for the kind, e.g. `"duplicate_key"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Syntax => "syntax",
            ErrorKind::TrailingData => "trailing_data",
            ErrorKind::DuplicateKey => "duplicate_key",
            ErrorKind::LoneSurrogate => "lone_surrogate",
            ErrorKind::InvalidUtf8 => "invalid_utf8",
            ErrorKind::NonFiniteNumber => "non_finite_number",
            ErrorKind::NumberOutOfRange => "number_out_of_range",
            ErrorKind::InexactNumber => "inexact_number",
            ErrorKind::TooDeep => "too_deep",
            ErrorKind::TooLarge => "too_large",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected input: the first problem in byte order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What was wrong.
    pub kind: ErrorKind,
    /// RFC 6901 JSON pointer of the value being read (`""` for the root).
    /// For a duplicate key it names the object holding the key; for an error
    /// between members or elements it names the container.
    pub pointer: String,
    /// Byte offset of the problem in the input.
    pub offset: usize,
    /// One human line, e.g. `duplicate key "a" at /x (byte 12)`.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl core::error::Error for Error {}

/// A JSON number: its IEEE-754 double value and the exact text it was
/// written as (for exact decimal arithmetic elsewhere).
///
/// Canonical output uses `value` only.
#[derive(Clone, Debug, PartialEq)]
pub struct Number {
    /// The value, rounded to nearest; never NaN or infinite when parsed.
    pub value: f64,
    /// The number exactly as it appeared in the input, e.g. `"1.50e2"`.
    pub raw: String,
}

/// A parsed JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number.
    Number(Number),
    /// A string (unescaped).
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object's members in input order; keys are unique when parsed.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// RFC 6901 lookup (`~0`/`~1` unescaped); `""` is the value itself.
    /// `None` when the pointer is malformed or names nothing.
    pub fn pointer(&self, ptr: &str) -> Option<&Value> {
        pointer::lookup(self, ptr)
    }

    /// The member `key` of an object; `None` for a missing key or a non-object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Removes and returns the member `key` of an object, keeping the order of
    /// the others; `None` for a missing key or a non-object.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        match self {
            Value::Object(members) => {
                let at = members.iter().position(|(k, _)| k == key)?;
                Some(members.remove(at).1)
            }
            _ => None,
        }
    }

    /// Sets the member `key` of an object: replaces the value in place when
    /// the key exists, appends it otherwise. Does nothing on a non-object.
    pub fn insert(&mut self, key: String, v: Value) {
        if let Value::Object(members) = self {
            match members.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = v,
                None => members.push((key, v)),
            }
        }
    }
}

/// Parses `input` as strict I-JSON into a tree.
pub fn parse(input: &[u8], limits: &Limits) -> Result<Value, Error> {
    let mut sink = parse::TreeSink::default();
    parse::run(input, limits, false, &mut sink)?;
    Ok(sink.finish())
}

/// [`parse`] for what is fingerprinted or dispatched: also refuses a number
/// whose canonical form denotes another decimal than its literal
/// ([`ErrorKind::InexactNumber`]), because two different effects would share
/// a fingerprint and the value sent would differ from the caller's.
pub fn parse_exact(input: &[u8], limits: &Limits) -> Result<Value, Error> {
    let mut sink = parse::TreeSink::default();
    parse::run(input, limits, true, &mut sink)?;
    Ok(sink.finish())
}

/// Checks that `input` is strict I-JSON within the limits, building nothing
/// (receipts are stored as their sender wrote them, once checked).
pub fn validate(input: &[u8], limits: &Limits) -> Result<(), Error> {
    parse::run(input, limits, false, &mut parse::NullSink)
}

/// Parses `input` as strict I-JSON and returns its RFC 8785 canonical form.
///
/// Same result as [`parse`] followed by [`write_canonical`], without building
/// a tree.
pub fn canonicalize(input: &[u8], limits: &Limits) -> Result<String, Error> {
    let mut out = String::with_capacity(input.len());
    canonicalize_into(input, limits, &mut out)?;
    Ok(out)
}

/// Like [`canonicalize`], appending to `out` (to reuse a buffer). On error
/// `out` is left as it was.
pub fn canonicalize_into(input: &[u8], limits: &Limits, out: &mut String) -> Result<(), Error> {
    canonicalize_with(input, limits, false, out)
}

/// [`canonicalize_into`] with [`parse_exact`]'s number rule (the payload path).
pub fn canonicalize_exact_into(input: &[u8], limits: &Limits, out: &mut String) -> Result<(), Error> {
    canonicalize_with(input, limits, true, out)
}

fn canonicalize_with(input: &[u8], limits: &Limits, exact: bool, out: &mut String) -> Result<(), Error> {
    let before = out.len();
    let mut sink = write::CanonSink::new(out);
    let result = parse::run(input, limits, exact, &mut sink);
    if result.is_err() {
        out.truncate(before);
    }
    result
}

#[cfg(test)]
mod tests;
