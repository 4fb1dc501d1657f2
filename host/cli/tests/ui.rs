//! `once ui` over HTTP, as a real process on a real SQLite ledger: tokens,
//! sessions, login CSRF, the security headers of every response, CSRF, the
//! scope boundary, resolutions through the engine, and /metrics read by a
//! Prometheus text-format parser.

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
    // A link with the token still signs a browser in: a cookie, and the token leaves the address bar.
    let mut r = agent().get(ui.token_link()).call().unwrap();
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

/// A sign-in form POST with optional extra headers: (status, Set-Cookie, Location, headers, body).
fn sign_in(base: &str, token: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, ureq::http::HeaderMap, String) {
    let mut req = agent().post(format!("{base}/login"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send_form([("token", token)]).expect("POST /login");
    let cookie = r.headers().get("set-cookie").map(|v| v.to_str().unwrap().to_string());
    let headers = r.headers().clone();
    (
        r.status().as_u16(),
        cookie,
        headers,
        r.body_mut().read_to_string().unwrap(),
    )
}

/// A GET with a `Cookie` header: (status, body).
fn get_with_cookie(url: &str, cookie: &str) -> (u16, String) {
    let mut r = agent().get(url).header("Cookie", cookie).call().expect("GET");
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// Signing in opens a session: the cookie holds a random id kept by the process, never the token; it is
/// HttpOnly and SameSite=Strict (and Secure with `--behind-tls`); it expires; the raw token is no cookie.
/// The address `once ui` prints holds no token.
#[test]
fn a_sign_in_sets_a_session_cookie_not_the_token() {
    let (_dir, db) = ledger(&["tenant-a"]);
    let ui = UiProcess::start(&db, &["--session-lifetime-secs", "2"]);
    let token = ui.token();
    assert!(
        !ui.first_line.contains("token="),
        "no token in the printed address: {}",
        ui.first_line
    );

    let (status, cookie, headers, _) = sign_in(&ui.base, &token, &[]);
    assert_eq!(status, 303);
    assert_eq!(headers.get("location").unwrap(), "/");
    let cookie = cookie.expect("a session cookie");
    assert!(!cookie.contains(&token), "the token is not in the cookie: {cookie}");
    let session = cookie.split(';').next().unwrap();
    let (name, id) = session.split_once('=').unwrap();
    assert_eq!(name, "once_session");
    assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=2"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP without --behind-tls: {cookie}");
    let (status, page) = get_with_cookie(&format!("{}/", ui.base), session);
    assert_eq!(status, 200);
    assert!(page.contains("k-tenant-a"));
    // A second sign-in is a second session, not the same id.
    let (_, again, _, _) = sign_in(&ui.base, &token, &[]);
    assert_ne!(again.unwrap().split(';').next().unwrap(), session);
    // The token itself, or a made-up id, in the cookie opens nothing.
    for forged in [
        format!("once_session={token}"),
        format!("once_token={token}"),
        format!("once_session={}", "0".repeat(64)),
    ] {
        assert_eq!(get_with_cookie(&format!("{}/", ui.base), &forged).0, 401, "{forged}");
    }
    // The session expires (here after 2 s).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(
        get_with_cookie(&format!("{}/", ui.base), session).0,
        401,
        "an expired session"
    );

    let tls = UiProcess::start(&db, &["--behind-tls"]);
    let (status, cookie, _, _) = sign_in(&tls.base, &tls.token(), &[]);
    assert_eq!(status, 303);
    assert!(cookie.unwrap().contains("; Secure"), "--behind-tls");
}

/// Login CSRF: a sign-in another site starts (its form posted cross-site, or a link to `/login?token=`) is
/// refused 403 and sets no cookie; one from the page itself (or from no page at all) signs in.
#[test]
fn a_sign_in_from_another_site_is_refused() {
    let (_dir, db) = ledger(&["tenant-a"]);
    let ui = UiProcess::start(&db, &[]);
    let token = ui.token();
    let own = ui.base.clone();
    for headers in [
        vec![("Origin", "http://evil.example")],
        vec![("Origin", "null")],
        vec![("Sec-Fetch-Site", "cross-site")],
        vec![("Sec-Fetch-Site", "same-site"), ("Origin", "http://sub.127.0.0.1")],
        vec![("Sec-Fetch-Site", "cross-site"), ("Origin", own.as_str())],
    ] {
        let (status, cookie, _, body) = sign_in(&ui.base, &token, &headers);
        assert_eq!(status, 403, "{headers:?}: {body}");
        assert!(cookie.is_none(), "{headers:?}: no cookie");
        assert!(body.contains("started by another site was refused"), "{body}");
    }
    let mut link = agent()
        .get(ui.token_link())
        .header("Sec-Fetch-Site", "cross-site")
        .call()
        .unwrap();
    assert_eq!(link.status().as_u16(), 403);
    assert!(link.headers().get("set-cookie").is_none());
    let _ = link.body_mut().read_to_string();

    for headers in [
        vec![("Origin", own.as_str())],
        vec![("Sec-Fetch-Site", "same-origin"), ("Origin", own.as_str())],
        vec![("Sec-Fetch-Site", "none")],
    ] {
        let (status, cookie, _, body) = sign_in(&ui.base, &token, &headers);
        assert_eq!(status, 303, "{headers:?}: {body}");
        assert!(cookie.is_some_and(|c| c.starts_with("once_session=")), "{headers:?}");
    }
}

/// The same security headers on every response: pages, a 404 for an unknown path, a redirect, a 401,
/// /metrics, a refused form.
#[test]
fn every_response_carries_the_security_headers() {
    let (_dir, db) = ledger(&["tenant-a"]);
    let ui = UiProcess::start(&db, &[]);
    let token = ui.token();
    let mut answers = Vec::new();
    for (path, bearer) in [
        ("/", Some(token.as_str())),
        ("/", None),
        ("/no-such-page", None),
        ("/no-such-page", Some(token.as_str())),
        ("/metrics", Some(token.as_str())),
        ("/login", None),
        ("/record?scope=tenant-a&key=nope", Some(token.as_str())),
    ] {
        let mut req = agent().get(format!("{}{path}", ui.base));
        if let Some(t) = bearer {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let r = req.call().unwrap();
        answers.push((format!("GET {path}"), r.status().as_u16(), r.headers().clone()));
    }
    let (status, _, headers, _) = sign_in(&ui.base, &token, &[]);
    answers.push(("POST /login".into(), status, headers));
    let (status, _, headers, _) = sign_in(&ui.base, &token, &[("Origin", "http://evil.example")]);
    answers.push(("POST /login cross-site".into(), status, headers));
    let r = agent().post(format!("{}/", ui.base)).send_empty().unwrap();
    answers.push(("POST /".into(), r.status().as_u16(), r.headers().clone()));
    let statuses: Vec<u16> = answers.iter().map(|(_, s, _)| *s).collect();
    assert_eq!(
        statuses,
        [200, 401, 404, 404, 200, 200, 404, 303, 403, 405],
        "{answers:#?}"
    );
    for (what, _, headers) in &answers {
        let csp = headers
            .get("content-security-policy")
            .unwrap_or_else(|| panic!("{what}: no CSP"))
            .to_str()
            .unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{what}: {csp}"
        );
        for (name, value) in [
            ("referrer-policy", "no-referrer"),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
            ("x-frame-options", "DENY"),
        ] {
            assert_eq!(
                headers.get(name).map(|v| v.to_str().unwrap()),
                Some(value),
                "{what}: {name}"
            );
        }
    }
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
    assert!(ui.printed_token.is_none(), "an operators file prints no token");

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

/// The page offers exactly the resolutions the engine's `resolvable` names: none while a holder's lease is
/// live or once confirmed, confirmed only for a failed record, both (absent with force) for a fresh unknown.
#[test]
fn the_resolve_form_offers_only_what_the_engine_would_accept() {
    let (dir, db) = ledger(&["tenant-a"]);
    let once = Once::sqlite(&db).unwrap().build().unwrap();
    let rejected = once
        .call(
            "tenant-a",
            Some("f-1"),
            "refund_order",
            r#"{"order":2,"amount":5}"#,
            |_| once::Sent::Rejected("card declined".into()),
        )
        .unwrap();
    assert!(
        matches!(rejected.ending(), Some(once::types::Ending::Rejected(_))),
        "{rejected:?}"
    );
    // A holder whose send is still under way: its lease is live while the page is read.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        once.call(
            "tenant-a",
            Some("live-1"),
            "refund_order",
            r#"{"order":3,"amount":5}"#,
            |_| {
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                once::Sent::Success(r#"{"refund_id":"r_3"}"#.into())
            },
        )
        .unwrap()
    });
    started_rx.recv().unwrap();
    let ui = UiProcess::start(&db, &["--operators", operators(dir.path()).to_str().unwrap()]);
    let page = |key: &str| {
        get(
            &format!("{}/record?scope=tenant-a&key={key}", ui.base),
            Some("alice-token"),
        )
        .1
    };

    let live = page("live-1");
    assert!(live.contains("<b id=state>in-flight</b>"), "{live}");
    assert!(!live.contains("id=resolve"), "a live lease cannot be resolved: {live}");

    let failed = page("f-1");
    assert!(failed.contains("<b id=state>failed</b>"), "{failed}");
    assert!(failed.contains("value=confirmed"), "{failed}");
    assert!(
        !failed.contains("value=absent"),
        "a failed record cannot be resolved absent: {failed}"
    );
    assert!(!failed.contains("name=force"), "{failed}");

    let unknown = page("k-tenant-a");
    assert!(
        unknown.contains("value=confirmed") && unknown.contains("value=absent"),
        "{unknown}"
    );
    assert!(
        unknown.contains("name=force"),
        "absent needs force before max_in_flight: {unknown}"
    );

    let confirmed = page("c-1");
    assert!(confirmed.contains("<b id=state>confirmed</b>"), "{confirmed}");
    assert!(!confirmed.contains("id=resolve"), "{confirmed}");

    release_tx.send(()).unwrap();
    let called = holder.join().unwrap();
    assert!(called.confirmed().is_some(), "{called:?}");
    let settled = page("live-1");
    assert!(!settled.contains("id=resolve"), "{settled}");
}

/// `once ui` as shipped (its default limits, `once_ui::DEFAULT_*`): a connection that sends half a request is
/// closed, not held; the operator's own connection, meanwhile, is served. (host/ui/tests/hostile_clients.rs
/// covers the slow body and the flood of idle connections with short limits.)
#[test]
fn the_shipped_page_cuts_off_half_a_request() {
    use std::io::{Read, Write};
    let (_dir, db) = ledger(&["tenant-a"]);
    let ui = UiProcess::start(&db, &[]);
    let addr = ui.base.trim_start_matches("http://").to_string();
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    // The default header timeout is 10 s: a minute is long past it, and short of forever.
    half.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost: ui\r\n").unwrap();
    let (status, _) = get(&format!("{}/", ui.base), Some(&ui.token()));
    assert_eq!(status, 200, "the operator is served while half a request waits");
    let mut rest = Vec::new();
    match half.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("once ui kept half a request's connection open: {e}"),
    }
    assert!(!String::from_utf8_lossy(&rest).contains("200 OK"));
}
