//! The tool server's SQLite tables: every request that reached it, the append-only effects, and the stored
//! responses its dedupe answers with. The study's counts are read from these rows, never from a client.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};

use super::Dedupe;
use crate::Error;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        arrived_at_ms INTEGER NOT NULL,
        call_id TEXT,
        idempotency_key TEXT,
        chars INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS effects (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        call_id TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS effects_args ON effects (tool, args_sha256);
    CREATE TABLE IF NOT EXISTS responses (
        idempotency_key TEXT PRIMARY KEY,
        effect_id INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        body TEXT NOT NULL
    );
";

/// One `POST /tool` as it arrived, before any fault acted on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRequest {
    /// The body's `call_id`, when the body could be read.
    pub call_id: Option<String>,
    /// The `Idempotency-Key` header, when present.
    pub idempotency_key: Option<String>,
    /// Characters in the body.
    pub chars: u64,
}

/// Read access to a tool server's tables, for metrics.
pub struct ToolTables {
    conn: Connection,
}

impl ToolTables {
    /// Opens an existing file; a missing one is an error, so a wrong path cannot read as "no effects".
    pub fn open(path: impl AsRef<Path>) -> Result<ToolTables, Error> {
        Ok(ToolTables {
            conn: crate::ledger::open_existing(path.as_ref())?,
        })
    }

    /// How many effects the server committed.
    pub fn effects(&self) -> Result<u64, Error> {
        let n: i64 = self.conn.query_row("SELECT COUNT(*) FROM effects", [], |r| r.get(0))?;
        Ok(n as u64)
    }

    /// Every `POST /tool` that reached the server, in arrival order.
    pub fn requests(&self) -> Result<Vec<ToolRequest>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT call_id, idempotency_key, chars FROM requests ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok(ToolRequest {
                call_id: r.get(0)?,
                idempotency_key: r.get(1)?,
                chars: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// Creates the tables if the file is new; harmless on an existing one.
pub(crate) fn init(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))?;
    Ok(())
}

/// Appends a request to the log.
pub(crate) fn log_request(conn: &Connection, request: &ToolRequest, now_ms: u64) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO requests (arrived_at_ms, call_id, idempotency_key, chars) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        now_ms as i64,
        request.call_id,
        request.idempotency_key,
        request.chars as i64
    ])?;
    Ok(())
}

/// A call the server is asked to carry out.
pub(crate) struct Effect<'a> {
    pub tool: &'a str,
    pub args_sha256: &'a str,
    pub idempotency_key: &'a str,
    pub call_id: &'a str,
}

/// What a write did.
pub(crate) enum Written {
    /// A new effect; its response.
    New(String),
    /// The dedupe matched an earlier effect; its stored response, nothing new was done.
    Replayed(String),
    /// The key names a different call; nothing was done.
    KeyConflict,
}

/// Dedupe, then append the effect and its response in one transaction.
pub(crate) fn write_effect(
    conn: &mut Connection,
    dedupe: Dedupe,
    call: &Effect<'_>,
    now_ms: u64,
) -> rusqlite::Result<Written> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let by_key: Option<(String, String, String)> = tx
        .prepare_cached("SELECT tool, args_sha256, body FROM responses WHERE idempotency_key = ?1")?
        .query_row([call.idempotency_key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    if let Some((tool, sha, body)) = by_key {
        // A key names one call (under either dedupe, the same call again matches its own effect); answering a
        // different call with that response would hide the caller's bug.
        let same = tool == call.tool && sha == call.args_sha256;
        return Ok(if same {
            Written::Replayed(body)
        } else {
            Written::KeyConflict
        });
    }
    if dedupe == Dedupe::Args
        && let Some(body) = by_args(&tx, call)?
    {
        return Ok(Written::Replayed(body));
    }
    tx.prepare_cached(
        "INSERT INTO effects (tool, args_sha256, idempotency_key, call_id, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        call.tool,
        call.args_sha256,
        call.idempotency_key,
        call.call_id,
        now_ms as i64
    ])?;
    let effect_id = tx.last_insert_rowid();
    let body = serde_json::json!({
        "effect_id": effect_id,
        "tool": call.tool,
        "idempotency_key": call.idempotency_key,
        "created_at": now_ms,
    })
    .to_string();
    tx.prepare_cached(
        "INSERT INTO responses (idempotency_key, effect_id, tool, args_sha256, body) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        call.idempotency_key,
        effect_id,
        call.tool,
        call.args_sha256,
        body
    ])?;
    tx.commit()?;
    Ok(Written::New(body))
}

/// The stored response of the first effect with these arguments.
fn by_args(conn: &Connection, call: &Effect<'_>) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached(
        "SELECT r.body FROM effects e JOIN responses r ON r.effect_id = e.id \
         WHERE e.tool = ?1 AND e.args_sha256 = ?2 ORDER BY e.id LIMIT 1",
    )?
    .query_row([call.tool, call.args_sha256], |r| r.get(0))
    .optional()
}

/// The stored response of the effect recorded under a key: the read path a reconciler uses.
pub(crate) fn find_by_key(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT body FROM responses WHERE idempotency_key = ?1")?
        .query_row([key], |r| r.get(0))
        .optional()
}
