//! Who is asking: operator tokens (kept as SHA-256 hashes), the scopes each
//! may see, the browser sessions `/login` opens, and the CSRF token of each
//! operator's forms.
//!
//! A browser never holds the token: signing in opens a session (a random id,
//! kept in this process's memory until it expires) and the cookie holds the
//! id. A cookie that leaks (a proxy log, a backup of the browser's profile)
//! opens the page until the session expires or the process restarts, and
//! never yields the long-lived token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use sha2::{Digest, Sha256};

/// The cookie a browser keeps its session id in after `/login` (never the token).
pub const COOKIE_NAME: &str = "once_session";
/// How long a session lasts from sign-in unless `once ui --session-lifetime-secs` says otherwise: a working day.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);
/// The most sessions kept at once; past it, the one nearest its expiry is dropped (only an operator's token
/// opens a session, so this bounds memory, not an attacker).
const MAX_SESSIONS: usize = 1024;

/// One signed-in browser: whose token opened it, and until when.
#[derive(Debug, Clone)]
struct Session {
    token_sha256: [u8; 32],
    expires: Instant,
}

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

/// The operators of one `once ui`, their sessions, and the secret its CSRF tokens derive from.
#[derive(Debug, Clone)]
pub struct Access {
    operators: Vec<Operator>,
    csrf_secret: [u8; 32],
    /// By SHA-256 of the session id, so the lookup is on a hash, not on the secret itself.
    sessions: Arc<Mutex<HashMap<[u8; 32], Session>>>,
    session_lifetime: Duration,
}

impl Access {
    /// These operators; the CSRF secret is fresh random bytes, so forms of an
    /// earlier process are refused after a restart.
    pub fn new(operators: Vec<Operator>) -> std::io::Result<Access> {
        Ok(Access {
            operators,
            csrf_secret: random_bytes()?,
            sessions: Arc::default(),
            session_lifetime: DEFAULT_SESSION_LIFETIME,
        })
    }

    /// Sessions last `lifetime` from sign-in.
    pub fn session_lifetime(mut self, lifetime: Duration) -> Access {
        self.session_lifetime = lifetime;
        self
    }

    /// How long a session lasts from sign-in.
    pub fn lifetime(&self) -> Duration {
        self.session_lifetime
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        // Every change to the map is one insert or remove: a panic elsewhere leaves it whole.
        self.sessions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new session for `operator`: its id (32 random bytes, hex), for the cookie.
    pub fn open_session(&self, operator: &Operator) -> std::io::Result<String> {
        let id = hex(&random_bytes()?);
        let now = Instant::now();
        let mut sessions = self.sessions();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(soonest) = sessions.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k)
        {
            sessions.remove(&soonest);
        }
        sessions.insert(
            token_sha256(&id),
            Session {
                token_sha256: operator.token_sha256,
                expires: now + self.session_lifetime,
            },
        );
        Ok(id)
    }

    /// The operator whose unexpired session `id` is, if any.
    fn by_session(&self, id: &str) -> Option<&Operator> {
        let key = token_sha256(id);
        let mut sessions = self.sessions();
        let session = sessions.get(&key)?.clone();
        if session.expires <= Instant::now() {
            sessions.remove(&key);
            return None;
        }
        self.operators
            .iter()
            .find(|o| same(&o.token_sha256, &session.token_sha256))
    }

    /// The operator whose token `token` is, if any.
    pub fn by_token(&self, token: &str) -> Option<&Operator> {
        let hash = token_sha256(token);
        self.operators.iter().find(|o| same(&o.token_sha256, &hash))
    }

    /// The operator a request authenticates as: a bearer token, else the session cookie.
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<&Operator> {
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match bearer {
            Some(token) => self.by_token(token.trim()),
            None => self.by_session(cookie(headers, COOKIE_NAME)?.trim()),
        }
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
