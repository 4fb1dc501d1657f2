//! A fault-injecting HTTP proxy: it damages the first `POST /refunds` through it and passes everything else.

use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::http::{self, Kind, Message};
use crate::server::{Server, Shared};
use crate::{Error, now_ms};

/// Proxy workers: a held (crash) or delayed (late reply) exchange each occupy one, the rest keep flowing.
const WORKERS: usize = 8;
/// Read/write timeout on both sides; the service is local, so this only bounds a misbehaving peer.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// What happens to the first `POST /refunds` through a [`FaultProxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// Passed through untouched.
    None,
    /// The client connection is closed without forwarding: the service never sees the request.
    PreEffectDisconnect,
    /// Forwarded and answered (the refund is committed), then the client connection closes without a reply.
    PostCommitDisconnect,
    /// Answered `502 Bad Gateway` without forwarding: no effect, but the client cannot know that.
    Reject502,
    /// Forwarded and answered, then the reply is held for `late_reply_delay` before it is sent.
    LateReply,
    /// Forwarded and answered, then the client connection is held open without a reply until `release()` or drop.
    CrashAfterDispatch,
    /// Passed through; the harness sends the duplicates concurrently.
    ConcurrentDuplicate,
    /// Like `PostCommitDisconnect`, and the next read is served from a snapshot older than the write.
    StaleRead,
}

impl Fault {
    /// Every fault, in a stable order.
    pub const ALL: [Fault; 8] = [
        Fault::None,
        Fault::PreEffectDisconnect,
        Fault::PostCommitDisconnect,
        Fault::Reject502,
        Fault::LateReply,
        Fault::CrashAfterDispatch,
        Fault::ConcurrentDuplicate,
        Fault::StaleRead,
    ];

    /// The snake_case name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::PreEffectDisconnect => "pre_effect_disconnect",
            Fault::PostCommitDisconnect => "post_commit_disconnect",
            Fault::Reject502 => "reject_502",
            Fault::LateReply => "late_reply",
            Fault::CrashAfterDispatch => "crash_after_dispatch",
            Fault::ConcurrentDuplicate => "concurrent_duplicate",
            Fault::StaleRead => "stale_read",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Fault {
    type Err = Error;

    fn from_str(s: &str) -> Result<Fault, Error> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| Error::UnknownFault(s.to_string()))
    }
}

/// Tunables of a [`FaultProxy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyOptions {
    /// How long `LateReply` holds the reply; longer than the demo client's timeout.
    pub late_reply_delay: Duration,
}

impl Default for ProxyOptions {
    fn default() -> ProxyOptions {
        ProxyOptions {
            late_reply_delay: Duration::from_millis(400),
        }
    }
}

/// Requests a proxy has seen, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// `POST /refunds`.
    pub refund_posts: u64,
    /// `GET /orders/{id}`.
    pub order_reads: u64,
    /// `GET /refunds?key=…`.
    pub lookups: u64,
    /// Anything else (health checks, junk).
    pub other: u64,
}

/// A proxy on 127.0.0.1 in front of a service; dropping it stops it, closing any held connection without a reply.
pub struct FaultProxy {
    server: Server,
    state: Arc<State>,
}

#[derive(Default)]
struct Counters {
    refund_posts: AtomicU64,
    order_reads: AtomicU64,
    lookups: AtomicU64,
    other: AtomicU64,
}

struct State {
    upstream: SocketAddr,
    fault: Fault,
    options: ProxyOptions,
    first_post_taken: AtomicBool,
    counters: Counters,
    signals: Mutex<Signals>,
    changed: Condvar,
}

#[derive(Default)]
struct Signals {
    dispatched: bool,
    released: bool,
    stopping: bool,
    /// Set by `StaleRead`: the snapshot the next read is served from.
    stale_as_of: Option<u64>,
}

