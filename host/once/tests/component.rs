//! The component itself: what it imports and exports, and that canonical
//! JSON computed inside it matches the RFC 8785 reference vectors.

use std::collections::BTreeSet;
use std::path::PathBuf;

use once::Once;
use once::runtime::Runtime;
use once::storage::memory::MemoryStorage;

#[path = "../../../tests/support/shared_vectors.rs"]
mod shared_vectors;

fn vectors() -> PathBuf {
    shared_vectors::dir().join("jcs")
}

fn engine_only() -> Once {
    Once::builder(MemoryStorage::new())
        .build()
        .expect("the component loads")
}

/// The interfaces world `once` imports and exports, read from the WIT file itself.
fn world_interfaces() -> (BTreeSet<String>, BTreeSet<String>) {
    let wit = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../wit/once.wit")).unwrap();
    let package = wit
        .lines()
        .find_map(|l| l.strip_prefix("package "))
        .expect("a package line")
        .trim_end_matches(';');
    let (namespace, version) = package.split_once('@').expect("a versioned package");
    let world = &wit[wit.find("world once {").expect("world once")..];
    let world = &world[..world.find('}').unwrap()];
    let named = |keyword: &str| -> BTreeSet<String> {
        world
            .lines()
            .filter_map(|l| l.trim().strip_prefix(keyword))
            .map(|name| format!("{namespace}/{}@{version}", name.trim_end_matches(';')))
            .collect()
    };
    let mut imports = named("import ");
    // The shared type definitions come along with the interfaces that use them.
    imports.insert(format!("{namespace}/types@{version}"));
    (imports, named("export "))
}

#[test]
fn component_imports_exactly_the_once_world() {
    let runtime = Runtime::shared().unwrap();
    let imports: BTreeSet<String> = runtime.imports().into_iter().collect();
    let (world_imports, world_exports) = world_interfaces();
    assert_eq!(
        imports, world_imports,
        "the rules can reach nothing but the declared imports (no WASI)"
    );
    assert!(imports.iter().all(|i| !i.starts_with("wasi:")));
    let exports: BTreeSet<String> = runtime.exports().into_iter().collect();
    assert_eq!(exports, world_exports);
    assert_eq!(exports.len(), 4, "engine, driver, protocol, transitions: {exports:?}");
}

#[test]
fn reference_vectors_canonicalize_through_the_component() {
    if shared_vectors::skip() {
        return;
    }
    let once = engine_only();
    let mut checked = 0;
    for entry in std::fs::read_dir(vectors().join("input")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let input = std::fs::read(&path).unwrap();
        let expected = std::fs::read_to_string(vectors().join("output").join(&name)).unwrap();
        let actual = once.canonicalize(&input).unwrap();
        assert_eq!(actual, expected, "{name:?}");
        checked += 1;
    }
    assert_eq!(checked, 6);
}

#[test]
fn es6_number_samples_format_through_the_component() {
    if shared_vectors::skip() {
        return;
    }
    let once = engine_only();
    let csv = std::fs::read_to_string(vectors().join("numbers/es6-number-samples.csv")).unwrap();
    let mut checked = 0;
    for line in csv.lines().skip(1) {
        let (hex, expected) = line.split_once(',').unwrap();
        let value = f64::from_bits(u64::from_str_radix(hex, 16).unwrap());
        // Rust's exponent form is valid JSON and differs from the canonical one.
        let input = format!("{value:e}");
        assert_eq!(
            once.canonicalize(input.as_bytes()).unwrap(),
            expected,
            "{hex} written as {input}"
        );
        checked += 1;
    }
    assert!(checked >= 7);
}

