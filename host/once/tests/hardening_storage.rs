//! Storage that fails closed: SQLite on real files that turn read-only,
//! fill up, stay locked by another process or are deleted under us.
//!
//! In every case `begin` answers `blocked(storage)` and nothing is
//! dispatched; a `finish` that cannot be stored is `unrecorded` and leaves
//! the record in flight (to be retried by its holder, or to expire into
//! unknown and be reconciled); a success is never reported unless stored.
//!
//! Cases that change the process (a file-size limit, a private tmpfs) run
//! in a child process: this test binary re-executed with
//! `ONCE_HARDENING_CHILD` set, under `bash` (file-size limit) or `unshare`
//! (a mount namespace of its own, so the tmpfs vanishes with it).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use once::storage::sqlite::{SqliteOptions, SqliteStorage, Synchronous};
use once::types::{BlockReason, Decision, Ending, Evidence, FinishAck, Grant, Outcome, State, UnrecordedInfo};
use once::{Called, ManualClock, Once, OnceError, Sent};

const CHILD: &str = "ONCE_HARDENING_CHILD";
const DIR: &str = "ONCE_HARDENING_DIR";
const START: u64 = 1_800_000_000_000;
const RECEIPT: &str = r#"{"paid":true}"#;

fn options() -> SqliteOptions {
    SqliteOptions {
        synchronous: Synchronous::Full,
        busy_timeout: Duration::from_millis(200),
    }
}

fn open(path: &Path, clock: &ManualClock) -> Once {
    let storage = SqliteStorage::open(path, options()).unwrap();
    Once::builder(storage)
        .clock(clock.clone())
        .provider(|_: &str, _: &str, _: &str| Evidence::Confirmed(RECEIPT.to_string()))
        .wait_up_to(Duration::ZERO)
        .build()
        .unwrap()
}

/// The padding of the calls that fill the disk. The pending holder's record and
/// the call made once the disk is full are as large: a write that fails can
/// leave the WAL grown by part of what it needed, room that a smaller write
/// would then fit in (and would rightly be stored).
const FILL: usize = 4_000;

fn args(i: usize, pad: usize) -> String {
    format!(r#"{{"amount":{i},"memo":"{}"}}"#, "m".repeat(pad))
}

/// A key confirmed and a key in flight (its grant kept), while the file is healthy.
fn healthy_start(once: &Once) -> Grant {
    let confirmed = once
        .call("s", Some("done"), "pay", &args(0, 10), |_| {
            Sent::Success(RECEIPT.into())
        })
        .unwrap();
    assert!(sent_now(&confirmed), "{confirmed:?}");
    match once
        .transitions()
        .begin(&Once::call_of("s", Some("pending"), "pay", &args(1, FILL)))
        .unwrap()
    {
        Decision::Execute(grant) => grant,
        other => panic!("a fresh key executes: {other:?}"),
    }
}

fn is_storage_block(called: &Called) -> bool {
    called.blocked().is_some_and(|b| b.reason == BlockReason::Storage)
}

/// Confirmed by this call's own send (not a replay).
fn sent_now(called: &Called) -> bool {
    called.confirmed().is_some_and(|c| !c.replayed)
}

/// The effect happened and the ledger could not record it.
fn is_unrecorded(called: &Called) -> bool {
    matches!(called.ending(), Some(Ending::Unrecorded(_)))
}

/// The broken ledger's checks: a new call is blocked(storage) and dispatches
/// nothing; the pending holder's success is unrecorded and the record stays
/// in flight; what was stored before is still there.
fn assert_fails_closed(once: &Once, pending: &Grant, what: &str) {
    let dispatched = AtomicU32::new(0);
    let called = once.call("s", Some("new"), "pay", &args(2, FILL), |_| {
        dispatched.fetch_add(1, Ordering::SeqCst);
        Sent::Success(RECEIPT.into())
    });
    match &called {
        Ok(c) if is_storage_block(c) => {}
        other => panic!("{what}: begin must be blocked(storage), got {other:?}"),
    }
    assert_eq!(
        dispatched.load(Ordering::SeqCst),
        0,
        "{what}: dispatched without a durable intent"
    );
    let ack = once
        .transitions()
        .finish("s", "pending", &pending.fence, &Outcome::Success(RECEIPT.into()));
    assert_eq!(
        ack.unwrap(),
        FinishAck::Unrecorded,
        "{what}: a success that was not stored"
    );
}

// ------------------------------------------------------------ child processes

/// Run the test `name` of this binary again in a child, through `bash -c
/// "<prefix> exec …"`, with `dir` as its work directory. Returns whether it passed.
fn run_child(name: &str, prefix: &str, dir: &Path, runner: &[&str]) -> bool {
    let exe = std::env::current_exe().unwrap();
    let script = format!("{prefix} exec \"$0\" \"$@\"");
    let output = Command::new(runner[0])
        .args(&runner[1..])
        .arg("bash")
        .arg("-c")
        .arg(script)
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env(DIR, dir)
        .output()
        .expect("spawning the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprintln!(
            "child {name} failed: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        );
        return false;
    }
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test:\n{stdout}\n{stderr}"
    );
    true
}

