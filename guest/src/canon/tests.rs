//! Unit and property tests for the canon module.

use super::*;
use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

fn canon(s: &str) -> Result<String, Error> {
    canonicalize(s.as_bytes(), &Limits::default())
}

/// Canonical form through the tree, checking both paths agree.
fn both(input: &[u8], limits: &Limits) -> Result<String, Error> {
    let direct = canonicalize(input, limits);
    let tree = parse(input, limits).map(|v| {
        let mut s = String::new();
        write_canonical(&v, &mut s);
        s
    });
    assert_eq!(
        direct,
        tree,
        "canonicalize vs parse+write for {:?}",
        String::from_utf8_lossy(input)
    );
    direct
}

fn err(s: &str) -> Error {
    match both(s.as_bytes(), &Limits::default()) {
        Ok(out) => panic!("{s:?} was accepted as {out:?}"),
        Err(e) => e,
    }
}

#[track_caller]
fn rejects(s: &str, kind: ErrorKind, pointer: &str, offset: usize) {
    let e = err(s);
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (kind, pointer, offset),
        "{s:?}: {e}"
    );
}

#[track_caller]
fn accepts(s: &str, want: &str) {
    assert_eq!(both(s.as_bytes(), &Limits::default()).as_deref(), Ok(want), "{s:?}");
}

#[test]
fn scalars_and_whitespace() {
    accepts("null", "null");
    accepts(" \t\r\ntrue \t\r\n", "true");
    accepts("false", "false");
    accepts("\"\"", "\"\"");
    accepts("[ ]", "[]");
    accepts("{ }", "{}");
    accepts("[1 , [ 2 ] , { } ]", "[1,[2],{}]");
    accepts(
        "{ \"b\" : [ ] , \"a\" : { \"d\" : 1 , \"c\" : 2 } }",
        "{\"a\":{\"c\":2,\"d\":1},\"b\":[]}",
    );
}

#[test]
fn numbers() {
    for (i, o) in [
        ("0", "0"),
        ("-0", "0"),
        ("-0.0", "0"),
        ("0e-5", "0"),
        ("1E3", "1000"),
        ("1e+3", "1000"),
        ("1.50", "1.5"),
        ("-12.5e-1", "-1.25"),
        ("123456789012345", "123456789012345"),
        ("-123456789012345", "-123456789012345"),
        ("9007199254740993", "9007199254740992"),
        ("12345678901234567890", "12345678901234567000"),
        ("1e21", "1e+21"),
        ("1e-400", "0"),
        ("-1e-400", "0"),
        ("123e-10000000", "0"),
        ("0.00000000000000000000000000000000000001e38", "1"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("4.9e-324", "5e-324"),
    ] {
        accepts(i, o);
    }
    // Exponents too long for str::parse, offset by many digits.
    let nines = "9".repeat(100_000);
    let zeros = "0".repeat(100_000);
    for (i, o) in [
        (format!("{nines}e-99990"), "10000000000"),
        (format!("-{nines}.{nines}E-099990"), "-10000000000"),
        (format!("0.{zeros}1e100001"), "1"),
        (format!("0.{zeros}15e+100002"), "15"),
        (format!("1{zeros}e-100000"), "1"),
        (format!("0.{zeros}e99999999999999999999999"), "0"),
        ("-0e-99999999999999999999999".to_owned(), "0"),
        ("1e-99999999999999999999999".to_owned(), "0"),
        ("123e-00000000000000000001".to_owned(), "12.3"),
        ("1.5e+00000000000000000000000000308".to_owned(), "1.5e+308"),
        (format!("0.{zeros}1e99999999999999"), "error"),
        ("1e99999999999999999999".to_owned(), "error"),
        (format!("1{zeros}"), "error"),
        (format!("{nines}e-99691"), "error"),
        (format!("{nines}e-99692"), "1e+308"),
    ] {
        match both(i.as_bytes(), &Limits::default()) {
            Ok(got) => assert_eq!(got, o, "{}", &i[i.len().saturating_sub(30)..]),
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::NumberOutOfRange, "{e}");
                assert_eq!(o, "error", "{e}");
            }
        }
    }
    let v = parse(b"[1.50e1]", &Limits::default()).unwrap();
    assert_eq!(
        v,
        Value::Array(vec![Value::Number(Number {
            value: 15.0,
            raw: "1.50e1".to_owned()
        })])
    );
}

