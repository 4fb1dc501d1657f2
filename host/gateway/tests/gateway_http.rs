//! `once gateway --listen`: MCP over Streamable HTTP, with real processes (the
//! gateway, its refund-mcp, the refund service's effect ledger) and a plain
//! HTTP client (raw HTTP where a well-behaved client would not do it).
//! Tenants from bearer tokens, the 401 front door, a proxy's tenant header
//! sent once or refused, /healthz, /metrics, the body limit, a body that is
//! not JSON, the header and body timeouts, idle sockets under a low
//! file-descriptor limit, SIGTERM with a call in flight, and two replicas on
//! one PostgreSQL ledger. Every verdict on refunds is read from the effect
//! ledger; every verdict on records from the once ledger.

mod gateway_common;
#[path = "../../once/tests/postgres_common/mod.rs"]
mod postgres_common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use gateway_common::http::*;
use gateway_common::*;
use once::Once;
use refund::{EffectLedger, ORDER_ID};
use serde_json::{Value, json};

const ACME: &str = "acme-token-1";
const GLOBEX: &str = "globex-token-2";

fn tenants_config() -> String {
    fast_config(&format!(
        "[http]\ntenants = {{ acme = \"{}\", globex = \"{}\" }}\nmetrics_tokens = [\"{}\"]\n",
        sha256_hex(ACME),
        sha256_hex(GLOBEX),
        sha256_hex("operator-token")
    ))
}

/// As shipped (no `[http] tenants`), the gateway listens only on loopback: another address is refused at
/// start, saying why and what to do, before any upstream starts. Tenants named by bearer tokens, or
/// `--public` (something in front authenticates every caller), let it listen there.
#[test]
fn an_open_gateway_listens_only_on_loopback() {
    for config in [
        fast_config(""),
        fast_config("[http]\ntenant_header = \"x-once-tenant\"\n"),
    ] {
        let rig = Rig::new(&config);
        let out = rig
            .gateway_command_with(&["--listen", "0.0.0.0:0"], "none")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("--listen 0.0.0.0:0 is not a loopback address") && stderr.contains("--public"),
            "{stderr}"
        );
        assert!(!rig.effects_db().exists(), "no upstream was started: {stderr}");
    }
    let rig = Rig::new(&tenants_config());
    let mut listening = rig.spawn_listening(rig.gateway_command_with(&["--listen", "0.0.0.0:0"], "none"), 0);
    assert!(listening.terminate().success(), "{}", rig.logs());
    let rig = Rig::new(&fast_config(""));
    let mut listening = rig.spawn_listening(
        rig.gateway_command_with(&["--listen", "0.0.0.0:0", "--public"], "none"),
        0,
    );
    assert!(listening.terminate().success(), "{}", rig.logs());
    // A loopback name is loopback once bound.
    let rig = Rig::new(&fast_config(""));
    let mut listening = rig.spawn_listening(rig.gateway_command_with(&["--listen", "localhost:0"], "none"), 0);
    assert!(listening.terminate().success(), "{}", rig.logs());
}

fn refund(amount: f64) -> Value {
    json!({"order_id": ORDER_ID, "amount": amount})
}

fn ledger(rig: &Rig) -> Once {
    Once::open(&rig.db).unwrap().build().unwrap()
}

/// Records in the once ledger, every scope.
fn records(rig: &Rig) -> u64 {
    ledger(rig).stats(None).unwrap().by_state.iter().map(|(_, n)| *n).sum()
}

fn amount_of(once: &Once, scope: &str, key: &str) -> f64 {
    let view = once
        .inspect(scope, key)
        .unwrap()
        .unwrap_or_else(|| panic!("{scope}/{key} is recorded"));
    let args: Value = serde_json::from_str(&view.args).unwrap();
    args["amount"].as_f64().unwrap()
}

