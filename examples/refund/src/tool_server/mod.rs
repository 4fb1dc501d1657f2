//! The second study's tool server: one `POST /tool`, an append-only effects table and a responses table keyed by
//! `Idempotency-Key`, on SQLite, with the study's server-side faults (a stall before the commit, a stall after it,
//! a 502 that never resolves). `GET /effects?key=…` is the read a reconciler uses.
//!
//! A request body is `{"tool":…,"call_id":…,"args":{…}}` (a retry may add a `"transcript"`); every `POST /tool` is
//! logged with its size on arrival, before any fault acts, so attempts and characters are counted by the server.

mod client;
mod tables;

pub use client::{EffectLookup, ToolClient};
pub use tables::{ToolRequest, ToolTables};

use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::http::{self, Kind, Message};
use crate::server::{Server, Shared};
use crate::{Error, now_ms};

/// Workers: stalled requests each hold one (a retrying client stacks up to four), lookups need one more.
const WORKERS: usize = 8;
/// How long a connection may dawdle over its request before we give up on it.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted idempotency key.
const MAX_KEY_LEN: usize = 512;

/// What the server deduplicates a `POST /tool` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dedupe {
    /// The `Idempotency-Key` header: a known key is answered from the responses table.
    Key,
    /// `(tool, sha256(args))`: the same arguments are the same call, whatever the key (and a known key still
    /// answers its own call).
    Args,
}

/// What the server does to `POST /tool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolFault {
    /// Every request is carried out and answered at once.
    None,
    /// Every request stalls before its commit and is dropped: nothing is written, no reply.
    PreCommitStall,
    /// The first request commits, then its reply stalls; later requests are answered at once.
    PostCommitStall,
    /// Every request is answered `502 Bad Gateway` and nothing is written.
    Reject502,
}

impl ToolFault {
    /// Every fault, in report order.
    pub const ALL: [ToolFault; 4] = [
        ToolFault::None,
        ToolFault::PreCommitStall,
        ToolFault::PostCommitStall,
        ToolFault::Reject502,
    ];

    /// The snake_case name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ToolFault::None => "none",
            ToolFault::PreCommitStall => "pre_commit_stall",
            ToolFault::PostCommitStall => "post_commit_stall",
            ToolFault::Reject502 => "reject_502",
        }
    }

    /// Whether any request can commit an effect under this fault (the two that never clear write nothing).
    pub fn commits(self) -> bool {
        matches!(self, ToolFault::None | ToolFault::PostCommitStall)
    }
}

impl fmt::Display for ToolFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ToolFault {
    type Err = Error;

    fn from_str(s: &str) -> Result<ToolFault, Error> {
        ToolFault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| Error::UnknownFault(s.to_string()))
    }
}

/// Tunables of a [`ToolServer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolServerOptions {
    /// How long a stalled request is held (the study's late reply: 0.35 s).
    pub stall: Duration,
}

impl Default for ToolServerOptions {
    fn default() -> ToolServerOptions {
        ToolServerOptions {
            stall: Duration::from_millis(350),
        }
    }
}

/// A running tool server on 127.0.0.1; dropping it stops it and joins its threads.
pub struct ToolServer {
    server: Server,
    db_path: PathBuf,
}

/// What every worker shares.
struct State {
    db: Mutex<Connection>,
    dedupe: Dedupe,
    fault: ToolFault,
    options: ToolServerOptions,
    first_post_taken: AtomicBool,
}

