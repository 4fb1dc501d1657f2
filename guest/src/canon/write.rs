//! RFC 8785 output: key order, string escaping, and the two writers (from a
//! tree, and straight from the parser).

use super::Value;
use super::number::format_number;
use super::parse::Sink;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Ordering;

/// Compares two strings by their UTF-16 code units (RFC 8785 §3.2.3),
/// working on the UTF-8 bytes.
///
/// UTF-8 byte order is code point order, which agrees with UTF-16 code unit
/// order except between U+E000..U+FFFF (one unit, lead byte 0xEE/0xEF) and
/// supplementary characters (a surrogate pair starting at 0xD800, lead byte
/// 0xF0..0xF4): there UTF-16 puts the supplementary character first. At the
/// first differing byte both strings are at the same position within the
/// same character boundaries (their prefixes are equal), so it is enough to
/// look at that byte pair.
pub(crate) fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some(i) => {
            let (x, y) = (a[i], b[i]);
            if x >= 0xEE && y >= 0xEE && ((x >= 0xF0) != (y >= 0xF0)) {
                y.cmp(&x)
            } else {
                x.cmp(&y)
            }
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether a byte must be escaped in a canonical string.
#[inline]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Appends `s` as a canonical JSON string (quotes included): `\"`, `\\`,
/// `\b`, `\f`, `\n`, `\r`, `\t`, other controls as `\u00xx`, all else raw.
pub(crate) fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.push_str(&s[run..i]);
        run = i + 1;
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            0x0C => out.push_str("\\f"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            _ => {
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xF)]));
            }
        }
    }
    out.push_str(&s[run..]);
    out.push('"');
}