#[test]
fn bad_json_is_a_typed_error_naming_the_place() {
    let once = engine_only();
    let err = once.canonicalize(br#"{"a":{"b":1,"b":2}}"#).unwrap_err();
    let once::OnceError::Json(e) = err else {
        panic!("expected a JSON error, got {err:?}")
    };
    assert_eq!(e.kind, once::types::JsonErrorKind::DuplicateKey);
    assert_eq!(e.pointer, "/a");
    for (input, kind) in [
        (&br#"{"a":"\ud800"}"#[..], once::types::JsonErrorKind::LoneSurrogate),
        (b"[NaN]", once::types::JsonErrorKind::NonFiniteNumber),
        (b"1e400", once::types::JsonErrorKind::NumberOutOfRange),
        (b"{\"a\":1} x", once::types::JsonErrorKind::TrailingData),
        (b"\xff", once::types::JsonErrorKind::InvalidUtf8),
    ] {
        match once.canonicalize(input) {
            Err(once::OnceError::Json(e)) => assert_eq!(e.kind, kind, "{input:?}"),
            other => panic!("{input:?}: expected {kind:?}, got {other:?}"),
        }
    }
    let deep = "[".repeat(10_000);
    match once.canonicalize(deep.as_bytes()) {
        Err(once::OnceError::Json(e)) => assert_eq!(e.kind, once::types::JsonErrorKind::TooDeep),
        other => panic!("expected too-deep, got {other:?}"),
    }
    let big = format!("\"{}\"", "x".repeat(16 << 20));
    match once.canonicalize(big.as_bytes()) {
        Err(once::OnceError::Json(e)) => assert_eq!(e.kind, once::types::JsonErrorKind::TooLarge),
        other => panic!("expected too-large, got {other:?}"),
    }
}

#[test]
fn fingerprint_is_sha256_of_the_canonical_call() {
    let once = engine_only();
    let a = once
        .fingerprint("refund_order", r#"{"order_id":1234,"amount":200}"#)
        .unwrap();
    let b = once
        .fingerprint("refund_order", r#"{ "amount": 2e2, "order_id": 1234 }"#)
        .unwrap();
    assert_eq!(a, b, "the fingerprint is over the canonical form");
    assert_eq!(a.len(), 64);
    assert!(a.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
    let canonical = once
        .canonicalize(br#"{"tool":"refund_order","args":{"order_id":1234,"amount":200}}"#)
        .unwrap();
    assert_eq!(
        canonical,
        r#"{"args":{"amount":200,"order_id":1234},"tool":"refund_order"}"#
    );
    assert_ne!(
        a,
        once.fingerprint("refund_order", r#"{"order_id":1234,"amount":201}"#)
            .unwrap()
    );
    assert_ne!(
        a,
        once.fingerprint("refund_orders", r#"{"order_id":1234,"amount":200}"#)
            .unwrap()
    );
}

#[test]
fn a_second_load_uses_the_compiled_cache() {
    let dir = tempfile::tempdir().unwrap();
    Runtime::load(Some(dir.path())).unwrap();
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(cached.len(), 1, "one compiled artifact: {cached:?}");
    assert!(cached[0].extension().is_some_and(|e| e == "cwasm"));
    let modified = std::fs::metadata(&cached[0]).unwrap().modified().unwrap();
    Runtime::load(Some(dir.path())).unwrap();
    assert_eq!(
        std::fs::metadata(&cached[0]).unwrap().modified().unwrap(),
        modified,
        "not recompiled"
    );
    // A corrupt artifact is recompiled, never trusted.
    std::fs::write(&cached[0], b"not a compiled component").unwrap();
    let runtime = Runtime::load(Some(dir.path())).unwrap();
    assert!(runtime.instantiate_check().is_ok());
}

/// Fuel metering is on in every runtime `Once` builds; the unmetered build
/// (for measuring what metering costs) runs the same protocol, with no budget.
#[test]
fn the_unmetered_runtime_runs_the_same_calls_without_a_fuel_budget() {
    assert!(Runtime::shared().unwrap().metered());
    let unmetered = std::sync::Arc::new(Runtime::load_unmetered(None).expect("compiles"));
    assert!(!unmetered.metered());
    // A budget of one unit would stop any metered call at once; here it is not counted.
    let once = Once::builder(MemoryStorage::new())
        .runtime(unmetered)
        .fuel_per_call(1)
        .build()
        .expect("configures");
    let called = once
        .call("s", Some("k"), "refund", r#"{"amount":1}"#, |_| {
            once::Sent::Success(r#"{"id":1}"#.into())
        })
        .unwrap();
    assert!(called.confirmed().is_some_and(|c| !c.replayed), "{called:?}");
}