#[test]
fn bad_numbers() {
    for (s, off) in [
        ("01", 0),
        ("-01", 1),
        ("+1", 0),
        (".5", 0),
        ("1.", 2),
        ("1.e5", 2),
        ("1e", 2),
        ("1e+", 3),
        ("-", 1),
        ("- 1", 1),
        ("0x10", 1),
        ("[1.]", 3),
        ("[00]", 1),
    ] {
        let e = err(s);
        assert!(
            matches!(e.kind, ErrorKind::Syntax | ErrorKind::TrailingData),
            "{s}: {e}"
        );
        assert_eq!(e.offset, off, "{s}: {e}");
    }
    rejects("NaN", ErrorKind::NonFiniteNumber, "", 0);
    rejects("[-NaN]", ErrorKind::NonFiniteNumber, "/0", 1);
    rejects("[1,Infinity]", ErrorKind::NonFiniteNumber, "/1", 3);
    rejects("{\"a\":-Infinity}", ErrorKind::NonFiniteNumber, "/a", 5);
    rejects("Nan", ErrorKind::Syntax, "", 0);
    rejects("-Inf", ErrorKind::Syntax, "", 1);
    rejects("1e400", ErrorKind::NumberOutOfRange, "", 0);
    rejects("{\"x\":[0,-1e400]}", ErrorKind::NumberOutOfRange, "/x/1", 8);
    rejects("[123123e100000]", ErrorKind::NumberOutOfRange, "/0", 1);
    rejects("1.8e308", ErrorKind::NumberOutOfRange, "", 0);
    let e = err("{\"a\": NaN}");
    assert_eq!(e.message, "non-finite number NaN is not allowed at /a (byte 6)");
}

#[test]
fn syntax_errors_with_pointers() {
    rejects("", ErrorKind::Syntax, "", 0);
    rejects("   ", ErrorKind::Syntax, "", 3);
    rejects("[", ErrorKind::Syntax, "/0", 1);
    rejects("[1", ErrorKind::Syntax, "", 2);
    rejects("[1,", ErrorKind::Syntax, "/1", 3);
    rejects("[1,]", ErrorKind::Syntax, "/1", 3);
    rejects("[1 2]", ErrorKind::Syntax, "", 3);
    rejects("{", ErrorKind::Syntax, "", 1);
    rejects("{\"a\"", ErrorKind::Syntax, "", 4);
    rejects("{\"a\" 1}", ErrorKind::Syntax, "", 5);
    rejects("{\"a\":}", ErrorKind::Syntax, "/a", 5);
    rejects("{\"a\":1,}", ErrorKind::Syntax, "", 7);
    rejects("{\"a\":1 \"b\":2}", ErrorKind::Syntax, "", 7);
    rejects("{1:2}", ErrorKind::Syntax, "", 1);
    rejects("{'a':2}", ErrorKind::Syntax, "", 1);
    rejects("[\"a\"]]", ErrorKind::TrailingData, "", 5);
    rejects("{} {}", ErrorKind::TrailingData, "", 3);
    rejects("1 2", ErrorKind::TrailingData, "", 2);
    rejects("tru", ErrorKind::Syntax, "", 3);
    rejects("True", ErrorKind::Syntax, "", 0);
    rejects("nul", ErrorKind::Syntax, "", 3);
    rejects("[nulL]", ErrorKind::Syntax, "/0", 4);
    rejects("{\"a/b\":{\"c~d\":[0,[x]]}}", ErrorKind::Syntax, "/a~1b/c~0d/1/0", 18);
    rejects("\u{feff}1", ErrorKind::Syntax, "", 0);
    rejects("\u{a0}1", ErrorKind::Syntax, "", 0);
    rejects("[1,\u{b}2]", ErrorKind::Syntax, "/1", 3);
    let e = err("{\"a\":[1,}");
    assert_eq!(e.message, "unexpected '}', expected a value at /a/1 (byte 8)");
    assert_eq!(e.to_string(), e.message);
}

