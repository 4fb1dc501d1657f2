//! `[http]` in `once.toml`: who may call the gateway when it listens on HTTP,
//! and which tenant (scope) each request is. A bearer token is stored only as
//! the SHA-256 of its text (lower-case hex); a header set by a trusted proxy
//! names the tenant only when the file says which header that is.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::config::Millis;

/// The request body limit when the file sets none: far above any tool call, far below a memory problem.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
/// How long a connection may take to send a request's headers (and how long it may sit idle between
/// requests) when the file sets none: far above a real client's, far below a file-descriptor siege.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take to send its body when the file sets none.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many connections may be open at once that have not yet carried an authenticated request, when the
/// file sets none: well below the usual 1,024 file descriptors, so a flood of them leaves room for tenants.
pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 256;
/// The browser origins a request may come from when the file names none: pages served from this machine
/// (loopback names, any port). A page elsewhere that reaches the gateway through the user's browser (a
/// cross-site request, or DNS rebinding to 127.0.0.1) carries its own origin and is answered 403.
pub const DEFAULT_ALLOWED_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

/// `[http]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpSection {
    body_limit: Option<usize>,
    tenant_header: Option<String>,
    tenants: Option<BTreeMap<String, TokenHashes>>,
    metrics_tokens: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    allowed_origins: Option<Vec<String>>,
    header_timeout: Option<Millis>,
    body_timeout: Option<Millis>,
    max_unauthenticated: Option<usize>,
}

/// One tenant's token hashes: one, or several while a token is rotated.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum TokenHashes {
    One(String),
    Many(Vec<String>),
}

/// A mistake in `[http]`, naming the key it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessConfigError {
    /// A token hash that is not 64 hex digits.
    #[error("[http] {key}: {value:?} is not a SHA-256 in hex (64 hex digits); write `printf %s TOKEN | sha256sum`")]
    BadHash {
        /// Where it is (`tenants.acme`, `metrics_tokens`).
        key: String,
        /// What was written.
        value: String,
    },
    /// One token for two tenants (or twice for one): a request with it would have no one scope.
    #[error("[http] tenants.{first} and tenants.{second}: the same token hash {hash}; every token names one tenant")]
    DuplicateToken {
        /// The tenant it was first given to.
        first: String,
        /// The tenant it was given to again.
        second: String,
        /// The hash.
        hash: String,
    },
    /// Tokens and a proxy header both name the tenant.
    #[error("[http] tenants and tenant_header both choose the tenant; set one")]
    BothModes,
    /// A tenant scope from the request, and `scope` from the file: two sources of one scope.
    #[error("[http] {mode} chooses each request's scope, so `scope` (here {scope:?}) cannot be set too")]
    ScopeTwice {
        /// `tenants` or `tenant_header`.
        mode: &'static str,
        /// The file's `scope`.
        scope: String,
    },
    /// A tenant with no token, or an empty name.
    #[error("[http] tenants.{key}: {why}")]
    BadTenant {
        /// The tenant's key.
        key: String,
        /// What is wrong.
        why: &'static str,
    },
    /// An empty or unusable header name.
    #[error("[http] tenant_header: {value:?} is not an HTTP header name")]
    BadHeader {
        /// What was written.
        value: String,
    },
    /// An `allowed_origins` entry that is not `scheme://host:port`, `scheme://host:*` or `null`.
    #[error("[http] allowed_origins[{index}]: {value:?} {why}")]
    BadOrigin {
        /// Its place in the list, from 0.
        index: usize,
        /// What was written.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A body limit of zero.
    #[error("[http] body_limit: must be at least 1 byte")]
    ZeroBodyLimit,
    /// A timeout or a connection cap of zero: no request could ever be served.
    #[error("[http] {key}: must be more than zero")]
    Zero {
        /// `header_timeout`, `body_timeout` or `max_unauthenticated`.
        key: &'static str,
    },
}

/// Who a request's tenant is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tenancy {
    /// No credentials: the file's `scope` applies, as on stdio.
    #[default]
    Open,
    /// `Authorization: Bearer TOKEN`, with SHA-256(TOKEN) -> tenant.
    Tokens(HashMap<[u8; 32], String>),
    /// The tenant is this header's value, set by a trusted proxy in front of the gateway.
    Header(String),
}

