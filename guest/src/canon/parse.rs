//! The strict I-JSON parser: one iterative engine feeding a [`Sink`] (a tree
//! builder, or the canonical writer).
//!
//! Errors are reported for the first problem in byte order. Duplicate keys
//! are found by sorting an object's keys when it closes (which the canonical
//! writer needs anyway); when any error is about to be reported, the objects
//! still open are searched for an earlier duplicate, so the result is the
//! same as checking every key the moment it is read.

use super::pointer::push_segment;
use super::write::{cmp_utf16, write_string};
use super::{Error, ErrorKind, Limits, Number, Value};
use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

/// Receives a well-formed document, value by value, in input order.
pub(crate) trait Sink {
    fn null(&mut self);
    fn boolean(&mut self, b: bool);
    /// `canonical`: `raw` is already what `format_number(value)` writes.
    fn number(&mut self, raw: &str, value: f64, canonical: bool);
    /// `plain`: `s` is verbatim input holding no `"`, `\` or control
    /// character, so it needs no escaping.
    fn string(&mut self, s: &str, plain: bool);
    fn begin_array(&mut self);
    fn end_array(&mut self);
    fn begin_object(&mut self);
    fn key(&mut self, k: &str, plain: bool);
    /// `order` lists the members (numbered in input order) in canonical order.
    fn end_object(&mut self, order: &[usize]);
}

/// Keeps nothing: for checking a document without building anything.
pub(crate) struct NullSink;

impl Sink for NullSink {
    fn null(&mut self) {}
    fn boolean(&mut self, _: bool) {}
    fn number(&mut self, _: &str, _: f64, _: bool) {}
    fn string(&mut self, _: &str, _: bool) {}
    fn begin_array(&mut self) {}
    fn end_array(&mut self) {}
    fn begin_object(&mut self) {}
    fn key(&mut self, _: &str, _: bool) {}
    fn end_object(&mut self, _: &[usize]) {}
}

/// Builds a [`Value`].
#[derive(Default)]
pub(crate) struct TreeSink {
    open: Vec<Open>,
    root: Option<Value>,
}

enum Open {
    Array(Vec<Value>),
    Object(Vec<(String, Value)>, String),
}

impl TreeSink {
    pub(crate) fn finish(self) -> Value {
        self.root.unwrap_or(Value::Null)
    }

    fn put(&mut self, v: Value) {
        match self.open.last_mut() {
            None => self.root = Some(v),
            Some(Open::Array(items)) => items.push(v),
            Some(Open::Object(members, key)) => members.push((core::mem::take(key), v)),
        }
    }
}

impl Sink for TreeSink {
    fn null(&mut self) {
        self.put(Value::Null);
    }

    fn boolean(&mut self, b: bool) {
        self.put(Value::Bool(b));
    }

    fn number(&mut self, raw: &str, value: f64, _canonical: bool) {
        self.put(Value::Number(Number {
            value,
            raw: raw.to_owned(),
        }));
    }

    fn string(&mut self, s: &str, _plain: bool) {
        self.put(Value::String(s.to_owned()));
    }

    fn begin_array(&mut self) {
        self.open.push(Open::Array(Vec::new()));
    }

    fn end_array(&mut self) {
        if let Some(Open::Array(items)) = self.open.pop() {
            self.put(Value::Array(items));
        }
    }

    fn begin_object(&mut self) {
        self.open.push(Open::Object(Vec::new(), String::new()));
    }

    fn key(&mut self, k: &str, _plain: bool) {
        if let Some(Open::Object(_, key)) = self.open.last_mut() {
            k.clone_into(key);
        }
    }

    fn end_object(&mut self, _order: &[usize]) {
        if let Some(Open::Object(members, _)) = self.open.pop() {
            self.put(Value::Object(members));
        }
    }
}