#[test]
fn strings() {
    accepts(r#""\"\\\/\b\f\n\r\t""#, r#""\"\\/\b\f\n\r\t""#);
    accepts(
        r#""\u0000\u001F\u001f\u0020\u007F\u0080""#,
        "\"\\u0000\\u001f\\u001f \u{7f}\u{80}\"",
    );
    accepts(r#""\u00e9\u00E9é""#, "\"ééé\"");
    accepts(r#""\uD834\uDD1E\ud834\udd1e""#, "\"\u{1d11e}\u{1d11e}\"");
    accepts(r#""\u2028\u2029""#, "\"\u{2028}\u{2029}\"");
    accepts(r#""\uFFFF\uFDD0""#, "\"\u{ffff}\u{fdd0}\"");
    accepts(
        "\"a long plain string past the eight-byte chunks: ok\"",
        "\"a long plain string past the eight-byte chunks: ok\"",
    );
    rejects("\"a\u{1}\"", ErrorKind::Syntax, "", 2);
    rejects("[\"\t\"]", ErrorKind::Syntax, "/0", 2);
    rejects("\"abcdefghijklm\nop\"", ErrorKind::Syntax, "", 14);
    rejects("\"abc", ErrorKind::Syntax, "", 4);
    rejects("\"\\x\"", ErrorKind::Syntax, "", 2);
    rejects("\"\\", ErrorKind::Syntax, "", 2);
    rejects("\"\\u12G4\"", ErrorKind::Syntax, "", 5);
    rejects("\"\\u12", ErrorKind::Syntax, "", 5);
    rejects("\"\\uD800\"", ErrorKind::LoneSurrogate, "", 1);
    rejects("\"\\uDC00\"", ErrorKind::LoneSurrogate, "", 1);
    rejects("[\"ab\\uD800\\u0041\"]", ErrorKind::LoneSurrogate, "/0", 4);
    rejects("[\"\\uD800\\uD800\"]", ErrorKind::LoneSurrogate, "/0", 2);
    rejects("[\"\\uDd1e\\uD834\"]", ErrorKind::LoneSurrogate, "/0", 2);
    rejects("[\"\\uD800\\n\"]", ErrorKind::LoneSurrogate, "/0", 2);
    rejects("[\"\\uD800\\u12\"]", ErrorKind::Syntax, "/0", 12);
    rejects("{\"a\":{\"\\uDFAA\":0}}", ErrorKind::LoneSurrogate, "/a", 7);
    let e = err("{\"k\":\"\\udead\"}");
    assert_eq!(e.message, "lone surrogate \\uDEAD in a string at /k (byte 6)");
}

#[test]
fn invalid_utf8() {
    let l = Limits::default();
    let e = both(b"[\"a\xff\"]", &l).unwrap_err();
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::InvalidUtf8, "/0", 3)
    );
    let e = both(b"{\"a\":[1,\"\xed\xa0\x80\"]}", &l).unwrap_err();
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::InvalidUtf8, "/a/1", 9)
    );
    let e = both(b"{\"\xc3\":1}", &l).unwrap_err();
    assert_eq!((e.kind, e.pointer.as_str(), e.offset), (ErrorKind::InvalidUtf8, "", 2));
    let e = both(b"1 \x80", &l).unwrap_err();
    assert_eq!((e.kind, e.pointer.as_str(), e.offset), (ErrorKind::InvalidUtf8, "", 2));
    let e = both(b"\xff", &l).unwrap_err();
    assert_eq!((e.kind, e.offset), (ErrorKind::InvalidUtf8, 0));
    // An earlier error wins.
    let e = both(b"[x \xff]", &l).unwrap_err();
    assert_eq!((e.kind, e.offset), (ErrorKind::Syntax, 1));
    let e = both(b"1 x \xff", &l).unwrap_err();
    assert_eq!((e.kind, e.offset), (ErrorKind::TrailingData, 2));
}

#[test]
fn duplicate_keys() {
    rejects("{\"a\":1,\"a\":2}", ErrorKind::DuplicateKey, "", 7);
    rejects("{\"a\":1,\"\\u0061\":2}", ErrorKind::DuplicateKey, "", 7);
    rejects(
        "{\"x\":[{\"b\":1,\"a\":2,\"b\":3}]}",
        ErrorKind::DuplicateKey,
        "/x/0",
        19,
    );
    let e = err("{\"x\":{\"a\":1,\"a\":2}}");
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::DuplicateKey, "/x", 12)
    );
    assert_eq!(e.message, "duplicate key \"a\" at /x (byte 12)");
    // The earliest second occurrence is reported.
    rejects("{\"b\":1,\"a\":1,\"a\":2,\"b\":2}", ErrorKind::DuplicateKey, "", 13);
    rejects(
        "{\"a\":1,\"b\":1,\"c\":2,\"b\":2,\"a\":2}",
        ErrorKind::DuplicateKey,
        "",
        19,
    );
    // A duplicate before a later error is reported first, at any depth.
    rejects("{\"a\":1,\"a\":2,}", ErrorKind::DuplicateKey, "", 7);
    rejects("{\"a\":1,\"a\":{\"c\":[x]}}", ErrorKind::DuplicateKey, "", 7);
    rejects("{\"a\":1,\"a\":{\"c\":1,\"c\":2}}", ErrorKind::DuplicateKey, "", 7);
    rejects("{\"a\":{\"k\":1,\"k\":2},\"a\":2}", ErrorKind::DuplicateKey, "/a", 12);
    rejects(
        "[{\"a\":1,\"b\":[1e999],\"a\":0}]",
        ErrorKind::NumberOutOfRange,
        "/0/b/0",
        13,
    );
    // Same key in different objects is fine; so are keys differing in case.
    accepts(
        "{\"a\":{\"a\":1},\"b\":{\"a\":2},\"A\":0}",
        "{\"A\":0,\"a\":{\"a\":1},\"b\":{\"a\":2}}",
    );
    let e = err("{\"k\\n\\\"\":1,\"k\\n\\\"\":2}");
    assert_eq!(e.message, "duplicate key \"k\\n\\\"\" at root (byte 11)");
    let long = "é".repeat(100);
    let e = err(&format!("{{\"{long}\":1,\"{long}\":2}}"));
    assert_eq!(
        e.message,
        format!("duplicate key \"{}...\" at root (byte 206)", "é".repeat(64))
    );
}

