//! The refund service: a JSON API over the effect ledger, in an unsafe (never dedupes) or idempotent mode.

use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::http::{self, Kind, Message};
use crate::ledger::{self, Refund};
use crate::money::{self, AmountError};
use crate::server::{Server, Shared};
use crate::{Error, now_ms};

/// Workers per service: enough that one held or slow request never blocks the rest.
const WORKERS: usize = 4;
/// How long a connection may dawdle over its request before we give up on it.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted idempotency key.
const MAX_KEY_LEN: usize = 512;

/// How the service treats a repeated idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Records the key but never dedupes, like the study's server: every call is a new refund.
    Unsafe,
    /// A known key returns its original refund; check and insert share one write transaction.
    Idempotent,
}

impl Mode {
    /// Every mode, in a stable order.
    pub const ALL: [Mode; 2] = [Mode::Unsafe, Mode::Idempotent];

    /// The snake_case name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Unsafe => "unsafe",
            Mode::Idempotent => "idempotent",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Mode, Error> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| Error::UnknownMode(s.to_string()))
    }
}

/// A running refund service on 127.0.0.1; dropping it stops it and joins its threads.
pub struct Service {
    server: Server,
    mode: Mode,
    db_path: PathBuf,
}

impl Service {
    /// Opens (or creates and seeds) the ledger at `db_path` and serves it on an ephemeral port.
    pub fn start(db_path: impl AsRef<Path>, mode: Mode) -> Result<Service, Error> {
        Service::bind(db_path, mode, SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Like [`Service::start`] on a chosen address (for the `refund-service` binary).
    pub fn bind(db_path: impl AsRef<Path>, mode: Mode, addr: SocketAddr) -> Result<Service, Error> {
        let db_path = db_path.as_ref().to_path_buf();
        let first = ledger::open_for_service(&db_path, true)?;
        ledger::init_schema(&first)?;
        let ticks = Ticks {
            last_stamp: ledger::max_created_at(&first)?,
            last_read: 0,
        };
        let clock = Arc::new(Clock {
            ticks: Mutex::new(ticks),
        });
        let mut conns = vec![first];
        for _ in 1..WORKERS {
            conns.push(ledger::open_for_service(&db_path, false)?);
        }
        let handlers = conns
            .into_iter()
            .map(|mut conn| {
                let clock = clock.clone();
                move |stream: TcpStream, shared: &Shared| serve(&mut conn, mode, &clock, stream, shared)
            })
            .collect();
        let server = Server::start(TcpListener::bind(addr)?, "refund-svc", handlers)?;
        Ok(Service { server, mode, db_path })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The dedupe mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The ledger file, for [`crate::EffectLedger::open`].
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }
}

/// Orders commits and reads in time, so that "stamped at or before a read position" means "visible to that read".
///
/// Held from a write's stamp to its commit, and from a read's position to the end of its transaction; a stamp is
/// always later than every position already handed out. Being in-process, it also keeps the workers off SQLite's
/// busy handler, which sleeps in milliseconds.
struct Clock {
    ticks: Mutex<Ticks>,
}

struct Ticks {
    last_stamp: u64,
    last_read: u64,
}

impl Clock {
    fn lock(&self) -> MutexGuard<'_, Ticks> {
        self.ticks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ticks {
    /// The wall clock, never ahead of it (or a reconciler could date a read after a dispatch it missed), and at or
    /// after every stamp, so a fresh read sees exactly the rows stamped at or before its position.
    fn read_position(&mut self) -> u64 {
        let mut now = now_ms();
        // A stamp may lead the clock by a millisecond (see `stamp`): wait that out. A longer lead means the clock
        // stepped back, which waiting would not fix soon; then the position is merely "at least this fresh".
        if self.last_stamp > now && self.last_stamp - now <= 2 {
            while now < self.last_stamp {
                thread::sleep(Duration::from_micros(100));
                now = now_ms();
            }
        }
        self.last_read = now.max(self.last_read);
        self.last_read
    }

    /// A commit stamp: after every read position handed out, so no earlier read can have missed a row stamped at or
    /// before its position (it may run a millisecond ahead of the wall clock for that).
    fn stamp(&mut self) -> u64 {
        self.last_stamp = now_ms().max(self.last_stamp).max(self.last_read + 1);
        self.last_stamp
    }
}

fn serve(conn: &mut Connection, mode: Mode, clock: &Clock, mut stream: TcpStream, shared: &Shared) {
    let _tracked = shared.track(&stream);
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let (status, body) = match http::read_message(&mut stream, Kind::Request) {
        Ok(Some(req)) => route(conn, mode, clock, &req),
        Ok(None) => return,
        Err(e) => error(400, &format!("malformed request: {e}")),
    };
    let _ = http::write_message(&mut stream, &http::json_response(status, body));
}

type Reply = (u16, String);

fn error(status: u16, message: &str) -> Reply {
    #[derive(Serialize)]
    struct Body<'a> {
        error: &'a str,
    }
    (status, json(&Body { error: message }))
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("plain structs serialize")
}

fn storage(e: rusqlite::Error) -> Reply {
    // 5xx: the client cannot tell whether a commit happened, and neither can we once SQLite has failed.
    error(500, &format!("storage: {e}"))
}

fn route(conn: &mut Connection, mode: Mode, clock: &Clock, req: &Message) -> Reply {
    let (path, query) = http::split_target(&req.start[1]);
    let param = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let as_of = match param("as_of").map(str::parse::<u64>) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(_)) => return error(400, "as_of must be milliseconds since the Unix epoch"),
    };
    let method = req.start[0].as_str();
    match (method, path) {
        ("GET", "/healthz") => (200, r#"{"ok":true}"#.to_string()),
        ("GET", "/refunds") => match param("key") {
            Some(key) => lookup(conn, clock, key, as_of).unwrap_or_else(storage),
            None => error(400, "missing key"),
        },
        ("POST", "/refunds") => refund(conn, mode, clock, &req.body),
        ("GET", p) if p.starts_with("/orders/") => match p["/orders/".len()..].parse::<i64>() {
            Ok(id) => order(conn, clock, id, as_of).unwrap_or_else(storage),
            Err(_) => error(404, "no such order"),
        },
        (_, "/healthz" | "/refunds") => error(405, "method not allowed"),
        (_, p) if p.starts_with("/orders/") => error(405, "method not allowed"),
        _ => error(404, "not found"),
    }
}

/// The read's position: now, or the older snapshot asked for (never a future one, which could not be honest).
fn read_position(ticks: &mut Ticks, as_of: Option<u64>) -> u64 {
    let now = ticks.read_position();
    as_of.map_or(now, |t| t.min(now))
}

fn order(conn: &mut Connection, clock: &Clock, order_id: i64, as_of: Option<u64>) -> rusqlite::Result<Reply> {
    #[derive(Serialize)]
    struct Body {
        order_id: i64,
        total: f64,
        refunded: f64,
        read_position: u64,
    }
    let mut ticks = clock.lock();
    let position = read_position(&mut ticks, as_of);
    let tx = conn.transaction()?;
    let row = ledger::read_order(&tx, order_id, as_of.map(|_| position))?;
    tx.finish()?;
    drop(ticks);
    Ok(match row {
        Some(o) => {
            let body = Body {
                order_id,
                total: money::dollars(o.total_cents),
                refunded: money::dollars(o.refunded_cents),
                read_position: position,
            };
            (200, json(&body))
        }
        None => error(404, "no such order"),
    })
}

#[derive(Serialize)]
struct Receipt<'a> {
    refund_id: i64,
    order_id: i64,
    amount: f64,
    idempotency_key: &'a str,
    created_at: u64,
}

