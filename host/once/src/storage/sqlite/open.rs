//! Opening the file: the writer and reader connections (busy timeout,
//! `synchronous`, WAL, `query_only`), and the schema, created or migrated in
//! one write transaction.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::{Level, SCHEMA_VERSION, SqliteOptions, Writer, err};
use crate::storage::ddl;
use crate::storage::{BODY_FORMAT_KEY, Flush, StorageError, next_body_format};

/// The busy timeout and the `synchronous` level every commit starts from.
fn configure(conn: &Connection, path: &Path, options: &SqliteOptions) -> Result<Level, StorageError> {
    let at = path.display();
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| err(format_args!("{at}: set busy_timeout"), e))?;
    let level = options.synchronous.level(Flush::Now);
    conn.pragma_update(None, "synchronous", level.pragma())
        .map_err(|e| err(format_args!("{at}: set synchronous"), e))?;
    Ok(level)
}

pub(super) fn open_writer(path: &Path, options: &SqliteOptions) -> Result<Writer, StorageError> {
    let at = path.display();
    if path.is_dir() {
        return Err(StorageError(format!("sqlite: {at}: is a directory")));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| err(format_args!("open {at}"), e))?;
    let level = configure(&conn, path, options)?;
    // SQLite silently falls back to read-only for a write-protected file.
    if conn
        .is_readonly(rusqlite::MAIN_DB)
        .map_err(|e| err(format_args!("{at}"), e))?
    {
        return Err(StorageError(format!("sqlite: {at}: the database file is read-only")));
    }
    enable_wal(&conn, path, options.busy_timeout)?;
    init_schema(&conn).map_err(|e| StorageError(format!("{} ({at})", e.0)))?;
    Ok(Writer { conn, level })
}

/// Switch the file to WAL (a no-op when it already is). Changing the journal
/// mode does not wait on SQLite's busy handler, so a file being created by
/// several connections at once is retried here until `timeout`.
pub(super) fn enable_wal(conn: &Connection, path: &Path, timeout: Duration) -> Result<(), StorageError> {
    let at = path.display();
    let deadline = Instant::now() + timeout;
    loop {
        let mode = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0))
            .and_then(|mode| {
                if mode.eq_ignore_ascii_case("wal") {
                    Ok(mode)
                } else {
                    conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
                }
            });
        match mode {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(StorageError(format!(
                    "sqlite: {at}: WAL journal mode unavailable (got {mode:?})"
                )));
            }
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(err(format_args!("{at}: set journal_mode=WAL"), e)),
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

pub(super) fn open_reader(path: &Path, options: &SqliteOptions) -> Result<Connection, StorageError> {
    let at = path.display();
    // Read-write (not read-only) so the reader may use the WAL index; never
    // created here: the writer made the file.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| err(format_args!("open {at}"), e))?;
    configure(&conn, path, options)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| err(format_args!("{at}: set query_only"), e))?;
    Ok(conn)
}

fn parse_version(found: &str) -> Result<u32, StorageError> {
    found
        .parse()
        .map_err(|_| StorageError(format!("sqlite: unreadable schema version {found:?}")))
}

/// Check the schema version, then create or upgrade the tables from the
/// files of `schema/sqlite` (schema/README.md), in one write transaction (so
/// processes opening a new file at once do not race).
fn init_schema(conn: &Connection) -> Result<(), StorageError> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| err("begin schema transaction", e))?;
    let result = (|| {
        if let Some(bootstrap) = ddl::SQLITE.bootstrap {
            conn.execute_batch(bootstrap).map_err(|e| err("create schema", e))?;
        }
        let has_meta: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| err("read schema", e))?;
        let found: Option<String> = if has_meta {
            conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
                .optional()
                .map_err(|e| err("read schema version", e))?
        } else {
            None
        };
        let version = found.as_deref().map_or(Ok(0), parse_version)?;
        if version > SCHEMA_VERSION {
            return Err(StorageError(format!(
                "sqlite: schema version {version} is newer than this build understands \
                 ({SCHEMA_VERSION}); upgrade once"
            )));
        }
        // schema/sqlite: a new file's whole layout, or the steps above its version.
        for step in ddl::SQLITE.plan(version) {
            conn.execute_batch(step.sql).map_err(|e| {
                if step.fresh {
                    err("create schema", e)
                } else {
                    err(format_args!("migrate schema to version {}", step.version), e)
                }
            })?;
        }
        if found.as_deref() != Some(SCHEMA_VERSION.to_string().as_str()) {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [SCHEMA_VERSION.to_string()],
            )
            .map_err(|e| err("write schema version", e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(|e| err("commit schema", e)),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The ledger's recorded body format, settled with an engine that writes
/// `format` ([`next_body_format`]): read, and written if it must change, in
/// one `BEGIN IMMEDIATE` transaction, so two processes opening the file at
/// once cannot both read the old value. A file already at `format` is only
/// read (no write lock taken).
pub(super) fn claim_body_format(conn: &Connection, path: &Path, format: u32) -> Result<(), StorageError> {
    let ledger = path.display().to_string();
    let read = || {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [BODY_FORMAT_KEY], |r| {
            r.get::<_, String>(0)
        })
        .optional()
        .map_err(|e| err(format_args!("{ledger}: read body format"), e))
    };
    if next_body_format(&ledger, read()?.as_deref(), format)?.is_none() {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| err(format_args!("{ledger}: begin body format transaction"), e))?;
    let result = (|| {
        // Read again under the write lock: another process may have raised it meanwhile.
        let stored = read()?;
        if let Some(next) = next_body_format(&ledger, stored.as_deref(), format)? {
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (BODY_FORMAT_KEY, next.to_string()),
            )
            .map_err(|e| err(format_args!("{ledger}: write body format"), e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn
            .execute_batch("COMMIT")
            .map_err(|e| err(format_args!("{ledger}: commit body format"), e)),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