#[test]
fn two_tenants_with_one_key_are_two_operations_and_never_see_each_other() {
    let rig = Rig::new(&tenants_config());
    let mut gw = rig.listen("none", 0);

    let a = gw.call(Some(ACME), Some("k-1"), refund(100.0));
    assert_eq!(a.outcome()["decision"], "executed", "{a:?}\n{}", rig.logs());
    assert_eq!(a.outcome()["scope"], "acme");
    let b = gw.call(Some(GLOBEX), Some("k-1"), refund(100.0));
    assert_eq!(
        b.outcome()["decision"],
        "executed",
        "globex's k-1 is its own operation: {b:?}"
    );
    assert_eq!(b.outcome()["scope"], "globex");
    assert_ne!(
        a.result()["structuredContent"]["refund_id"],
        b.result()["structuredContent"]["refund_id"]
    );
    // acme's own repeat is a replay.
    let again = gw.call(Some(ACME), Some("k-1"), refund(100.0));
    assert_eq!(again.outcome()["decision"], "replayed", "{again:?}");

    // globex names a key only acme has, with other args: not acme's conflict, not acme's replay.
    let only = gw.call(Some(ACME), Some("acme-only"), refund(20.0));
    assert_eq!(only.outcome()["decision"], "executed");
    let other = gw.call(Some(GLOBEX), Some("acme-only"), refund(50.0));
    assert_eq!(other.outcome()["decision"], "executed", "{other:?}");
    assert_eq!(other.outcome()["scope"], "globex");
    assert!(!other.text().contains("acme"), "{}", other.text());

    let refunds = EffectLedger::open(rig.effects_db()).unwrap();
    assert_eq!(refunds.count(ORDER_ID).unwrap(), 4, "{}", rig.logs());
    assert_eq!(refunds.refunded_cents(ORDER_ID).unwrap(), 27_000);

    // No credentials, or unknown ones: 401 with a Bearer challenge, nothing sent, nothing recorded.
    let before = records(&rig);
    for token in [None, Some("not-a-tenant"), Some("")] {
        let refused = gw.call(token, Some("k-401"), refund(10.0));
        assert_eq!(refused.status, 401, "{refused:?}");
        assert!(
            refused
                .www_authenticate
                .as_deref()
                .is_some_and(|w| w.starts_with("Bearer")),
            "{refused:?}"
        );
        assert!(refused.message.is_none(), "{refused:?}");
    }
    assert_eq!(records(&rig), before, "a refused request writes no record");
    assert_eq!(
        refunds.count(ORDER_ID).unwrap(),
        4,
        "a refused request reaches no upstream"
    );

    // Both tenants' records, each in its own scope with its own provider key.
    let once = ledger(&rig);
    let (ra, rb) = (
        once.inspect("acme", "k-1").unwrap().unwrap(),
        once.inspect("globex", "k-1").unwrap().unwrap(),
    );
    assert_ne!(ra.provider_key, rb.provider_key);
    assert_eq!(amount_of(&once, "acme", "acme-only"), 20.0);
    assert_eq!(amount_of(&once, "globex", "acme-only"), 50.0);
    assert!(
        once.inspect("default", "k-1").unwrap().is_none(),
        "no call fell into the file's scope"
    );

    // /metrics: the operator's token only (a tenant's would show the other tenant's counts).
    assert_eq!(gw.get("/metrics", Some(ACME)).0, 401);
    assert_eq!(gw.get("/metrics", None).0, 401);
    let (status, text) = gw.get("/metrics", Some("operator-token"));
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("once_gateway_unauthorized_total 3"), "{text}");

    assert!(gw.terminate().success(), "{}", rig.logs());
}

