//! `once ui`: the operator's page over a once ledger, and its metrics.
//!
//! What needs a person (unknown records, owed dispatches, expired leases)
//! comes from the engine's `queue` export; a record's page from `inspect`;
//! a resolution goes through the engine's `resolve`, so its guards and its
//! audit event are the engine's, exactly as for `once ledger resolve`. This
//! crate only serves HTTP, checks who is asking, and renders.

mod access;
mod config;
mod html;
pub mod metrics;
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
}

/// How many pending records the queue examines by default.
pub const DEFAULT_LIMIT: u32 = 1000;

impl Ui {
    /// A page over `once`'s ledger for the operators in `access`.
    pub fn new(once: Arc<Once>, access: Access) -> Ui {
        Ui {
            once,
            access,
            limit: DEFAULT_LIMIT,
            secure_cookie: false,
        }
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
pub async fn serve(listener: tokio::net::TcpListener, ui: Ui) -> std::io::Result<()> {
    axum::serve(listener, ui.router()).await
}

/// Whether `addr` is a loopback address: `once ui` refuses others unless told (`--public`).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}
