//! RFC 6901 JSON pointers.

use super::Value;
use alloc::format;
use alloc::string::String;

/// Checks an RFC 6901 pointer's syntax: `""`, or `/`-separated reference
/// tokens where `~` is only followed by `0` or `1`.
pub fn check_pointer(ptr: &str) -> Result<(), String> {
    if ptr.is_empty() {
        return Ok(());
    }
    if !ptr.starts_with('/') {
        return Err(format!("JSON pointer {ptr:?} must be empty or start with '/'"));
    }
    let b = ptr.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'~' && !matches!(b.get(i + 1), Some(b'0' | b'1')) {
            return Err(format!(
                "JSON pointer {ptr:?} has '~' not followed by '0' or '1' (byte {i})"
            ));
        }
    }
    Ok(())
}

/// Appends `/` and the escaped reference token for `segment` to `out`.
pub(crate) fn push_segment(out: &mut String, segment: &str) {
    out.push('/');
    if !segment.contains(['~', '/']) {
        out.push_str(segment);
        return;
    }
    for c in segment.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

/// Whether the escaped reference token `token` names `key`.
fn token_is(token: &str, key: &str) -> bool {
    if !token.contains('~') {
        return token == key;
    }
    let mut rest = key;
    for (i, part) in token.split('~').enumerate() {
        let literal = if i == 0 {
            part
        } else {
            let unescaped = match part.as_bytes().first() {
                Some(b'0') => "~",
                Some(b'1') => "/",
                _ => return false,
            };
            match rest.strip_prefix(unescaped) {
                Some(r) => rest = r,
                None => return false,
            }
            &part[1..]
        };
        match rest.strip_prefix(literal) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

/// Array index token: `0` or a decimal without leading zeros.
fn index(token: &str) -> Option<usize> {
    let b = token.as_bytes();
    if b.is_empty() || (b.len() > 1 && b[0] == b'0') || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    token.parse().ok()
}

pub(crate) fn lookup<'v>(root: &'v Value, ptr: &str) -> Option<&'v Value> {
    if ptr.is_empty() {
        return Some(root);
    }
    check_pointer(ptr).ok()?;
    let mut cur = root;
    for token in ptr[1..].split('/') {
        cur = match cur {
            Value::Object(members) => members.iter().find(|(k, _)| token_is(token, k)).map(|(_, v)| v)?,
            Value::Array(items) => items.get(index(token)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canon::{Limits, parse};

    #[test]
    fn check() {
        for ok in ["", "/", "/a", "/a/0", "/~0/~1", "//", "/a~1b~0c"] {
            assert!(check_pointer(ok).is_ok(), "{ok}");
        }
        for bad in ["a", "~", "/~", "/~2", "/a~", "#/a"] {
            assert!(check_pointer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn escape() {
        let mut s = String::new();
        push_segment(&mut s, "a/b~c");
        push_segment(&mut s, "");
        push_segment(&mut s, "x");
        assert_eq!(s, "/a~1b~0c//x");
    }

    #[test]
    fn rfc6901_examples() {
        let doc = br#"{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4,
            "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8, "~01": 9, "~1": 10}"#;
        let v = parse(doc, &Limits::default()).unwrap();
        let num = |p: &str| match v.pointer(p) {
            Some(Value::Number(n)) => Some(n.raw.clone()),
            _ => None,
        };
        assert_eq!(v.pointer(""), Some(&v));
        assert!(matches!(v.pointer("/foo"), Some(Value::Array(a)) if a.len() == 2));
        assert_eq!(v.pointer("/foo/0"), Some(&Value::String("bar".into())));
        assert_eq!(v.pointer("/foo/1"), Some(&Value::String("baz".into())));
        for (p, n) in [
            ("/", "0"),
            ("/a~1b", "1"),
            ("/c%d", "2"),
            ("/e^f", "3"),
            ("/g|h", "4"),
            ("/i\\j", "5"),
            ("/k\"l", "6"),
            ("/ ", "7"),
            ("/m~0n", "8"),
            ("/~001", "9"),
            ("/~01", "10"),
        ] {
            assert_eq!(num(p).as_deref(), Some(n), "{p}");
        }
        for missing in [
            "/foo/2", "/foo/01", "/foo/-", "/foo/x", "/nope", "/a/b", "/~2", "x", "/foo/0/0",
        ] {
            assert_eq!(v.pointer(missing), None, "{missing}");
        }
    }

    #[test]
    fn token_matching() {
        assert!(token_is("~0~1", "~/"));
        assert!(token_is("ab~1cd", "ab/cd"));
        assert!(!token_is("ab~1cd", "ab/c"));
        assert!(!token_is("ab~1", "ab/cd"));
        assert!(token_is("é~0ü", "é~ü"));
        assert!(!token_is("~2", "~2"));
    }
}