/// `[http]`, read and checked.
#[derive(Debug, Clone)]
pub struct HttpAccess {
    /// Largest request body accepted, in bytes; a larger one is answered 413.
    pub body_limit: usize,
    /// How each request's tenant is found.
    pub tenancy: Tenancy,
    /// SHA-256 of the bearer tokens that may read `/metrics` (all scopes).
    pub metrics_tokens: Vec<[u8; 32]>,
    /// `Host` values accepted (DNS-rebinding protection); `None`: loopback names only.
    pub allowed_hosts: Option<Vec<String>>,
    /// Browser origins a request carrying `Origin` may come from (`scheme://host:port`, `:*` for any port, or
    /// `null`); any other origin is answered 403. A request without `Origin` (not a browser's) is not judged.
    pub allowed_origins: Vec<String>,
    /// How long a connection may take to send a request's headers, or sit idle between requests, before
    /// it is closed.
    pub header_timeout: Duration,
    /// How long a request may take to send its body before it is answered 408 and its connection closed.
    pub body_timeout: Duration,
    /// How many connections may be open that have not yet carried an authenticated request; a new one
    /// beyond it closes the oldest of them.
    pub max_unauthenticated: usize,
}

impl Default for HttpAccess {
    fn default() -> HttpAccess {
        HttpAccess {
            body_limit: DEFAULT_BODY_LIMIT,
            tenancy: Tenancy::Open,
            metrics_tokens: Vec::new(),
            allowed_hosts: None,
            allowed_origins: DEFAULT_ALLOWED_ORIGINS.map(String::from).to_vec(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_unauthenticated: DEFAULT_MAX_UNAUTHENTICATED,
        }
    }
}

/// Why a request was refused before it reached the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No valid credentials (401).
    Unauthorized(&'static str),
    /// Credentials that do not grant this (403).
    Forbidden(&'static str),
    /// Credentials that say two things at once (400): a tenant header sent more than once, or
    /// with a comma-joined list, as a proxy that appends instead of replacing would pass on.
    BadRequest(String),
}

impl HttpAccess {
    /// Check `[http]` (and that `scope` is not set when a tenant comes from the request).
    pub(crate) fn from_section(section: HttpSection, scope: Option<&str>) -> Result<HttpAccess, AccessConfigError> {
        if section.body_limit == Some(0) {
            return Err(AccessConfigError::ZeroBodyLimit);
        }
        for (key, zero) in [
            ("header_timeout", section.header_timeout == Some(Millis(0))),
            ("body_timeout", section.body_timeout == Some(Millis(0))),
            ("max_unauthenticated", section.max_unauthenticated == Some(0)),
        ] {
            if zero {
                return Err(AccessConfigError::Zero { key });
            }
        }
        let tenancy = match (section.tenants, section.tenant_header) {
            (Some(_), Some(_)) => return Err(AccessConfigError::BothModes),
            (Some(tenants), None) => Tenancy::Tokens(token_map(tenants)?),
            (None, Some(header)) => {
                let valid = !header.is_empty()
                    && header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !valid {
                    return Err(AccessConfigError::BadHeader { value: header });
                }
                Tenancy::Header(header.to_ascii_lowercase())
            }
            (None, None) => Tenancy::Open,
        };
        if let (Some(scope), Some(mode)) = (scope, tenancy.mode()) {
            return Err(AccessConfigError::ScopeTwice {
                mode,
                scope: scope.to_string(),
            });
        }
        let metrics_tokens = section
            .metrics_tokens
            .unwrap_or_default()
            .iter()
            .map(|h| parse_hash("metrics_tokens", h))
            .collect::<Result<_, _>>()?;
        Ok(HttpAccess {
            body_limit: section.body_limit.unwrap_or(DEFAULT_BODY_LIMIT),
            tenancy,
            metrics_tokens,
            allowed_hosts: section.allowed_hosts,
            allowed_origins: match section.allowed_origins {
                Some(origins) => checked_origins(origins)?,
                None => DEFAULT_ALLOWED_ORIGINS.map(String::from).to_vec(),
            },
            header_timeout: section
                .header_timeout
                .map_or(DEFAULT_HEADER_TIMEOUT, |m| Duration::from_millis(m.0)),
            body_timeout: section
                .body_timeout
                .map_or(DEFAULT_BODY_TIMEOUT, |m| Duration::from_millis(m.0)),
            max_unauthenticated: section.max_unauthenticated.unwrap_or(DEFAULT_MAX_UNAUTHENTICATED),
        })
    }

    /// The tenant a request is, from its headers: `Ok(None)` when the gateway is open.
    pub fn tenant_of(&self, headers: &axum::http::HeaderMap) -> Result<Option<String>, Refusal> {
        match &self.tenancy {
            Tenancy::Open => Ok(None),
            Tenancy::Tokens(tokens) => {
                let token = bearer(headers).ok_or(Refusal::Unauthorized("this gateway needs a bearer token"))?;
                tokens
                    .get(&sha256(token))
                    .cloned()
                    .map(Some)
                    .ok_or(Refusal::Unauthorized("the bearer token is not one this gateway knows"))
            }
            Tenancy::Header(name) => {
                // A proxy that appends the header instead of replacing it passes the client's own value on
                // beside its own: taking either would let the client choose its tenant, so two are refused.
                let mut values = headers.get_all(name).iter();
                let (Some(value), None) = (values.next(), values.next()) else {
                    return match headers.get_all(name).iter().count() {
                        0 => Err(Refusal::Unauthorized(
                            "this gateway takes the tenant from a header its proxy sets, and the request has none",
                        )),
                        n => Err(Refusal::BadRequest(format!(
                            "the tenant header {name} came {n} times; it must come once, set (not appended) by the proxy"
                        ))),
                    };
                };
                let value = value
                    .to_str()
                    .map_err(|_| Refusal::BadRequest(format!("the tenant header {name} is not visible ASCII text")))?;
                // `a, b` is how HTTP joins two values of one header: the same ambiguity in one line.
                if value.contains(',') {
                    return Err(Refusal::BadRequest(format!(
                        "the tenant header {name} holds a list ({value:?}); it must name one tenant, set (not appended) by the proxy"
                    )));
                }
                let value = value.trim();
                if value.is_empty() {
                    return Err(Refusal::Unauthorized(
                        "this gateway takes the tenant from a header its proxy sets, and the request has none",
                    ));
                }
                Ok(Some(value.to_string()))
            }
        }
    }

    /// Whether a request may read `/metrics`: an operator token when the file names some; else only an
    /// open gateway's metrics are open (a tenant's token never shows the other tenants' counts).
    pub fn may_read_metrics(&self, headers: &axum::http::HeaderMap) -> Result<(), Refusal> {
        if self.metrics_tokens.is_empty() {
            return match self.tenancy {
                Tenancy::Open => Ok(()),
                _ => Err(Refusal::Forbidden(
                    "this gateway has tenants: name the operators who may read /metrics in [http] metrics_tokens",
                )),
            };
        }
        let token = bearer(headers).ok_or(Refusal::Unauthorized("/metrics needs an operator's bearer token"))?;
        if self.metrics_tokens.contains(&sha256(token)) {
            Ok(())
        } else {
            Err(Refusal::Unauthorized(
                "the bearer token is not one of [http] metrics_tokens",
            ))
        }
    }
}

impl Tenancy {
    /// The key that chooses the tenant, if any.
    fn mode(&self) -> Option<&'static str> {
        match self {
            Tenancy::Open => None,
            Tenancy::Tokens(_) => Some("tenants"),
            Tenancy::Header(_) => Some("tenant_header"),
        }
    }
}

fn token_map(tenants: BTreeMap<String, TokenHashes>) -> Result<HashMap<[u8; 32], String>, AccessConfigError> {
    let mut map: HashMap<[u8; 32], String> = HashMap::new();
    for (tenant, hashes) in tenants {
        let key = format!("tenants.{tenant}");
        if tenant.trim().is_empty() {
            return Err(AccessConfigError::BadTenant {
                key: tenant,
                why: "a tenant needs a name",
            });
        }
        let hashes = match hashes {
            TokenHashes::One(h) => vec![h],
            TokenHashes::Many(hs) => hs,
        };
        if hashes.is_empty() {
            return Err(AccessConfigError::BadTenant {
                key: tenant,
                why: "no token hash",
            });
        }
        for text in hashes {
            let hash = parse_hash(&key, &text)?;
            if let Some(first) = map.insert(hash, tenant.clone()) {
                return Err(AccessConfigError::DuplicateToken {
                    first,
                    second: tenant,
                    hash: text.to_ascii_lowercase(),
                });
            }
        }
    }
    Ok(map)
}

fn parse_hash(key: &str, text: &str) -> Result<[u8; 32], AccessConfigError> {
    let bad = || AccessConfigError::BadHash {
        key: key.to_string(),
        value: text.to_string(),
    };
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(bad());
    }
    let mut hash = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
        hash[i] = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
    }
    Ok(hash)
}

fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// `allowed_origins` as written, each checked: `null`, or an `http`/`https` origin with an explicit port or `:*`
/// (rmcp reads a missing port as "any port" today and as the scheme's default later: neither is written here).
fn checked_origins(origins: Vec<String>) -> Result<Vec<String>, AccessConfigError> {
    for (index, value) in origins.iter().enumerate() {
        let bad = |why| AccessConfigError::BadOrigin {
            index,
            value: value.clone(),
            why,
        };
        if value == "null" {
            continue;
        }
        // rmcp compares an origin's parts as text; a browser sends them in lower case, canonical, no path.
        if *value != value.to_ascii_lowercase() {
            return Err(bad("is not in lower case, as a browser sends an origin"));
        }
        let rest = value
            .strip_prefix("http://")
            .or_else(|| value.strip_prefix("https://"))
            .ok_or_else(|| bad("is not an origin: write http://HOST:PORT or https://HOST:PORT (or null)"))?;
        let port = match rest.strip_prefix('[') {
            Some(v6) => {
                let (address, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("has an IPv6 host without its closing bracket"))?;
                match address.parse::<std::net::Ipv6Addr>() {
                    Err(_) => return Err(bad("has a bracketed host that is not an IPv6 address")),
                    Ok(ip) if ip.to_string() != address => {
                        return Err(bad(
                            "has an IPv6 host not written as a browser writes it (shortest form, as ::1)",
                        ));
                    }
                    Ok(_) => {}
                }
                match after {
                    "" => None,
                    _ => Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| bad("has text after its host that is not :PORT"))?,
                    ),
                }
            }
            None => {
                let (host, port) = match rest.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (rest, None),
                };
                if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b)) {
                    return Err(bad("has no host, or a host with characters an origin never holds"));
                }
                let numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
                if numeric && host.parse::<std::net::Ipv4Addr>().map(|ip| ip.to_string()).as_deref() != Ok(host) {
                    return Err(bad(
                        "has a numeric host that is not an IPv4 address as a browser writes it (as 127.0.0.1)",
                    ));
                }
                port
            }
        };
        match port {
            Some("*") => {}
            Some(port) if port.parse::<u16>().is_ok_and(|p| p > 0) => {}
            Some(port) if port.contains('/') => return Err(bad("has a path: an origin ends at its port")),
            Some(_) => return Err(bad("has a port that is neither a number from 1 to 65535 nor *")),
            None => return Err(bad("names no port: write :PORT, or :* for any port")),
        }
    }
    Ok(origins)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    const ACME: &str = "307c609f87da43c3d563428a4f7efdf9857f4871fd10465732c4ab11a985a08c"; // sha256("acme-secret")

    fn section(text: &str) -> HttpSection {
        toml::from_str(text).unwrap()
    }

    fn with_bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        headers
    }

    #[test]
    fn browser_origins_default_to_this_machines_pages_and_a_list_is_checked() {
        let open = HttpAccess::from_section(section(""), None).unwrap();
        assert_eq!(open.allowed_origins, DEFAULT_ALLOWED_ORIGINS.map(String::from).to_vec());
        let listed =
            r#"allowed_origins = ["https://app.example.com:443", "http://localhost:*", "http://[::1]:8080", "null"]"#;
        let access = HttpAccess::from_section(section(listed), None).unwrap();
        assert_eq!(access.allowed_origins.len(), 4);
        assert!(
            HttpAccess::from_section(section("allowed_origins = []"), None)
                .unwrap()
                .allowed_origins
                .is_empty()
        );
        for (value, why) in [
            ("app.example.com:443", "is not an origin"),
            ("ftp://example.com:21", "is not an origin"),
            ("https://example.com", "names no port"),
            ("https://example.com:0", "has a port that is neither"),
            ("https://example.com:https", "has a port that is neither"),
            ("https://example.com:443/path", "has a path"),
            ("https://example.com:443/", "has a path"),
            ("HTTPS://example.com:443", "is not in lower case"),
            ("https://App.example.com:443", "is not in lower case"),
            ("http://[0:0:0:0:0:0:0:1]:*", "not written as a browser writes it"),
            ("http://127.1:80", "not an IPv4 address as a browser writes it"),
            ("http://2130706433:*", "not an IPv4 address as a browser writes it"),
            ("https://:443", "has no host"),
            ("https://exa mple.com:443", "has no host, or a host with characters"),
            ("http://[::1:8080", "without its closing bracket"),
            ("http://[example]:80", "not an IPv6 address"),
            ("http://[::1]8080", "has text after its host"),
        ] {
            let text = format!("allowed_origins = [\"http://localhost:*\", {value:?}]");
            let err = HttpAccess::from_section(section(&text), None).unwrap_err();
            assert!(
                matches!(&err, AccessConfigError::BadOrigin { index: 1, value: v, why: w } if v == value && w.contains(why)),
                "{value}: {err}"
            );
            assert!(err.to_string().starts_with("[http] allowed_origins[1]: "), "{err}");
        }
    }

    #[test]
    fn a_token_names_its_tenant_by_its_hash() {
        assert_eq!(hex(&sha256("acme-secret")), ACME);
        let access = HttpAccess::from_section(section(&format!("tenants = {{ acme = \"{ACME}\" }}")), None).unwrap();
        assert_eq!(
            access.tenant_of(&with_bearer("acme-secret")),
            Ok(Some("acme".to_string()))
        );
        assert!(matches!(
            access.tenant_of(&with_bearer("nope")),
            Err(Refusal::Unauthorized(_))
        ));
        assert!(matches!(
            access.tenant_of(&HeaderMap::new()),
            Err(Refusal::Unauthorized(_))
        ));
        assert!(matches!(
            access.may_read_metrics(&with_bearer("acme-secret")),
            Err(Refusal::Forbidden(_))
        ));
    }

    #[test]
    fn config_mistakes_name_their_key() {
        let bad = HttpAccess::from_section(section("tenants = { acme = \"abc\" }"), None).unwrap_err();
        assert_eq!(
            bad,
            AccessConfigError::BadHash {
                key: "tenants.acme".into(),
                value: "abc".into()
            }
        );
        let twice = format!(
            "tenants = {{ acme = \"{ACME}\", beta = [\"{}\"] }}",
            ACME.to_uppercase()
        );
        assert!(matches!(
            HttpAccess::from_section(section(&twice), None),
            Err(AccessConfigError::DuplicateToken { first, second, .. }) if first == "acme" && second == "beta"
        ));
        let both = format!("tenant_header = \"x-tenant\"\ntenants = {{ acme = \"{ACME}\" }}");
        assert_eq!(
            HttpAccess::from_section(section(&both), None).unwrap_err(),
            AccessConfigError::BothModes
        );
        assert!(matches!(
            HttpAccess::from_section(section("tenant_header = \"x-tenant\""), Some("meta:tenant")),
            Err(AccessConfigError::ScopeTwice {
                mode: "tenant_header",
                ..
            })
        ));
        assert!(matches!(
            HttpAccess::from_section(section("tenant_header = \"x tenant\""), None),
            Err(AccessConfigError::BadHeader { .. })
        ));
        assert_eq!(
            HttpAccess::from_section(section("body_timeout = \"0s\""), None).unwrap_err(),
            AccessConfigError::Zero { key: "body_timeout" }
        );
        let timed =
            HttpAccess::from_section(section("header_timeout = \"2s\"\nmax_unauthenticated = 8"), None).unwrap();
        assert_eq!(
            (timed.header_timeout, timed.body_timeout, timed.max_unauthenticated),
            (Duration::from_secs(2), DEFAULT_BODY_TIMEOUT, 8)
        );
        assert!(matches!(
            HttpAccess::from_section(section("metrics_tokens = [\"zz\"]"), None),
            Err(AccessConfigError::BadHash { key, .. }) if key == "metrics_tokens"
        ));
    }

    #[test]
    fn a_proxy_header_names_the_tenant_only_when_configured() {
        let access = HttpAccess::from_section(section("tenant_header = \"X-Tenant\""), None).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", HeaderValue::from_static("acme"));
        assert_eq!(access.tenant_of(&headers), Ok(Some("acme".to_string())));
        assert!(access.tenant_of(&HeaderMap::new()).is_err());
        let mut twice = headers.clone();
        twice.append("x-tenant", HeaderValue::from_static("globex"));
        assert!(
            matches!(access.tenant_of(&twice), Err(Refusal::BadRequest(why)) if why.contains("x-tenant came 2 times"))
        );
        let mut joined = HeaderMap::new();
        joined.insert("x-tenant", HeaderValue::from_static("globex, acme"));
        assert!(matches!(access.tenant_of(&joined), Err(Refusal::BadRequest(why)) if why.contains("holds a list")));
        let open = HttpAccess::default();
        assert_eq!(open.tenant_of(&headers), Ok(None));
        assert_eq!(open.may_read_metrics(&HeaderMap::new()), Ok(()));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
