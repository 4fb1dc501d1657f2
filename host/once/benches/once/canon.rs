//! Row 1: canonicalize + fingerprint of 100 B / 10 KB / 1 MB JSON, three ways:
//! the guest through the component (wasmtime), the same guest library
//! compiled natively, and `serde_json_canonicalizer` + `sha2` (native peer).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput};
use once::Once;
use once::storage::memory::MemoryStorage;
use once_guest::testing::MemoryHost;
use sha2::{Digest, Sha256};

use crate::record::{compare, timed};

const TOOL: &str = "refund";

/// A JSON object of exactly `target` bytes (at least ~90): unsorted keys,
/// nested objects and arrays, escapes, non-ASCII, integers, decimals and
/// exponents, so canonicalization has to sort, re-escape and reformat.
pub fn payload(target: usize) -> String {
    let mut s = String::from(r#"{"order":1234,"amount":200.5,"currency":"EUR","customer":"c_42","items":["#);
    const TAIL: usize = r#"],"note":""}"#.len();
    for i in 0.. {
        let item = format!(
            r#"{{"sku":"SKU-{i}","qty":{},"price":{}.{:02},"tags":["gift","caf\u00e9","Zoë \"Z\""],"eta":1.5e3,"ok":true,"meta":null}}"#,
            i % 7 + 1,
            i % 500,
            i % 100
        );
        if s.len() + item.len() + 1 + TAIL > target {
            break;
        }
        if i > 0 {
            s.push(',');
        }
        s.push_str(&item);
    }
    s.push_str(r#"],"note":""#);
    while s.len() + 2 < target {
        s.push('x');
    }
    s.push_str(r#""}"#);
    s
}

/// The peer pipeline: parse, build `{"tool":…,"args":…}`, RFC 8785, SHA-256 (hex).
fn peer_fingerprint(tool: &str, args: &str) -> String {
    let args: serde_json::Value = serde_json::from_str(args).expect("valid JSON");
    let call = serde_json::json!({ "tool": tool, "args": args });
    let canonical = serde_json_canonicalizer::to_vec(&call).expect("canonicalizable");
    Sha256::digest(&canonical).iter().map(|b| format!("{b:02x}")).collect()
}

/// The peer's canonical form alone.
fn peer_canonicalize(json: &str) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
    serde_json_canonicalizer::to_vec(&value).expect("canonicalizable")
}

fn time(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed()
}

/// Register the row's groups.
pub fn bench(c: &mut Criterion) {
    let once = Once::builder(MemoryStorage::new()).build().expect("the once component");
    let native = MemoryHost::new();
    for (label, size) in [("100B", 100), ("10KB", 10_000), ("1MB", 1_000_000)] {
        let args = payload(size);
        assert_eq!(args.len(), size);
        // The three do the same work: the same fingerprint and canonical form.
        let component = once.fingerprint(TOOL, &args).expect("component fingerprint");
        assert_eq!(
            component,
            once_guest::engine::fingerprint(&native, TOOL, &args).expect("native")
        );
        assert_eq!(component, peer_fingerprint(TOOL, &args));
        assert_eq!(
            once.canonicalize(args.as_bytes())
                .expect("component canonicalize")
                .into_bytes(),
            peer_canonicalize(&args)
        );

        let samples = if size >= 1_000_000 { 10 } else { 20 };
        let mut g = c.benchmark_group(format!("fingerprint/{label}"));
        g.throughput(Throughput::Bytes(size as u64))
            .sample_size(samples)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        if size >= 1_000_000 {
            g.sampling_mode(SamplingMode::Flat);
        }
        let id = |who: &str| format!("fingerprint/{label}/{who}");
        g.bench_function("component", |b| {
            timed(b, &id("component"), |n| {
                time(n, || {
                    black_box(once.fingerprint(TOOL, black_box(&args)).unwrap());
                })
            })
        });
        g.bench_function("guest-native", |b| {
            timed(b, &id("guest-native"), |n| {
                time(n, || {
                    black_box(once_guest::engine::fingerprint(&native, TOOL, black_box(&args)).unwrap());
                })
            })
        });
        // The export's previous path (parse into a tree, then write it): the fast path's own baseline.
        let limits = once_guest::canon::Limits::default();
        g.bench_function("guest-native-tree", |b| {
            timed(b, &id("guest-native-tree"), |n| {
                time(n, || {
                    let tree = once_guest::canon::parse(black_box(args.as_bytes()), &limits).unwrap();
                    black_box(once_guest::payload::fingerprint_of(TOOL, tree));
                })
            })
        });
        g.bench_function("serde_json_canonicalizer", |b| {
            timed(b, &id("serde_json_canonicalizer"), |n| {
                time(n, || {
                    black_box(peer_fingerprint(TOOL, black_box(&args)));
                })
            })
        });
        g.bench_function("component-canonicalize-only", |b| {
            timed(b, &id("component-canonicalize-only"), |n| {
                time(n, || {
                    black_box(once.canonicalize(black_box(args.as_bytes())).unwrap());
                })
            })
        });
        g.bench_function("serde_json_canonicalizer-canonicalize-only", |b| {
            timed(b, &id("serde_json_canonicalizer-canonicalize-only"), |n| {
                time(n, || {
                    black_box(peer_canonicalize(black_box(&args)));
                })
            })
        });
        g.finish();
        let row = format!("1. fingerprint {label}");
        compare(&row, &id("component"), &id("serde_json_canonicalizer"), samples);
        compare(&row, &id("guest-native"), &id("serde_json_canonicalizer"), samples);
        compare(&row, &id("component"), &id("guest-native"), samples);
        compare(&row, &id("guest-native"), &id("guest-native-tree"), samples);
        compare(
            &format!("1. canonicalize {label}"),
            &id("component-canonicalize-only"),
            &id("serde_json_canonicalizer-canonicalize-only"),
            samples,
        );
    }
}
