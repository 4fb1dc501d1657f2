//! The operator's page in a real browser: a gateway in front of the refund
//! service loses a reply and cannot read the provider (its config has no
//! lookup), so the refund is UNKNOWN; headless Chromium, driven over
//! WebDriver, opens `once ui`, finds the record in the queue and resolves it
//! with a note; the ledger shows the transition and the audit event.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them;
//! `ONCE_CHROMIUM` / `ONCE_CHROMEDRIVER` point elsewhere). Without them the
//! test says so and passes, except under `CI`, where it fails.

// The gateway suites' rig (host/gateway/tests/), run here on this package's own `once`.
#[path = "../../gateway/tests/gateway_common/mod.rs"]
mod gateway_common;
mod ui_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use gateway_common::{Rig, text};
use once::types::State;
use serde_json::json;
use ui_common::{UiProcess, record};

/// A gateway config whose refund tool has no lookup: an UNKNOWN waits for an operator. (Nothing the gateway
/// does can settle it, so it need not wait out a shutdown grace for it.)
const NO_LOOKUP: &str = r#"in_flight_wait = "0ms"
shutdown_grace = "0ms"

[tools.refund_order]
provider_key = "argument:idempotency_key"
timeout = "1s"
max_in_flight = "1500ms"
"#;

fn tool(env: &str, default: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from);
    path.exists().then_some(path)
}

/// chromedriver on a free port; killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start(chromedriver: &Path) -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Driver { child, url }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, chromium: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session in headless Chromium")
}

/// Chromium and chromedriver, or none (said, and a failure under `CI`).
fn browser_tools() -> Option<(PathBuf, PathBuf)> {
    let (Some(chromium), Some(chromedriver)) = (
        tool("ONCE_CHROMIUM", "/usr/bin/chromium"),
        tool("ONCE_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: chromium and chromedriver are required (apt-get install chromium chromium-driver)"
        );
        eprintln!("skipped: no /usr/bin/chromium or /usr/bin/chromedriver (apt-get install chromium chromium-driver)");
        return None;
    };
    Some((chromium, chromedriver))
}

