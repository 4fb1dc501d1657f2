//! An accept loop of its own: hyper's HTTP/1.1 server per connection
//! with a header read timeout (a connection that sends half a request, or
//! sits idle between requests, is closed), and a cap on the connections
//! that have not yet carried an authenticated request. A new connection
//! beyond the cap closes the oldest of those, so a flood of idle or
//! half-open sockets cannot take the file descriptors a tenant's call needs:
//! the flood churns through the cap, a tenant's connection leaves it the
//! moment its first request passes the front door.
//!
//! axum's own `serve` sets neither (it gives hyper no timer), which is why
//! neither the gateway nor the operator's page uses it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

/// The connections that have not yet carried an authenticated request, oldest first.
#[derive(Debug, Default)]
pub struct Admission {
    waiting: Mutex<Waiting>,
    /// Connections closed to make room under the cap (for /metrics).
    evicted: AtomicU64,
}

#[derive(Debug, Default)]
struct Waiting {
    next: u64,
    /// By connection number (accept order): the token that closes each.
    open: BTreeMap<u64, CancellationToken>,
}

/// A request's connection, in its extensions, so the front door can say it authenticated.
#[derive(Debug, Clone)]
pub struct Connection {
    id: u64,
    admission: Arc<Admission>,
}

impl Connection {
    /// This connection carried a request the front door let in: it is no longer counted under the cap,
    /// and no flood closes it.
    pub fn authenticated(&self) {
        self.admission.lock().open.remove(&self.id);
    }

    /// This connection is closed: it no longer counts, whatever it carried.
    fn closed(&self) {
        self.admission.lock().open.remove(&self.id);
    }
}

impl Admission {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // A panic while holding this lock leaves the map whole (every change is one insert or remove).
        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Connections closed to keep the unauthenticated ones under the cap, since start.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Count a new connection as unauthenticated, first closing the oldest ones while `cap` are open.
    fn admit(self: &Arc<Self>, cap: usize) -> (Connection, CancellationToken) {
        let mut waiting = self.lock();
        while waiting.open.len() >= cap {
            if !self.close_oldest(&mut waiting) {
                break;
            }
        }
        let id = waiting.next;
        waiting.next += 1;
        let close = CancellationToken::new();
        waiting.open.insert(id, close.clone());
        let connection = Connection {
            id,
            admission: self.clone(),
        };
        (connection, close)
    }

    fn close_oldest(&self, waiting: &mut Waiting) -> bool {
        match waiting.open.pop_first() {
            Some((_, close)) => {
                close.cancel();
                self.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// How the accept loop treats connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// hyper's header read timeout: from the moment a request is awaited (the connection opening, or the
    /// previous answer) to its last header.
    pub header_timeout: Duration,
    /// The most unauthenticated connections open at once.
    pub max_unauthenticated: usize,
}

/// Accept on `listener` and serve `app` until `stopping`; then stop accepting, let every connection finish
/// the request it carries, and return when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    admission: Arc<Admission>,
    stopping: CancellationToken,
) {
    // Every connection's task holds a sender; when the last is dropped, `recv` ends.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<Infallible>(1);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (or another passing failure): closing the oldest
                    // unauthenticated connection frees one; a pause keeps the loop from spinning.
                    let freed = admission.close_oldest(&mut admission.lock());
                    tracing::warn!(target: "once::serve", "accepting a connection failed: {e}{}",
                        if freed { "; closed the oldest unauthenticated connection" } else { "" });
                    tokio::time::sleep(Duration::from_millis(if freed { 5 } else { 100 })).await;
                    continue;
                }
            },
            _ = stopping.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (connection, close) = admission.admit(limits.max_unauthenticated);
        let service = {
            let (app, connection) = (app.clone(), connection.clone());
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(connection.clone());
                let mut app = app.clone();
                async move { app.call(request.map(Body::new)).await }
            })
        };
        let (stopping, open) = (stopping.clone(), open_tx.clone());
        tokio::spawn(async move {
            let _open = open;
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(served);
            let mut shutting = false;
            loop {
                tokio::select! {
                    ended = served.as_mut() => {
                        if let Err(e) = ended {
                            tracing::debug!(target: "once::serve", "connection ended: {e}");
                        }
                        break;
                    }
                    // Dropping the connection closes its socket.
                    _ = close.cancelled() => break,
                    _ = stopping.cancelled(), if !shutting => {
                        shutting = true;
                        served.as_mut().graceful_shutdown();
                    }
                }
            }
            connection.closed();
        });
    }
    drop(listener);
    drop(open_tx);
    let _ = open_rx.recv().await;
}
