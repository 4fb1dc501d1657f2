//! The effect ledger: one SQLite file per service instance, and the only source of truth for what was refunded.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::Error;

/// The order every fresh ledger is seeded with.
pub const ORDER_ID: i64 = 1234;
/// Its total: $500.00.
pub const ORDER_TOTAL_CENTS: i64 = 50_000;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS orders (
        order_id INTEGER PRIMARY KEY,
        total_cents INTEGER NOT NULL,
        refunded_cents INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS refunds (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        order_id INTEGER NOT NULL,
        amount_cents INTEGER NOT NULL,
        op_key TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS refunds_op_key ON refunds (op_key);
    CREATE INDEX IF NOT EXISTS refunds_order ON refunds (order_id, created_at_ms);
";

/// One row of the append-only `refunds` table: one real-world effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// Row id, assigned in commit order.
    pub id: i64,
    /// The order refunded.
    pub order_id: i64,
    /// Amount in cents.
    pub amount_cents: i64,
    /// The idempotency key the request carried (recorded in both modes, deduped only in idempotent mode).
    pub op_key: String,
    /// Commit-time stamp, ms since the Unix epoch.
    pub created_at_ms: u64,
}

/// Read access to a ledger file, for metrics: counts come from the rows, never from anyone's bookkeeping.
pub struct EffectLedger {
    conn: Connection,
}

impl EffectLedger {
    /// Opens an existing ledger; a missing file is an error, so a wrong path cannot read as "zero refunds".
    pub fn open(path: impl AsRef<Path>) -> Result<EffectLedger, Error> {
        Ok(EffectLedger {
            conn: open_existing(path.as_ref())?,
        })
    }

    /// Every refund of an order, oldest first.
    pub fn refunds(&self, order_id: i64) -> Result<Vec<Refund>, Error> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, order_id, amount_cents, op_key, created_at_ms FROM refunds WHERE order_id = ?1 ORDER BY id",
        )?;
        let rows = stmt.query_map([order_id], row_to_refund)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many refunds an order has: 1 is right, 0 is a dropped refund, 2 a double refund.
    pub fn count(&self, order_id: i64) -> Result<u64, Error> {
        let n: i64 = self
            .conn
            .query_row("SELECT COUNT(*) FROM refunds WHERE order_id = ?1", [order_id], |r| {
                r.get(0)
            })?;
        Ok(n as u64)
    }

    /// Total refunded on an order, in cents, summed from the refund rows.
    pub fn refunded_cents(&self, order_id: i64) -> Result<i64, Error> {
        let sql = "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ?1";
        Ok(self.conn.query_row(sql, [order_id], |r| r.get(0))?)
    }
}

/// Opens an existing file for a metrics reader; a missing one is an error, never an empty ledger.
pub(crate) fn open_existing(path: &Path) -> Result<Connection, Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

pub(crate) fn row_to_refund(row: &rusqlite::Row<'_>) -> rusqlite::Result<Refund> {
    Ok(Refund {
        id: row.get(0)?,
        order_id: row.get(1)?,
        amount_cents: row.get(2)?,
        op_key: row.get(3)?,
        created_at_ms: row.get::<_, i64>(4)? as u64,
    })
}

/// Opens a service connection; the first one (`create`) also creates the file and switches it to WAL.
pub(crate) fn open_for_service(path: &Path, create: bool) -> Result<Connection, Error> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    // No fsync: a commit is in the OS page cache before the reply leaves, so it survives a killed process (the
    // fault the demo injects); only a power cut could lose it, and an fsync costs milliseconds on every trial.
    // Set before the WAL switch, which would otherwise sync too.
    conn.pragma_update(None, "synchronous", "OFF")?;
    if create {
        // WAL lets metric readers and lookups run beside writers. It is persistent, so later connections inherit it.
        switch_to_wal(&conn)?;
    }
    Ok(conn)
}

/// `journal_mode = WAL`, retried while another process opening the same new file holds it: the
/// switch needs the file to itself and, unlike a statement, does not wait on the busy timeout.
fn switch_to_wal(conn: &Connection) -> Result<(), Error> {
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return Ok(other?),
        }
    }
}

/// Creates the schema and seeds order 1234 if the file is new; harmless on an existing ledger.
/// `IMMEDIATE`: two services creating one file wait for each other instead of failing to upgrade a read.
pub(crate) fn init_schema(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE; {SCHEMA} INSERT OR IGNORE INTO orders (order_id, total_cents, refunded_cents) \
         VALUES ({ORDER_ID}, {ORDER_TOTAL_CENTS}, 0); COMMIT;"
    ))?;
    Ok(())
}

/// Latest stamp already in the ledger, so a reopened ledger's clock never runs behind its own rows.
pub(crate) fn max_created_at(conn: &Connection) -> Result<u64, Error> {
    let ms: i64 = conn.query_row("SELECT COALESCE(MAX(created_at_ms), 0) FROM refunds", [], |r| r.get(0))?;
    Ok(ms as u64)
}

/// An order as of a snapshot: totals in cents.
pub(crate) struct OrderRow {
    pub total_cents: i64,
    pub refunded_cents: i64,
}

/// Reads an order; with `as_of`, `refunded` counts only refunds stamped at or before it.
pub(crate) fn read_order(conn: &Connection, order_id: i64, as_of: Option<u64>) -> rusqlite::Result<Option<OrderRow>> {
    let mut order = conn
        .prepare_cached("SELECT total_cents, refunded_cents FROM orders WHERE order_id = ?1")?
        .query_row([order_id], |r| {
            Ok(OrderRow {
                total_cents: r.get(0)?,
                refunded_cents: r.get(1)?,
            })
        })
        .optional()?;
    if let (Some(row), Some(as_of)) = (order.as_mut(), as_of) {
        row.refunded_cents = conn
            .prepare_cached(
                "SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ?1 AND created_at_ms <= ?2",
            )?
            .query_row(params![order_id, as_of as i64], |r| r.get(0))?;
    }
    Ok(order)
}

/// The first refund recorded under a key, optionally only among those stamped at or before `as_of`.
pub(crate) fn find_by_key(conn: &Connection, key: &str, as_of: Option<u64>) -> rusqlite::Result<Option<Refund>> {
    conn.prepare_cached(
        "SELECT id, order_id, amount_cents, op_key, created_at_ms FROM refunds \
         WHERE op_key = ?1 AND created_at_ms <= ?2 ORDER BY id LIMIT 1",
    )?
    .query_row(params![key, as_of.map_or(i64::MAX, |t| t as i64)], row_to_refund)
    .optional()
}

/// Appends a refund row and raises the order's refunded total; the caller holds the write transaction.
pub(crate) fn insert_refund(
    conn: &Connection,
    order_id: i64,
    amount_cents: i64,
    key: &str,
    created_at_ms: u64,
) -> rusqlite::Result<Refund> {
    conn.prepare_cached("INSERT INTO refunds (order_id, amount_cents, op_key, created_at_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![order_id, amount_cents, key, created_at_ms as i64])?;
    let id = conn.last_insert_rowid();
    conn.prepare_cached("UPDATE orders SET refunded_cents = refunded_cents + ?2 WHERE order_id = ?1")?
        .execute(params![order_id, amount_cents])?;
    Ok(Refund {
        id,
        order_id,
        amount_cents,
        op_key: key.to_string(),
        created_at_ms,
    })
}
