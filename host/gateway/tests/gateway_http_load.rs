//! A bounded load test of `once gateway --listen` on 127.0.0.1 with the
//! README's tenant config as printed (the example's refund tool, its 500.00 a
//! day quota, the acme and globex tokens), in front of the real refund-mcp and
//! its SQLite effect ledger, on the default SQLite once ledger and on
//! PostgreSQL:
//!
//! - 2,000 protected calls (each its own operation key) from 16 clients, then
//!   the same from 128 clients with every fifth call a repeat of the client's
//!   previous key; as the run's baseline, 2,000 of the same calls routed
//!   DIRECT (through the gateway, no ledger);
//! - 128 calls of one refund under one key at once: one refund, 127 replays;
//! - 64 refunds of 10.00 at once on a fresh tenant's bucket: 50 refunds and
//!   14 over the ceiling.
//!
//! No call may be refused because others were busy (`blocked(storage)`), and
//! no refund may be doubled or pass the ceiling. It prints throughput and
//! p50/p99 latency, and the 128-client throughput as a share of the
//! 16-client figure, which BENCHMARKS.md records (timings are never asserted:
//! a first call whose reply the upstream did not give within the tool's 2 s
//! timeout, and that once then confirmed by reading the provider, is once
//! doing its job on a saturated machine, so it is counted and printed, not
//! failed). The same holds at once: in the hot-key and hot-bucket phases a
//! sender's reply lost at or past that timeout and confirmed by the lookup is
//! accepted in place of `executed`, and a caller on the hot key that ran out
//! of the default 10 s `in_flight_wait` (answering `in-flight` or `unknown`,
//! having sent nothing) is asked again and must then replay.
//!
//! Ignored by a plain `cargo test` (it takes a while on a debug build);
//! `.ci/run` runs it with `--ignored` in its own stage.

mod gateway_common;
#[path = "../../once/tests/postgres_common/mod.rs"]
mod postgres_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gateway_common::http::*;
use gateway_common::*;
use refund::{EffectLedger, ORDER_ID};
use serde_json::{Value, json};

const CALLS: usize = 2_000;
/// `timeout` of `refund_order` in the README's config (`run_on` checks it is still that).
const TOOL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call waits for another holding its key: the gateway's default `in_flight_wait`, which the
/// README's config leaves as it is (`run_on` checks).
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// The least time a call that waited out [`IN_FLIGHT_WAIT`] took: a wait answers as soon as its next wake
/// would come after the wait, a holder's poll (50 ms) or a due read (at most the default 1 s reconcile
/// interval) early.
const WAITED_OUT: Duration = Duration::from_secs(9);
const ACME: &str = "acme-token";
const GLOBEX: &str = "globex-token";

