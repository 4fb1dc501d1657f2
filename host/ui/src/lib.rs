//! `once ui`: the operator's page over a once ledger, and its metrics.
//!
//! What needs a person (unknown records, owed dispatches, expired leases)
//! comes from the engine's `queue` export; a record's page from `inspect`;
//! a resolution goes through the engine's `resolve`, so its guards and its
//! audit event are the engine's, exactly as for `once ledger resolve`. This
//! crate only serves HTTP, checks who is asking, and renders. It serves
//! through `once_serve`, as the gateway does: a client that sends half a
//! request, or a body slowly, or floods the port with idle connections, is
//! cut off ([`Ui::header_timeout`], [`Ui::body_timeout`],
//! [`Ui::max_unauthenticated`]).
#![deny(missing_docs)]

mod access;
mod config;
mod html;
mod pages;
mod routes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use once::Once;

pub use crate::access::{Access, DEFAULT_SESSION_LIFETIME, Operator, random_token, token_sha256};
pub use crate::config::{ConfigError, load_operators};

/// What one `once ui` serves: a ledger, and who may see which part of it.
pub struct Ui {
    once: Arc<Once>,
    access: Access,
    limit: u32,
    secure_cookie: bool,
    header_timeout: Duration,
    body_timeout: Duration,
    max_unauthenticated: usize,
}

/// How many pending records the queue examines by default (its page's and its metrics').
pub const DEFAULT_LIMIT: u32 = once::metrics::DEFAULT_QUEUE_LIMIT;
/// How long a request's headers may take, counted from the connection opening or the previous answer (so an
/// idle connection is closed after it too), by default.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request's body may take to arrive, by default.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many connections that have carried no operator's request may be open at once, by default; a new one
/// beyond it closes the oldest of them.
pub const DEFAULT_MAX_UNAUTHENTICATED: usize = 64;
/// The largest request body the page takes: its forms carry a token, a CSRF token, a scope, a key and a note.
pub const BODY_LIMIT: usize = 64 * 1024;

impl Ui {
    /// A page over `once`'s ledger for the operators in `access`.
    pub fn new(once: Arc<Once>, access: Access) -> Ui {
        Ui {
            once,
            access,
            limit: DEFAULT_LIMIT,
            secure_cookie: false,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_unauthenticated: DEFAULT_MAX_UNAUTHENTICATED,
        }
    }

    /// A request's headers must arrive within `timeout` of the connection opening or of the previous answer
    /// (an idle connection is closed after it too); else the connection is closed ([`DEFAULT_HEADER_TIMEOUT`]).
    pub fn header_timeout(mut self, timeout: Duration) -> Ui {
        self.header_timeout = timeout;
        self
    }

    /// A request's body must arrive within `timeout`; else it is answered 408 and the connection closed
    /// ([`DEFAULT_BODY_TIMEOUT`]).
    pub fn body_timeout(mut self, timeout: Duration) -> Ui {
        self.body_timeout = timeout;
        self
    }

    /// At most `cap` connections that have not yet carried an operator's request are open at once; a new one
    /// beyond it closes the oldest of them ([`DEFAULT_MAX_UNAUTHENTICATED`]).
    pub fn max_unauthenticated(mut self, cap: usize) -> Ui {
        self.max_unauthenticated = cap.max(1);
        self
    }

    /// Browsers reach the page over HTTPS (a TLS-terminating proxy in front of it): the session cookie is
    /// `Secure`, so a browser never sends it over plain HTTP.
    pub fn secure_cookie(mut self, secure: bool) -> Ui {
        self.secure_cookie = secure;
        self
    }

    /// A browser's session lasts `lifetime` from sign-in.
    pub fn session_lifetime(mut self, lifetime: Duration) -> Ui {
        self.access = self.access.session_lifetime(lifetime);
        self
    }

    /// Examine at most `limit` pending records per queue (the page says when there were more).
    pub fn limit(mut self, limit: u32) -> Ui {
        self.limit = limit;
        self
    }

    /// The HTTP routes (for embedding in another axum server, or for tests).
    pub fn router(self) -> axum::Router {
        routes::router(Arc::new(self))
    }
}

/// Serve `ui` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, ui: Ui) {
    let limits = once_serve::Limits {
        header_timeout: ui.header_timeout,
        max_unauthenticated: ui.max_unauthenticated,
    };
    let admission = Arc::new(once_serve::Admission::default());
    let never = tokio_util::sync::CancellationToken::new();
    once_serve::serve(listener, ui.router(), limits, admission, never).await;
}

/// Whether `addr` is a loopback address: `once ui` refuses others unless told (`--public`).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
