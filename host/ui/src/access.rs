//! Who is asking: operator tokens (kept as SHA-256 hashes), the scopes each
//! may see, and the CSRF token of each operator's forms.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use sha2::{Digest, Sha256};

/// The cookie a browser keeps the operator's token in after `/login`.
pub const COOKIE_NAME: &str = "once_token";

/// One operator: a name for the audit trail, a token hash, and the scopes they may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// Who, as resolutions record it.
    pub name: String,
    /// SHA-256 of the token, so the token itself is never stored.
    pub token_sha256: [u8; 32],
    /// The scopes this operator may see and resolve; none: every scope.
    pub scopes: Option<Vec<String>>,
}

impl Operator {
    /// Whether this operator may see `scope`'s records.
    pub fn sees(&self, scope: &str) -> bool {
        self.scopes.as_ref().is_none_or(|s| s.iter().any(|x| x == scope))
    }
}

/// The operators of one `once ui`, and the secret its CSRF tokens derive from.
#[derive(Debug, Clone)]
pub struct Access {
    operators: Vec<Operator>,
    csrf_secret: [u8; 32],
}

impl Access {
    /// These operators; the CSRF secret is fresh random bytes, so forms of an
    /// earlier process are refused after a restart.
    pub fn new(operators: Vec<Operator>) -> std::io::Result<Access> {
        Ok(Access {
            operators,
            csrf_secret: random_bytes()?,
        })
    }

    /// The operator whose token `token` is, if any.
    pub fn by_token(&self, token: &str) -> Option<&Operator> {
        let hash = token_sha256(token);
        self.operators.iter().find(|o| same(&o.token_sha256, &hash))
    }

    /// The operator a request authenticates as: a bearer token, else the login cookie.
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<&Operator> {
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let token = bearer.or_else(|| cookie(headers, COOKIE_NAME))?;
        self.by_token(token.trim())
    }

    /// The CSRF token an operator's forms carry: bound to the operator and to this process.
    pub fn csrf_token(&self, operator: &Operator) -> String {
        let mut h = Sha256::new();
        h.update(b"once-ui csrf\0");
        h.update(self.csrf_secret);
        h.update(operator.token_sha256);
        hex(&h.finalize())
    }

    /// Whether `presented` is `operator`'s CSRF token.
    pub fn csrf_ok(&self, operator: &Operator, presented: &str) -> bool {
        same(self.csrf_token(operator).as_bytes(), presented.as_bytes())
    }
}

/// SHA-256 of a token, as an operators file stores it (`token_sha256`, hex).
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A new random token for an operator (32 random bytes, hex).
pub fn random_token() -> std::io::Result<String> {
    Ok(hex(&random_bytes()?))
}

fn random_bytes() -> std::io::Result<[u8; 32]> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no randomness: {e}")))?;
    Ok(bytes)
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Constant-time equality, so a wrong token's first differing byte is not timed.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