/// `CALLS` refunds of one cent by acme from `clients` threads; every `repeat_every`th call of a client
/// (if any) repeats its previous key and must replay. Every answer's once `decision` must be `decision`
/// (`None`: the upstream's own result, untouched, as a DIRECT call's is), or for a first call its lost
/// reply confirmed by the lookup ([`confirmed_by_read`]). Returns the elapsed time, every latency and
/// how many replies were lost, and checks one refund per key in the effect ledger.
fn load(
    gw: &Listening,
    rig: &Rig,
    run: &str,
    clients: usize,
    repeat_every: Option<usize>,
    decision: Option<&str>,
) -> (Duration, Vec<Duration>, usize) {
    let refunds_before = EffectLedger::open(rig.effects_db()).unwrap().count(ORDER_ID).unwrap();
    let started = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, decision, run) = (gw.url.clone(), decision.map(str::to_string), run.to_string());
            std::thread::spawn(move || {
                let (mut latencies, mut keys, mut lost, mut last) = (Vec::new(), 0, 0, String::new());
                for (n, i) in (c..CALLS).step_by(clients).enumerate() {
                    let repeat = repeat_every.is_some_and(|every| n % every == every - 1);
                    if !repeat {
                        last = format!("{run}-{i}");
                        keys += 1;
                    }
                    let key = last.clone();
                    let args = json!({"order_id": ORDER_ID, "amount": 0.01, "idempotency_key": key});
                    let sent = Instant::now();
                    let answer = post(
                        &url,
                        Some(ACME),
                        &[],
                        &call_body("refund_order", args, Some(&key)).to_string(),
                    );
                    latencies.push(sent.elapsed());
                    match unexpected(&answer, &key, decision.as_deref(), repeat) {
                        Ok(Read::Answered) => {}
                        // Only the tool's timeout may lose a reply here: one lost sooner is a fault.
                        Ok(Read::LostAndRead) if sent.elapsed() >= TOOL_TIMEOUT => lost += 1,
                        Ok(Read::LostAndRead) => {
                            return Err(format!(
                                "{key}: its reply was lost before the tool's {TOOL_TIMEOUT:?} timeout: {answer:?}"
                            ));
                        }
                        Err(wrong) => return Err(wrong),
                    }
                }
                Ok((latencies, keys, lost))
            })
        })
        .collect();
    let (mut latencies, mut keys, mut lost, mut wrong) = (Vec::new(), 0, 0, Vec::new());
    for t in threads {
        match t
            .join()
            .unwrap_or_else(|_| panic!("a client thread panicked\n{}", rig.logs()))
        {
            Ok((l, k, n)) => {
                latencies.extend(l);
                keys += k;
                lost += n;
            }
            Err(w) => wrong.push(w),
        }
    }
    // Each client's first wrong answer, after the gateway log (a long log must not push them out of sight).
    if !wrong.is_empty() {
        fail(
            rig,
            format!(
                "{run}: {} clients got a wrong answer:\n{}",
                wrong.len(),
                wrong.join("\n")
            ),
        );
    }
    let elapsed = started.elapsed();
    assert_eq!(latencies.len(), CALLS);
    let effects = EffectLedger::open(rig.effects_db()).unwrap();
    let refunds = effects.count(ORDER_ID).unwrap() - refunds_before;
    let expected = if decision.is_some() { keys } else { CALLS };
    assert_eq!(refunds, expected as u64, "{run}: one refund per key, none for a replay");
    let rows = effects.refunds(ORDER_ID).unwrap();
    let provider_keys: BTreeSet<String> = rows.iter().map(|r| r.op_key.clone()).collect();
    assert_eq!(
        provider_keys.len(),
        rows.len(),
        "no provider key twice: no duplicate refund"
    );
    (elapsed, latencies, lost)
}

/// How a right answer came about.
enum Read {
    /// As expected.
    Answered,
    /// A first call's own reply was lost and the lookup confirmed its effect ([`confirmed_by_read`]).
    LostAndRead,
}

/// What is wrong with `answer` to a call under `key`, if anything: the HTTP status must be 200; a
/// repeat must replay and a first call have `decision` (`None`: the upstream's own result, untouched)
/// or be its lost reply confirmed by the lookup.
fn unexpected(answer: &Answer, key: &str, decision: Option<&str>, repeat: bool) -> Result<Read, String> {
    let wrong = |what: &str| Err(format!("{key}: {what}: {answer:?}"));
    if answer.status != 200 {
        return wrong("HTTP status not 200");
    }
    let Some(result) = answer.message.as_ref().and_then(|m| m.get("result")) else {
        return wrong("no tools/call result");
    };
    let outcome = &result["_meta"]["once/outcome"];
    let said = &outcome["decision"];
    match (decision, repeat) {
        (Some(_), true) if said != "replayed" => wrong("a repeat did not replay"),
        (Some(_), false) if confirmed_by_read(outcome) => Ok(Read::LostAndRead),
        (Some(decision), false) if said != decision => wrong(&format!("not {decision}")),
        (None, _) if result["isError"] == true => wrong("the upstream's result is an error"),
        (None, _) if result["structuredContent"]["idempotency_key"] != key => {
            wrong("the upstream's result is for another key")
        }
        _ => Ok(Read::Answered),
    }
}

/// A first call whose own reply did not come within the tool's timeout (a saturated machine: the
/// clients, the gateway, the refund service and the database share two cores), and that once
/// confirmed by reading the provider: the refund happened, once, and the answer says so. Which calls
/// lose their reply is timing, never asserted; that each is confirmed, not sent again, is (the
/// effect ledger's one refund per key).
fn confirmed_by_read(outcome: &Value) -> bool {
    // Via the provider when this call's own read found it; via the key when the gateway's background
    // read confirmed the record first and the call replays the record.
    outcome["decision"] == "replayed"
        && (outcome["via"] == "provider" || outcome["via"] == "key")
        && outcome["confirmed_by"] == "provider"
        && outcome["effect"] == "happened"
}