impl State {
    /// One connection for every worker, so a read under the lock sees every commit made before it.
    fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ToolServer {
    /// Creates the tables at `db_path` (if new) and serves them on an ephemeral port.
    pub fn start(
        db_path: impl AsRef<Path>,
        dedupe: Dedupe,
        fault: ToolFault,
        options: ToolServerOptions,
    ) -> Result<ToolServer, Error> {
        let db_path = db_path.as_ref().to_path_buf();
        let conn = crate::ledger::open_for_service(&db_path, true)?;
        tables::init(&conn)?;
        let state = Arc::new(State {
            db: Mutex::new(conn),
            dedupe,
            fault,
            options,
            first_post_taken: AtomicBool::new(false),
        });
        let handlers = (0..WORKERS)
            .map(|_| {
                let state = state.clone();
                move |stream: TcpStream, shared: &Shared| serve(&state, stream, shared)
            })
            .collect();
        let server = Server::start(TcpListener::bind(("127.0.0.1", 0))?, "tool-server", handlers)?;
        Ok(ToolServer { server, db_path })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The tables' file, for [`ToolTables::open`].
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }
}

fn serve(state: &State, mut stream: TcpStream, shared: &Shared) {
    let _tracked = shared.track(&stream);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let reply = match http::read_message(&mut stream, Kind::Request) {
        Ok(Some(req)) => route(state, &req, shared),
        Ok(None) => return,
        Err(e) => Some(error(400, &format!("malformed request: {e}"))),
    };
    // No reply is a fault's doing: the connection closes without one.
    if let Some((status, body)) = reply {
        let _ = http::write_message(&mut stream, &http::json_response(status, body));
    }
}

type Reply = (u16, String);

fn error(status: u16, message: &str) -> Reply {
    (status, serde_json::json!({ "error": message }).to_string())
}

fn storage(e: rusqlite::Error) -> Reply {
    // 5xx: the client cannot tell whether a commit happened, and neither can we once SQLite has failed.
    error(500, &format!("storage: {e}"))
}

fn route(state: &State, req: &Message, shared: &Shared) -> Option<Reply> {
    let (path, query) = http::split_target(&req.start[1]);
    match (req.start[0].as_str(), path) {
        ("POST", "/tool") => tool_call(state, req, shared),
        ("GET", "/effects") => Some(match query.iter().find(|(k, _)| k == "key") {
            Some((_, key)) => lookup(state, key).unwrap_or_else(storage),
            None => error(400, "missing key"),
        }),
        ("GET", "/healthz") => Some((200, r#"{"ok":true}"#.to_string())),
        (_, "/tool" | "/effects" | "/healthz") => Some(error(405, "method not allowed")),
        _ => Some(error(404, "not found")),
    }
}

#[derive(Deserialize)]
struct CallBody<'a> {
    tool: String,
    call_id: String,
    #[serde(borrow)]
    args: &'a RawValue,
}

fn tool_call(state: &State, req: &Message, shared: &Shared) -> Option<Reply> {
    let text = std::str::from_utf8(&req.body).ok();
    let body: Option<CallBody<'_>> = text.and_then(|t| serde_json::from_str(t).ok());
    let key = req.header("idempotency-key").map(str::to_string);
    let logged = ToolRequest {
        call_id: body.as_ref().map(|b| b.call_id.clone()),
        idempotency_key: key.clone(),
        chars: text.map_or(req.body.len(), |t| t.chars().count()) as u64,
    };
    // Logged on arrival, before any fault: this is what "reached the server" means.
    if let Err(e) = tables::log_request(&state.db(), &logged, now_ms()) {
        return Some(storage(e));
    }
    let first = !state.first_post_taken.swap(true, Ordering::SeqCst);
    match state.fault {
        ToolFault::Reject502 => return Some(error(502, "bad gateway")),
        ToolFault::PreCommitStall => {
            sleep_unless_stopping(shared, state.options.stall);
            return None;
        }
        ToolFault::None | ToolFault::PostCommitStall => {}
    }
    let Some(body) = body else {
        return Some(error(
            400,
            "the body must be JSON {\"tool\":…,\"call_id\":…,\"args\":{…}}",
        ));
    };
    let key = match key {
        Some(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => k,
        _ => return Some(error(400, "an Idempotency-Key header of 1 to 512 bytes is required")),
    };
    let args_sha256 = hex(&Sha256::digest(body.args.get().as_bytes()));
    let effect = tables::Effect {
        tool: &body.tool,
        args_sha256: &args_sha256,
        idempotency_key: &key,
        call_id: &body.call_id,
    };
    let mut db = state.db();
    // Stamped while holding the lock, which is what makes a lookup's read position honest.
    let written = tables::write_effect(&mut db, state.dedupe, &effect, now_ms());
    drop(db);
    let reply = match written {
        Ok(tables::Written::New(response) | tables::Written::Replayed(response)) => (200, response),
        Ok(tables::Written::KeyConflict) => error(409, "Idempotency-Key was used for a different call"),
        Err(e) => storage(e),
    };
    if state.fault == ToolFault::PostCommitStall && first {
        sleep_unless_stopping(shared, state.options.stall);
    }
    Some(reply)
}

/// `GET /effects?key=…`: the stored response under the key, and the read's position.
fn lookup(state: &State, key: &str) -> rusqlite::Result<Reply> {
    let db = state.db();
    // Every commit takes this lock and stamps itself at or after the moment it holds it, so a commit this read
    // missed is stamped at or after now: every commit up to a millisecond before is visible.
    let read_position = now_ms().saturating_sub(1);
    let found = tables::find_by_key(&db, key)?;
    drop(db);
    // The stored response as stored: a receipt is the server's words, never re-serialized.
    let body = format!(
        r#"{{"found":{},"effect":{},"read_position":{read_position}}}"#,
        found.is_some(),
        found.as_deref().unwrap_or("null")
    );
    Ok((200, body))
}

/// Sleeps for `stall`, or less if the server is stopping (a drop must not wait stalls out).
fn sleep_unless_stopping(shared: &Shared, stall: Duration) {
    let until = Instant::now() + stall;
    while !shared.stopping() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
