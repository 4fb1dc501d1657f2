//! `once ui` as a user starts it: a real process on a real SQLite ledger,
//! its address read from the first line it prints, and HTTP helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use once::{Once, Sent};
use ureq::Agent;

/// A running `once ui`; killed on drop.
pub struct UiProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// The random operator token it printed beside its address, when it printed one.
    pub printed_token: Option<String>,
    /// The first line it printed.
    pub first_line: String,
}

impl UiProcess {
    /// `once ui --db DB --listen 127.0.0.1:0 EXTRA…`
    pub fn start(db: &Path, extra: &[&str]) -> UiProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_once"))
            .arg("ui")
            .arg("--db")
            .arg(db)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("ONCE_DB")
            .env_remove("ONCE_UI_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting once ui");
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut first).expect("reading once ui's address");
        // Keep reading what it prints, as a terminal would.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let said = first
            .trim()
            .strip_prefix("once ui: ")
            .unwrap_or_else(|| panic!("once ui printed {first:?}"));
        let base = said.split(' ').next().unwrap().trim_end_matches('/').to_string();
        let printed_token = said
            .split_once("(sign in with the operator token: ")
            .map(|(_, t)| t.trim_end_matches(')').to_string());
        UiProcess {
            child,
            base,
            printed_token,
            first_line: first.trim().to_string(),
        }
    }

    /// The token it printed.
    pub fn token(&self) -> String {
        self.printed_token.clone().expect("a printed token")
    }

    /// A link that signs a browser in with `token` in its address (written before sign-in moved to the form;
    /// still accepted, and redirected at once so the token leaves the address bar).
    pub fn token_link(&self) -> String {
        format!("{}/login?token={}", self.base, self.token())
    }
}

impl Drop for UiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client that shows every status and redirect as it is.
pub fn agent() -> Agent {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// A GET with an optional bearer token: (status, body).
pub fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = agent().get(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut r = req.call().expect("GET");
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// A form POST with an optional bearer token: (status, Location, body).
pub fn post(url: &str, token: Option<&str>, form: &[(&str, &str)]) -> (u16, Option<String>, String) {
    let mut req = agent().post(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut r = req.send_form(form.iter().copied()).expect("POST");
    let location = r.headers().get("location").map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), location, r.body_mut().read_to_string().unwrap())
}

/// The CSRF token in a record page's resolve form.
pub fn csrf_of(page: &str) -> String {
    let at = page.find("name=csrf value=\"").expect("a resolve form") + "name=csrf value=\"".len();
    page[at..].split('"').next().unwrap().to_string()
}

/// A ledger at `db` holding, per scope in `scopes`, one unknown record `k-<scope>` (its reply was lost and
/// nothing can read the provider), plus in the first scope a confirmed record `c-1` repeated once (a replay).
pub fn seed(db: &Path, scopes: &[&str]) {
    let once = Once::sqlite(db).unwrap().wait_up_to(Duration::ZERO).build().unwrap();
    for scope in scopes {
        let key = format!("k-{scope}");
        let args = format!(r#"{{"order":1234,"amount":200,"scope":"{scope}"}}"#);
        let called = once
            .call(scope, Some(&key), "refund_order", &args, |_| {
                Sent::Ambiguous("the reply was lost".into())
            })
            .unwrap();
        assert_eq!(called.effect(), once::types::Effect::Unknown, "{called:?}");
    }
    for _ in 0..2 {
        let _ = once
            .call(
                scopes[0],
                Some("c-1"),
                "refund_order",
                r#"{"order":1,"amount":5}"#,
                |_| Sent::Success(r#"{"refund_id":"r_1"}"#.into()),
            )
            .unwrap();
    }
}

/// The record as the library reads it back: (state, version, audit kinds and details).
pub fn record(db: &Path, scope: &str, key: &str) -> (once::types::State, u64, Vec<String>) {
    let once = Once::sqlite(db).unwrap().build().unwrap();
    let v = once.inspect(scope, key).unwrap().expect("the record");
    let audit = v.audit.iter().map(|e| format!("{} {}", e.kind, e.detail)).collect();
    (v.state, v.version, audit)
}