#[test]
fn healthz_metrics_and_the_body_limit() {
    let rig = Rig::new(&fast_config("[http]\nbody_limit = 4096\n"));
    let mut gw = rig.listen("none", 0);
    let (status, text) = gw.get("/healthz", None);
    assert_eq!((status, text.as_str()), (200, "ok: the ledger answers\n"));

    assert_eq!(
        gw.call(None, Some("m-1"), refund(10.0)).outcome()["decision"],
        "executed"
    );
    assert_eq!(
        gw.call(None, Some("m-1"), refund(10.0)).outcome()["decision"],
        "replayed"
    );
    assert_eq!(
        gw.call(None, Some("m-1"), refund(11.0)).outcome()["decision"],
        "conflict"
    );
    // Over the quota (300 a day): blocked, and only this process can count that.
    assert_eq!(
        gw.call(None, Some("m-2"), refund(299.0)).outcome()["decision"],
        "blocked"
    );

    let (status, text) = gw.get("/metrics", None);
    assert_eq!(status, 200, "{text}");
    let metrics = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str, label: Option<(&str, &str)>| {
        metrics
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                ref other => panic!("{name}: {other:?}"),
            })
            .unwrap_or_else(|| panic!("{name} {label:?} in\n{text}"))
    };
    let stats = ledger(&rig).stats(None).unwrap();
    let confirmed = stats
        .by_state
        .iter()
        .find(|(s, _)| s.name() == "confirmed")
        .map_or(0, |(_, n)| *n);
    assert_eq!(confirmed, 1);
    assert_eq!(value("once_records", Some(("state", "confirmed"))), confirmed as f64);
    assert_eq!(value("once_replays_total", None), 1.0);
    assert_eq!(value("once_conflicts_total", None), 1.0);
    assert_eq!(value("once_gateway_blocked_total", Some(("reason", "quota"))), 1.0);

    // A body over the limit: 413 and a body that says so; nothing reaches the engine.
    let big = call_body(
        "refund_order",
        json!({"order_id": ORDER_ID, "amount": 1, "pad": "x".repeat(5000)}),
        Some("big"),
    );
    let answer = gw.post(None, &[], &big);
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.body.contains("exceeds 4096 bytes"), "{}", answer.body);
    assert!(ledger(&rig).inspect("default", "big").unwrap().is_none());

    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// A gateway (with `extra` settings) over a refund service that commits each refund at once and
/// answers 1.5 s later, inside the tool's 4 s timeout.
fn late_replies(extra: &str) -> (Rig, Listening) {
    let config = fast_config(extra)
        .replace("timeout = \"1s\"", "timeout = \"4s\"")
        .replace("max_in_flight = \"1500ms\"", "max_in_flight = \"5s\"");
    let rig = Rig::new(&config);
    let gw = rig.listen_upstream(&["--late-reply-ms", "1500"], "late_reply", 0);
    (rig, gw)
}

#[test]
fn sigterm_lets_the_call_in_flight_finish_then_exits_0() {
    let (rig, mut gw) = late_replies("");
    let url = gw.url.clone();
    let body = call_body("refund_order", refund(200.0), Some("t-1")).to_string();
    let call = std::thread::spawn(move || post(&url, None, &[], &body));
    wait_until("the refund committed", || rig.effects().0 == 1);
    gw.signal("-TERM");
    let answer = call.join().unwrap();
    assert_eq!(answer.status, 200, "{answer:?}\n{}", rig.logs());
    assert_eq!(answer.outcome()["decision"], "executed", "{answer:?}\n{}", rig.logs());
    let status = gw.wait_exit();
    assert!(status.success(), "exit {status}\n{}", rig.logs());
    assert_exactly_one_refund(&rig);
    assert!(rig.logs().contains("stopping: no new requests"), "{}", rig.logs());
}

