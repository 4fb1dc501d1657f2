//! A bounded load test of `once gateway --listen` on 127.0.0.1: 2,000
//! protected calls (each its own operation key) from 16 clients at once, in
//! front of the real refund-mcp and its SQLite effect ledger, on an SQLite
//! once ledger; then, as the same run's baseline, 2,000 of the same calls
//! routed DIRECT (through the gateway, no ledger). No call may fail and no
//! refund may be doubled; it prints throughput and p50/p99 latency for both,
//! which BENCHMARKS.md records.
//!
//! Ignored by a plain `cargo test` (it takes a while on a debug build);
//! `.ci/run` runs it with `--ignored` in its own stage.

mod gateway_common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use gateway_common::http::*;
use gateway_common::*;
use refund::{EffectLedger, ORDER_ID};
use serde_json::json;

const CLIENTS: usize = 16;
const CALLS: usize = 2_000;

/// `CALLS` refunds of one cent, each under its own key, from `CLIENTS` threads; every answer once's
/// `decision` (`None`: the upstream's own result, untouched, as a DIRECT call's is).
fn load(rig: &Rig, decision: Option<&str>) -> (Duration, Vec<Duration>) {
    let mut gw = rig.listen("none", 0);
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (url, decision) = (gw.url.clone(), decision.map(str::to_string));
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                for i in (c..CALLS).step_by(CLIENTS) {
                    let key = format!("load-{i}");
                    let args = json!({"order_id": ORDER_ID, "amount": 0.01, "idempotency_key": key});
                    let body = call_body("refund_order", args, Some(&key));
                    let sent = Instant::now();
                    let answer = post(&url, None, &[], &body.to_string());
                    latencies.push(sent.elapsed());
                    assert_eq!(answer.status, 200, "{key}: {answer:?}");
                    match &decision {
                        Some(decision) => assert_eq!(answer.outcome()["decision"], *decision, "{key}: {answer:?}"),
                        None => {
                            assert_ne!(answer.result()["isError"], true, "{key}: {answer:?}");
                            assert_eq!(
                                answer.result()["structuredContent"]["idempotency_key"],
                                key,
                                "{answer:?}"
                            );
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let latencies: Vec<Duration> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let elapsed = started.elapsed();
    assert!(gw.terminate().success(), "{}", rig.logs());
    assert_eq!(latencies.len(), CALLS);
    let effects = EffectLedger::open(rig.effects_db()).unwrap();
    assert_eq!(effects.count(ORDER_ID).unwrap(), CALLS as u64, "one refund per call");
    assert_eq!(effects.refunded_cents(ORDER_ID).unwrap(), CALLS as i64);
    let keys: BTreeSet<String> = effects
        .refunds(ORDER_ID)
        .unwrap()
        .into_iter()
        .map(|r| r.op_key)
        .collect();
    assert_eq!(keys.len(), CALLS, "no provider key twice: no duplicate refund");
    (elapsed, latencies)
}

fn report(what: &str, (elapsed, mut latencies): (Duration, Vec<Duration>)) -> f64 {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let rate = CALLS as f64 / elapsed.as_secs_f64();
    println!(
        "gateway --listen load, {what}: {CALLS} calls from {CLIENTS} clients in {:.2} s: {rate:.0} calls/s, \
         p50 {:.1} ms, p99 {:.1} ms",
        elapsed.as_secs_f64(),
        at(0.50).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
    );
    rate
}

#[test]
#[ignore = "a load test: cargo test -p once-cli --test gateway_http_load -- --ignored --nocapture"]
fn two_thousand_protected_calls_from_sixteen_clients() {
    // No quota: a quota is one bucket record that every call writes, and 16 writers at once exhaust
    // the engine's optimistic retries on it (`blocked(storage)`, nothing sent): that measures the bucket.
    let protect: String = fast_config("")
        .lines()
        .filter(|l| !l.starts_with("quota ="))
        .collect::<Vec<_>>()
        .join("\n");
    let direct = protect.replace("[tools.refund_order]", "[tools.refund_order]\nroute = \"direct\"");
    let protected = report("PROTECT", load(&Rig::new(&protect), Some("executed")));
    let baseline = report("DIRECT (baseline)", load(&Rig::new(&direct), None));
    println!("PROTECT / DIRECT throughput: {:.2}", protected / baseline);
}