#[test]
fn many_keys_sorted_and_checked() {
    let n = 3000;
    let mut s = String::from("{");
    for i in (0..n).rev() {
        if i != n - 1 {
            s.push(',');
        }
        s.push_str(&format!("\"k{i:05}\":{{\"v\":[{i},\"x\"],\"u\":{i}}}"));
    }
    s.push('}');
    let out = canon(&s).unwrap();
    let mut want = String::from("{");
    for i in 0..n {
        if i != 0 {
            want.push(',');
        }
        want.push_str(&format!("\"k{i:05}\":{{\"u\":{i},\"v\":[{i},\"x\"]}}"));
    }
    want.push('}');
    assert_eq!(out, want);
    assert_eq!(both(s.as_bytes(), &Limits::default()).unwrap(), want);
    // One duplicate at the very end.
    let dup = format!("{},\"k00007\":0}}", &s[..s.len() - 1]);
    let e = err(&dup);
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::DuplicateKey, "", s.len())
    );
}

#[test]
fn depth_limits() {
    let deep = "[".repeat(10_000);
    let e = both(deep.as_bytes(), &Limits::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooDeep);
    assert_eq!(e.offset, 128);
    assert_eq!(e.pointer, "/0".repeat(128));
    let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
    assert_eq!(canon(&ok).unwrap(), ok);
    let objs = format!("{}1{}", "{\"a\":".repeat(129), "}".repeat(129));
    let e = err(&objs);
    assert_eq!((e.kind, e.offset), (ErrorKind::TooDeep, 128 * 5));
    assert_eq!(e.pointer, "/a".repeat(128));
    let zero = Limits {
        max_depth: 0,
        ..Limits::default()
    };
    assert_eq!(both(b"1", &zero).as_deref(), Ok("1"));
    assert_eq!(both(b"[]", &zero).unwrap_err().kind, ErrorKind::TooDeep);
    // The parser's own stack takes any depth; canonicalize builds no tree.
    let big = Limits {
        max_depth: 200_000,
        max_input_bytes: 1 << 20,
    };
    let n = 200_000;
    let s = format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(canonicalize(s.as_bytes(), &big).unwrap(), s);
}

