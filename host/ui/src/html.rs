//! HTML building blocks: escaping, the page frame, times and ages.

use std::fmt::Write as _;

/// `text` with HTML's special characters escaped (safe in text and in quoted attributes).
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` percent-encoded for a query string value.
pub fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The link to one record's page.
pub fn record_href(scope: &str, key: &str) -> String {
    format!("/record?scope={}&key={}", query_value(scope), query_value(key))
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap;word-break:break-all;margin:0}\
.bad{color:#a00}.ok{color:#070}.muted{color:#777}form.inline{display:inline}fieldset{margin:1em 0;max-width:48em}\
textarea,input[type=text]{width:100%;box-sizing:border-box}nav a{margin-right:1em}";

/// A whole page: title, who is signed in, and the body.
pub fn page(title: &str, operator: Option<&str>, body: &str) -> String {
    let who = operator.map_or(String::new(), |o| {
        format!(" <span class=muted>signed in as {}</span>", esc(o))
    });
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>{t} · once</title>\
         <meta name=viewport content=\"width=device-width\"><style>{STYLE}</style></head>\
         <body><nav><a href=\"/\">queue</a>{who}</nav><h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

/// A ledger timestamp (ms since the epoch) as UTC, `2026-12-01 22:16:10.123Z`.
pub fn time(ms: u64) -> String {
    let t = once::UtcTime::from_ms(ms);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second, t.millis
    )
}

/// A duration in ms as an operator reads it: `2h 03m`, `4m 10s`, `850ms`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_ages_read_as_written() {
        assert_eq!(time(0), "1970-01-01 00:00:00.000Z");
        // 2024-02-29 12:34:56.789 UTC, a leap day.
        assert_eq!(time(1_709_210_096_789), "2024-02-29 12:34:56.789Z");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00.000Z");
        assert_eq!(age(850), "850ms");
        assert_eq!(age(61_000), "1m 01s");
        assert_eq!(age(7_380_000), "2h 03m");
        assert_eq!(age(90_000_000), "1d 01h");
    }

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        assert_eq!(query_value("a b/é&"), "a%20b%2F%C3%A9%26");
    }
}