/// Parses `input` into `sink`.
///
/// With `exact_numbers`, a number whose double denotes another decimal than
/// its literal is [`ErrorKind::InexactNumber`] (the payload path's rule).
pub(crate) fn run<S: Sink>(input: &[u8], limits: &Limits, exact_numbers: bool, sink: &mut S) -> Result<(), Error> {
    if input.len() > limits.max_input_bytes {
        let offset = limits.max_input_bytes;
        return Err(Error {
            kind: ErrorKind::TooLarge,
            pointer: String::new(),
            offset,
            message: format!(
                "input of {} bytes is over the limit of {} bytes at root (byte {offset})",
                input.len(),
                limits.max_input_bytes
            ),
        });
    }
    // Parse the valid UTF-8 prefix; reaching its end early is InvalidUtf8.
    let (text, bad_utf8) = match core::str::from_utf8(input) {
        Ok(text) => (text, false),
        Err(e) => (
            core::str::from_utf8(&input[..e.valid_up_to()]).unwrap_or_default(),
            true,
        ),
    };
    Parser {
        text,
        bytes: text.as_bytes(),
        bad_utf8,
        pos: 0,
        max_depth: limits.max_depth,
        exact_numbers,
        frames: Vec::new(),
        keys: Vec::new(),
        arena: String::new(),
        scratch: String::new(),
        order: Vec::new(),
    }
    .document(sink)
}

/// A member name read in an open object.
struct Key {
    /// Where the name is: `text[start..end]`, or `arena[start..end]` when it
    /// had escapes.
    start: usize,
    end: usize,
    in_arena: bool,
    /// Offset of its opening quote.
    offset: usize,
}

/// An open array or object.
struct Frame {
    object: bool,
    /// Reading (or about to read) an element / a member's value, so the
    /// pointer of the value being read goes one level further down.
    in_child: bool,
    /// Array: index of the current element.
    index: usize,
    /// `keys[key_base..]` (up to the next frame's base) are this object's.
    key_base: usize,
    arena_base: usize,
}

struct Parser<'t> {
    text: &'t str,
    bytes: &'t [u8],
    /// The input continues with invalid UTF-8 after `text`.
    bad_utf8: bool,
    pos: usize,
    max_depth: usize,
    /// Refuse numbers that a double cannot hold exactly (see [`run`]).
    exact_numbers: bool,
    frames: Vec<Frame>,
    keys: Vec<Key>,
    arena: String,
    scratch: String,
    order: Vec<usize>,
}

/// Bytes that end a run of plain string content.
const STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

