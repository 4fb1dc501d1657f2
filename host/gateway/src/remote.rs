//! A remote upstream: an MCP server at a URL, spoken to over Streamable HTTP
//! (rmcp's client transport over reqwest). What matters here is which
//! failures prove that a request never left: only a failure to open the
//! connection does. Everything after a connection was made (a timeout, a
//! reset, a 5xx, a stream cut before the answer) may follow an effect.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceError;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};

/// How long opening a TCP connection to the upstream may take before the request counts as not sent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An upstream URL, checked: what the gateway connects to, and what it may show.
#[derive(Clone)]
pub struct UpstreamUrl {
    /// The URL as given, credentials included: only ever handed to the HTTP client.
    url: String,
    /// The URL without credentials, query or fragment: for messages, logs and the default owner.
    shown: String,
    /// The URL as the HTTP client names it in its errors (no credentials, but the query): replaced by `shown`.
    requested: String,
}

impl std::fmt::Debug for UpstreamUrl {
    // Never the credentials, not even in a debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UpstreamUrl").field(&self.shown).finish()
    }
}

impl UpstreamUrl {
    /// Parse and check `text`: an `http://` URL with a host. `https://` is refused, since this
    /// build carries no TLS stack (terminate TLS in a proxy on the gateway's host).
    pub fn parse(text: &str) -> Result<UpstreamUrl, String> {
        let url = reqwest::Url::parse(text).map_err(|e| format!("upstream URL: {e}"))?;
        let mut requested = url.clone();
        let _ = requested.set_username("");
        let _ = requested.set_password(None);
        requested.set_fragment(None);
        let mut shown = requested.clone();
        shown.set_query(None);
        let (requested, shown) = (requested.to_string(), shown.to_string());
        match url.scheme() {
            "http" => {}
            "https" => {
                return Err(format!(
                    "upstream URL {shown}: https is not supported by this build (no TLS); reach the server over \
                     http, e.g. through a TLS-terminating proxy on this host"
                ));
            }
            other => return Err(format!("upstream URL {shown}: the scheme must be http, not {other:?}")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("upstream URL {shown}: no host"));
        }
        Ok(UpstreamUrl {
            url: text.to_string(),
            shown,
            requested,
        })
    }

    /// `message` (an error's text) with the URL in the shown form: no credentials, no query.
    pub fn redact(&self, message: String) -> String {
        message
            .replace(&self.url, &self.shown)
            .replace(&self.requested, &self.shown)
    }

    /// The URL without credentials, query or fragment.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The URL as given, credentials included: only for the upstream's identity digest
    /// ([`crate::identity`]), never for a message.
    pub fn as_given(&self) -> &str {
        &self.url
    }

    /// A fresh transport: a new session, initialized by whoever serves over it.
    pub fn transport(&self) -> Result<StreamableHttpClientTransport<reqwest::Client>, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| format!("the HTTP client for {}: {}", self.shown, e.without_url()))?;
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str());
        // The server's stream of notifications and requests is reopened a bounded number of times;
        // a call that finds the server gone reconnects on its own (`Upstream::forget`).
        let mut reopen = ExponentialBackoff::default();
        reopen.max_times = Some(5);
        reopen.base_duration = Duration::from_millis(200);
        config.retry_config = Arc::new(reopen);
        Ok(StreamableHttpClientTransport::with_client(client, config))
    }
}

/// Whether this failure of a request proves it never reached the server: the connection to it
/// could not be opened (refused, unreachable, no route, the connect timeout). A request that
/// got a connection may have been read and acted on, whatever happened next.
pub fn never_left(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(dynamic) = error else {
        return false;
    };
    matches!(
        dynamic.error.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
        Some(StreamableHttpError::Client(e)) if e.is_connect()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_credentials_query_or_fragment() {
        let url = UpstreamUrl::parse("http://ops:pw%21@mcp.internal:8931/mcp?token=abc#x").unwrap();
        assert_eq!(url.shown(), "http://mcp.internal:8931/mcp");
        assert_eq!(format!("{url:?}"), "UpstreamUrl(\"http://mcp.internal:8931/mcp\")");
        let said = url.redact("error sending request for url (http://mcp.internal:8931/mcp?token=abc)".into());
        assert_eq!(said, "error sending request for url (http://mcp.internal:8931/mcp)");
        let said = url.redact("http://ops:pw%21@mcp.internal:8931/mcp?token=abc#x refused".into());
        assert_eq!(said, "http://mcp.internal:8931/mcp refused");
    }

    #[test]
    fn only_http_urls_with_a_host_are_taken() {
        let e = UpstreamUrl::parse("https://ops:pw@example.com/mcp").unwrap_err();
        assert!(e.contains("https is not supported") && !e.contains("pw"), "{e}");
        let e = UpstreamUrl::parse("ftp://example.com/mcp").unwrap_err();
        assert!(e.contains("the scheme must be http"), "{e}");
        let e = UpstreamUrl::parse("/mcp").unwrap_err();
        assert!(e.starts_with("upstream URL: "), "{e}");
        assert!(UpstreamUrl::parse("http://127.0.0.1:8931/mcp").is_ok());
    }
}