fn report(what: &str, clients: usize, (elapsed, mut latencies, lost): (Duration, Vec<Duration>, usize)) -> f64 {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let rate = CALLS as f64 / elapsed.as_secs_f64();
    println!(
        "gateway --listen load, {what}: {CALLS} calls from {clients} clients in {:.2} s: {rate:.0} calls/s, \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {lost} replies lost and confirmed by the lookup",
        elapsed.as_secs_f64(),
        at(0.50).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
        at(1.0).as_secs_f64() * 1000.0,
    );
    rate
}

/// `bodies` POSTed by one thread each, released together; every answer's once outcome and latency.
fn at_once(gw: &Listening, rig: &Rig, token: &'static str, bodies: Vec<Value>) -> Vec<(Value, Duration)> {
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (url, barrier) = (gw.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let sent = Instant::now();
                let answer = post(&url, Some(token), &[], &body.to_string());
                match answer.status {
                    200 => Ok((answer.outcome().clone(), sent.elapsed())),
                    _ => Err(format!("HTTP status not 200: {answer:?}")),
                }
            })
        })
        .collect();
    let answers: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("a client thread panicked"))
        .collect();
    if let Some(Err(wrong)) = answers.iter().find(|a| a.is_err()) {
        fail(rig, wrong.clone());
    }
    answers.into_iter().flatten().collect()
}