/// A call refused because the key it supersedes is still in flight (`superseded-unresolved`) has no
/// record of its own, and a repeat of it waits for that other key: the gateway must not keep it as
/// an operation of its own to settle. On 7bfedc1 it did: every round asked the ledger for it ("no
/// record for this scope and key") and a SIGTERM waited out the whole shutdown grace for it, then
/// exited "with unsettled operations".
#[test]
fn a_call_blocked_on_an_unresolved_original_is_not_kept_as_unsettled() {
    let (rig, mut gw) = late_replies("shutdown_grace = \"3s\"");
    let url = gw.url.clone();
    let original = call_body("refund_order", refund(200.0), Some("original")).to_string();
    let call = std::thread::spawn(move || post(&url, None, &[], &original));
    wait_until("the original refund committed", || rig.effects().0 == 1);

    let mut successor = call_body("refund_order", refund(50.0), Some("successor"));
    successor["params"]["_meta"]["once/supersedes"] = json!("original");
    let answer = gw.post(None, &[], &successor);
    assert_eq!(answer.outcome()["decision"], "blocked", "{answer:?}\n{}", rig.logs());
    assert_eq!(answer.outcome()["reason"], "superseded-unresolved", "{answer:?}");
    assert_eq!(answer.outcome()["repeat"], "waits", "{answer:?}");
    assert!(ledger(&rig).inspect("default", "successor").unwrap().is_none());

    let first = call.join().unwrap();
    assert_eq!(first.outcome()["decision"], "executed", "{first:?}\n{}", rig.logs());
    gw.signal("-TERM");
    let status = gw.wait_exit();
    assert!(status.success(), "exit {status}\n{}", rig.logs());
    let logs = rig.logs();
    assert!(!logs.contains("no record for this scope and key"), "{logs}");
    assert!(!logs.contains("exiting with unsettled operations"), "{logs}");
    assert_exactly_one_refund(&rig);
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Two replicas (`owner` the same) on one PostgreSQL ledger, one refund service behind both:
/// 32 clients send the same key at once, half to each. One dispatch; every client is told the one
/// receipt, or honestly that the operation is in flight or unknown, or that this call sent nothing
/// (a storage block under contention), never a second refund.
#[test]
fn two_replicas_on_postgres_dispatch_a_key_once() {
    let Some(schema) = postgres_common::TestSchema::new() else {
        return;
    };
    let config = fast_config("owner = \"refund-replicas\"");
    let mut a = Rig::new(&config);
    a.db = schema.location();
    let b = a.beside(&config);
    let (ga, gb) = (a.listen("none", 0), b.listen("none", 0));
    let urls = [ga.url.clone(), gb.url.clone()];
    let start = Arc::new(Barrier::new(32));
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let (url, start) = (urls[i % 2].clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                post(
                    &url,
                    None,
                    &[],
                    &call_body("refund_order", refund(200.0), Some("same-key")).to_string(),
                )
            })
        })
        .collect();
    let answers: Vec<Answer> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let mut receipts = BTreeSet::new();
    let mut executed = 0;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
        let decision = answer.outcome()["decision"].as_str().unwrap().to_string();
        match decision.as_str() {
            "executed" | "replayed" => {
                executed += usize::from(decision == "executed");
                receipts.insert(answer.result()["structuredContent"]["refund_id"].to_string());
            }
            // The holder's attempt had not ended within in_flight_wait, or its outcome is being reconciled.
            "in-flight" | "unknown" => {}
            // The engine's optimistic writes lost to the other 31 too often (every replay is counted on the
            // record): nothing was sent by this call; the ledger could not say whether the operation's effect
            // exists, and the answer does not claim either way; the same call again replays.
            "blocked" if answer.outcome()["reason"] == "storage" && answer.outcome()["effect"] == "unknown" => {}
            other => panic!("{other}: {answer:?}\n{}{}", a.logs(), b.logs()),
        }
    }
    assert!(executed <= 1, "{executed} clients were told they executed it");
    assert_eq!(receipts.len(), 1, "one receipt for everyone told one: {receipts:?}");
    assert_exactly_one_refund(&a);
    let view = Once::open(&a.db)
        .unwrap()
        .build()
        .unwrap()
        .inspect("default", "same-key")
        .unwrap()
        .unwrap();
    let trail: Vec<String> = view.audit.iter().map(|e| format!("{}: {}", e.kind, e.detail)).collect();
    // Each attempt after the first follows one that provably sent nothing (not sent, or read absent).
    let proven_unsent = view
        .audit
        .iter()
        .filter(|e| e.kind == "finish-not-sent" || e.kind == "reconciled-absent")
        .count() as u32;
    assert_eq!(
        view.attempts,
        1 + proven_unsent,
        "one dispatch that may have acted: {trail:#?}"
    );
    assert!(!view.possible_duplicate, "{trail:#?}");

    // The ledger stops answering (its schema is gone): /healthz says so, 503 with the reason.
    assert_eq!(ga.get("/healthz", None).0, 200);
    postgres_common::client(&schema.url)
        .batch_execute(&format!("DROP SCHEMA {} CASCADE", schema.name))
        .unwrap();
    let (status, text) = ga.get("/healthz", None);
    assert_eq!(status, 503, "{text}");
    assert!(text.starts_with("the ledger does not answer"), "{text}");
    drop((ga, gb));
}