#[test]
fn size_limits() {
    let body = "x".repeat(16 << 20);
    let s = format!("\"{body}\"");
    let e = both(s.as_bytes(), &Limits::default()).unwrap_err();
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::TooLarge, "", 1 << 20)
    );
    let raised = Limits {
        max_input_bytes: 17 << 20,
        ..Limits::default()
    };
    assert_eq!(canonicalize(s.as_bytes(), &raised).unwrap(), s);
    let exact = Limits {
        max_input_bytes: 3,
        ..Limits::default()
    };
    assert!(canonicalize(b"[1]", &exact).is_ok());
    assert_eq!(canonicalize(b"[1] ", &exact).unwrap_err().kind, ErrorKind::TooLarge);
}

#[test]
fn canonicalize_into_appends_and_restores() {
    let mut out = String::from("prefix:");
    canonicalize_into(b"{\"b\":1,\"a\":2}", &Limits::default(), &mut out).unwrap();
    assert_eq!(out, "prefix:{\"a\":2,\"b\":1}");
    assert!(canonicalize_into(b"{\"b\":1,\"a\":2", &Limits::default(), &mut out).is_err());
    assert_eq!(out, "prefix:{\"a\":2,\"b\":1}");
}

#[test]
fn value_helpers() {
    let mut v = parse(br#"{"b":1,"a":{"c":[true,null]},"d":"x"}"#, &Limits::default()).unwrap();
    assert_eq!(v.get("d"), Some(&Value::String("x".into())));
    assert_eq!(v.get("zz"), None);
    assert_eq!(v.pointer("/a/c/1"), Some(&Value::Null));
    assert_eq!(v.pointer("/a/c/0"), Some(&Value::Bool(true)));
    assert_eq!(Value::Null.get("a"), None);
    assert_eq!(v.remove("b").map(|b| matches!(b, Value::Number(_))), Some(true));
    assert_eq!(v.remove("b"), None);
    v.insert("d".into(), Value::Bool(false));
    v.insert("0".into(), Value::Null);
    let Value::Object(m) = &v else { panic!() };
    let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "d", "0"]);
    let mut out = String::new();
    write_canonical(&v, &mut out);
    assert_eq!(out, r#"{"0":null,"a":{"c":[true,null]},"d":false}"#);
    let mut s = Value::Bool(true);
    s.insert("a".into(), Value::Null);
    assert_eq!(s.remove("a"), None);
    assert_eq!(s, Value::Bool(true));
}

