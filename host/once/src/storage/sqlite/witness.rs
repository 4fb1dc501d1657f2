//! The witness of an SQLite ledger (the `witness` import; docs/design.md
//! "Older history"): its own SQLite file beside the ledger, `<ledger>.witness`,
//! so copying an older ledger file back leaves it as it was. The Python and
//! Node hosts keep the same file in the same format, and may share it.
//!
//! Every grant keeps one row here, durably (`synchronous = FULL`), before it
//! leaves the engine. Concurrent keeps go to disk together: the first caller
//! to find no write under way writes every keep queued by then in one
//! transaction, one sync for all of them, while the others wait for its
//! answer (as the ledger's own group commit does).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::err;
use super::open::enable_wal;
use crate::storage::StorageError;

/// The table, as every host creates it.
const SCHEMA: &str = include_str!("../../../../../schema/witness/sqlite.sql");

/// A keep replaces what is kept unless that was granted later.
const KEEP: &str = "INSERT INTO witness (scope, key, at, body) VALUES (?1, ?2, ?3, ?4) \
    ON CONFLICT (scope, key) DO UPDATE SET at = excluded.at, body = excluded.body \
    WHERE excluded.at >= witness.at";

/// The path of the witness of the ledger at `ledger`: `<ledger>.witness`.
pub fn witness_path(ledger: &Path) -> PathBuf {
    let mut path = OsString::from(ledger.as_os_str());
    path.push(".witness");
    PathBuf::from(path)
}

/// One keep waiting to be written.
struct Keep {
    scope: String,
    key: String,
    body: String,
    at: i64,
}

/// Keeps queued for the next write, and the answers of written groups.
#[derive(Default)]
struct Group {
    /// Keeps waiting for a writer; they join group `next`.
    waiting: Vec<Keep>,
    /// The group the waiting keeps belong to.
    next: u64,
    /// Whether a caller is writing a group now.
    writing: bool,
    /// Answers of written groups, with how many of their callers have yet to take it.
    answers: BTreeMap<u64, (Result<(), String>, usize)>,
}

/// The witness file of one SQLite ledger.
pub(crate) struct SqliteWitness {
    path: PathBuf,
    busy_timeout: Duration,
    /// The connection keeps are written through; none until first used, or
    /// after an error left it in an unknown state.
    writer: Mutex<Option<Connection>>,
    /// Idle connections `seen` reads through (one per concurrent reader).
    readers: Mutex<Vec<Connection>>,
    group: Mutex<Group>,
    written: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SqliteWitness {
    /// The witness of the ledger at `ledger`, its file opened (and made) when first used.
    pub fn new(ledger: &Path, busy_timeout: Duration) -> Self {
        SqliteWitness {
            path: witness_path(ledger),
            busy_timeout,
            writer: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            group: Mutex::new(Group::default()),
            written: Condvar::new(),
        }
    }

    fn open(&self) -> Result<Connection, StorageError> {
        let at = self.path.display();
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn =
            Connection::open_with_flags(&self.path, flags).map_err(|e| err(format_args!("witness: open {at}"), e))?;
        conn.busy_timeout(self.busy_timeout)
            .map_err(|e| err(format_args!("witness: {at}: set busy_timeout"), e))?;
        // A keep is answered once it is on disk: the grant it keeps leaves right after.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| err(format_args!("witness: {at}: set synchronous"), e))?;
        enable_wal(&conn, &self.path, self.busy_timeout)?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| err(format_args!("witness: {at}: create its table"), e))?;
        Ok(conn)
    }

    /// Run `f` on the connection in `slot`, opened if need be; an error drops it.
    fn with<R>(
        &self,
        slot: &Mutex<Option<Connection>>,
        f: impl FnOnce(&Connection) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        let mut slot = lock(slot);
        let conn = match slot.take() {
            Some(conn) => conn,
            None => self.open()?,
        };
        let answer = f(&conn);
        if answer.is_ok() {
            *slot = Some(conn);
        }
        answer
    }

    /// The body kept for (scope, key).
    pub fn seen(&self, scope: &str, key: &str) -> Result<Option<String>, StorageError> {
        let idle = lock(&self.readers).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open()?,
        };
        let body = conn
            .query_row(
                "SELECT body FROM witness WHERE scope = ?1 AND key = ?2",
                params![scope, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| err(format_args!("witness: {}: read", self.path.display()), e))?;
        lock(&self.readers).push(conn);
        Ok(body)
    }

    /// Keep `body` for (scope, key) unless what is kept was granted after `at`; on disk when it answers.
    pub fn keep(&self, scope: &str, key: &str, body: &str, at: u64) -> Result<(), StorageError> {
        let mut group = lock(&self.group);
        let mine = group.next;
        group.waiting.push(Keep {
            scope: scope.to_string(),
            key: key.to_string(),
            body: body.to_string(),
            at: i64::try_from(at).unwrap_or(i64::MAX),
        });
        loop {
            if let Some((answer, left)) = group.answers.get_mut(&mine) {
                let answer = answer.clone();
                *left -= 1;
                if *left == 0 {
                    group.answers.remove(&mine);
                }
                return answer.map_err(StorageError);
            }
            if !group.writing {
                // Write every keep queued so far (this one's group), one sync for all.
                group.writing = true;
                let keeps = std::mem::take(&mut group.waiting);
                let written = group.next;
                group.next += 1;
                drop(group);
                // A panic inside must not leave `writing` set: every later keep would wait for ever.
                let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.write(&keeps)))
                    .unwrap_or_else(|_| Err(StorageError("witness: a write panicked".to_string())))
                    .map_err(|e| e.0);
                group = lock(&self.group);
                group.writing = false;
                group.answers.insert(written, (answer, keeps.len()));
                self.written.notify_all();
                continue;
            }
            group = self.written.wait(group).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn write(&self, keeps: &[Keep]) -> Result<(), StorageError> {
        let at = self.path.display();
        self.with(&self.writer, |conn| {
            let fail = |e| err(format_args!("witness: {at}: keep"), e);
            conn.execute_batch("BEGIN IMMEDIATE").map_err(fail)?;
            let applied = keeps
                .iter()
                .try_for_each(|k| conn.execute(KEEP, params![k.scope, k.key, k.at, k.body]).map(|_| ()));
            match applied.and_then(|()| conn.execute_batch("COMMIT")) {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(fail(e))
                }
            }
        })
    }

    /// Forget what is kept for (scope, key) if it was kept as of before `before`.
    pub fn forget(&self, scope: &str, key: &str, before: u64) -> Result<(), StorageError> {
        let before = i64::try_from(before).unwrap_or(i64::MAX);
        self.with(&self.writer, |conn| {
            conn.execute(
                "DELETE FROM witness WHERE scope = ?1 AND key = ?2 AND at < ?3",
                params![scope, key, before],
            )
            .map(|_| ())
            .map_err(|e| err(format_args!("witness: {}: forget", self.path.display()), e))
        })
    }
}
