//! Checks on what callers hand the engine: limits, names, JSON errors.

use alloc::format;
use alloc::string::{String, ToString};

use crate::canon;
use crate::types::{Error, JsonError, JsonErrorKind, Settings};

/// The JSON limits of the host's settings.
pub fn limits(settings: &Settings) -> canon::Limits {
    canon::Limits {
        max_input_bytes: settings.max_input_bytes as usize,
        max_depth: settings.max_depth as usize,
    }
}

/// The WIT form of a canonical-JSON error.
pub fn json_error(e: canon::Error) -> Error {
    Error::InvalidJson(to_wit_json_error(e))
}

/// The WIT form of a canonical-JSON error, without the outer variant.
pub fn to_wit_json_error(e: canon::Error) -> JsonError {
    use canon::ErrorKind as K;
    let kind = match e.kind {
        K::Syntax => JsonErrorKind::Syntax,
        K::TrailingData => JsonErrorKind::TrailingData,
        K::DuplicateKey => JsonErrorKind::DuplicateKey,
        K::LoneSurrogate => JsonErrorKind::LoneSurrogate,
        K::InvalidUtf8 => JsonErrorKind::InvalidUtf8,
        K::NonFiniteNumber => JsonErrorKind::NonFiniteNumber,
        K::NumberOutOfRange => JsonErrorKind::NumberOutOfRange,
        K::InexactNumber => JsonErrorKind::InexactNumber,
        K::TooDeep => JsonErrorKind::TooDeep,
        K::TooLarge => JsonErrorKind::TooLarge,
    };
    JsonError {
        kind,
        pointer: e.pointer,
        offset: e.offset as u64,
        message: e.message,
    }
}

/// A scope or operation key: non-empty, within the length limit, no control characters.
pub fn check_name(what: &str, value: &str, settings: &Settings) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::InvalidRequest(format!("{what} is empty")));
    }
    if value.len() > settings.max_key_bytes as usize {
        return Err(Error::InvalidRequest(format!(
            "{what} is {} bytes, over the limit of {}",
            value.len(),
            settings.max_key_bytes
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::InvalidRequest(format!("{what} contains a control character")));
    }
    Ok(())
}

/// A receipt (a provider's response, a lookup's or an operator's receipt),
/// checked to be strict I-JSON within the limits and kept exactly as written:
/// the provider's words are never re-serialized through doubles.
pub fn checked_receipt(text: String, settings: &Settings) -> Result<String, Error> {
    canon::validate(text.as_bytes(), &limits(settings)).map_err(json_error)?;
    Ok(text)
}

/// A note for an operator command: required.
pub fn check_note(note: &str) -> Result<(), Error> {
    if note.trim().is_empty() {
        return Err(Error::InvalidRequest(
            "an operator resolution needs a --note".to_string(),
        ));
    }
    Ok(())
}