/// How many answers had each `decision` (with the block reason: `blocked(quota)`).
fn decisions(answers: &[(Value, Duration)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (o, _) in answers {
        let decision = match o["reason"].as_str() {
            Some(reason) if o["decision"] == "blocked" => format!("blocked({reason})"),
            _ => o["decision"].as_str().unwrap_or("none").to_string(),
        };
        *counts.entry(decision).or_default() += 1;
    }
    counts
}

/// Checks the answers to one refund called under one key by many callers at once: one call sent it
/// (`executed`), or, when that call's reply missed the tool's timeout, none says `executed` and every
/// replay is of the effect the lookup confirmed; every other call replays it, or says what was known
/// when it ran out of the README's 10 s `in_flight_wait` on a saturated machine (`in-flight` or
/// `unknown`, having sent nothing). Returns the latter (the caller asks them again, and they must
/// replay) and whether the sender's reply was lost.
fn one_sent_rest_replayed(answers: &[(Value, Duration)]) -> Result<(usize, bool), String> {
    let counts = decisions(answers);
    let count = |d: &str| counts.get(d).copied().unwrap_or(0);
    let waited_out = |o: &Value| o["decision"] == "in-flight" || o["decision"] == "unknown";
    if let Some((o, took)) = answers.iter().find(|(o, took)| {
        !(o["decision"] == "executed" || o["decision"] == "replayed" || waited_out(o) && *took >= WAITED_OUT)
    }) {
        return Err(format!(
            "neither sent, replayed nor waited out its {IN_FLIGHT_WAIT:?} after {took:?}: {o}; all: {counts:?}"
        ));
    }
    let lost = match count("executed") {
        1 => false,
        // The sender's own answer is among them: its reply lost at or past the timeout, then confirmed.
        0 if replays_confirmed_by_read(answers) && answers.iter().any(|(o, took)| lost_and_confirmed(o, *took)) => true,
        _ => {
            return Err(format!(
                "not one call executed, nor one lost reply the lookup confirmed: {counts:?}"
            ));
        }
    };
    Ok((answers.iter().filter(|(o, _)| waited_out(o)).count(), lost))
}

/// A first call's answer when its reply was lost to the tool's timeout and the lookup confirmed the
/// effect (a reply lost sooner is a fault).
fn lost_and_confirmed(outcome: &Value, took: Duration) -> bool {
    confirmed_by_read(outcome) && took >= TOOL_TIMEOUT
}

/// Whether every replay among `answers` is of an effect the lookup confirmed.
fn replays_confirmed_by_read(answers: &[(Value, Duration)]) -> bool {
    answers
        .iter()
        .all(|(o, _)| o["decision"] != "replayed" || confirmed_by_read(o))
}

/// Checks the answers to refunds under distinct keys called at once on one bucket: `sent` sent (each
/// `executed`, or its reply lost at or past the tool's timeout and confirmed by the lookup), the others
/// `blocked(quota)`. Returns how many replies were lost.
fn sent_or_over_quota(answers: &[(Value, Duration)], sent: usize) -> Result<usize, String> {
    let (mut executed, mut lost, mut over) = (0, 0, 0);
    for (o, took) in answers {
        match o["decision"].as_str() {
            Some("executed") => executed += 1,
            Some("replayed") if lost_and_confirmed(o, *took) => lost += 1,
            Some("blocked") if o["reason"] == "quota" => over += 1,
            _ => return Err(format!("neither sent nor over the quota after {took:?}: {o}")),
        }
    }
    if executed + lost != sent || over != answers.len() - sent {
        return Err(format!(
            "{} sent ({lost} of them lost and confirmed) and {over} over the quota, not {sent} and {}: {:?}",
            executed + lost,
            answers.len() - sent,
            decisions(answers)
        ));
    }
    Ok(lost)
}

/// Fails with `what` after the gateway's logs, and without a backtrace (`resume_unwind` skips the panic
/// hook), so that the last lines of a long output, all a CI summary may show, say what went wrong.
fn fail(rig: &Rig, what: String) -> ! {
    eprintln!("{}\n\nFAILED: {what}", rig.logs());
    std::panic::resume_unwind(Box::new(what))
}

/// A rig with the README's tenant config whose once ledger is `db` (`None`: the README's SQLite file).
fn readme_rig(db: Option<String>) -> Rig {
    let mut rig = Rig::new(&readme_tenant_config());
    if let Some(db) = db {
        rig.db = db;
    }
    rig
}

/// The whole run; `dbs`: two fresh ledgers (`None`: SQLite files). The bucket test gets its own
/// refund service (an order refunds 500.00 at most) and so its own ledger (a ledger serves one upstream).
fn run_on(ledger: &str, dbs: [Option<String>; 2]) {
    assert!(
        readme_tenant_config().contains("timeout = \"2s\""),
        "TOOL_TIMEOUT is the README's"
    );
    assert!(
        !readme_tenant_config().contains("in_flight_wait"),
        "IN_FLIGHT_WAIT is the default"
    );
    let [loads_db, bucket_db] = dbs;
    let rig = readme_rig(loads_db);
    let mut gw = rig.listen("none", 0);
    let sixteen = report(
        &format!("PROTECT, {ledger}"),
        16,
        load(&gw, &rig, "sixteen", 16, None, Some("executed")),
    );
    let many = report(
        &format!("PROTECT, {ledger}, every 5th call a repeat"),
        128,
        load(&gw, &rig, "many", 128, Some(5), Some("executed")),
    );
    println!("{ledger}: 128-client / 16-client throughput: {:.2}", many / sixteen);

    // 128 calls of one refund under one key, at once: one refund, and every call's answer is its
    // outcome, at once or when asked again.
    let before = rig.effects().0;
    let one = json!({"order_id": ORDER_ID, "amount": 1.0, "idempotency_key": "hot"});
    let body = call_body("refund_order", one, Some("hot-key"));
    let answers = at_once(&gw, &rig, ACME, vec![body.clone(); 128]);
    let (waited_out, lost) = one_sent_rest_replayed(&answers).unwrap_or_else(|e| fail(&rig, format!("hot key: {e}")));
    let again = at_once(&gw, &rig, ACME, vec![body; waited_out]);
    if decisions(&again).keys().any(|d| d != "replayed") || lost && !replays_confirmed_by_read(&again) {
        fail(
            &rig,
            format!("hot key: asked again after the wait, not the same replay: {again:?}"),
        );
    }
    println!(
        "{ledger}: 128 calls on one key: {:?}; {waited_out} asked again; the sender's reply lost: {lost}",
        decisions(&answers)
    );
    if rig.effects().0 - before != 1 {
        fail(
            &rig,
            format!("hot key: {} refunds for one key", rig.effects().0 - before),
        );
    }
    assert!(gw.terminate().success(), "{}", rig.logs());

    // 64 refunds of 10.00 at once on a tenant's 500.00 bucket: 50 fit, 14 do not.
    let rig = readme_rig(bucket_db);
    let mut gw = rig.listen("none", 0);
    let bodies = (0..64)
        .map(|i| {
            let key = format!("bucket-{i}");
            call_body(
                "refund_order",
                json!({"order_id": ORDER_ID, "amount": 10.0, "idempotency_key": key}),
                Some(&key),
            )
        })
        .collect();
    let lost = sent_or_over_quota(&at_once(&gw, &rig, GLOBEX, bodies), 50)
        .unwrap_or_else(|e| fail(&rig, format!("hot bucket: {e}")));
    println!("{ledger}: 64 refunds on one bucket: 50 sent ({lost} replies lost and confirmed), 14 over the quota");
    if rig.effects() != (50, 50_000) {
        fail(
            &rig,
            format!(
                "hot bucket: {:?} refunds and cents, not (50, 50000): the ceiling passed",
                rig.effects()
            ),
        );
    }
    assert!(gw.terminate().success(), "{}", rig.logs());
}

#[test]
#[ignore = "a load test: cargo test -p once-gateway --test gateway_http_load -- --ignored --nocapture"]
fn the_readmes_tenant_config_under_load_on_sqlite() {
    run_on("SQLite", [None, None]);
    // The baseline: the same gateway and calls with the refund routed DIRECT.
    let direct = readme_tenant_config().replace("[tools.refund_order]", "[tools.refund_order]\nroute = \"direct\"");
    let rig = Rig::new(&direct);
    let mut gw = rig.listen("none", 0);
    report("DIRECT (baseline)", 16, load(&gw, &rig, "direct", 16, None, None));
    assert!(gw.terminate().success(), "{}", rig.logs());
}

#[test]
#[ignore = "a load test: cargo test -p once-gateway --test gateway_http_load -- --ignored --nocapture"]
fn the_readmes_tenant_config_under_load_on_postgres() {
    let (Some(loads), Some(bucket)) = (postgres_common::TestSchema::new(), postgres_common::TestSchema::new()) else {
        return;
    };
    run_on("PostgreSQL", [Some(loads.location()), Some(bucket.location())]);
}

/// The checkers of the at-once phases can fail: each wrong set of answers is refused.
#[test]
fn the_at_once_checkers_refuse_wrong_answers() {
    let answer = |decision: &str, secs: u64| {
        let o = match decision {
            "lost" => {
                json!({"decision": "replayed", "via": "provider", "confirmed_by": "provider", "effect": "happened"})
            }
            "quota" => json!({"decision": "blocked", "reason": "quota"}),
            d => json!({"decision": d}),
        };
        (o, Duration::from_secs(secs))
    };
    let of = |list: &[(&str, u64)]| list.iter().map(|(d, s)| answer(d, *s)).collect::<Vec<_>>();
    let one_key = |list: &[(&str, u64)]| one_sent_rest_replayed(&of(list));
    assert_eq!(one_key(&[("executed", 0), ("replayed", 0)]), Ok((0, false)));
    assert_eq!(
        one_key(&[("executed", 0), ("in-flight", 10), ("unknown", 11)]),
        Ok((2, false))
    );
    assert_eq!(one_key(&[("lost", 2), ("lost", 0)]), Ok((0, true)));
    assert_eq!(one_key(&[("executed", 0), ("in-flight", 9)]), Ok((1, false)));
    for wrong in [
        &[("executed", 0), ("executed", 0)][..],
        &[("replayed", 3), ("replayed", 0)],
        &[("lost", 1), ("lost", 0)],
        &[("lost", 2), ("replayed", 0)],
        &[("executed", 0), ("unknown", 8)],
        &[("executed", 0), ("in-flight", 8)],
        &[("lost", 1), ("in-flight", 10)],
        &[("unknown", 10), ("in-flight", 10)],
        &[("executed", 0), ("quota", 0)],
    ] {
        assert!(one_key(wrong).is_err(), "{wrong:?}");
    }
    let bucket = |list: &[(&str, u64)]| sent_or_over_quota(&of(list), 2);
    assert_eq!(bucket(&[("executed", 0), ("lost", 2), ("quota", 0)]), Ok(1));
    for wrong in [
        &[("executed", 0), ("executed", 0), ("executed", 0)][..],
        &[("executed", 0), ("quota", 0), ("quota", 0)],
        &[("executed", 0), ("lost", 1), ("quota", 0)],
        &[("executed", 0), ("replayed", 3), ("quota", 0)],
        &[("executed", 0), ("executed", 0), ("unknown", 10)],
    ] {
        assert!(bucket(wrong).is_err(), "{wrong:?}");
    }
}
