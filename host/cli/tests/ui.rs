//! `once ui` over HTTP, as a real process on a real SQLite ledger: tokens,
//! CSRF, the scope boundary, resolutions through the engine, and /metrics
//! read by a Prometheus text-format parser.

mod ui_common;

use std::path::Path;
use std::process::Command;

use once::Once;
use once::types::State;
use ui_common::*;

fn ledger(scopes: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    seed(&db, scopes);
    (dir, db)
}

fn sha256_hex(token: &str) -> String {
    // The operators file stores what `printf %s "$TOKEN" | sha256sum` prints.
    once_ui::token_sha256(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An operators file: alice sees scope `tenant-a` only, root sees every scope.
fn operators(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("operators.toml");
    let text = format!(
        "[[operator]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nscopes = [\"tenant-a\"]\n\n\
         [[operator]]\nname = \"root\"\ntoken_sha256 = \"{}\"\n",
        sha256_hex("alice-token"),
        sha256_hex("root-token")
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn without_a_valid_token_every_request_is_401_and_nothing_is_written() {
    let (_dir, db) = ledger(&["tenant-a"]);
    let before = record(&db, "tenant-a", "k-tenant-a");
    let ui = UiProcess::start(&db, &[]);
    for token in [None, Some("not-the-token")] {
        for path in ["/", "/record?scope=tenant-a&key=k-tenant-a", "/record", "/metrics"] {
            let (status, _) = get(&format!("{}{path}", ui.base), token);
            assert_eq!(status, 401, "{path} with {token:?}");
        }
        let form = [
            ("scope", "tenant-a"),
            ("key", "k-tenant-a"),
            ("resolution", "absent"),
            ("note", "x"),
        ];
        let (status, _, _) = post(&format!("{}/resolve", ui.base), token, &form);
        assert_eq!(status, 401);
    }
    // The printed address signs a browser in: a cookie, and the token leaves the address bar.
    let mut r = agent().get(ui.login.as_deref().unwrap()).call().unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers().get("set-cookie").unwrap().to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert_eq!(r.headers().get("location").unwrap(), "/");
    let _ = r.body_mut().read_to_string();
    let session = cookie.split(';').next().unwrap();
    let mut page = agent()
        .get(format!("{}/", ui.base))
        .header("Cookie", session)
        .call()
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.body_mut().read_to_string().unwrap().contains("k-tenant-a"));
    assert_eq!(record(&db, "tenant-a", "k-tenant-a"), before);
}

#[test]
fn a_post_without_its_csrf_token_is_refused_and_writes_nothing() {
    let (_dir, db) = ledger(&["tenant-a"]);
    let before = record(&db, "tenant-a", "k-tenant-a");
    let ui = UiProcess::start(&db, &[]);
    let token = ui.token();
    let (status, page) = get(
        &format!("{}/record?scope=tenant-a&key=k-tenant-a", ui.base),
        Some(&token),
    );
    assert_eq!(status, 200);
    let csrf = csrf_of(&page);
    for bad in ["", "0000", &csrf[..csrf.len() - 1]] {
        let form = [
            ("csrf", bad),
            ("scope", "tenant-a"),
            ("key", "k-tenant-a"),
            ("resolution", "confirmed"),
            ("receipt", r#"{"refund_id":"r_9"}"#),
            ("note", "forged"),
        ];
        let (status, _, body) = post(&format!("{}/resolve", ui.base), Some(&token), &form);
        assert_eq!(status, 403, "csrf {bad:?}: {body}");
        assert!(body.contains("nothing was resolved"), "{body}");
    }
    assert_eq!(record(&db, "tenant-a", "k-tenant-a"), before);
}

#[test]
fn an_operator_limited_to_a_scope_never_sees_or_resolves_another() {
    let (dir, db) = ledger(&["tenant-a", "tenant-b"]);
    let b_before = record(&db, "tenant-b", "k-tenant-b");
    let ui = UiProcess::start(&db, &["--operators", operators(dir.path()).to_str().unwrap()]);
    assert!(ui.login.is_none(), "an operators file prints no token");

    let (status, queue) = get(&format!("{}/", ui.base), Some("alice-token"));
    assert_eq!(status, 200);
    assert!(queue.contains("k-tenant-a") && !queue.contains("k-tenant-b"), "{queue}");
    assert!(!queue.contains("tenant-b"), "{queue}");
    // Asking for the other scope by name shows nothing either.
    let (_, filtered) = get(&format!("{}/?scope=tenant-b", ui.base), Some("alice-token"));
    assert!(!filtered.contains("k-tenant-b"), "{filtered}");
    // Her counts are her scope's: one unknown, one confirmed.
    assert!(queue.contains(r#"<td data-state="unknown">1</td>"#), "{queue}");
    let (_, root_queue) = get(&format!("{}/", ui.base), Some("root-token"));
    assert!(root_queue.contains("k-tenant-a") && root_queue.contains("k-tenant-b"));
    assert!(
        root_queue.contains(r#"<td data-state="unknown">2</td>"#),
        "{root_queue}"
    );

    let (status, page) = get(
        &format!("{}/record?scope=tenant-b&key=k-tenant-b", ui.base),
        Some("alice-token"),
    );
    assert_eq!(status, 404);
    assert!(
        page.contains("no record for key &quot;k-tenant-b&quot; in scope &quot;tenant-b&quot;"),
        "{page}"
    );
    // The same answer as for a key that does not exist at all.
    let (status, _) = get(
        &format!("{}/record?scope=tenant-a&key=nope", ui.base),
        Some("alice-token"),
    );
    assert_eq!(status, 404);

    let (_, own) = get(
        &format!("{}/record?scope=tenant-a&key=k-tenant-a", ui.base),
        Some("alice-token"),
    );
    let form = [
        ("csrf", csrf_of(&own)),
        ("scope", "tenant-b".into()),
        ("key", "k-tenant-b".into()),
        ("resolution", "confirmed".into()),
        ("receipt", r#"{"refund_id":"r_b"}"#.into()),
        ("note", "not mine".into()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, _, body) = post(&format!("{}/resolve", ui.base), Some("alice-token"), &form);
    assert_eq!(status, 404, "{body}");
    assert_eq!(record(&db, "tenant-b", "k-tenant-b"), b_before);

    let (_, metrics) = get(&format!("{}/metrics", ui.base), Some("alice-token"));
    let scrape = parse_metrics(&metrics);
    assert_eq!(sample(&scrape, "once_records", Some(("state", "unknown"))), 1.0);
    assert_eq!(sample(&scrape, "once_queue", Some(("attention", "unknown"))), 1.0);
}

#[test]
fn a_resolution_from_the_page_is_the_engines_own_and_audited_with_who_and_why() {
    let (dir, db) = ledger(&["tenant-a"]);
    let ui = UiProcess::start(&db, &["--operators", operators(dir.path()).to_str().unwrap()]);
    let url = format!("{}/record?scope=tenant-a&key=k-tenant-a", ui.base);
    let (_, page) = get(&url, Some("alice-token"));
    let csrf = csrf_of(&page);
    let resolve = |resolution: &str, receipt: &str, note: &str, force: bool| {
        let mut form = vec![
            ("csrf", csrf.as_str()),
            ("scope", "tenant-a"),
            ("key", "k-tenant-a"),
            ("resolution", resolution),
            ("receipt", receipt),
            ("note", note),
        ];
        if force {
            form.push(("force", "1"));
        }
        post(&format!("{}/resolve", ui.base), Some("alice-token"), &form)
    };
    let before = record(&db, "tenant-a", "k-tenant-a");

    // The engine checks the receipt and states the guard; the page shows its words and nothing changes.
    let (status, _, body) = resolve("confirmed", "{\"refund_id\":", "checked the bank", false);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Not resolved: invalid JSON"), "{body}");
    let (status, _, body) = resolve("absent", "", "checked the bank", false);
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("Not resolved:") && body.contains("max_in_flight"),
        "{body}"
    );
    let (status, _, body) = resolve("confirmed", r#"{"refund_id":"r_1"}"#, "  ", false);
    assert_eq!(status, 400);
    assert!(body.contains("needs a note"), "{body}");
    assert_eq!(record(&db, "tenant-a", "k-tenant-a"), before);

    let (status, location, _) = resolve("confirmed", r#"{"refund_id":"r_77"}"#, "bank statement line 4", false);
    assert_eq!(status, 303);
    let location = location.unwrap();
    let (_, after) = get(&format!("{}{location}", ui.base), Some("alice-token"));
    assert!(after.contains("Resolved: the record is now confirmed"), "{after}");
    let (state, version, audit) = record(&db, "tenant-a", "k-tenant-a");
    assert_eq!((state, version), (State::Confirmed, before.1 + 1));
    let last = audit.last().unwrap();
    assert!(last.contains("alice (once ui): bank statement line 4"), "{last}");

    // The command line reads the same resolution.
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args([
            "ledger",
            "--db",
            db.to_str().unwrap(),
            "show",
            "k-tenant-a",
            "--scope",
            "tenant-a",
        ])
        .env_remove("ONCE_DB")
        .output()
        .unwrap();
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains("state        confirmed"), "{shown}");
    assert!(shown.contains(r#"{"refund_id":"r_77"}"#), "{shown}");
    assert!(shown.contains("alice (once ui): bank statement line 4"), "{shown}");
}

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_ledger() {
    let (_dir, db) = ledger(&["tenant-a", "tenant-b"]);
    let ui = UiProcess::start(&db, &[]);
    let (status, text) = get(&format!("{}/metrics", ui.base), Some(&ui.token()));
    assert_eq!(status, 200);
    let scrape = parse_metrics(&text);
    let once = Once::sqlite(&db).unwrap().build().unwrap();
    let stats = once.stats(None).unwrap();
    for state in State::ALL {
        let n = stats.by_state.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n);
        assert_eq!(
            sample(&scrape, "once_records", Some(("state", state.name()))),
            n as f64,
            "{state}"
        );
    }
    let events = |kind: &str| stats.events.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n) as f64;
    assert_eq!(sample(&scrape, "once_replays_total", None), events("replay"));
    assert_eq!(events("replay"), 1.0);
    assert_eq!(sample(&scrape, "once_conflicts_total", None), events("conflict"));
    assert_eq!(sample(&scrape, "once_queue", Some(("attention", "unknown"))), 2.0);
    assert!(sample(&scrape, "once_oldest_unknown_age_seconds", None) >= 0.0);
    for (kind, n) in &stats.events {
        assert_eq!(
            sample(&scrape, "once_audit_events_total", Some(("kind", kind))),
            *n as f64,
            "{kind}"
        );
    }
}

#[test]
fn a_listen_address_beyond_loopback_needs_public() {
    let out = Command::new(env!("CARGO_BIN_EXE_once"))
        .args(["ui", "--db", "unused.db", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("0.0.0.0:0 is not a loopback address") && err.contains("--public"),
        "{err}"
    );
}

fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text format")
}

/// The value of one sample, by name and (optionally) one label.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let s = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"));
    match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => panic!("{name} is not a plain number"),
    }
}