impl Parser<'_> {
    fn document<S: Sink>(&mut self, sink: &mut S) -> Result<(), Error> {
        'value: loop {
            self.skip_ws();
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(self.unexpected("a value"));
            };
            match b {
                b'{' | b'[' => {
                    let object = b == b'{';
                    if self.frames.len() >= self.max_depth {
                        return Err(self.error(
                            ErrorKind::TooDeep,
                            self.pos,
                            &format!("nesting deeper than {}", self.max_depth),
                        ));
                    }
                    self.pos += 1;
                    self.frames.push(Frame {
                        object,
                        in_child: false,
                        index: 0,
                        key_base: self.keys.len(),
                        arena_base: self.arena.len(),
                    });
                    self.skip_ws();
                    if object {
                        sink.begin_object();
                        if self.bytes.get(self.pos) == Some(&b'}') {
                            self.pos += 1;
                            self.close_object(sink)?;
                        } else {
                            self.member(sink)?;
                            continue 'value;
                        }
                    } else {
                        sink.begin_array();
                        if self.bytes.get(self.pos) == Some(&b']') {
                            self.pos += 1;
                            self.frames.pop();
                            sink.end_array();
                        } else {
                            if let Some(f) = self.frames.last_mut() {
                                f.in_child = true;
                            }
                            continue 'value;
                        }
                    }
                }
                b'"' => {
                    let mut buf = core::mem::take(&mut self.scratch);
                    let (start, end, plain) = self.string(&mut buf)?;
                    sink.string(if plain { &self.text[start..end] } else { &buf }, plain);
                    self.scratch = buf;
                }
                b'-' | b'0'..=b'9' => self.number(sink)?,
                b't' => {
                    self.literal("true")?;
                    sink.boolean(true);
                }
                b'f' => {
                    self.literal("false")?;
                    sink.boolean(false);
                }
                b'n' => {
                    self.literal("null")?;
                    sink.null();
                }
                b'N' | b'I' => {
                    return Err(self.non_finite().unwrap_or_else(|| self.unexpected("a value")));
                }
                _ => return Err(self.unexpected("a value")),
            }

            // A value is complete: continue or close its containers.
            loop {
                let Some(top) = self.frames.len().checked_sub(1) else {
                    return self.finish();
                };
                self.frames[top].in_child = false;
                self.skip_ws();
                let object = self.frames[top].object;
                match self.bytes.get(self.pos) {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.skip_ws();
                            self.member(sink)?;
                        } else {
                            let f = &mut self.frames[top];
                            f.index += 1;
                            f.in_child = true;
                        }
                        continue 'value;
                    }
                    Some(b']') if !object => {
                        self.pos += 1;
                        self.frames.pop();
                        sink.end_array();
                    }
                    Some(b'}') if object => {
                        self.pos += 1;
                        self.close_object(sink)?;
                    }
                    _ => {
                        return Err(self.unexpected(if object { "',' or '}'" } else { "',' or ']'" }));
                    }
                }
            }
        }
    }

    /// After the root value.
    fn finish(&mut self) -> Result<(), Error> {
        self.skip_ws();
        if self.pos < self.bytes.len() {
            Err(self.error(
                ErrorKind::TrailingData,
                self.pos,
                "unexpected data after the JSON value",
            ))
        } else if self.bad_utf8 {
            Err(self.unexpected("the end of input"))
        } else {
            Ok(())
        }
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    /// Reads `"key"` and `:` of an object member (at the key's quote).
    fn member<S: Sink>(&mut self, sink: &mut S) -> Result<(), Error> {
        if self.bytes.get(self.pos) != Some(&b'"') {
            return Err(self.unexpected("a string key"));
        }
        let offset = self.pos;
        let mut buf = core::mem::take(&mut self.scratch);
        let (start, end, plain) = self.string(&mut buf)?;
        let key = if plain {
            sink.key(&self.text[start..end], true);
            Key {
                start,
                end,
                in_arena: false,
                offset,
            }
        } else {
            sink.key(&buf, false);
            let start = self.arena.len();
            self.arena.push_str(&buf);
            Key {
                start,
                end: self.arena.len(),
                in_arena: true,
                offset,
            }
        };
        self.scratch = buf;
        self.keys.push(key);
        self.skip_ws();
        if self.bytes.get(self.pos) != Some(&b':') {
            return Err(self.unexpected("':'"));
        }
        self.pos += 1;
        if let Some(f) = self.frames.last_mut() {
            f.in_child = true;
        }
        Ok(())
    }

    fn key_str(&self, k: &Key) -> &str {
        if k.in_arena {
            &self.arena[k.start..k.end]
        } else {
            &self.text[k.start..k.end]
        }
    }

    /// Closes the top frame, an object whose `}` was just read.
    fn close_object<S: Sink>(&mut self, sink: &mut S) -> Result<(), Error> {
        let Some(frame) = self.frames.pop() else {
            return Ok(());
        };
        let keys = &self.keys[frame.key_base..];
        let mut order = core::mem::take(&mut self.order);
        order.clear();
        order.extend(0..keys.len());
        if keys.len() > 1 {
            // Stable: equal keys stay in input order.
            order.sort_by(|&a, &b| cmp_utf16(self.key_str(&keys[a]), self.key_str(&keys[b])));
            if let Some(dup) = self.first_duplicate(keys, &order) {
                let key = self.key_str(&keys[dup]).to_owned();
                let offset = keys[dup].offset;
                self.keys.truncate(frame.key_base);
                return Err(self
                    .earlier_duplicate(offset)
                    .unwrap_or_else(|| self.duplicate(&key, offset, self.pointer(self.frames.len()))));
            }
        }
        sink.end_object(&order);
        self.order = order;
        self.keys.truncate(frame.key_base);
        self.arena.truncate(frame.arena_base);
        Ok(())
    }

    /// The earliest second occurrence of a key in `keys`, given `order`
    /// (indices into `keys`, stably sorted by key).
    fn first_duplicate(&self, keys: &[Key], order: &[usize]) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut i = 1;
        while i < order.len() {
            let (a, b) = (&keys[order[i - 1]], &keys[order[i]]);
            if self.key_str(a) == self.key_str(b) {
                // order[i] is the group's second occurrence; skip the rest.
                if best.is_none_or(|x| b.offset < keys[x].offset) {
                    best = Some(order[i]);
                }
                let group = self.key_str(a);
                while i < order.len() && self.key_str(&keys[order[i]]) == group {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        best
    }

    fn duplicate(&self, key: &str, offset: usize, pointer: String) -> Error {
        let mut shown = String::new();
        match key.char_indices().nth(64) {
            Some((cut, _)) => {
                write_string(&key[..cut], &mut shown);
                shown.insert_str(shown.len() - 1, "...");
            }
            None => write_string(key, &mut shown),
        }
        let message = format!("duplicate key {shown} {}", at(&pointer, offset));
        Error {
            kind: ErrorKind::DuplicateKey,
            pointer,
            offset,
            message,
        }
    }

    /// RFC 6901 pointer through the first `depth` frames (each one's current
    /// child when it is reading one).
    fn pointer(&self, depth: usize) -> String {
        let mut p = String::new();
        for (i, f) in self.frames[..depth].iter().enumerate() {
            if !f.in_child {
                continue;
            }
            if f.object {
                let end = self.frames.get(i + 1).map_or(self.keys.len(), |n| n.key_base);
                if let Some(k) = end.checked_sub(1).and_then(|e| self.keys.get(e)) {
                    push_segment(&mut p, self.key_str(k));
                }
            } else {
                p.push('/');
                p.push_str(itoa(f.index, &mut [0; 20]));
            }
        }
        p
    }

    /// An error at `offset` about the value being read, unless an open
    /// object already has a duplicate key before it.
    fn error(&self, kind: ErrorKind, offset: usize, what: &str) -> Error {
        if let Some(e) = self.earlier_duplicate(offset) {
            return e;
        }
        let pointer = self.pointer(self.frames.len());
        let message = format!("{what} {}", at(&pointer, offset));
        Error {
            kind,
            pointer,
            offset,
            message,
        }
    }

    /// The first duplicate key, before `offset`, in the objects still open.
    fn earlier_duplicate(&self, offset: usize) -> Option<Error> {
        let mut best: Option<(usize, usize, usize)> = None; // (offset, frame, key)
        let mut order = Vec::new();
        for (i, f) in self.frames.iter().enumerate() {
            let end = self.frames.get(i + 1).map_or(self.keys.len(), |n| n.key_base);
            if !f.object || end - f.key_base < 2 {
                continue;
            }
            let keys = &self.keys[f.key_base..end];
            order.clear();
            order.extend(0..keys.len());
            order.sort_by(|&a, &b| cmp_utf16(self.key_str(&keys[a]), self.key_str(&keys[b])));
            if let Some(d) = self.first_duplicate(keys, &order)
                && best.is_none_or(|b| keys[d].offset < b.0)
            {
                best = Some((keys[d].offset, i, f.key_base + d));
            }
        }
        let (dup_offset, frame, key) = best.filter(|b| b.0 < offset)?;
        Some(self.duplicate(self.key_str(&self.keys[key]), dup_offset, self.pointer(frame)))
    }

    /// Syntax error at `pos` (or InvalidUtf8 / end of input there).
    fn unexpected(&self, expected: &str) -> Error {
        match self.text[self.pos..].chars().next() {
            Some(c) => {
                let what = if c.is_ascii_graphic() {
                    format!("unexpected '{c}', expected {expected}")
                } else {
                    format!("unexpected U+{:04X}, expected {expected}", u32::from(c))
                };
                self.error(ErrorKind::Syntax, self.pos, &what)
            }
            None if self.bad_utf8 => self.error(ErrorKind::InvalidUtf8, self.pos, "invalid UTF-8"),
            None => self.error(
                ErrorKind::Syntax,
                self.pos,
                &format!("unexpected end of input, expected {expected}"),
            ),
        }
    }

    /// `NaN`, `Infinity` or `-Infinity` (`-NaN` too) at `pos`.
    fn non_finite(&self) -> Option<Error> {
        let rest = &self.text[self.pos..];
        let unsigned = rest.strip_prefix('-').unwrap_or(rest);
        for word in ["NaN", "Infinity"] {
            if unsigned.starts_with(word) {
                let shown = &rest[..rest.len() - unsigned.len() + word.len()];
                return Some(self.error(
                    ErrorKind::NonFiniteNumber,
                    self.pos,
                    &format!("non-finite number {shown} is not allowed"),
                ));
            }
        }
        None
    }

    fn literal(&mut self, word: &str) -> Result<(), Error> {
        for &c in word.as_bytes() {
            if self.bytes.get(self.pos) != Some(&c) {
                return Err(self.unexpected(word));
            }
            self.pos += 1;
        }
        Ok(())
    }

    fn number<S: Sink>(&mut self, sink: &mut S) -> Result<(), Error> {
        let b = self.bytes;
        let start = self.pos;
        let neg = b[start] == b'-';
        let int_start = start + usize::from(neg);
        self.pos = int_start;
        match b.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = b.get(self.pos) {
                    return Err(self.error(ErrorKind::Syntax, int_start, "number with a leading zero"));
                }
            }
            Some(b'1'..=b'9') => {
                self.pos += 1;
                while let Some(b'0'..=b'9') = b.get(self.pos) {
                    self.pos += 1;
                }
            }
            Some(b'N' | b'I') => {
                self.pos = start;
                if let Some(e) = self.non_finite() {
                    return Err(e);
                }
                self.pos = int_start;
                return Err(self.unexpected("a digit"));
            }
            _ => return Err(self.unexpected("a digit")),
        }
        let int_digits = self.pos - int_start;
        let int_end = self.pos;
        let mut frac = int_end..int_end;
        let mut exp = int_end..int_end;
        if b.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            let from = self.pos;
            self.digits()?;
            frac = from..self.pos;
        }
        if let Some(b'e' | b'E') = b.get(self.pos) {
            self.pos += 1;
            let from = self.pos;
            if let Some(b'+' | b'-') = b.get(self.pos) {
                self.pos += 1;
            }
            self.digits()?;
            exp = from..self.pos;
        }
        let integer = self.pos == int_end;
        let raw = &self.text[start..self.pos];
        let value = if integer && int_digits <= 19 {
            // Exact in u64; the conversion rounds to nearest, ties to even.
            let n = b[int_start..int_end]
                .iter()
                .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
            if neg { -(n as f64) } else { n as f64 }
        } else {
            let exp = &b[exp.clone()];
            let exp_digits = exp.iter().skip_while(|&&d| !matches!(d, b'1'..=b'9')).count();
            if exp_digits > 4 {
                // core's parser saturates very long exponents, which is
                // wrong when many digits offset them: normalize first.
                scaled(neg, &b[int_start..int_end], &b[frac.clone()], exp)
            } else {
                raw.parse::<f64>().unwrap_or(f64::NAN)
            }
        };
        if !value.is_finite() {
            let shown = if raw.len() > 40 { &raw[..40] } else { raw };
            let ellipsis = if raw.len() > 40 { "..." } else { "" };
            return Err(self.error(
                ErrorKind::NumberOutOfRange,
                start,
                &format!("number {shown}{ellipsis} is outside the range of a double"),
            ));
        }
        let canonical = if integer {
            int_digits <= 15 && raw != "-0"
        } else {
            exp.is_empty() && plain_decimal_is_canonical(&b[int_start..int_end], &b[frac.clone()])
        };
        if self.exact_numbers
            && !canonical
            && !super::number::denotes_its_double(&b[int_start..int_end], &b[frac], &b[exp], value)
        {
            let shown = if raw.len() > 40 { &raw[..40] } else { raw };
            let ellipsis = if raw.len() > 40 { "..." } else { "" };
            let mut canonical_text = String::new();
            super::format_number(value, &mut canonical_text);
            return Err(self.error(
                ErrorKind::InexactNumber,
                start,
                &format!(
                    "number {shown}{ellipsis} is not exactly a double (it would be read as {canonical_text}); \
                     send it as a string"
                ),
            ));
        }
        sink.number(raw, value, canonical);
        Ok(())
    }

    /// One or more digits at `pos`.
    fn digits(&mut self) -> Result<(), Error> {
        let from = self.pos;
        while let Some(b'0'..=b'9') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
        if self.pos == from {
            return Err(self.unexpected("a digit"));
        }
        Ok(())
    }

    /// Reads the string whose opening quote is at `pos`. Returns the content
    /// range in `text` and whether it is plain (no escapes); otherwise the
    /// unescaped content is in `buf` (cleared first).
    fn string(&mut self, buf: &mut String) -> Result<(usize, usize, bool), Error> {
        let b = self.bytes;
        let start = self.pos + 1;
        let mut i = start;
        let mut run = start;
        let mut plain = true;
        loop {
            // Eight bytes at a time: stop at '"', '\\' or a byte < 0x20.
            while let Some(chunk) = b.get(i..i + 8) {
                let mut w = [0u8; 8];
                w.copy_from_slice(chunk);
                let w = u64::from_le_bytes(w);
                let quote = w ^ (LO * u64::from(b'"'));
                let slash = w ^ (LO * u64::from(b'\\'));
                let hits = (quote.wrapping_sub(LO) & !quote)
                    | (slash.wrapping_sub(LO) & !slash)
                    | (w.wrapping_sub(LO * 0x20) & !w);
                let hits = hits & HI;
                if hits != 0 {
                    i += (hits.trailing_zeros() / 8) as usize;
                    break;
                }
                i += 8;
            }
            while i < b.len() && !STOP[usize::from(b[i])] {
                i += 1;
            }
            match b.get(i) {
                Some(b'"') => {
                    if !plain {
                        buf.push_str(&self.text[run..i]);
                    }
                    self.pos = i + 1;
                    return Ok((start, i, plain));
                }
                Some(b'\\') => {
                    if plain {
                        plain = false;
                        buf.clear();
                    }
                    buf.push_str(&self.text[run..i]);
                    i = self.escape(i, buf)?;
                    run = i;
                }
                Some(&c) => {
                    self.pos = i;
                    return Err(self.error(
                        ErrorKind::Syntax,
                        i,
                        &format!("control character U+{c:04X} must be escaped in a string"),
                    ));
                }
                None => {
                    self.pos = i;
                    return Err(self.unexpected("'\"'"));
                }
            }
        }
    }

    /// Decodes the escape whose backslash is at `i` into `buf`; returns the
    /// offset after it.
    fn escape(&mut self, i: usize, buf: &mut String) -> Result<usize, Error> {
        let c = match self.bytes.get(i + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let unit = self.hex4(i + 2)?;
                let c = match unit {
                    0xD800..=0xDBFF => {
                        let low = if self.bytes.get(i + 6..i + 8) == Some(b"\\u") {
                            Some(self.hex4(i + 8)?)
                        } else {
                            None
                        };
                        match low {
                            Some(low @ 0xDC00..=0xDFFF) => {
                                let c = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                                buf.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
                                return Ok(i + 12);
                            }
                            _ => return Err(self.lone_surrogate(i, unit)),
                        }
                    }
                    0xDC00..=0xDFFF => return Err(self.lone_surrogate(i, unit)),
                    _ => char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER),
                };
                buf.push(c);
                return Ok(i + 6);
            }
            Some(_) => {
                self.pos = i + 1;
                return Err(self.unexpected("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)"));
            }
            None => {
                self.pos = i + 1;
                return Err(self.unexpected("an escape"));
            }
        };
        buf.push(c);
        Ok(i + 2)
    }

    fn lone_surrogate(&mut self, i: usize, unit: u32) -> Error {
        self.pos = i;
        self.error(
            ErrorKind::LoneSurrogate,
            i,
            &format!("lone surrogate \\u{unit:04X} in a string"),
        )
    }

    /// Four hex digits at `at`.
    fn hex4(&mut self, at: usize) -> Result<u32, Error> {
        let mut v = 0;
        for j in at..at + 4 {
            let d = match self.bytes.get(j) {
                Some(&c @ b'0'..=b'9') => c - b'0',
                Some(&c @ b'a'..=b'f') => c - b'a' + 10,
                Some(&c @ b'A'..=b'F') => c - b'A' + 10,
                _ => {
                    self.pos = j;
                    return Err(self.unexpected("a hex digit"));
                }
            };
            v = v * 16 + u32::from(d);
        }
        Ok(v)
    }
}