impl State {
    fn signals(&self) -> MutexGuard<'_, Signals> {
        self.signals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut Signals)) {
        f(&mut self.signals());
        self.changed.notify_all();
    }

    /// Sleeps up to `timeout` or until stop; true if the whole time passed.
    fn sleep(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.signals();
        while !s.stopping {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        false
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` that injects `fault` into the first `POST /refunds`.
    pub fn start(upstream: SocketAddr, fault: Fault, options: ProxyOptions) -> Result<FaultProxy, Error> {
        let state = Arc::new(State {
            upstream,
            fault,
            options,
            first_post_taken: AtomicBool::new(false),
            counters: Counters::default(),
            signals: Mutex::default(),
            changed: Condvar::new(),
        });
        let handlers = (0..WORKERS)
            .map(|_| {
                let state = state.clone();
                move |stream: TcpStream, shared: &Shared| handle(&state, stream, shared)
            })
            .collect();
        let server = Server::start(TcpListener::bind(("127.0.0.1", 0))?, "refund-proxy", handlers)?;
        Ok(FaultProxy { server, state })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The injected fault.
    pub fn fault(&self) -> Fault {
        self.state.fault
    }

    /// Waits until the first `POST /refunds` has been forwarded and the service's whole reply read (so its effect, if
    /// any, is committed); false on timeout or stop. Never true for faults that do not forward it (pre-effect, 502).
    pub fn wait_dispatched(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.signals();
        while !s.dispatched {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || s.stopping {
                return false;
            }
            s = self
                .state
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Lets a held `CrashAfterDispatch` connection close (still without a reply).
    pub fn release(&self) {
        self.state.update(|s| s.released = true);
    }

    /// Requests seen so far, by kind.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.state.counters;
        ProxyStats {
            refund_posts: c.refund_posts.load(Ordering::SeqCst),
            order_reads: c.order_reads.load(Ordering::SeqCst),
            lookups: c.lookups.load(Ordering::SeqCst),
            other: c.other.load(Ordering::SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Wake held and delayed exchanges first, or joining their workers would wait them out.
        self.state.update(|s| s.stopping = true);
        self.server.stop();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    RefundPost,
    OrderRead,
    Lookup,
    Other,
}

fn classify(req: &Message) -> RequestKind {
    let (path, _) = http::split_target(&req.start[1]);
    match (req.start[0].as_str(), path) {
        ("POST", "/refunds") => RequestKind::RefundPost,
        ("GET", "/refunds") => RequestKind::Lookup,
        ("GET", p) if p.starts_with("/orders/") => RequestKind::OrderRead,
        _ => RequestKind::Other,
    }
}

fn bad_gateway() -> Message {
    http::json_response(502, r#"{"error":"bad gateway"}"#.to_string())
}

fn handle(state: &State, mut client: TcpStream, shared: &Shared) {
    let _tracked = shared.track(&client);
    let _ = client.set_nodelay(true);
    let _ = client.set_read_timeout(Some(IO_TIMEOUT));
    let _ = client.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(Some(mut req)) = http::read_message(&mut client, Kind::Request) else {
        return;
    };
    let kind = classify(&req);
    let c = &state.counters;
    let counter = match kind {
        RequestKind::RefundPost => &c.refund_posts,
        RequestKind::OrderRead => &c.order_reads,
        RequestKind::Lookup => &c.lookups,
        RequestKind::Other => &c.other,
    };
    counter.fetch_add(1, Ordering::SeqCst);

    let faulted = kind == RequestKind::RefundPost && !state.first_post_taken.swap(true, Ordering::SeqCst);
    if !faulted {
        let stale = match kind {
            RequestKind::OrderRead | RequestKind::Lookup => state.signals().stale_as_of.take(),
            _ => None,
        };
        if let Some(as_of) = stale {
            let sep = if req.start[1].contains('?') { '&' } else { '?' };
            req.start[1] = format!("{}{sep}as_of={as_of}", req.start[1]);
        }
        let reply = forward(state, &req, shared).unwrap_or_else(bad_gateway);
        let _ = http::write_message(&mut client, &reply);
        return;
    }

    // Only a completed upstream exchange counts as dispatched: the harness relies on the effect being committed.
    let dispatch = |req: &Message| {
        let reply = forward(state, req, shared);
        if reply.is_some() {
            state.update(|s| s.dispatched = true);
        }
        reply
    };
    match state.fault {
        Fault::None | Fault::ConcurrentDuplicate => {
            let reply = dispatch(&req).unwrap_or_else(bad_gateway);
            let _ = http::write_message(&mut client, &reply);
        }
        // Dropping `client` on return closes it: no reply, nothing forwarded.
        Fault::PreEffectDisconnect => {}
        Fault::Reject502 => {
            let _ = http::write_message(&mut client, &bad_gateway());
        }
        Fault::PostCommitDisconnect => {
            dispatch(&req);
        }
        Fault::StaleRead => {
            // Taken before forwarding, so the snapshot at T0-1 cannot contain this write.
            let t0 = now_ms();
            state.update(|s| s.stale_as_of = Some(t0.saturating_sub(1)));
            dispatch(&req);
        }
        Fault::LateReply => {
            let reply = dispatch(&req).unwrap_or_else(bad_gateway);
            if state.sleep(state.options.late_reply_delay) {
                // The client has usually hung up by now; a failed write is the expected outcome, not an error.
                let _ = http::write_message(&mut client, &reply);
            }
        }
        Fault::CrashAfterDispatch => {
            dispatch(&req);
            let mut s = state.signals();
            while !s.released && !s.stopping {
                s = state.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
}

/// Sends the request upstream on a fresh connection and reads the whole reply; `None` if the service is unreachable
/// or the exchange broke (the caller answers 502, which a client must treat as ambiguous).
fn forward(state: &State, req: &Message, shared: &Shared) -> Option<Message> {
    let mut upstream = TcpStream::connect_timeout(&state.upstream, IO_TIMEOUT).ok()?;
    let _tracked = shared.track(&upstream);
    let _ = upstream.set_nodelay(true);
    let _ = upstream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = upstream.set_write_timeout(Some(IO_TIMEOUT));
    let mut req = req.clone();
    req.headers.retain(|(name, _)| !name.eq_ignore_ascii_case("host"));
    req.headers.push(("Host".to_string(), state.upstream.to_string()));
    req.start[2] = "HTTP/1.1".to_string();
    http::write_message(&mut upstream, &req).ok()?;
    http::read_message(&mut upstream, Kind::Response).ok().flatten()
}