fn child_dir() -> Option<PathBuf> {
    std::env::var_os(CHILD)?;
    Some(PathBuf::from(
        std::env::var_os(DIR).expect("the parent sets the directory"),
    ))
}

/// Fill the ledger with calls until the store refuses a write, checking at
/// every step that nothing is dispatched without a durable intent and that
/// no success is claimed unless stored; then the pending holder's finish.
/// With `filler`, delete it afterwards and check that the ledger recovers.
fn fill_until_blocked(dir: &Path, filler: Option<PathBuf>) {
    let clock = ManualClock::new(START);
    let once = open(&dir.join("once.db"), &clock);
    let pending = healthy_start(&once);
    let dispatched = AtomicU32::new(0);
    let mut blocked_at = None;
    let mut refused_unkept = false;
    for i in 0..2_000 {
        let key = format!("fill-{i}");
        let before = dispatched.load(Ordering::SeqCst);
        let called = once
            .call("s", Some(&key), "pay", &args(i, FILL), |_| {
                dispatched.fetch_add(1, Ordering::SeqCst);
                Sent::Success(RECEIPT.into())
            })
            .unwrap();
        let sent = dispatched.load(Ordering::SeqCst) - before;
        let stored = once.inspect("s", &key).unwrap().map(|v| v.state);
        match called {
            c if sent_now(&c) => {
                assert_eq!((sent, stored), (1, Some(State::Confirmed)), "{key}");
            }
            // The intent was stored, the outcome could not be: in flight, never confirmed.
            c if is_unrecorded(&c) => assert_eq!((sent, stored), (1, Some(State::InFlight)), "{key}"),
            c if is_storage_block(&c) => {
                // Refused before the intent was written; or written, and the witness (a file of
                // its own beside the ledger) could not keep the grant, which then never left: its
                // attempt is recorded as not sent, or, when the ledger is full too, stays in
                // flight until its lease ends (then a read settles it, as for any lost reply).
                let detail = &c.blocked().expect("a block").detail;
                let unkept = detail.contains("witness could not keep");
                assert_eq!(sent, 0, "{key}: blocked, yet sent: {detail}");
                assert!(
                    if unkept {
                        matches!(stored, Some(State::Failed | State::InFlight))
                    } else {
                        stored.is_none()
                    },
                    "{key}: blocked, yet {stored:?} was stored: {detail}"
                );
                refused_unkept = unkept;
                blocked_at = Some(i);
                break;
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    let blocked_at = blocked_at.expect("the file never filled up");
    assert!(blocked_at > 0, "the limit left no room for a single call");
    let top_up = filler.as_ref().map(|f| fill_the_rest(&f.with_file_name("top-up")));
    assert_fails_closed(&once, &pending, "disk full");
    assert_eq!(once.inspect("s", "pending").unwrap().unwrap().state, State::InFlight);
    assert_eq!(once.inspect("s", "done").unwrap().unwrap().state, State::Confirmed);

    if let Some(filler) = filler {
        std::fs::remove_file(filler).unwrap();
        std::fs::remove_file(top_up.expect("topped up with the filler")).unwrap();
        // The holder retries its finish: the outcome is kept.
        let ack = once
            .transitions()
            .finish("s", "pending", &pending.fence, &Outcome::Success(RECEIPT.into()));
        assert_eq!(ack.unwrap(), FinishAck::Recorded(State::Confirmed));
        // The refused key left nothing behind (or, refused by the witness, nothing sent: a
        // new key stands in for it): it now runs once, normally.
        let key = match refused_unkept {
            false => format!("fill-{blocked_at}"),
            true => "after-the-witness-refused".to_string(),
        };
        let sent = AtomicU32::new(0);
        let called = once
            .call("s", Some(&key), "pay", &args(blocked_at, 10), |_| {
                sent.fetch_add(1, Ordering::SeqCst);
                Sent::Success(RECEIPT.into())
            })
            .unwrap();
        assert!(sent_now(&called), "{called:?}");
        assert_eq!(sent.load(Ordering::SeqCst), 1);
    }
}

/// Take what space the blocked write left (less than that call needed, maybe
/// enough for a smaller one), so that every write now meets a full disk.
fn fill_the_rest(path: &Path) -> PathBuf {
    let mut file = std::fs::File::create(path).unwrap();
    let page = [0u8; 4096];
    loop {
        match file.write(&page) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling the rest of the disk: {e}"),
        }
    }
    path.to_path_buf()
}

/// Disk full as a file-size limit (RLIMIT_FSIZE, `ulimit -f`) on the child:
/// the WAL cannot grow past it. SIGXFSZ is ignored so writes fail with EFBIG.
#[test]
fn a_file_size_limit_fails_closed() {
    if let Some(dir) = child_dir() {
        return fill_until_blocked(&dir, None);
    }
    let dir = tempfile::tempdir().unwrap();
    // 256 KiB (bash counts 1024-byte blocks): room for the schema and some calls.
    assert!(run_child(
        "a_file_size_limit_fails_closed",
        "trap '' XFSZ; ulimit -f 256;",
        dir.path(),
        &["env"]
    ));
}

/// Disk full for real (ENOSPC): a 512 KiB tmpfs in a mount namespace of the
/// child's own. Needs root and `unshare`; elsewhere the size limit above
/// stands in for it.
#[test]
fn a_full_filesystem_fails_closed_and_recovers_when_space_returns() {
    if let Some(dir) = child_dir() {
        let filler = dir.join("filler");
        std::fs::write(&filler, vec![0u8; 128 << 10]).unwrap();
        return fill_until_blocked(&dir, Some(filler));
    }
    let namespaces = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !namespaces {
        eprintln!(
            "skipped: no mount namespace here (needs root and unshare); the file-size limit test covers disk full"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mount = format!("mount -t tmpfs -o size=512k once-full '{}' &&", dir.path().display());
    assert!(run_child(
        "a_full_filesystem_fails_closed_and_recovers_when_space_returns",
        &mount,
        dir.path(),
        &["unshare", "--mount", "--propagation", "private"],
    ));
}

// ------------------------------------------------------------ a held lock

/// Another process holds the write lock (`BEGIN IMMEDIATE`) past our busy
/// timeout: begin is blocked(storage), the holder's success is unrecorded;
/// once the lock is gone, the in-flight record expires into unknown and
/// reconciliation confirms it.
#[test]
fn a_write_lock_held_by_another_process_fails_closed() {
    if let Some(dir) = child_dir() {
        // The lock holder: take the write lock, say so, hold it until stdin closes.
        let conn = rusqlite::Connection::open(dir.join("once.db")).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        println!("locked");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().lines().count();
        conn.execute_batch("ROLLBACK").unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let once = open(&dir.path().join("once.db"), &clock);
    let pending = healthy_start(&once);

    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_write_lock_held_by_another_process_fails_closed",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env(DIR, dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.trim() == "locked")),
        "the holder never took the lock"
    );
    assert_fails_closed(&once, &pending, "lock held elsewhere");
    // Reads are not blocked by a writer (WAL): the record is in flight.
    assert_eq!(once.inspect("s", "pending").unwrap().unwrap().state, State::InFlight);

    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // The lease ends; a settling round expires it into unknown and reads it: confirmed, nothing sent.
    let policy = once.policy("pay");
    clock.advance(policy.lease_ms + 1);
    let settled = once
        .settle(100, |d| panic!("a found effect is sent again: {}", d.key))
        .unwrap();
    assert_eq!((settled.sweep.reads.len(), settled.read.len()), (1, 1));
    let view = once.inspect("s", "pending").unwrap().unwrap();
    assert_eq!(view.state, State::Confirmed, "{:?}", view.audit);
    assert_eq!(view.receipt.as_deref(), Some(RECEIPT));
    // And the key that was refused runs now.
    let called = once
        .call("s", Some("new"), "pay", &args(2, 10), |_| Sent::Success(RECEIPT.into()))
        .unwrap();
    assert!(sent_now(&called), "{called:?}");
}

/// The lock is taken by another process while our dispatch is out: `call`
/// reports the effect as unrecorded (never as a plain success, never an
/// error that would make the application mint a new intent).
#[test]
fn a_lock_taken_during_dispatch_makes_the_success_unrecorded() {
    if let Some(dir) = child_dir() {
        let conn = rusqlite::Connection::open(dir.join("once.db")).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        println!("locked");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().lines().count();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let once = open(&dir.path().join("once.db"), &clock);
    let mut holder = None;
    let called = once
        .call("s", Some("k"), "pay", &args(1, 10), |_| {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "a_lock_taken_during_dispatch_makes_the_success_unrecorded",
                    "--nocapture",
                ])
                .env(CHILD, "1")
                .env(DIR, dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            assert!(lines.any(|l| l.is_ok_and(|l| l.trim() == "locked")));
            // Keep reading its output, or it dies of a broken pipe when it reports.
            holder = Some((child, lines));
            Sent::Success(RECEIPT.into())
        })
        .unwrap();
    assert_eq!(
        called.ending(),
        Some(&Ending::Unrecorded(UnrecordedInfo {
            response: RECEIPT.into()
        })),
        "{called:?}"
    );
    assert_eq!(once.inspect("s", "k").unwrap().unwrap().state, State::InFlight);
    let (mut holder, lines) = holder.unwrap();
    drop(holder.stdin.take());
    assert!(lines.map_while(Result::ok).any(|l| l.contains("1 passed")));
    assert!(holder.wait().unwrap().success());
}

// ------------------------------------------------------------ read-only, deleted

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Make files read-only: immutable (`chattr +i`) when root, as root ignores
/// permission bits, and that also stops writes through descriptors already
/// open; mode 0444 otherwise. Undone on drop. `None` (after a note) when
/// root cannot set the flag here (a filesystem without it, e.g. tmpfs).
struct ReadOnly(Vec<PathBuf>, bool);

impl ReadOnly {
    fn new(paths: &[PathBuf]) -> Option<ReadOnly> {
        let mut guard = ReadOnly(Vec::new(), root());
        for path in paths {
            if guard.1 {
                let ok = Command::new("chattr")
                    .arg("+i")
                    .arg(path)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    eprintln!("skipped: chattr +i {} is not supported here", path.display());
                    return None;
                }
            } else {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444)).unwrap();
            }
            guard.0.push(path.clone());
        }
        Some(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        for path in &self.0 {
            if self.1 {
                let _ = Command::new("chattr").arg("-i").arg(path).status();
            } else {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644));
            }
        }
    }
}