impl<'a> From<&'a Refund> for Receipt<'a> {
    fn from(r: &'a Refund) -> Receipt<'a> {
        Receipt {
            refund_id: r.id,
            order_id: r.order_id,
            amount: money::dollars(r.amount_cents),
            idempotency_key: &r.op_key,
            created_at: r.created_at_ms,
        }
    }
}

fn lookup(conn: &mut Connection, clock: &Clock, key: &str, as_of: Option<u64>) -> rusqlite::Result<Reply> {
    #[derive(Serialize)]
    struct Body<'a> {
        found: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        refund: Option<Receipt<'a>>,
        read_position: u64,
    }
    let mut ticks = clock.lock();
    let position = read_position(&mut ticks, as_of);
    let tx = conn.transaction()?;
    let found = ledger::find_by_key(&tx, key, as_of.map(|_| position))?;
    tx.finish()?;
    drop(ticks);
    let body = Body {
        found: found.is_some(),
        refund: found.as_ref().map(Receipt::from),
        read_position: position,
    };
    Ok((200, json(&body)))
}

#[derive(Deserialize)]
struct RefundRequest<'a> {
    order_id: i64,
    #[serde(borrow)]
    amount: &'a RawValue,
    idempotency_key: String,
}

fn refund(conn: &mut Connection, mode: Mode, clock: &Clock, body: &[u8]) -> Reply {
    let Ok(text) = std::str::from_utf8(body) else {
        return error(400, "body is not UTF-8");
    };
    let req: RefundRequest<'_> = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => return error(400, &format!("malformed body: {e}")),
    };
    if req.idempotency_key.is_empty() || req.idempotency_key.len() > MAX_KEY_LEN {
        return error(400, "idempotency_key must be 1 to 512 bytes");
    }
    let amount_text = match serde_json::from_str::<String>(req.amount.get()) {
        Ok(s) => s,
        Err(_) => req.amount.get().to_string(),
    };
    let amount_cents = match money::parse_cents(&amount_text) {
        Ok(c) => c,
        // Too large for any order: let the over-total check refuse it with the right status.
        Err(AmountError::TooLarge) => i64::MAX,
        Err(AmountError::Malformed) => {
            return error(400, "amount must be a number of dollars with at most 2 decimals");
        }
    };
    write_refund(conn, mode, clock, req.order_id, amount_cents, &req.idempotency_key).unwrap_or_else(storage)
}

fn write_refund(
    conn: &mut Connection,
    mode: Mode,
    clock: &Clock,
    order_id: i64,
    amount_cents: i64,
    key: &str,
) -> rusqlite::Result<Reply> {
    let mut ticks = clock.lock();
    // IMMEDIATE takes SQLite's write lock first, so two requests with one key cannot both miss the check and insert
    // even if another process writes this file.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if mode == Mode::Idempotent
        && let Some(existing) = ledger::find_by_key(&tx, key, None)?
    {
        if existing.order_id != order_id || existing.amount_cents != amount_cents {
            // A key names one operation; silently answering a different one would hide the caller's bug.
            return Ok(error(409, "idempotency_key was used for a different refund"));
        }
        return Ok((200, json(&Receipt::from(&existing))));
    }
    let Some(order) = ledger::read_order(&tx, order_id, None)? else {
        return Ok(error(404, "no such order"));
    };
    if amount_cents <= 0 {
        return Ok(error(422, "amount must be positive"));
    }
    if amount_cents > order.total_cents - order.refunded_cents {
        return Ok(error(422, "amount would exceed the order total"));
    }
    let refund = ledger::insert_refund(&tx, order_id, amount_cents, key, ticks.stamp())?;
    tx.commit()?;
    drop(ticks);
    Ok((200, json(&Receipt::from(&refund))))
}