#[test]
fn write_canonical_hand_built() {
    let v = Value::Object(vec![
        (
            "\u{fb33}".into(),
            Value::Number(Number {
                value: -0.0,
                raw: String::new(),
            }),
        ),
        ("\u{1f600}".into(), Value::String("\u{1}\"".into())),
        (
            "".into(),
            Value::Array(vec![Value::Array(vec![]), Value::Object(vec![])]),
        ),
    ]);
    let mut out = String::new();
    write_canonical(&v, &mut out);
    assert_eq!(out, "{\"\":[[],{}],\"\u{1f600}\":\"\\u0001\\\"\",\"\u{fb33}\":0}");
}

#[test]
fn error_kind_names() {
    assert_eq!(ErrorKind::DuplicateKey.as_str(), "duplicate_key");
    assert_eq!(format!("{}", ErrorKind::TooLarge), "too_large");
}

// ---- properties -------------------------------------------------------

fn arb_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        "[a-c]{0,2}",
        proptest::collection::vec(
            prop_oneof![
                Just('\u{0}'),
                Just('"'),
                Just('\\'),
                Just('\u{7f}'),
                Just('\u{e9}'),
                Just('\u{ffff}'),
                Just('\u{1f600}'),
                proptest::char::any(),
            ],
            0..4
        )
        .prop_map(|c| c.into_iter().collect::<String>()),
    ];
    let number = prop_oneof![
        any::<i32>().prop_map(f64::from),
        any::<u64>()
            .prop_map(f64::from_bits)
            .prop_filter("finite", |f| f.is_finite()),
        (-30i32..30).prop_map(|e| 10f64.powi(e)),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number.prop_map(|value| Value::Number(Number {
            value,
            raw: String::new()
        })),
        key.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6).prop_map(|members| {
                let mut out: Vec<(String, Value)> = Vec::new();
                for (k, v) in members {
                    if !out.iter().any(|(e, _)| *e == k) {
                        out.push((k, v));
                    }
                }
                Value::Object(out)
            }),
        ]
    })
}

/// A deterministic coin for the renderer.
struct Coin(u64);

impl Coin {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn ws(c: &mut Coin, out: &mut String) {
    for _ in 0..c.next(3) {
        out.push([' ', '\t', '\n', '\r'][c.next(4) as usize]);
    }
}

fn render_str(s: &str, c: &mut Coin, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        let escape = (ch as u32) < 0x20 || ch == '"' || ch == '\\' || c.next(4) == 0;
        if !escape {
            out.push(ch);
            continue;
        }
        let short = match ch {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\n' => Some("\\n"),
            '\t' => Some("\\t"),
            _ => None,
        };
        match short {
            Some(e) if c.next(2) == 0 => out.push_str(e),
            _ => {
                let mut units = [0u16; 2];
                for u in ch.encode_utf16(&mut units) {
                    if c.next(2) == 0 {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            }
        }
    }
    out.push('"');
}

fn render(v: &Value, c: &mut Coin, out: &mut String) {
    ws(c, out);
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match c.next(3) {
            0 => out.push_str(&format!("{}", n.value)),
            1 => out.push_str(&format!("{:e}", n.value)),
            _ => out.push_str(&format!("{:E}", n.value)),
        },
        Value::String(s) => render_str(s, c, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                render(item, c, out);
            }
            ws(c, out);
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(c, out);
                render_str(k, c, out);
                ws(c, out);
                out.push(':');
                render(item, c, out);
            }
            ws(c, out);
            out.push('}');
        }
    }
    ws(c, out);
}