/// Signed in as the README says: the page's own form, the printed token pasted into it.
async fn sign_in(c: &Client, ui: &UiProcess) {
    c.goto(&format!("{}/", ui.base)).await.unwrap();
    c.find(Locator::Css(r#"input[name="token"]"#))
        .await
        .unwrap()
        .send_keys(&ui.token())
        .await
        .unwrap();
    c.find(Locator::Css(r#"form[action="/login"] button"#))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_url(&format!("{}/", ui.base).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(c.current_url().await.unwrap().path(), "/");
}

/// Fill the record page's resolve form: choose `resolution`, write `note`, submit; the banner's text.
async fn decide(c: &Client, resolution: &str, note: &str) -> String {
    c.find(Locator::Css(&format!(
        r#"input[name="resolution"][value="{resolution}"]"#
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    c.find(Locator::Css(r#"input[name="note"]"#))
        .await
        .unwrap()
        .send_keys(note)
        .await
        .unwrap();
    c.find(Locator::Css("#resolve button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let banner = c.wait().for_element(Locator::Id("banner")).await.unwrap();
    banner.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resolves_a_gateways_unknown_refund_in_the_browser() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };

    // A real gateway, a refund whose reply is lost after it committed, and no way to read it back.
    let rig = Rig::new(NO_LOOKUP);
    let session = rig.connect("post_commit_disconnect", 0).await;
    let result = session
        .call(
            "refund_order",
            json!({"order_id": refund::ORDER_ID, "amount": 200.0}),
            Some("refund-ui-1"),
        )
        .await;
    assert!(session.close().await.success(), "{}", rig.logs());
    assert!(text(&result).starts_with("UNKNOWN"), "{}", text(&result));
    assert_eq!(rig.effects(), (1, 20_000), "the refund happened once");
    // The gateway's default scope (`scope = "fixed:default"`).
    let scope = "default";
    assert_eq!(record(Path::new(&rig.db), scope, "refund-ui-1").0, State::Unknown);

    let ui = UiProcess::start(Path::new(&rig.db), &[]);
    let driver = Driver::start(&chromedriver);
    let c = browser(&driver, &chromium).await;
    sign_in(&c, &ui).await;
    // The browser holds a session id, never the token.
    let cookies = c.get_all_cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|k| k.name() == "once_session")
        .expect("a session cookie");
    assert_ne!(session.value(), ui.token());
    assert!(session.http_only().unwrap_or(false));
    let row = c
        .find(Locator::Css(
            r#"table[data-section="unknown"] tr[data-key="refund-ui-1"]"#,
        ))
        .await
        .expect("the unknown refund in the queue");
    assert!(row.text().await.unwrap().contains("refund_order"));
    row.find(Locator::Css("a")).await.unwrap().click().await.unwrap();

    assert_eq!(
        c.find(Locator::Id("state")).await.unwrap().text().await.unwrap(),
        "unknown"
    );
    c.find(Locator::Css(r#"textarea[name="receipt"]"#))
        .await
        .unwrap()
        .send_keys(r#"{"refund":"seen in the refund service","amount":200}"#)
        .await
        .unwrap();
    let banner = decide(&c, "confirmed", "refund service shows one $200 refund for order 1234").await;
    assert_eq!(banner, "Resolved: the record is now confirmed.");
    c.close().await.unwrap();

    let (state, _, audit) = record(Path::new(&rig.db), scope, "refund-ui-1");
    assert_eq!(state, State::Confirmed);
    let last = audit.last().unwrap();
    assert!(
        last.contains("operator (once ui): refund service shows one $200 refund for order 1234"),
        "{last}"
    );
    // Resolving sent nothing: still exactly one refund.
    assert_eq!(rig.effects(), (1, 20_000));
}

/// The approval flow on the page: a gateway's refund above the tool's threshold is not sent but waits for a
/// person; the operator finds it under "Awaiting approval" with why, opens it (its payload and fingerprint),
/// approves it with a note; the same call again sends it, once. A second one is denied and refused after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approves_one_refund_and_denies_another_in_the_browser() {
    let Some((chromium, chromedriver)) = browser_tools() else {
        return;
    };
    let rig = Rig::new(&format!(
        "{NO_LOOKUP}approval = {{ field = \"/amount\", above = \"100\" }}\n"
    ));
    let refund = |key: &'static str| {
        let rig = &rig;
        async move {
            let session = rig.connect("none", 0).await;
            let args = json!({"order_id": refund::ORDER_ID, "amount": 200.0});
            let result = session.call("refund_order", args, Some(key)).await;
            assert!(session.close().await.success(), "{}", rig.logs());
            text(&result)
        }
    };
    let asked = refund("refund-approve-1").await;
    assert!(asked.starts_with("AWAITING APPROVAL"), "{asked}");
    assert!(refund("refund-deny-1").await.starts_with("AWAITING APPROVAL"));
    assert_eq!(rig.effects(), (0, 0), "nothing sent before a person decides");

    let ui = UiProcess::start(Path::new(&rig.db), &[]);
    let driver = Driver::start(&chromedriver);
    let c = browser(&driver, &chromium).await;
    sign_in(&c, &ui).await;
    let row = c
        .find(Locator::Css(
            r#"table[data-section="approval"] tr[data-key="refund-approve-1"]"#,
        ))
        .await
        .expect("the refund in the approvals");
    assert!(row.text().await.unwrap().contains("/amount is 200.0, above 100"));
    row.find(Locator::Css("a")).await.unwrap().click().await.unwrap();
    assert_eq!(
        c.find(Locator::Id("state")).await.unwrap().text().await.unwrap(),
        "awaiting-approval"
    );
    let page = c.source().await.unwrap();
    assert!(page.contains("amount") && page.contains("200"), "the payload is shown");
    let banner = decide(&c, "approve", "the customer called; order 1234 is eligible").await;
    assert!(
        banner.starts_with("Approved: this exact call may now be sent, once"),
        "{banner}"
    );

    c.goto(&format!("{}/record?scope=default&key=refund-deny-1", ui.base))
        .await
        .unwrap();
    let banner = decide(&c, "deny", "not this customer").await;
    assert_eq!(banner, "Denied: this call will never be sent.");
    c.close().await.unwrap();

    let (state, _, audit) = record(Path::new(&rig.db), "default", "refund-approve-1");
    assert_eq!(state, State::Absent, "approved: the dispatch is owed");
    assert!(
        audit
            .last()
            .unwrap()
            .contains("operator (once ui): the customer called; order 1234 is eligible"),
        "{audit:?}"
    );
    let sent = refund("refund-approve-1").await;
    assert!(!sent.starts_with("AWAITING") && !sent.starts_with("BLOCKED"), "{sent}");
    assert_eq!(rig.effects(), (1, 20_000), "the approved refund, once");
    let refused = refund("refund-deny-1").await;
    assert!(
        refused.starts_with("BLOCKED: refund_order was not sent: operation refund-deny-1 was not approved"),
        "{refused}"
    );
    assert_eq!(record(Path::new(&rig.db), "default", "refund-deny-1").0, State::Denied);
    assert_eq!(rig.effects(), (1, 20_000));
}
