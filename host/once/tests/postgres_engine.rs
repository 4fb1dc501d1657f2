//! once over one shared ledger, through the real component, with real OS
//! processes: racing `begin`s on PostgreSQL (16 processes) and on one SQLite
//! file (8), holders SIGKILLed between `execute` and `finish`, the
//! database connection terminated under `begin` and under `finish`, and two
//! replicas' background rounds racing over the same owed dispatches.
//!
//! Effects are counted in tables once never touches (the "provider"), so a
//! duplicate would show up there whatever the ledger says. Child processes are
//! this test binary run again on one `#[ignore]`d test, told what to do by
//! environment variables. Without `ONCE_TEST_DATABASE_URL` the PostgreSQL
//! tests print "skipped: no database" and pass, unless `CI` is set.

mod postgres_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use once::storage::postgres::{PostgresOptions, PostgresStorage};
use once::types::{BlockReason, Decision, Ending, Evidence, FinishAck, Outcome, PolicyInput, State, UnrecordedInfo};
use once::{Called, Once, Sent};
use postgres_common::TestSchema;

const TOOL: &str = "effect";

/// What a child process is asked to do, and with what.
const ROLE: &str = "ONCE_ENGINE_TEST_ROLE";
const LEDGER: &str = "ONCE_ENGINE_TEST_LEDGER";
const EFFECTS: &str = "ONCE_ENGINE_TEST_EFFECTS";
const INDEX: &str = "ONCE_ENGINE_TEST_INDEX";
const KEYS: &str = "ONCE_ENGINE_TEST_KEYS";
const SYNC_DIR: &str = "ONCE_ENGINE_TEST_SYNC";
const KEY: &str = "ONCE_ENGINE_TEST_KEY";
const DELAYS: &str = "ONCE_ENGINE_TEST_DELAYS";

/// The tests that start many processes take turns: on two cores, running
/// them side by side only makes each slower and keeps more sessions open.
static MANY_PROCESSES: Mutex<()> = Mutex::new(());

fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    MANY_PROCESSES.lock().unwrap_or_else(|p| p.into_inner())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// This test binary, run again on one ignored test with `envs`.
fn child(test: &str, envs: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        test,
        "--test-threads=1",
        "--quiet",
        "--nocapture",
    ])
    .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn args_of(key: &str) -> String {
    format!(r#"{{"effect":"{key}"}}"#)
}

fn receipt_of(key: &str) -> String {
    format!(r#"{{"done":"{key}"}}"#)
}

/// A small pseudo-random sequence (xorshift64*), seeded from the clock and
/// printed, so a failing run can be told apart from a flaky one.
struct Rng(u64);

impl Rng {
    fn seeded(what: &str) -> Rng {
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
        let _ = writeln!(std::io::stderr(), "{what}: seed {seed}");
        Rng(seed)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

// ------------------------------------------------------------- effect sinks

/// Where a process that was told `execute` leaves its effect: a table of its own.
enum Sink {
    Postgres(Box<postgres::Client>, String),
    Sqlite(rusqlite::Connection),
}

impl Sink {
    /// `location` is `postgres|URL|SCHEMA` or `sqlite|DIR`; `index` names the table or file.
    fn open(location: &str, index: usize) -> Sink {
        let parts: Vec<&str> = location.split('|').collect();
        match parts.as_slice() {
            ["postgres", url, schema] => {
                let mut c = postgres_common::client(url);
                let table = format!("{schema}.effects_{index}");
                c.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, pid integer NOT NULL)"
                ))
                .unwrap();
                Sink::Postgres(Box::new(c), table)
            }
            ["sqlite", dir] => {
                let c = rusqlite::Connection::open(Path::new(dir).join(format!("effects-{index}.db"))).unwrap();
                c.execute_batch("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, pid INTEGER NOT NULL)")
                    .unwrap();
                Sink::Sqlite(c)
            }
            _ => panic!("bad effects location {location:?}"),
        }
    }

    /// Record one effect; a second one for the same key in this table fails loudly.
    fn record(&mut self, key: &str) {
        let pid = std::process::id() as i32;
        match self {
            Sink::Postgres(c, table) => {
                c.execute(
                    &format!("INSERT INTO {table} (key, pid) VALUES ($1, $2)"),
                    &[&key, &pid],
                )
                .unwrap();
            }
            Sink::Sqlite(c) => {
                c.execute(
                    "INSERT INTO effects (key, pid) VALUES (?1, ?2)",
                    rusqlite::params![key, pid],
                )
                .unwrap();
            }
        }
    }
}

/// Effects per key over every process's table.
fn count_effects(location: &str, processes: usize) -> BTreeMap<String, u64> {
    let parts: Vec<&str> = location.split('|').collect();
    let mut counts = BTreeMap::new();
    match parts.as_slice() {
        ["postgres", url, schema] => {
            let union = (0..processes)
                .map(|i| format!("SELECT key FROM {schema}.effects_{i}"))
                .collect::<Vec<_>>()
                .join(" UNION ALL ");
            let mut c = postgres_common::client(url);
            for row in c
                .query(&format!("SELECT key, count(*) FROM ({union}) e GROUP BY key"), &[])
                .unwrap()
            {
                counts.insert(row.get(0), row.get::<_, i64>(1) as u64);
            }
        }
        ["sqlite", dir] => {
            for i in 0..processes {
                let c = rusqlite::Connection::open(Path::new(dir).join(format!("effects-{i}.db"))).unwrap();
                let mut stmt = c.prepare("SELECT key FROM effects").unwrap();
                for key in stmt.query_map([], |r| r.get::<_, String>(0)).unwrap() {
                    *counts.entry(key.unwrap()).or_default() += 1;
                }
            }
        }
        _ => panic!("bad effects location {location:?}"),
    }
    counts
}

// ---------------------------------------------------- racing begin, N processes

/// Not a test on its own: one racing process of `*_processes_race_begin`.
#[test]
#[ignore = "run by the *_processes_race_begin tests in child processes"]
fn child_racer() {
    if std::env::var(ROLE).as_deref() != Ok("racer") {
        return;
    }
    let index: usize = env(INDEX).parse().unwrap();
    let keys: usize = env(KEYS).parse().unwrap();
    let sync = PathBuf::from(env(SYNC_DIR));
    let once = Once::open(&env(LEDGER)).unwrap().build().unwrap();
    let mut sink = Sink::open(&env(EFFECTS), index);
    // Every process walks the keys in its own order, so contention moves around.
    let mut order: Vec<usize> = (0..keys).collect();
    let mut rng = Rng((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let calls: Vec<_> = order
        .iter()
        .map(|k| {
            let key = format!("key-{k}");
            Once::call_of("race", Some(&key), TOOL, &args_of(&key))
        })
        .collect();
    let transitions = once.transitions();

    std::fs::write(sync.join(format!("ready-{index}")), b"").unwrap();
    let give_up = Instant::now() + Duration::from_secs(120);
    while !sync.join("go").exists() {
        assert!(Instant::now() < give_up, "never told to go");
        std::thread::sleep(Duration::from_millis(1));
    }

    let (mut executed, mut others) = (0, 0);
    for call in &calls {
        match transitions.begin(call).unwrap() {
            Decision::Execute(grant) => {
                sink.record(&grant.key);
                let ack = transitions
                    .finish(
                        "race",
                        &grant.key,
                        &grant.fence,
                        &Outcome::Success(receipt_of(&grant.key)),
                    )
                    .unwrap();
                assert_eq!(ack, FinishAck::Recorded(State::Confirmed));
                executed += 1;
            }
            Decision::InFlight(_) | Decision::Replay(_) => others += 1,
            other => panic!("process {index}: {} got {other:?}", call.keys[0].1),
        }
    }
    println!("racer {index}: executed {executed} others {others}");
}

/// `processes` OS processes race `begin` on every one of `keys` keys of one
/// ledger; each process that is told `execute` writes the effect into a table
/// of its own. Every key has exactly one effect and one execute.
fn processes_race_begin(ledger: &str, effects: &str, processes: usize, keys: usize) {
    let _turn = take_turn();
    // Compile (or load) the component once here, so the children find it cached,
    // and create the ledger before they race to open it.
    let once = Once::open(ledger).unwrap().build().unwrap();
    let sync = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut children: Vec<Child> = (0..processes)
        .map(|i| {
            child(
                "child_racer",
                &[
                    (ROLE, "racer".into()),
                    (LEDGER, ledger.into()),
                    (EFFECTS, effects.into()),
                    (INDEX, i.to_string()),
                    (KEYS, keys.to_string()),
                    (SYNC_DIR, sync.path().display().to_string()),
                ],
            )
            .spawn()
            .unwrap()
        })
        .collect();
    let give_up = Instant::now() + Duration::from_secs(120);
    while (0..processes).any(|i| !sync.path().join(format!("ready-{i}")).exists()) {
        assert!(Instant::now() < give_up, "the racers never got ready");
        if let Some(i) = children.iter_mut().position(|c| c.try_wait().unwrap().is_some()) {
            let out = children.remove(i).wait_with_output().unwrap();
            panic!(
                "a racer ended before the race: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = started.elapsed();
    std::fs::write(sync.path().join("go"), b"").unwrap();
    let mut executed = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "a racer failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("racer "))
            .expect("a racer's report");
        executed += line.split_whitespace().nth(3).unwrap().parse::<usize>().unwrap();
    }
    let _ = writeln!(
        std::io::stderr(),
        "{processes} processes x {keys} keys: ready after {ready:?}, done after {:?}",
        started.elapsed()
    );

    let effects = count_effects(effects, processes);
    assert_eq!(effects.len(), keys, "every key has an effect");
    let doubled: Vec<_> = effects.iter().filter(|(_, n)| **n != 1).collect();
    assert!(doubled.is_empty(), "keys with more than one effect: {doubled:?}");
    assert_eq!(executed, keys, "exactly one execute per key");
    let confirmed = once.list(Some(State::Confirmed), u32::MAX).unwrap();
    assert_eq!(confirmed.len(), keys);
    for k in [0, keys / 2, keys - 1] {
        let view = once.inspect("race", &format!("key-{k}")).unwrap().unwrap();
        assert_eq!((view.state, view.attempts), (State::Confirmed, 1));
    }
}

#[test]
fn postgres_16_processes_race_begin_on_200_keys() {
    let Some(schema) = TestSchema::new() else { return };
    let effects = format!("postgres|{}|{}", schema.url, schema.name);
    processes_race_begin(&schema.location(), &effects, 16, 200);
}

#[test]
fn sqlite_8_processes_race_begin_on_200_keys() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.db");
    let effects = format!("sqlite|{}", dir.path().display());
    processes_race_begin(ledger.to_str().unwrap(), &effects, 8, 200);
}

// ------------------------------------------- holders SIGKILLed mid-operation

/// A lease as short as the engine allows for a 50 ms dispatch timeout, so
/// expiry can be waited for in real time across processes.
const LEASE_MS: u64 = 300;
const MAX_IN_FLIGHT_MS: u64 = 50;

fn short_policy() -> PolicyInput {
    PolicyInput {
        dispatch_timeout_ms: Some(50),
        lease_ms: Some(LEASE_MS),
        max_in_flight_ms: Some(MAX_IN_FLIGHT_MS),
        reconcile_interval_ms: Some(10),
        attempt_budget: Some(4),
        resolve_deadline_ms: Some(60_000),
        ..once::policy_input()
    }
}

/// How the call ended (it is a protected one).
fn ending(called: &Called) -> &Ending {
    called
        .ending()
        .unwrap_or_else(|| panic!("not a protected call: {called:?}"))
}

/// The provider's authoritative read: the effects table, through a session
/// of its own. The read position is when the statement started, in the
/// database clock (the ledger clock of a PostgreSQL ledger): every commit
/// before it is visible to the statement's snapshot.
fn effects_lookup(url: &str, schema: &str) -> impl Fn(&str, &str, &str) -> Evidence + Send + Sync + 'static {
    let client = Mutex::new(postgres_common::client(url));
    let sql = format!(
        "SELECT floor(extract(epoch from statement_timestamp()) * 1000)::bigint,
                (SELECT key FROM {schema}.effects WHERE provider_key = $1 LIMIT 1)"
    );
    move |_tool: &str, provider_key: &str, _args: &str| {
        let mut c = client.lock().unwrap();
        match c.query_one(&sql, &[&provider_key]) {
            Ok(row) => match row.get::<_, Option<String>>(1) {
                Some(key) => Evidence::Confirmed(receipt_of(&key)),
                None => Evidence::Absent(row.get::<_, i64>(0) as u64),
            },
            Err(e) => Evidence::Unknown(e.to_string()),
        }
    }
}

fn record_effect(c: &mut postgres::Client, schema: &str, key: &str, provider_key: &str, by: &str) {
    c.execute(
        &format!("INSERT INTO {schema}.effects (key, provider_key, by) VALUES ($1, $2, $3)"),
        &[&key, &provider_key, &by],
    )
    .unwrap();
}

/// Not a test on its own: a holder process of
/// `postgres_holders_sigkilled_between_execute_and_finish`, killed mid-call.
#[test]
#[ignore = "run by postgres_holders_sigkilled_between_execute_and_finish in child processes"]
fn child_holder() {
    if std::env::var(ROLE).as_deref() != Ok("holder") {
        return;
    }
    let key = env(KEY);
    let effects = env(EFFECTS);
    let (url, schema) = effects.split_once('|').unwrap();
    let delays: Vec<u64> = env(DELAYS).split(',').map(|d| d.parse().unwrap()).collect();
    // The same provider as every host of this ledger: the records it creates can be read.
    let once = Once::open(&env(LEDGER))
        .unwrap()
        .provider(effects_lookup(url, schema))
        .policy(TOOL, short_policy())
        .build()
        .unwrap();
    let mut effects = postgres_common::client(url);
    let called = once
        .call("kill", Some(&key), TOOL, &args_of(&key), |d| {
            println!("holder: dispatching {}", d.key);
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_millis(delays[0]));
            record_effect(&mut effects, schema, d.key, d.provider_key, "holder");
            std::thread::sleep(Duration::from_millis(delays[1]));
            Sent::Success(receipt_of(d.key))
        })
        .unwrap();
    println!("holder: finished {called:?}");
}

/// Where the holder was when it was killed, as the ledger and the effects tell.
#[derive(Debug, Default)]
struct Killed {
    before_effect: AtomicUsize,
    after_effect_before_finish: AtomicUsize,
    after_finish: AtomicUsize,
}

#[test]
fn postgres_holders_sigkilled_between_execute_and_finish() {
    const HOLDERS: usize = 100;
    const AT_ONCE: usize = 6;
    let Some(schema) = TestSchema::new() else { return };
    let _turn = take_turn();
    let setup = schema.open();
    postgres_common::client(&schema.url)
        .batch_execute(&format!(
            "CREATE TABLE {}.effects (key text NOT NULL, provider_key text NOT NULL, by text NOT NULL)",
            schema.name
        ))
        .unwrap();
    drop(setup);
    let once = Once::open(&schema.location())
        .unwrap()
        .provider(effects_lookup(&schema.url, &schema.name))
        .policy(TOOL, short_policy())
        .build()
        .unwrap();
    let effects_location = format!("{}|{}", schema.url, schema.name);
    let rng = Mutex::new(Rng::seeded("holders"));
    let next = AtomicUsize::new(0);
    let killed = Killed::default();
    let started = Instant::now();

    std::thread::scope(|scope| {
        for _ in 0..AT_ONCE {
            scope.spawn(|| {
                let mut effects = postgres_common::client(&schema.url);
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= HOLDERS {
                        break;
                    }
                    let key = format!("held-{i}");
                    let (d1, d2, kill_after) = {
                        let mut rng = rng.lock().unwrap();
                        let (d1, d2) = (rng.below(20), rng.below(20));
                        (d1, d2, rng.below(d1 + d2 + 5))
                    };
                    let mut holder = child(
                        "child_holder",
                        &[
                            (ROLE, "holder".into()),
                            (LEDGER, schema.location()),
                            (EFFECTS, effects_location.clone()),
                            (KEY, key.clone()),
                            (DELAYS, format!("{d1},{d2}")),
                        ],
                    )
                    .spawn()
                    .unwrap();
                    // Wait for the holder to be granted execute and start its dispatch.
                    let (tx, rx) = mpsc::channel();
                    let stdout = holder.stdout.take().unwrap();
                    std::thread::spawn(move || {
                        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                            if line.starts_with("holder: dispatching") {
                                let _ = tx.send(());
                            }
                        }
                    });
                    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
                        let _ = holder.kill();
                        let out = holder.wait_with_output().unwrap();
                        panic!(
                            "holder {key} never dispatched: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                    }
                    let seen = once.now();
                    std::thread::sleep(Duration::from_millis(kill_after));
                    holder.kill().unwrap(); // SIGKILL
                    holder.wait().unwrap();
                    let effect_by_holder = count_for(&mut effects, &schema.name, &key) == 1;

                    // After the lease (and max_in_flight), reconcile until the record
                    // settles; an owed dispatch records the effect from here.
                    while once.now() <= seen + LEASE_MS + MAX_IN_FLIGHT_MS {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let give_up = Instant::now() + Duration::from_secs(20);
                    loop {
                        let called = once
                            .resume("kill", &key, |d| {
                                record_effect(&mut effects, &schema.name, d.key, d.provider_key, "reconciler");
                                Sent::Success(receipt_of(d.key))
                            })
                            .unwrap();
                        match ending(&called) {
                            Ending::Confirmed(c) => {
                                assert_eq!(c.receipt, receipt_of(&key));
                                break;
                            }
                            Ending::Unknown(_) | Ending::InFlight(_) => {}
                            _ => panic!("{key}: {called:?}"),
                        }
                        assert!(Instant::now() < give_up, "{key} never settled: {called:?}");
                        std::thread::sleep(Duration::from_millis(20));
                    }

                    assert_eq!(
                        count_for(&mut effects, &schema.name, &key),
                        1,
                        "{key}: one effect, never two"
                    );
                    let view = once.inspect("kill", &key).unwrap().unwrap();
                    assert_eq!(view.state, State::Confirmed, "{key}");
                    let finished = view
                        .audit
                        .iter()
                        .any(|e| e.kind.starts_with("finish") && e.attempt == Some(1));
                    if finished {
                        killed.after_finish.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    // Killed before its finish: the record became unknown after its lease.
                    let lease_until = view
                        .audit
                        .iter()
                        .find(|e| e.to_state == Some(State::InFlight))
                        .and_then(|e| serde_json::from_str::<serde_json::Value>(&e.detail).ok())
                        .and_then(|d| d["lease_until"].as_u64())
                        .unwrap_or_else(|| panic!("{key}: no lease in {:?}", view.audit));
                    let expired = view
                        .audit
                        .iter()
                        .find(|e| e.kind == "lease-expired")
                        .unwrap_or_else(|| panic!("{key}: never expired: {:?}", view.audit));
                    assert_eq!(expired.to_state, Some(State::Unknown), "{key}");
                    assert!(expired.at >= lease_until, "{key}: expired before its lease ended");
                    if effect_by_holder {
                        killed.after_effect_before_finish.fetch_add(1, Ordering::SeqCst);
                    } else {
                        killed.before_effect.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });

    let mut c = postgres_common::client(&schema.url);
    let total: i64 = c
        .query_one(&format!("SELECT count(*) FROM {}.effects", schema.name), &[])
        .unwrap()
        .get(0);
    assert_eq!(total, HOLDERS as i64, "one effect per key");
    let _ = writeln!(
        std::io::stderr(),
        "{HOLDERS} holders SIGKILLed in {:?}: {killed:?}",
        started.elapsed()
    );
    // Both windows between execute and finish were hit, not just the edges.
    assert!(killed.before_effect.load(Ordering::SeqCst) >= 10, "{killed:?}");
    assert!(
        killed.after_effect_before_finish.load(Ordering::SeqCst) >= 10,
        "{killed:?}"
    );
}

fn count_for(c: &mut postgres::Client, schema: &str, key: &str) -> i64 {
    c.query_one(
        &format!("SELECT count(*) FROM {schema}.effects WHERE key = $1"),
        &[&key],
    )
    .unwrap()
    .get(0)
}

// ------------------------------------ the connection terminated under begin/finish

/// A handle whose sessions the test can find and terminate, with the short
/// policy and the effects lookup.
fn killable(schema: &TestSchema, app: &str) -> Once {
    let storage = PostgresStorage::open_with(
        &schema.url,
        PostgresOptions {
            application_name: Some(app.to_string()),
            ..schema.options()
        },
    )
    .unwrap();
    let clock = storage.clock().unwrap();
    postgres_common::client(&schema.url)
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {}.effects (key text NOT NULL, provider_key text NOT NULL, by text NOT NULL)",
            schema.name
        ))
        .unwrap();
    Once::builder(storage)
        .clock(clock)
        .provider(effects_lookup(&schema.url, &schema.name))
        .policy(TOOL, short_policy())
        .build()
        .unwrap()
}

#[test]
fn postgres_connection_terminated_during_begin_blocks_without_dispatch() {
    let Some(schema) = TestSchema::new() else { return };
    let app = postgres_common::unique_name("once_begin");
    let once = killable(&schema, &app);
    // Another session is inserting the same record and has not committed:
    // begin's claim waits on it, and is terminated while it waits.
    let mut blocker = schema.client();
    let mut tx = blocker.transaction().unwrap();
    tx.execute(
        "INSERT INTO rows (tbl, scope, key, version, state, body) VALUES ('operation', 'term', 'k', 1, 'in-flight', '{}')",
        &[],
    )
    .unwrap();
    let dispatched = AtomicUsize::new(0);
    let called = std::thread::scope(|scope| {
        let call = scope.spawn(|| {
            once.call("term", Some("k"), TOOL, &args_of("k"), |_| {
                dispatched.fetch_add(1, Ordering::SeqCst);
                Sent::Success(receipt_of("k"))
            })
        });
        assert_eq!(
            postgres_common::terminate_when_waiting(&schema.url, &app, Duration::from_secs(10)),
            1
        );
        call.join().unwrap().unwrap()
    });
    tx.rollback().unwrap();
    match called.blocked() {
        Some(b) => assert_eq!(b.reason, BlockReason::Storage, "{b:?}"),
        None => panic!("expected blocked(storage), got {called:?}"),
    }
    assert_eq!(
        dispatched.load(Ordering::SeqCst),
        0,
        "no dispatch without a durable intent"
    );
    assert!(once.inspect("term", "k").unwrap().is_none(), "the claim did not commit");

    // The same intent again, on a healthy connection: dispatched once.
    let called = once
        .call("term", Some("k"), TOOL, &args_of("k"), |_| {
            dispatched.fetch_add(1, Ordering::SeqCst);
            Sent::Success(receipt_of("k"))
        })
        .unwrap();
    assert!(called.confirmed().is_some_and(|c| !c.replayed), "{called:?}");
    assert_eq!(dispatched.load(Ordering::SeqCst), 1);
}

#[test]
fn postgres_connection_terminated_during_finish_loses_no_outcome() {
    let Some(schema) = TestSchema::new() else { return };
    let app = postgres_common::unique_name("once_finish");
    let once = killable(&schema, &app);
    let mut effects = postgres_common::client(&schema.url);
    let mut blocker = schema.client();
    let mut tx = Some(blocker.transaction().unwrap());
    let called = std::thread::scope(|scope| {
        let killer =
            scope.spawn(|| postgres_common::terminate_when_waiting(&schema.url, &app, Duration::from_secs(10)));
        let called = once
            .call("term", Some("f"), TOOL, &args_of("f"), |d| {
                record_effect(&mut effects, &schema.name, d.key, d.provider_key, "holder");
                // Hold the record, so finish's write waits and is terminated while it waits.
                tx.as_mut()
                    .unwrap()
                    .execute(
                        "SELECT 1 FROM rows WHERE tbl = 'operation' AND scope = 'term' AND key = 'f' FOR UPDATE",
                        &[],
                    )
                    .unwrap();
                Sent::Success(receipt_of(d.key))
            })
            .unwrap();
        assert_eq!(killer.join().unwrap(), 1);
        called
    });
    tx.take().unwrap().rollback().unwrap();
    // The caller is told the effect happened (never an error that would make it mint a new intent).
    assert_eq!(
        ending(&called),
        &Ending::Unrecorded(UnrecordedInfo {
            response: receipt_of("f")
        })
    );
    assert_eq!(once.inspect("term", "f").unwrap().unwrap().state, State::InFlight);

    // The record expires into unknown after its lease and reconciliation finds the effect.
    let lease_end = once.now() + LEASE_MS;
    while once.now() <= lease_end {
        std::thread::sleep(Duration::from_millis(10));
    }
    match once.transitions().reconcile("term", "f").unwrap() {
        Decision::Replay(r) => assert_eq!(r.receipt, receipt_of("f")),
        other => panic!("expected the effect to be found, got {other:?}"),
    }
    let view = once.inspect("term", "f").unwrap().unwrap();
    assert_eq!(view.state, State::Confirmed);
    assert!(view.audit.iter().any(|e| e.kind == "lease-expired"), "{:?}", view.audit);
    assert_eq!(count_for(&mut effects, &schema.name, "f"), 1);
    let again = once
        .call("term", Some("f"), TOOL, &args_of("f"), |_| {
            panic!("must not dispatch again")
        })
        .unwrap();
    assert!(again.confirmed().is_some_and(|c| c.replayed), "{again:?}");
}

/// A TCP proxy to the test server that, once armed, forwards the next
/// batch of scope `lost` to the server and then cuts the connection without
/// relaying the answer: the commit happens, its reply is lost. A batch is one
/// autocommit statement (`apply_batch`), so the message that carries the
/// record's JSON is the one that commits.
struct CommitCutter {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CommitCutter {
    fn start(url: &str) -> CommitCutter {
        let config: postgres::Config = url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("the test server must be on TCP, not {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let server = format!("{host}:{port}");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let cutter = CommitCutter {
            port: listener.local_addr().unwrap().port(),
            armed: Arc::new(AtomicBool::new(false)),
            cuts: Arc::new(AtomicUsize::new(0)),
        };
        let (armed, cuts) = (cutter.armed.clone(), cutter.cuts.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    return;
                };
                let cut = Arc::new(AtomicBool::new(false));
                let (c2, u2, cut2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap(), cut.clone());
                // Server to client: relayed until the cut.
                std::thread::spawn(move || {
                    let (mut from, mut to) = (u2, c2);
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 || cut2.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
                let (armed, cuts) = (armed.clone(), cuts.clone());
                std::thread::spawn(move || {
                    // The record's JSON, as the batch's parameters carry it (reads send only names).
                    const COMMIT: &[u8] = br#""scope":"lost""#;
                    let (mut from, mut to) = (client, upstream);
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let chunk = &buf[..n];
                        let commit = chunk.windows(COMMIT.len()).any(|w| w == COMMIT);
                        if commit && armed.swap(false, Ordering::SeqCst) {
                            cut.store(true, Ordering::SeqCst);
                            let _ = to.write_all(chunk);
                            // Let the server commit, then drop both sides unanswered.
                            std::thread::sleep(Duration::from_millis(200));
                            cuts.fetch_add(1, Ordering::SeqCst);
                            let _ = from.shutdown(Shutdown::Both);
                            let _ = to.shutdown(Shutdown::Both);
                            break;
                        }
                        if to.write_all(chunk).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        cutter
    }

    /// The test server's URL, through this proxy.
    fn url(&self, url: &str) -> String {
        let config: postgres::Config = url.parse().unwrap();
        format!(
            "postgres://{}@127.0.0.1:{}/{}",
            config.get_user().unwrap_or("postgres"),
            self.port,
            config.get_dbname().unwrap_or("postgres")
        )
    }
}

/// The claim's batch reaches the server and commits, but its answer is
/// lost: `begin` is blocked(storage) and nothing is dispatched. The claim
/// is in the ledger with its attempt; it expires into unknown, reconciliation
/// proves the provider has nothing, and the owed dispatch happens once.
#[test]
fn postgres_commit_with_a_lost_reply_blocks_then_recovers_once() {
    let Some(schema) = TestSchema::new() else { return };
    drop(schema.open());
    let cutter = CommitCutter::start(&schema.url);
    let storage = PostgresStorage::open_with(&cutter.url(&schema.url), schema.options()).unwrap();
    let clock = storage.clock().unwrap();
    let once = Once::builder(storage)
        .clock(clock)
        .provider(effects_lookup(&schema.url, &schema.name))
        .policy(TOOL, short_policy())
        .build()
        .unwrap();
    let mut effects = postgres_common::client(&schema.url);
    effects
        .batch_execute(&format!(
            "CREATE TABLE {}.effects (key text NOT NULL, provider_key text NOT NULL, by text NOT NULL)",
            schema.name
        ))
        .unwrap();
    let dispatched = AtomicUsize::new(0);
    let mut dispatch = |d: &once::Dispatch<'_>| {
        dispatched.fetch_add(1, Ordering::SeqCst);
        record_effect(&mut effects, &schema.name, d.key, d.provider_key, "caller");
        Sent::Success(receipt_of(d.key))
    };

    cutter.armed.store(true, Ordering::SeqCst);
    let called = once
        .call("lost", Some("c"), TOOL, &args_of("c"), &mut dispatch)
        .unwrap();
    assert_eq!(cutter.cuts.load(Ordering::SeqCst), 1, "the claim's COMMIT was cut");
    match called.blocked() {
        Some(b) => {
            assert_eq!(b.reason, BlockReason::Storage, "{b:?}");
            assert!(b.detail.contains("COMMIT"), "the outcome is reported unknown: {b:?}");
        }
        None => panic!("expected blocked(storage), got {called:?}"),
    }
    assert_eq!(dispatched.load(Ordering::SeqCst), 0, "no dispatch on an unknown commit");
    // It did commit: the claim is there, in flight, carrying its attempt.
    let direct = Once::open(&schema.location()).unwrap().build().unwrap();
    let view = direct.inspect("lost", "c").unwrap().expect("the claim committed");
    assert_eq!((view.state, view.attempts), (State::InFlight, 1));

    // The same intent, after the claim's lease (and max_in_flight): reconciled, then owed, then sent once.
    let lease_end = once.now() + LEASE_MS + MAX_IN_FLIGHT_MS;
    while once.now() <= lease_end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let called = once
            .call("lost", Some("c"), TOOL, &args_of("c"), &mut dispatch)
            .unwrap();
        match ending(&called) {
            Ending::Confirmed(c) => {
                assert_eq!(c.receipt, receipt_of("c"));
                break;
            }
            Ending::Unknown(_) | Ending::InFlight(_) => {}
            _ => panic!("{called:?}"),
        }
        assert!(Instant::now() < give_up, "never settled");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dispatched.load(Ordering::SeqCst), 1);
    assert_eq!(count_for(&mut effects, &schema.name, "c"), 1);
    let view = once.inspect("lost", "c").unwrap().unwrap();
    assert_eq!((view.state, view.attempts), (State::Confirmed, 2), "{:?}", view.audit);
    assert!(view.audit.iter().any(|e| e.kind == "lease-expired"), "{:?}", view.audit);
}

// ------------------------------------------------------------- replicas

/// Two replicas (one owner, one PostgreSQL ledger, each its own engine and
/// connection) run their background rounds at the same moment over the same
/// unknown records. Each record is read, proven absent and granted through
/// the ledger's compare-and-swap, so each owed dispatch is sent by exactly
/// one of them, once. (A round grants all its owed dispatches, then sends
/// them in turn: a grant whose send-by passed meanwhile is reported not sent,
/// spends an attempt and is granted again; the count of grants shows it.)
#[test]
fn postgres_replicas_settling_at_once_send_each_owed_dispatch_once() {
    const KEYS: usize = 40;
    let Some(schema) = TestSchema::new() else { return };
    drop(schema.open());
    postgres_common::client(&schema.url)
        .batch_execute(&format!(
            "CREATE TABLE {}.effects (key text NOT NULL, provider_key text NOT NULL, by text NOT NULL)",
            schema.name
        ))
        .unwrap();
    let replica = || {
        Once::open(&schema.location())
            .unwrap()
            .provider(effects_lookup(&schema.url, &schema.name))
            .policy(TOOL, short_policy())
            .owner("gateway: replicas")
            .wait_up_to(Duration::ZERO)
            .build()
            .unwrap()
    };
    let replicas = [replica(), replica()];
    // Every key's first attempt is lost without an effect: unknown, owed once absence is proven.
    for i in 0..KEYS {
        let key = format!("owed-{i}");
        let called = replicas[i % 2]
            .call("replicas", Some(&key), TOOL, &args_of(&key), |_| {
                Sent::Ambiguous("reply lost".into())
            })
            .unwrap();
        assert!(matches!(ending(&called), Ending::Unknown(_)), "{called:?}");
    }

    let sent: Mutex<BTreeMap<String, Vec<usize>>> = Mutex::new(BTreeMap::new());
    let granted = AtomicUsize::new(0);
    let start = std::sync::Barrier::new(2);
    let give_up = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|scope| {
        for (n, once) in replicas.iter().enumerate() {
            let (sent, granted, start, url, name) = (&sent, &granted, &start, &schema.url, &schema.name);
            scope.spawn(move || {
                let mut effects = postgres_common::client(url);
                start.wait();
                while sent.lock().unwrap().len() < KEYS {
                    assert!(
                        Instant::now() < give_up,
                        "replica {n}: never all sent: {:?}",
                        sent.lock().unwrap()
                    );
                    let round = once
                        .settle(KEYS as u32, |d| {
                            sent.lock().unwrap().entry(d.key.to_string()).or_default().push(n);
                            record_effect(&mut effects, name, d.key, d.provider_key, &format!("replica-{n}"));
                            Sent::Success(receipt_of(d.key))
                        })
                        .unwrap();
                    // A grant whose turn in the round came after its send-by is reported not sent, never
                    // sent late: only what reached `send` above is counted as a dispatch.
                    granted.fetch_add(round.sent.len(), Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
    });

    let sent = sent.into_inner().unwrap();
    let mut c = postgres_common::client(&schema.url);
    for i in 0..KEYS {
        let key = format!("owed-{i}");
        assert_eq!(sent[&key].len(), 1, "{key} was sent by replicas {:?}", sent[&key]);
        assert_eq!(count_for(&mut c, &schema.name, &key), 1, "{key}: one effect");
        let view = replicas[0].inspect("replicas", &key).unwrap().unwrap();
        assert_eq!(view.state, State::Confirmed, "{key}: {:?}", view.audit);
        let successes = view.audit.iter().filter(|e| e.kind == "finish-success").count();
        assert_eq!(successes, 1, "{key}: {:?}", view.audit);
    }
    let by_first = sent.values().filter(|v| v[0] == 0).count();
    let _ = writeln!(
        std::io::stderr(),
        "{KEYS} owed dispatches: {by_first} sent by replica 0, {} by replica 1, out of {} grants",
        KEYS - by_first,
        granted.load(Ordering::SeqCst)
    );
}

// --------------------------------------------------------------------- CI

/// CI must run the PostgreSQL tests, not skip them: with `CI` set, the
/// server's URL must be too.
#[test]
fn postgres_tests_are_not_skipped_in_ci() {
    if postgres_common::in_ci() {
        assert!(postgres_common::database_url().is_some());
    }
}