/// Appends the RFC 8785 canonical form of `v` to `out`.
///
/// Numbers are written from [`Number::value`](super::Number::value). Objects
/// built by hand with repeated keys are written with every member (sorted,
/// repeats in their original order); parsed objects never have them. Uses no
/// call-stack recursion.
pub fn write_canonical(v: &Value, out: &mut String) {
    enum Level<'a> {
        Array(core::slice::Iter<'a, Value>, bool),
        Object(core::slice::Iter<'a, (String, Value)>, bool),
        Sorted(alloc::vec::IntoIter<&'a (String, Value)>, bool),
    }
    let mut stack: Vec<Level<'_>> = Vec::new();
    let mut next = Some(v);
    loop {
        if let Some(v) = next.take() {
            match v {
                Value::Null => out.push_str("null"),
                Value::Bool(true) => out.push_str("true"),
                Value::Bool(false) => out.push_str("false"),
                Value::Number(n) => format_number(n.value, out),
                Value::String(s) => write_string(s, out),
                Value::Array(items) => {
                    out.push('[');
                    stack.push(Level::Array(items.iter(), true));
                }
                Value::Object(members) => {
                    out.push('{');
                    let sorted = members
                        .windows(2)
                        .all(|w| cmp_utf16(&w[0].0, &w[1].0) != Ordering::Greater);
                    if sorted {
                        stack.push(Level::Object(members.iter(), true));
                    } else {
                        let mut refs: Vec<&(String, Value)> = members.iter().collect();
                        refs.sort_by(|a, b| cmp_utf16(&a.0, &b.0));
                        stack.push(Level::Sorted(refs.into_iter(), true));
                    }
                }
            }
        }
        let Some(top) = stack.last_mut() else {
            return;
        };
        let (member, first) = match top {
            Level::Array(items, first) => match items.next() {
                Some(item) => {
                    if !*first {
                        out.push(',');
                    }
                    *first = false;
                    next = Some(item);
                    continue;
                }
                None => {
                    out.push(']');
                    stack.pop();
                    continue;
                }
            },
            Level::Object(members, first) => (members.next(), first),
            Level::Sorted(members, first) => (members.next(), first),
        };
        match member {
            Some((key, value)) => {
                if !*first {
                    out.push(',');
                }
                *first = false;
                write_string(key, out);
                out.push(':');
                next = Some(value);
            }
            None => {
                out.push('}');
                stack.pop();
            }
        }
    }
}

/// Writes canonical output while parsing, without a tree.
///
/// Object members are written in input order; when the object closes and
/// its members were not already in canonical order, its body is rearranged
/// in place (each member is a contiguous span of the output).
pub(crate) struct CanonSink<'o> {
    out: &'o mut String,
    /// Open containers: `None` for an array, `Some(base)` for an object whose
    /// member starts begin at `starts[base]`.
    open: Vec<Option<usize>>,
    /// Output offset where each member (its key) starts, for open objects.
    starts: Vec<usize>,
    scratch: String,
}

impl<'o> CanonSink<'o> {
    pub(crate) fn new(out: &'o mut String) -> Self {
        CanonSink {
            out,
            open: Vec::new(),
            starts: Vec::new(),
            scratch: String::new(),
        }
    }

    /// Separator before an array element.
    #[inline]
    fn element(&mut self) {
        if let Some(None) = self.open.last()
            && !self.out.ends_with('[')
        {
            self.out.push(',');
        }
    }
}

impl Sink for CanonSink<'_> {
    fn null(&mut self) {
        self.element();
        self.out.push_str("null");
    }

    fn boolean(&mut self, b: bool) {
        self.element();
        self.out.push_str(if b { "true" } else { "false" });
    }

    fn number(&mut self, raw: &str, value: f64, canonical: bool) {
        self.element();
        if canonical {
            self.out.push_str(raw);
        } else {
            format_number(value, self.out);
        }
    }

    fn string(&mut self, s: &str, plain: bool) {
        self.element();
        if plain {
            self.out.push('"');
            self.out.push_str(s);
            self.out.push('"');
        } else {
            write_string(s, self.out);
        }
    }

    fn begin_array(&mut self) {
        self.element();
        self.out.push('[');
        self.open.push(None);
    }

    fn end_array(&mut self) {
        self.out.push(']');
        self.open.pop();
    }

    fn begin_object(&mut self) {
        self.element();
        self.out.push('{');
        self.open.push(Some(self.starts.len()));
    }

    fn key(&mut self, k: &str, plain: bool) {
        if let Some(Some(base)) = self.open.last()
            && self.starts.len() > *base
        {
            self.out.push(',');
        }
        self.starts.push(self.out.len());
        self.string(k, plain);
        self.out.push(':');
    }

    fn end_object(&mut self, order: &[usize]) {
        let base = self.open.pop().flatten().unwrap_or(self.starts.len());
        let starts = &self.starts[base..];
        if order.iter().enumerate().any(|(i, &j)| i != j) {
            let body = starts[0];
            self.scratch.clear();
            self.scratch.push_str(&self.out[body..]);
            self.out.truncate(body);
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    self.out.push(',');
                }
                let from = starts[i] - body;
                // A member ends where the comma before the next one is.
                let to = starts.get(i + 1).map_or(self.scratch.len(), |&s| s - 1 - body);
                self.out.push_str(&self.scratch[from..to]);
            }
        }
        self.out.push('}');
        self.starts.truncate(base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn utf16_order_examples() {
        // RFC 8785 §3.2.3 sorting example, in expected order.
        let keys = ["\r", "1", "\u{80}", "\u{f6}", "\u{20ac}", "\u{1f600}", "\u{fb33}"];
        for w in keys.windows(2) {
            assert_eq!(cmp_utf16(w[0], w[1]), Ordering::Less, "{:?}", w);
            assert_eq!(cmp_utf16(w[1], w[0]), Ordering::Greater, "{:?}", w);
        }
        assert_eq!(cmp_utf16("", ""), Ordering::Equal);
        assert_eq!(cmp_utf16("a", "ab"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{ffff}", "\u{10000}"), Ordering::Greater);
        assert_eq!(cmp_utf16("\u{d7ff}", "\u{10000}"), Ordering::Less);
        assert_eq!(cmp_utf16("\u{e000}", "\u{10ffff}"), Ordering::Greater);
    }

    fn utf16(a: &str, b: &str) -> Ordering {
        a.encode_utf16().cmp(b.encode_utf16())
    }

    proptest::proptest! {
        #[test]
        fn utf16_order_matches_encode_utf16(
            prefix in "[a\u{e000}\u{10000}]{0,3}",
            a in proptest::collection::vec(proptest::char::any(), 0..6),
            b in proptest::collection::vec(proptest::char::any(), 0..6),
        ) {
            let a: String = prefix.chars().chain(a).collect();
            let b: String = prefix.chars().chain(b).collect();
            proptest::prop_assert_eq!(cmp_utf16(&a, &b), utf16(&a, &b));
        }

        #[test]
        fn utf16_order_boundary_chars(
            a in proptest::collection::vec(proptest::sample::select(Vec::from(BOUNDARY)), 0..4),
            b in proptest::collection::vec(proptest::sample::select(Vec::from(BOUNDARY)), 0..4),
        ) {
            let a: String = a.into_iter().collect();
            let b: String = b.into_iter().collect();
            proptest::prop_assert_eq!(cmp_utf16(&a, &b), utf16(&a, &b));
        }
    }

    const BOUNDARY: [char; 14] = [
        '\0',
        'a',
        '\u{7f}',
        '\u{80}',
        '\u{7ff}',
        '\u{800}',
        '\u{d7ff}',
        '\u{e000}',
        '\u{efff}',
        '\u{f000}',
        '\u{ffff}',
        '\u{10000}',
        '\u{10fc00}',
        '\u{10ffff}',
    ];

    #[test]
    fn string_escaping() {
        let mut s = String::new();
        write_string("a\"b\\c\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}\u{80}\u{2028}/é😀", &mut s);
        assert_eq!(
            s,
            "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0000\\u001f\u{7f}\u{80}\u{2028}/é😀\""
        );
    }
}
