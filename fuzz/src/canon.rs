//! The canonical-JSON properties, shared by the fuzz target and its replay of the corpus.

use once_guest::canon::{self, ErrorKind, Limits, Value};

/// Check every property of `canonicalize` on one input; panics on a violation.
pub fn check_canonicalize(data: &[u8]) {
    let limits = Limits::default();
    let ours = canon::canonicalize(data, &limits);

    // The streaming and the tree path must agree, output or error.
    let tree = canon::parse(data, &limits);
    match (&ours, &tree) {
        (Ok(out), Ok(value)) => {
            let mut written = String::new();
            canon::write_canonical(value, &mut written);
            assert_eq!(&written, out, "canonicalize and parse+write_canonical disagree");
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "canonicalize and parse report different errors"),
        _ => panic!("canonicalize {ours:?} but parse {tree:?}"),
    }

    let theirs = std::str::from_utf8(data).ok().map(serde_json_canonicalizer::pipe);

    match ours {
        Ok(out) => {
            // A fixed point: canonical bytes canonicalize to themselves.
            let again = canon::canonicalize(out.as_bytes(), &limits)
                .unwrap_or_else(|e| panic!("canonical output {out:?} does not parse: {e}"));
            assert_eq!(again, out, "canonical output is not a fixed point");
            // And the same value as the input.
            let before = tree.expect("checked above");
            let after = canon::parse(out.as_bytes(), &limits).expect("parsed above");
            assert!(same(&before, &after), "{out:?} is not the value of the input");
            // Differential: where serde_json accepts the text too, the bytes are the same.
            if let Some(Ok(theirs)) = theirs {
                assert_eq!(out, theirs, "serde_json_canonicalizer disagrees");
            }
        }
        Err(e) => {
            // Where the other implementation accepts what we reject, the reason
            // must be a rule it does not enforce: I-JSON's unique keys, or our limits.
            if let Some(Ok(theirs)) = theirs {
                assert!(
                    matches!(
                        e.kind,
                        ErrorKind::DuplicateKey | ErrorKind::TooDeep | ErrorKind::TooLarge
                    ),
                    "we reject ({e}) what serde_json_canonicalizer accepts as {theirs:?}"
                );
            }
        }
    }
}

/// The same JSON value: members in any order, numbers by their double value.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        // -0 and 0 are one number in JCS (`-0` canonicalizes to `0`).
        (Value::Number(x), Value::Number(y)) => x.value == y.value,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.iter().find(|(k2, _)| k2 == k).is_some_and(|(_, w)| same(v, w)))
        }
        _ => false,
    }
}