fn oracle_accepts(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn render_parse_canonical(v in arb_value(), seed in 1u64..) {
        let mut c = Coin(seed);
        let mut text = String::new();
        render(&v, &mut c, &mut text);
        let mut want = String::new();
        write_canonical(&v, &mut want);
        let got = both(text.as_bytes(), &Limits::default());
        prop_assert_eq!(got.as_deref(), Ok(want.as_str()), "text {:?}", text);
        // Canonical output is a fixed point.
        let again = canon(&want);
        prop_assert_eq!(again.as_deref(), Ok(want.as_str()));
        // And the oracle agrees it is JSON.
        prop_assert!(oracle_accepts(text.as_bytes()));
    }

    #[test]
    fn number_text_canonical(s in "-?(0|[1-9][0-9]{0,17})(\\.0{0,7}[0-9]{1,12}0?)?([eE][+-]?[0-9]{1,3})?") {
        let v: f64 = s.parse().unwrap();
        let got = both(s.as_bytes(), &Limits::default());
        if v.is_finite() {
            let mut want = String::new();
            format_number(v, &mut want);
            prop_assert_eq!(got, Ok(want), "{}", s);
        } else {
            prop_assert_eq!(got.map_err(|e| e.kind), Err(ErrorKind::NumberOutOfRange));
        }
    }

    #[test]
    fn mutations_agree(v in arb_value(), seed in 1u64.., edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..4)) {
        let mut c = Coin(seed);
        let mut text = String::new();
        render(&v, &mut c, &mut text);
        let mut bytes = text.into_bytes();
        for (at, b, op) in edits {
            let at = at % (bytes.len() + 1);
            let b = b"{}[]\",:\\ u0123456789eE.-+tfnaxD8C"[usize::from(b) % 33];
            match op {
                0 => bytes.insert(at, b),
                1 if at < bytes.len() => { bytes.remove(at); }
                _ => bytes.truncate(at),
            }
        }
        let ours = both(&bytes, &Limits::default());
        let oracle = oracle_accepts(&bytes);
        match &ours {
            Ok(_) => prop_assert!(oracle, "we accept what serde_json rejects: {:?}", String::from_utf8_lossy(&bytes)),
            Err(e) if oracle => prop_assert!(
                matches!(e.kind, ErrorKind::DuplicateKey),
                "serde_json accepts, we say {}: {:?}", e, String::from_utf8_lossy(&bytes)
            ),
            Err(e) => {
                prop_assert!(e.offset <= bytes.len());
                // The reported pointer is well formed.
                prop_assert!(check_pointer(&e.pointer).is_ok());
            }
        }
        if let Err(e) = &ours {
            // Nothing before the reported offset is wrong: the input cut
            // there is complete, or fails only because it ends there.
            let cut = both(&bytes[..e.offset], &Limits::default());
            match cut {
                Ok(_) => prop_assert!(
                    matches!(e.kind, ErrorKind::TrailingData | ErrorKind::InvalidUtf8),
                    "{} but the prefix is fine: {:?}", e, String::from_utf8_lossy(&bytes)
                ),
                Err(c) => {
                    prop_assert_eq!(c.offset, e.offset, "{} vs prefix {}: {:?}", e, c, String::from_utf8_lossy(&bytes));
                    prop_assert_eq!(c.kind, ErrorKind::Syntax);
                }
            }
        }
    }
}

// ---- the payload path: numbers a double cannot hold exactly ----

#[track_caller]
fn exact_rejects(s: &str, pointer: &str, offset: usize) -> Error {
    let limits = Limits::default();
    let e = parse_exact(s.as_bytes(), &limits).expect_err(s);
    assert_eq!(
        (e.kind, e.pointer.as_str(), e.offset),
        (ErrorKind::InexactNumber, pointer, offset),
        "{s:?}: {e}"
    );
    let mut out = String::from("kept");
    assert_eq!(canonicalize_exact_into(s.as_bytes(), &limits, &mut out), Err(e.clone()));
    assert_eq!(out, "kept", "nothing appended on error");
    // canonicalize itself follows RFC 8785 and rounds.
    assert!(canonicalize(s.as_bytes(), &limits).is_ok(), "{s:?}");
    e
}

