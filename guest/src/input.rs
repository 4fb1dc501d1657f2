//! Checks on what callers hand the engine: limits, names, JSON errors.

use alloc::format;
use alloc::string::{String, ToString};

use crate::canon;
use crate::digest::sha256_hex;
use crate::record::{Receipt, ReceiptFlaw};
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

/// A scope, operation key or tool name an operation is begun (or a tool
/// configured) under: [`check_name`], and not blank. A name of only
/// whitespace (`" "`, `"\u{3000}"`) shows as nothing in a log or the operator
/// queue, and a trimmed copy would name another operation, so it is refused,
/// never trimmed. The operator and read exports keep [`check_name`]: a record
/// begun under such a name before this rule stays reachable.
pub fn check_new_name(what: &str, value: &str, settings: &Settings) -> Result<(), Error> {
    check_name(what, value, settings)?;
    // `trim` strips Unicode White_Space, ASCII spaces and tabs included.
    if value.trim().is_empty() {
        return Err(Error::InvalidRequest(format!("{what} is only whitespace")));
    }
    Ok(())
}

/// A receipt an operator asserts, checked to be strict I-JSON within the
/// limits and kept exactly as written: the provider's words are never
/// re-serialized through doubles. An operator can correct a bad one; a
/// provider's is taken as it comes ([`provider_receipt`]).
pub fn checked_receipt(text: String, settings: &Settings) -> Result<String, Error> {
    canon::validate(text.as_bytes(), &limits(settings)).map_err(json_error)?;
    Ok(text)
}

/// A receipt the provider sent (a response to a dispatch, a lookup's
/// evidence), as the ledger keeps it. Strict I-JSON within the limits is kept
/// exactly as written, like [`checked_receipt`]. Anything else is still the
/// evidence that the effect happened (DESIGN.md "Every answer is true"), so it
/// is never refused: within the size limit it is kept verbatim, over it (it
/// cannot be stored whole) it is replaced by a stand-in naming its size and
/// SHA-256; either way the receipt is flagged with what the check found.
pub fn provider_receipt(text: String, settings: &Settings) -> Receipt {
    let Err(e) = canon::validate(text.as_bytes(), &limits(settings)) else {
        return Receipt::strict(text);
    };
    let sha256 = sha256_hex(text.as_bytes());
    let bytes = text.len() as u64;
    let abridged = e.kind == canon::ErrorKind::TooLarge;
    // Text no JSON parser reads would be stored fine, but every host that replays it parses it
    // (Python's `json.loads`, JavaScript's `JSON.parse`) and would fail on the replay, so it is kept
    // whole inside a JSON stand-in. Duplicate keys, lone surrogates and huge numbers parse in both (the gateway,
    // whose serde_json refuses a lone surrogate, shows such a receipt as text).
    let unparsed = matches!(
        e.kind,
        canon::ErrorKind::Syntax
            | canon::ErrorKind::TrailingData
            | canon::ErrorKind::NonFiniteNumber
            | canon::ErrorKind::InvalidUtf8
    );
    let text = if abridged {
        abridged_receipt(bytes, &sha256, u64::from(settings.max_input_bytes))
    } else if unparsed {
        unparsed_receipt(&text, bytes, &sha256)
    } else {
        text
    };
    Receipt {
        text,
        flaw: Some(ReceiptFlaw {
            problem: e.message,
            abridged,
            unparsed: unparsed && !abridged,
            bytes,
            sha256,
        }),
    }
}

/// What is stored and replayed for a receipt that is not JSON: canonical JSON
/// holding the provider's text whole, as a string, beside its size and SHA-256.
fn unparsed_receipt(text: &str, bytes: u64, sha256: &str) -> String {
    let mut out = String::with_capacity(text.len() + 128);
    out.push_str("{\"once_unparsed_receipt\":{\"bytes\":");
    out.push_str(&bytes.to_string());
    out.push_str(",\"sha256\":");
    canon::write_string(sha256, &mut out);
    out.push_str(",\"text\":");
    canon::write_string(text, &mut out);
    out.push_str("}}");
    out
}

/// What is stored and replayed for a receipt over the size limit: canonical
/// JSON (so every host reads it like any receipt) that says what it stands
/// for, under a name no provider's receipt is likely to use.
fn abridged_receipt(bytes: u64, sha256: &str, limit: u64) -> String {
    format!(
        "{{\"once_abridged_receipt\":{{\"bytes\":{bytes},\"note\":\"the provider's receipt was over the \
         ledger's limit of {limit} bytes: only its size and SHA-256 are kept\",\"sha256\":\"{sha256}\"}}}}"
    )
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