/// A ledger file that is read-only is refused when opened (never a handle
/// that could read but not record an intent).
#[test]
fn a_read_only_ledger_file_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let clock = ManualClock::new(START);
    drop(healthy_start(&open(&path, &clock)));
    let Some(_guard) = ReadOnly::new(std::slice::from_ref(&path)) else {
        return;
    };
    match SqliteStorage::open(&path, options()) {
        Err(e) => assert!(e.0.contains("read"), "{e}"),
        Ok(_) => panic!("a read-only ledger file was opened for writing"),
    }
    assert!(matches!(
        Once::sqlite(&path),
        Err(OnceError::Engine(once::types::Error::Storage(_)))
    ));
}

/// The ledger's files turn read-only while we hold them open (immutable:
/// only root can do that to open descriptors): fails closed, and recovers
/// when they are writable again, the holder's retried finish keeping its outcome.
#[test]
fn a_ledger_turned_read_only_under_us_fails_closed_and_recovers() {
    if !root() {
        eprintln!("skipped: only root can make open files read-only (chattr +i)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Some filesystems (tmpfs) still accept writes through descriptors opened before the flag.
    let probe = dir.path().join("probe");
    let mut open_file = std::fs::File::create(&probe).unwrap();
    let Some(probe_guard) = ReadOnly::new(std::slice::from_ref(&probe)) else {
        return;
    };
    if open_file.write_all(b"x").and_then(|()| open_file.sync_all()).is_ok() {
        eprintln!("skipped: this filesystem lets open descriptors write to immutable files");
        return;
    }
    drop(probe_guard);
    let path = dir.path().join("once.db");
    let clock = ManualClock::new(START);
    let once = open(&path, &clock);
    let pending = healthy_start(&once);
    let files: Vec<PathBuf> = ["once.db", "once.db-wal"].iter().map(|f| dir.path().join(f)).collect();
    let Some(guard) = ReadOnly::new(&files) else {
        return;
    };
    assert_fails_closed(&once, &pending, "read-only under us");
    assert_eq!(once.inspect("s", "pending").unwrap().unwrap().state, State::InFlight);
    drop(guard);
    let ack = once
        .transitions()
        .finish("s", "pending", &pending.fence, &Outcome::Success(RECEIPT.into()));
    assert_eq!(ack.unwrap(), FinishAck::Recorded(State::Confirmed));
    let called = once
        .call("s", Some("new"), "pay", &args(2, 10), |_| Sent::Success(RECEIPT.into()))
        .unwrap();
    assert!(sent_now(&called), "{called:?}");
}

/// The ledger file is deleted while we hold it open: writes must not go on
/// into an unlinked file that no later reader of the path will see, and no
/// empty ledger may be created in its place.
#[test]
fn a_ledger_file_deleted_under_us_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let clock = ManualClock::new(START);
    let once = open(&path, &clock);
    let pending = healthy_start(&once);
    for name in ["once.db", "once.db-wal", "once.db-shm"] {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    assert_fails_closed(&once, &pending, "deleted under us");
    assert!(
        !path.exists(),
        "an empty ledger was created in place of the deleted one"
    );
}

/// The ledger file is replaced under us (say, a backup restored over it):
/// writes must not go on into the old file.
#[test]
fn a_ledger_file_replaced_under_us_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let clock = ManualClock::new(START);
    let once = open(&path, &clock);
    let pending = healthy_start(&once);
    let other = dir.path().join("other.db");
    drop(SqliteStorage::open(&other, options()).unwrap());
    std::fs::rename(&other, &path).unwrap();
    assert_fails_closed(&once, &pending, "replaced under us");
}