/// Another tenant cannot compute a tenant's provider key (issue 30 item 5). It
/// used to be an unsalted SHA-256 of `["once-provider-key", scope, key]`, so
/// globex, knowing acme's scope and key, computed it and read acme's refund
/// through the DIRECT `find_refund_by_key`. Now it is an HMAC under the
/// ledger's secret: the computed key finds nothing, and only acme's own
/// record knows the real one.
#[test]
fn another_tenant_cannot_compute_a_provider_key_and_read_the_refund() {
    let rig = Rig::new(&tenants_config());
    let gw = rig.listen("none", 0);
    let a = gw.call(Some(ACME), Some("k-1"), refund(100.0));
    assert_eq!(a.outcome()["decision"], "executed", "{a:?}\n{}", rig.logs());
    let real = ledger(&rig).inspect("acme", "k-1").unwrap().unwrap().provider_key;

    // What anyone could compute before: the JCS text of the array, hashed.
    let computed = format!("once-{}", sha256_hex(r#"["once-provider-key","acme","k-1"]"#));
    assert_ne!(real, computed, "the provider key is not the unsalted hash");
    let lookup = |key: &str| {
        let args = json!({"idempotency_key": key});
        gw.post(Some(GLOBEX), &[], &call_body("find_refund_by_key", args, None))
    };
    let stolen = lookup(&computed);
    assert_eq!(stolen.status, 200, "{stolen:?}");
    let found: Value =
        serde_json::from_str(&stolen.text()).unwrap_or_else(|_| stolen.result()["structuredContent"].clone());
    assert_eq!(found["found"], false, "globex read acme's refund: {stolen:?}");
    assert!(!stolen.text().contains("refund_id"), "{stolen:?}");
    // The lookup tool itself works: under the real key (which only the ledger knows) it finds the refund.
    let own = lookup(&real);
    assert!(own.text().contains("refund_id"), "{own:?}");
}

/// A trusted proxy's header names the tenant, only when the file names the header; without it, 401.
#[test]
fn a_proxy_header_names_the_tenant_when_configured() {
    let rig = Rig::new(&fast_config("[http]\ntenant_header = \"X-Once-Tenant\"\n"));
    let mut gw = rig.listen("none", 0);
    let a = gw.post(
        None,
        &[("x-once-tenant", "acme")],
        &call_body("refund_order", refund(10.0), Some("h-1")),
    );
    assert_eq!(a.outcome()["scope"], "acme", "{a:?}");
    let b = gw.post(
        None,
        &[("x-once-tenant", "globex")],
        &call_body("refund_order", refund(10.0), Some("h-1")),
    );
    assert_eq!(
        (b.outcome()["scope"].clone(), b.outcome()["decision"].clone()),
        (json!("globex"), json!("executed"))
    );
    let none = gw.call(None, Some("h-2"), refund(10.0));
    assert_eq!(none.status, 401, "{none:?}");
    assert!(ledger(&rig).inspect("default", "h-2").unwrap().is_none());
    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// `[http]` mistakes stop the gateway at start (exit 2) with a message naming the key.
#[test]
fn http_config_mistakes_name_the_key() {
    let acme = sha256_hex(ACME);
    for (text, said) in [
        (
            "[http]\ntenants = { acme = \"abc\" }\n".to_string(),
            "[http] tenants.acme: \"abc\" is not a SHA-256 in hex",
        ),
        (
            format!("[http]\ntenants = {{ acme = \"{acme}\", beta = \"{acme}\" }}\n"),
            "[http] tenants.acme and tenants.beta: the same token hash",
        ),
        (
            format!("[http]\ntenant_header = \"x-t\"\ntenants = {{ acme = \"{acme}\" }}\n"),
            "[http] tenants and tenant_header both choose the tenant",
        ),
        (
            format!("scope = \"meta:tenant\"\n[http]\ntenants = {{ acme = \"{acme}\" }}\n"),
            "[http] tenants chooses each request's scope, so `scope`",
        ),
        (
            "[http]\nallowed_origins = [\"https://app.example.com\"]\n".to_string(),
            "[http] allowed_origins[0]: \"https://app.example.com\" names no port",
        ),
    ] {
        let rig = Rig::new(&text);
        let out = std::process::Command::new(gateway_common::once_exe())
            .args(["gateway", "--check-config", "--config"])
            .arg(&rig.config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(said), "{said:?} in {stderr}");
    }
}

/// A page in the user's browser that reaches the gateway (a cross-site request, or a name rebound to
/// 127.0.0.1) carries its own `Origin`: as shipped, only this machine's pages may call, any other origin is
/// answered 403 before anything reaches the engine or the upstream, as the Streamable HTTP transport requires.
/// A client that sends no `Origin` (every MCP SDK) is not judged by it; `[http] allowed_origins` names others.
#[test]
fn a_browser_page_from_another_origin_is_refused_403() {
    let rig = Rig::new(&fast_config(""));
    let mut gw = rig.listen("none", 0);
    for origin in [
        "http://evil.example",
        "http://evil.example:8080",
        "null",
        "https://localhost.evil.example:443",
    ] {
        let refused = gw.post(
            None,
            &[("origin", origin)],
            &call_body("refund_order", refund(10.0), Some("origin-1")),
        );
        assert_eq!(refused.status, 403, "{origin}: {refused:?}");
    }
    assert_eq!(records(&rig), 0, "a refused request writes no record\n{}", rig.logs());
    assert_eq!(rig.effects().0, 0, "a refused request reaches no upstream");
    for (n, origin) in [
        "http://localhost:5173",
        "http://127.0.0.1:8080",
        "https://[::1]",
        "http://localhost",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("origin-ok-{n}");
        let sent = gw.post(
            None,
            &[("origin", origin)],
            &call_body("refund_order", refund(10.0), Some(&key)),
        );
        assert_eq!(sent.outcome()["decision"], "executed", "{origin}: {sent:?}");
    }
    let plain = gw.call(None, Some("origin-none"), refund(10.0));
    assert_eq!(plain.outcome()["decision"], "executed", "no Origin: {plain:?}");
    assert!(gw.terminate().success(), "{}", rig.logs());
    assert_eq!(rig.effects().0, 5);

    // A list replaces the default: the named origin may call, this machine's pages no longer.
    let rig = Rig::new(&fast_config(
        "[http]\nallowed_origins = [\"https://app.example.com:443\"]\n",
    ));
    let mut gw = rig.listen("none", 0);
    let named = gw.post(
        None,
        &[("origin", "https://app.example.com")],
        &call_body("refund_order", refund(10.0), Some("origin-app")),
    );
    assert_eq!(named.outcome()["decision"], "executed", "{named:?}");
    let local = gw.post(
        None,
        &[("origin", "http://localhost:5173")],
        &call_body("refund_order", refund(10.0), Some("origin-local")),
    );
    assert_eq!(local.status, 403, "{local:?}");
    assert!(gw.terminate().success(), "{}", rig.logs());
    assert_eq!(rig.effects().0, 1);
}

/// A proxy that appends the tenant header instead of replacing it would let the client choose its tenant:
/// two values (two header lines, or one comma-joined line) are refused 400, naming the header, and nothing
/// reaches the engine or the upstream.
#[test]
fn a_tenant_header_with_two_values_is_refused_400() {
    let rig = Rig::new(&fast_config("[http]\ntenant_header = \"X-Once-Tenant\"\n"));
    let mut gw = rig.listen("none", 0);
    let body = call_body("refund_order", refund(10.0), Some("dup-1")).to_string();
    for (headers, said) in [
        (
            "X-Once-Tenant: globex\r\nX-Once-Tenant: acme\r\n",
            "the tenant header x-once-tenant came 2 times",
        ),
        (
            "X-Once-Tenant: globex, acme\r\n",
            "the tenant header x-once-tenant holds a list",
        ),
        ("X-Once-Tenant: globex,acme\r\n", "holds a list"),
    ] {
        let (status, head, text) = raw::exchange(&gw.base, &raw::post_mcp(headers, &body));
        assert_eq!(status, 400, "{headers:?}: {head}{text}");
        assert!(text.contains(said), "{said:?} in {text}");
    }
    assert_eq!(records(&rig), 0, "a refused request writes no record\n{}", rig.logs());
    assert_eq!(rig.effects().0, 0, "a refused request reaches no upstream");
    // One value still names the tenant.
    let one = gw.post(
        None,
        &[("x-once-tenant", "acme")],
        &call_body("refund_order", refund(10.0), Some("dup-1")),
    );
    assert_eq!(one.outcome()["scope"], "acme", "{one:?}");
    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// A body that is not JSON is a JSON-RPC parse error (-32700, HTTP 400), not rmcp's 415; JSON that is no
/// JSON-RPC message is an invalid request (-32600); a wrong content type is still 415. Nothing is recorded.
#[test]
fn a_body_that_is_not_json_is_a_jsonrpc_parse_error() {
    let rig = Rig::new(&fast_config(""));
    let mut gw = rig.listen("none", 0);
    let answer = post(&gw.url, None, &[], "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ");
    assert_eq!(answer.status, 400, "{answer:?}");
    let message = answer
        .message
        .as_ref()
        .unwrap_or_else(|| panic!("a JSON-RPC error: {answer:?}"));
    assert_eq!(message["jsonrpc"], "2.0", "{message}");
    assert_eq!(message["id"], Value::Null, "{message}");
    assert_eq!(message["error"]["code"], -32700, "{message}");
    assert!(
        message["error"]["message"].as_str().unwrap().starts_with("Parse error"),
        "{message}"
    );

    let answer = post(
        &gw.url,
        None,
        &[],
        "{\"jsonrpc\": \"2.0\", \"id\": 7, \"nothing\": true}",
    );
    assert_eq!(answer.status, 400, "{answer:?}");
    let message = answer
        .message
        .as_ref()
        .unwrap_or_else(|| panic!("a JSON-RPC error: {answer:?}"));
    assert_eq!(
        (message["error"]["code"].clone(), message["id"].clone()),
        (json!(-32600), json!(7)),
        "{message}"
    );

    let body = call_body("refund_order", refund(10.0), Some("p-1")).to_string();
    let text_plain = raw::post_mcp("", &body).replace("Content-Type: application/json", "Content-Type: text/plain");
    let (status, head, text) = raw::exchange(&gw.base, &text_plain);
    assert_eq!(status, 415, "{head}{text}");
    assert_eq!(records(&rig), 0, "{}", rig.logs());
    assert_eq!(rig.effects().0, 0);
    // A well-formed call still goes through.
    assert_eq!(
        gw.call(None, Some("p-1"), refund(10.0)).outcome()["decision"],
        "executed"
    );
    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// How long the gateway took to close `stream` (read to its end), and what it sent first; panics past `limit`.
fn closed_within(mut stream: std::net::TcpStream, limit: std::time::Duration) -> (std::time::Duration, String) {
    use std::io::Read;
    let started = std::time::Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => {}
        // A reset is a close too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!(
            "the connection was still open after {:?} ({e}); it had sent {:?}",
            started.elapsed(),
            String::from_utf8_lossy(&answer)
        ),
    }
    (started.elapsed(), String::from_utf8_lossy(&answer).to_string())
}

/// `[http] header_timeout`: a client that sends half a request's headers, or nothing at all, is disconnected
/// when it runs out; `[http] body_timeout`: a body trickled a byte at a time is answered 408 and cut.
#[test]
fn half_sent_headers_and_trickled_bodies_are_cut_at_their_timeouts() {
    use std::io::Write;
    use std::time::Duration;
    let rig = Rig::new(&fast_config("[http]\nheader_timeout = \"1s\"\nbody_timeout = \"1s\"\n"));
    let mut gw = rig.listen("none", 0);
    let addr = raw::addr(&gw.base);

    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        .unwrap();
    let silent = std::net::TcpStream::connect(&addr).unwrap();
    let (took, _) = closed_within(half, Duration::from_secs(10));
    assert!(took < Duration::from_secs(6), "half a header held {took:?}");
    let (took, _) = closed_within(silent, Duration::from_secs(10));
    assert!(took < Duration::from_secs(6), "a silent connection held {took:?}");

    // Headers whole and at once, then a 200-byte body one byte every 100 ms (at most 100 of them: 10 s).
    let body = call_body("refund_order", refund(10.0), Some("slow-1")).to_string();
    let body = format!("{body:<200}");
    let head = raw::post_mcp("", "").replace("Content-Length: 0", &format!("Content-Length: {}", body.len()));
    let mut trickle = std::net::TcpStream::connect(&addr).unwrap();
    trickle.write_all(head.as_bytes()).unwrap();
    let reader = trickle.try_clone().unwrap();
    let cut = std::thread::spawn(move || closed_within(reader, Duration::from_secs(15)));
    let started = std::time::Instant::now();
    for byte in body.as_bytes().iter().take(100) {
        if cut.is_finished() || trickle.write_all(&[*byte]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, answer) = cut.join().unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "a trickled body held {took:?}: {answer:?}"
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("did not arrive within 1s"), "{answer:?}");
    assert!(ledger(&rig).inspect("default", "slow-1").unwrap().is_none());

    // A client that sends its request in time is served as before.
    assert_eq!(
        gw.call(None, Some("fast-1"), refund(10.0)).outcome()["decision"],
        "executed"
    );
    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// 200 idle sockets that never authenticate, at a 128 file-descriptor limit: the gateway keeps at most
/// `[http] max_unauthenticated` of them (closing the oldest), so a tenant's call still succeeds.
#[test]
fn idle_unauthenticated_sockets_do_not_starve_a_tenant() {
    use std::time::Duration;
    let config = fast_config(&format!(
        "[http]\ntenants = {{ acme = \"{}\" }}\nmetrics_tokens = [\"{}\"]\n\
         header_timeout = \"60s\"\nmax_unauthenticated = 32\n",
        sha256_hex(ACME),
        sha256_hex("operator-token")
    ));
    let rig = Rig::new(&config);
    let mut gw = rig.listen_with_nofile(128, "none", 0);
    let addr = raw::addr(&gw.base);
    let flood: Vec<std::net::TcpStream> = (0..200)
        .map(|i| {
            std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("socket {i}: {e}"))
        })
        .collect();
    // The tenant's call, with a bound of its own (a starved one would wait in the listen backlog forever).
    let body = call_body("refund_order", refund(10.0), Some("flood-1")).to_string();
    let request = raw::post_mcp(&format!("Authorization: Bearer {ACME}\r\n"), &body);
    let (status, head, text) = raw::exchange_within(&gw.base, &request, Duration::from_secs(15));
    assert_eq!(status, 200, "{head}{text}\n{}", rig.logs());
    let message: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        message["result"]["_meta"]["once/outcome"]["decision"], "executed",
        "{message}"
    );
    assert_eq!(message["result"]["_meta"]["once/outcome"]["scope"], "acme", "{message}");

    let (status, metrics) = gw.get("/metrics", Some("operator-token"));
    assert_eq!(status, 200, "{metrics}");
    let evicted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("once_gateway_connections_evicted_total "))
        .unwrap_or_else(|| panic!("the eviction counter in {metrics}"))
        .parse()
        .unwrap();
    assert!(evicted >= 200 - 32, "{evicted} evicted:\n{metrics}");
    drop(flood);
    assert!(gw.terminate().success(), "{}", rig.logs());
}

/// The README's tenant config (the example config plus acme and globex tokens) on two gateways in front of
/// the same server for two accounts, on one ledger: the second stops at start, naming the tenant's scope and
/// what to set (b58a043: it served, and account B's acme was answered with account A's acme receipts).
#[test]
fn the_readmes_tenants_on_a_second_account_are_refused_at_start() {
    let config = readme_tenant_config();
    assert!(config.contains(&sha256_hex("acme-token")), "{config}");
    let a = Rig::new(&config);
    let mut gw = a.listen("none", 0);
    let first = gw.call(Some("acme-token"), Some("k-1"), refund(100.0));
    assert_eq!(first.outcome()["decision"], "executed", "{first:?}\n{}", a.logs());
    assert!(gw.terminate().success(), "{}", a.logs());

    // Account B: its own refund service, the same once ledger and config.
    let mut b = Rig::new(&config);
    b.db = a.db.clone();
    let mut cmd = b.gateway_command_with(&["--listen", "127.0.0.1:0"], "none");
    cmd.env("REFUND_ACCOUNT", "acct-b");
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > give_up {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(
        stderr.contains("scope \"acme\" on this ledger belongs to another upstream"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "it never listened: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let refunds = EffectLedger::open(b.effects_db()).unwrap();
    assert_eq!(refunds.count(ORDER_ID).unwrap(), 0);
}