/// Whether `int.frac` (no exponent; JSON grammar) is exactly how ECMAScript
/// writes its double: at most 15 significant digits (so they are the unique
/// shortest digits that round-trip), no trailing zero, and within the range
/// written without an exponent (1e-6 <= |x| < 1e21).
fn plain_decimal_is_canonical(int: &[u8], frac: &[u8]) -> bool {
    if frac.last().is_none_or(|&d| d == b'0') {
        return false;
    }
    if int == b"0" {
        let zeros = frac.iter().take_while(|&&d| d == b'0').count();
        zeros <= 5 && frac.len() - zeros <= 15
    } else {
        int.len() + frac.len() <= 15
    }
}

/// The double nearest to `int.frac x 10^exp` (`exp`: optional sign, then
/// digits of any length) for an exponent too long for `str::parse`.
fn scaled(neg: bool, int: &[u8], frac: &[u8], exp: &[u8]) -> f64 {
    let zero = if neg { -0.0 } else { 0.0 };
    let digits = || int.iter().chain(frac);
    let Some(first) = digits().position(|&d| d != b'0') else {
        return zero;
    };
    let nonzero = |d: &u8| *d != b'0';
    let last = match frac.iter().rposition(nonzero) {
        Some(i) => int.len() + i,
        None => int.iter().rposition(nonzero).unwrap_or(first),
    };
    let (exp_neg, exp) = match exp.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, exp),
    };
    let e = exp
        .iter()
        .fold(0i64, |e, &d| (e * 10 + i64::from(d - b'0')).min(1_000_000_000_000));
    let e = if exp_neg { -e } else { e };
    // The value is 0.d(first)..d(last) x 10^n.
    let n = e.saturating_add(int.len() as i64 - first as i64);
    if n > 400 {
        return if neg { f64::NEG_INFINITY } else { f64::INFINITY };
    }
    if n < -400 {
        return zero;
    }
    let mut s = String::with_capacity(last - first + 12);
    if neg {
        s.push('-');
    }
    s.push_str("0.");
    digits()
        .skip(first)
        .take(last + 1 - first)
        .for_each(|&d| s.push(char::from(d)));
    s.push_str(&format!("e{n}"));
    s.parse().unwrap_or(f64::NAN)
}

/// `at /a/b (byte 12)`, or `at root (byte 12)`.
fn at(pointer: &str, offset: usize) -> String {
    let place = if pointer.is_empty() { "root" } else { pointer };
    format!("at {place} (byte {offset})")
}

fn itoa(mut n: usize, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    core::str::from_utf8(&buf[i..]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn itoa_works() {
        for n in [0usize, 7, 10, 1234567, usize::MAX] {
            assert_eq!(itoa(n, &mut [0; 20]), alloc::format!("{n}"));
        }
    }
}