#[test]
fn the_payload_path_refuses_numbers_a_double_changes() {
    let e = exact_rejects(r#"{"order_id":9007199254740993}"#, "/order_id", 12);
    assert_eq!(
        e.message,
        "number 9007199254740993 is not exactly a double (it would be read as 9007199254740992); send it as a \
         string at /order_id (byte 12)"
    );
    exact_rejects("[0.30000000000000001]", "/0", 1);
    exact_rejects("[1,-9007199254740995]", "/1", 3);
    exact_rejects("1e-400", "", 0);
    exact_rejects("123456789012345678901234567890", "", 0);
    exact_rejects(r#"{"a":{"b":[2.00000000000000000001]}}"#, "/a/b/0", 11);
}

#[test]
fn the_payload_path_keeps_numbers_whose_canonical_form_is_the_same_value() {
    let limits = Limits::default();
    for (literal, canonical) in [
        ("9007199254740992", "9007199254740992"),
        ("-9007199254740992", "-9007199254740992"),
        ("0.1", "0.1"),
        ("1.0", "1"),
        ("1e2", "100"),
        ("1.50", "1.5"),
        ("-0", "0"),
        ("0e5", "0"),
        ("0.000", "0"),
        ("5e-324", "5e-324"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("100000000000000000000", "100000000000000000000"),
        ("1e21", "1e+21"),
        ("123.456e-2", "1.23456"),
        ("18014398509481984", "18014398509481984"),
    ] {
        let mut out = String::new();
        assert_eq!(
            canonicalize_exact_into(literal.as_bytes(), &limits, &mut out),
            Ok(()),
            "{literal}"
        );
        assert_eq!(out, canonical, "{literal}");
        assert!(parse_exact(literal.as_bytes(), &limits).is_ok(), "{literal}");
    }
}

#[test]
fn validate_checks_without_building() {
    let limits = Limits::default();
    assert_eq!(validate(br#"{"id":9007199254740993}"#, &limits), Ok(()));
    assert_eq!(
        validate(br#"{"a":1,"a":2}"#, &limits).map_err(|e| e.kind),
        Err(ErrorKind::DuplicateKey)
    );
    assert_eq!(validate(b"[1,", &limits), Err(parse(b"[1,", &limits).unwrap_err()));
}

proptest! {
    /// The exact path accepts a number exactly when its canonical text, read
    /// back as a decimal, is the literal's decimal: checked against an
    /// independent exact comparison of the two decimal strings.
    #[test]
    fn exactness_agrees_with_decimal_comparison(
        neg in any::<bool>(),
        int in "(0|[1-9][0-9]{0,22})",
        frac in proptest::option::of("[0-9]{1,20}"),
        exp in proptest::option::of(-30i32..30),
    ) {
        let mut literal = String::new();
        if neg { literal.push('-'); }
        literal.push_str(&int);
        if let Some(f) = &frac { literal.push('.'); literal.push_str(f); }
        if let Some(e) = exp { literal.push_str(&format!("e{e}")); }
        let limits = Limits::default();
        let canonical = canonicalize(literal.as_bytes(), &limits).unwrap();
        let same = normalized(&literal) == normalized(&canonical);
        let exact = parse_exact(literal.as_bytes(), &limits);
        prop_assert_eq!(exact.is_ok(), same, "{} -> {}", literal, canonical);
    }
}

/// A decimal string as (negative, significant digits, exponent of 0.d1d2…),
/// zero as one canonical form: an exact comparison without floating point.
fn normalized(s: &str) -> (bool, String, i64) {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].trim_start_matches('+').parse::<i64>().unwrap()),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = int.chars().chain(frac.chars()).collect();
    let Some(first) = digits.find(|c| c != '0') else {
        return (false, String::new(), 0);
    };
    let last = digits.rfind(|c| c != '0').unwrap();
    (
        neg,
        digits[first..=last].to_string(),
        exp + int.len() as i64 - first as i64,
    )
}
