//! Guest limits: a component that loops, traps, recurses or allocates
//! without bound is stopped with a typed error, its instance is discarded,
//! and the ledger never holds half a write.
//!
//! The hostile component is `host/once/tests/hostile-guest/`, a crate of its own
//! workspace that implements world `once`; this test builds it for
//! `wasm32-wasip2` with the same cargo, into the target directory where
//! `host/once/build.rs` builds the real guest (so the bindings' dependencies are
//! already compiled there: the build takes seconds). It is never committed
//! as `.wasm`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use once::io::HostState;
use once::runtime::{Instance, Runtime};
use once::storage::Storage;
use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{
    Configuration, Decision, FinishAck, LedgerEncoding, Outcome, ProviderReads, QuotaInput, State, Table, ToolConfig,
};
use once::{GuestLimit, GuestLimits, Once, OnceError};

const TARGET: &str = "wasm32-wasip2";

/// The hostile component, built once per test process.
fn hostile_runtime() -> Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let wasm = build_hostile_guest();
            let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("reading {}: {e}", wasm.display()));
            Arc::new(Runtime::load_component(&bytes, None).expect("the hostile guest implements world once"))
        })
        .clone()
}

fn build_hostile_guest() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile-guest/Cargo.toml");
    // <target>/tmp -> <target>/once-guest, where host/once/build.rs builds the real guest.
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is inside the target directory")
        .join("once-guest");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--locked", "--release", "--target", TARGET, "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        // The same profile as host/once/build.rs, so the shared dependencies are reused.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort");
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("running cargo to build the hostile guest");
    assert!(status.success(), "building host/once/tests/hostile-guest failed");
    target_dir.join(TARGET).join("release").join("once_hostile_guest.wasm")
}

fn sqlite(path: &Path) -> SqliteStorage {
    SqliteStorage::open(path, SqliteOptions::default()).unwrap()
}

fn hostile(path: &Path, limits: GuestLimits) -> Once {
    Once::builder(sqlite(path))
        .runtime(hostile_runtime())
        .fuel_per_call(limits.fuel)
        .memory_limit(limits.memory_bytes)
        .build()
        .unwrap()
}

const SMALL: GuestLimits = GuestLimits {
    fuel: 50_000_000,
    memory_bytes: 32 << 20,
};

/// How many calls the instance that answers has served: 1 means a fresh instance.
fn served(once: &Once) -> u32 {
    once.canonicalize(b"count").unwrap().parse().unwrap()
}

#[test]
fn the_defaults_are_finite_and_the_builder_sets_them() {
    let dir = tempfile::tempdir().unwrap();
    let once = Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap();
    assert_eq!(once.guest_limits(), GuestLimits::DEFAULT);
    assert_eq!(GuestLimits::default(), GuestLimits::DEFAULT);
    const { assert!(GuestLimits::DEFAULT.fuel < u64::MAX && GuestLimits::DEFAULT.memory_bytes < 4 << 30) };
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .fuel_per_call(123 << 20)
        .memory_limit(456 << 16)
        .build()
        .unwrap();
    assert_eq!(
        once.guest_limits(),
        GuestLimits {
            fuel: 123 << 20,
            memory_bytes: 456 << 16
        }
    );
    // Configuring is an export call too: a budget too small for it fails the build, not the first call.
    match Once::builder(sqlite(&dir.path().join("once.db")))
        .fuel_per_call(123)
        .build()
    {
        Err(OnceError::Limit(GuestLimit::Fuel(123))) => {}
        Err(other) => panic!("expected the fuel limit, got {other:?}"),
        Ok(_) => panic!("123 fuel configured the engine"),
    }
}

#[test]
fn a_healthy_instance_is_pooled_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let once = hostile(&dir.path().join("once.db"), SMALL);
    assert_eq!(served(&once), 1);
    assert_eq!(served(&once), 2);
    assert_eq!(served(&once), 3);
}

#[test]
fn an_endless_loop_runs_out_of_fuel_and_its_instance_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let once = hostile(&dir.path().join("once.db"), SMALL);
    assert_eq!(served(&once), 1);
    assert_eq!(served(&once), 2);
    match once.canonicalize(b"loop") {
        Err(OnceError::Limit(GuestLimit::Fuel(fuel))) => assert_eq!(fuel, SMALL.fuel),
        other => panic!("a loop must run out of fuel, got {other:?}"),
    }
    assert_eq!(served(&once), 1, "the looping instance was reused");
    // The budget is per call, not per instance: a fresh call gets it whole again.
    for _ in 0..3 {
        assert!(matches!(
            once.canonicalize(b"loop"),
            Err(OnceError::Limit(GuestLimit::Fuel(_)))
        ));
    }
}

#[test]
fn unbounded_allocation_hits_the_memory_limit_and_its_instance_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let once = hostile(&dir.path().join("once.db"), SMALL);
    assert_eq!(served(&once), 1);
    match once.canonicalize(b"alloc") {
        Err(OnceError::Limit(GuestLimit::Memory(bytes))) => assert_eq!(bytes, SMALL.memory_bytes),
        other => panic!("unbounded allocation must hit the memory limit, got {other:?}"),
    }
    assert_eq!(served(&once), 1, "the instance that hit its memory limit was reused");
}

#[test]
fn a_trap_and_a_stack_overflow_are_component_errors_and_discard_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let once = hostile(&dir.path().join("once.db"), SMALL);
    for command in ["trap", "recurse"] {
        assert_eq!(served(&once), 1);
        assert_eq!(served(&once), 2);
        match once.canonicalize(command.as_bytes()) {
            Err(OnceError::Component(message)) => assert!(!message.is_empty()),
            other => panic!("{command}: expected a component error, got {other:?}"),
        }
        assert_eq!(served(&once), 1, "{command}: the trapped instance was reused");
        // Leave the pool with one fresh instance for the next round.
        assert!(matches!(once.canonicalize(b"trap"), Err(OnceError::Component(_))));
    }
}

/// A guest stopped after a ledger write leaves that write whole (both rows
/// and its audit event) and nothing else; one stopped before leaves nothing.
#[test]
fn a_guest_stopped_after_a_write_leaves_the_whole_batch_and_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let once = hostile(&path, SMALL);
    for misdeed in ["trap", "loop", "alloc", "recurse"] {
        for write_first in [false, true] {
            let tool = if write_first {
                format!("write-then-{misdeed}")
            } else {
                misdeed.to_string()
            };
            let key = format!("key-{tool}");
            let result = once.call("s", Some(&key), &tool, "{}", |_| {
                panic!("{tool}: the hostile guest granted a dispatch")
            });
            match (misdeed, &result) {
                ("loop", Err(OnceError::Limit(GuestLimit::Fuel(_))))
                | ("alloc", Err(OnceError::Limit(GuestLimit::Memory(_))))
                | ("trap" | "recurse", Err(OnceError::Component(_))) => {}
                _ => panic!("{tool}: unexpected {result:?}"),
            }
            // Read back through a new connection: what is on disk.
            let disk = sqlite(&path);
            let op = disk.get(Table::Operation, "s", &key).unwrap();
            let quota = disk.get(Table::Quota, "s", &key).unwrap();
            let audit = disk.audit("s", &key).unwrap();
            if write_first {
                let op = op.unwrap_or_else(|| panic!("{tool}: the committed batch lost its operation row"));
                assert_eq!((op.version, op.state), (1, Some(State::InFlight)), "{tool}");
                assert!(quota.is_some(), "{tool}: the committed batch lost its quota row");
                assert_eq!(audit.len(), 1, "{tool}: {audit:?}");
                assert_eq!(audit[0].version, 1);
                assert_eq!(audit[0].kind, "hostile-write");
            } else {
                assert!(
                    op.is_none() && quota.is_none() && audit.is_empty(),
                    "{tool}: wrote {op:?}"
                );
            }
        }
    }
    // The failures never took a healthy instance with them.
    assert_eq!(served(&once), 1);
}

/// The tool `pay` with a spend ceiling, as a user configures it.
fn configuration() -> Configuration {
    let mut pay = once::policy_input();
    pay.quota = Some(QuotaInput {
        spend_field: "/amount".to_string(),
        ceiling: "1000000.00".to_string(),
        decimals: None,
        window_ms: 86_400_000,
        bucket: None,
    });
    Configuration {
        settings: once::default_settings().unwrap(),
        defaults: once::policy_input(),
        tools: vec![ToolConfig {
            tool: "pay".to_string(),
            policy: pay,
            descriptor: None,
        }],
        ledger_encoding: LedgerEncoding::Typed,
        reads: ProviderReads::Import,
    }
}

/// What the ledger holds for one key after a probe, checked whole: the audit
/// trail is versions 1..=version, chained state to state, ending in the
/// record's state, and the quota bucket holds exactly the record's reservation.
fn whole_state(storage: &dyn Storage, once: &Once, key: &str) -> Option<State> {
    let reserved = |view: &once::types::RecordView| -> u128 {
        let body: serde_json::Value = serde_json::from_str(&view.body).unwrap();
        body["reservation"]["units"].as_str().map_or(0, |u| u.parse().unwrap())
    };
    let used: u128 = storage
        .get(Table::Quota, "s", &format!("pay@{}", START - START % 86_400_000))
        .unwrap()
        .map_or(0, |row| {
            let body: serde_json::Value = serde_json::from_str(&row.body).unwrap();
            body["used"].as_str().unwrap().parse().unwrap()
        });
    let Some(view) = once.inspect("s", key).unwrap() else {
        assert_eq!(used, 0, "{key}: a quota reservation without its record");
        return None;
    };
    let versions: Vec<u64> = view.audit.iter().map(|e| e.version).collect();
    assert_eq!(
        versions,
        (1..=view.version).collect::<Vec<_>>(),
        "{key}: {:?}",
        view.audit
    );
    for pair in view.audit.windows(2) {
        assert_eq!(
            pair[1].from_state, pair[0].to_state,
            "{key}: broken chain {:?}",
            view.audit
        );
    }
    assert_eq!(view.audit.last().and_then(|e| e.to_state), Some(view.state), "{key}");
    assert_eq!(used, reserved(&view), "{key}: the bucket and the record disagree");
    Some(view.state)
}

const START: u64 = 1_800_000_000_000;
const ARGS: &str = r#"{"amount":12.5,"to":"acct-1"}"#;

/// One probe's ledger: a fresh SQLite file, a full-budget handle to set up
/// and check with, and an instance configured on the full budget whose
/// calls from then on get `fuel`.
struct Probe {
    _dir: tempfile::TempDir,
    storage: Arc<SqliteStorage>,
    full: Once,
    limited: Instance,
}

fn probe(fuel: u64) -> Probe {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let clock = once::ManualClock::new(START);
    let configuration = configuration();
    let pay = configuration.tools[0].policy.clone();
    let full = Once::builder(sqlite(&path))
        .clock(clock.clone())
        .policy("pay", pay)
        .build()
        .unwrap();
    let state = HostState {
        storage: Arc::new(sqlite(&path)),
        clock: Arc::new(clock),
        provider: Arc::new(once::NoProvider),
        operator: Arc::new(once::LogOperator),
        entropy: Arc::new(once::SystemEntropy),
    };
    let mut limited = Runtime::shared().unwrap().instantiate(state).unwrap();
    limited.configure(&configuration, 1).unwrap().unwrap();
    limited.set_fuel_per_call(fuel);
    Probe {
        _dir: dir,
        storage: Arc::new(sqlite(&path)),
        full,
        limited,
    }
}

/// The least fuel in `lo..=hi` for which `works` holds (it must be monotone).
fn least(mut lo: u64, mut hi: u64, mut works: impl FnMut(u64) -> bool) -> u64 {
    assert!(works(hi), "{hi} fuel is not enough");
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if works(mid) { hi = mid } else { lo = mid + 1 }
    }
    hi
}

/// The real guest's `begin`, stopped for lack of fuel at every point: each
/// probe leaves no record or a whole one (record, audit event and quota
/// reservation from one batch). The least fuel that writes the intent
/// leaves it whole; one unit less leaves nothing.
#[test]
fn the_real_guest_stopped_anywhere_in_begin_leaves_no_record_or_a_whole_one() {
    let outcome = |fuel: u64| -> (Option<State>, bool) {
        let mut p = probe(fuel);
        let result = p.limited.begin(&Once::call_of("s", Some("k"), "pay", ARGS));
        let state = whole_state(p.storage.as_ref(), &p.full, "k");
        match result {
            Ok(Ok(Decision::Execute(_))) => {
                assert_eq!(state, Some(State::InFlight), "fuel {fuel}: execute without an intent");
                (state, true)
            }
            Err(OnceError::Limit(GuestLimit::Fuel(f))) => {
                assert_eq!(f, fuel);
                assert!(matches!(state, None | Some(State::InFlight)), "fuel {fuel}: {state:?}");
                (state, false)
            }
            other => panic!("fuel {fuel}: {other:?}"),
        }
    };
    let answers = least(0, 100_000_000, |fuel| outcome(fuel).1);
    let writes = least(0, answers, |fuel| outcome(fuel).0.is_some());
    assert!(writes < answers, "the intent is written before begin answers");
    assert_eq!(outcome(writes - 1).0, None, "one unit less writes nothing");
    assert_eq!(
        outcome(writes),
        (Some(State::InFlight), false),
        "stopped after the write: whole, no answer"
    );
    assert!(outcome(answers).1);
}

/// The real guest's `finish` of a success, stopped for lack of fuel at
/// every point: the record stays a whole in-flight record (to expire into
/// unknown and be reconciled) or becomes a whole confirmed one, and the
/// caller is told success only when it is stored.
#[test]
fn the_real_guest_stopped_anywhere_in_finish_never_reports_an_unstored_success() {
    let outcome = |fuel: u64| -> (Option<State>, bool) {
        let mut p = probe(fuel);
        let call = Once::call_of("s", Some("k"), "pay", ARGS);
        let Decision::Execute(grant) = p.full.transitions().begin(&call).unwrap() else {
            panic!("a fresh key executes")
        };
        let success = Outcome::Success(r#"{"paid":true}"#.to_string());
        let result = p.limited.finish("s", "k", &grant.fence, &success);
        let state = whole_state(p.storage.as_ref(), &p.full, "k");
        match result {
            Ok(Ok(FinishAck::Recorded(State::Confirmed))) => {
                assert_eq!(
                    state,
                    Some(State::Confirmed),
                    "fuel {fuel}: success reported, not stored"
                );
                (state, true)
            }
            Err(OnceError::Limit(GuestLimit::Fuel(_))) => {
                assert!(
                    matches!(state, Some(State::InFlight | State::Confirmed)),
                    "fuel {fuel}: {state:?}"
                );
                (state, false)
            }
            other => panic!("fuel {fuel}: {other:?}"),
        }
    };
    let answers = least(0, 100_000_000, |fuel| outcome(fuel).1);
    let writes = least(0, answers, |fuel| outcome(fuel).0 == Some(State::Confirmed));
    assert!(writes < answers);
    assert_eq!(
        outcome(writes - 1).0,
        Some(State::InFlight),
        "one unit less leaves it in flight"
    );
    assert_eq!(outcome(writes), (Some(State::Confirmed), false));
}

/// A memory limit below what a large input needs stops the call before any
/// write; the default limits take the largest input the settings allow.
#[test]
fn the_memory_limit_stops_a_large_call_before_any_write_and_the_default_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    // Half a million numbers: the heaviest 1 MiB of args measured.
    let mut big = String::from(r#"{"amount":1,"x":["#);
    while big.len() < (1 << 20) - 16 {
        big.push_str("0,");
    }
    big.push_str("0]}");
    assert!(big.len() <= 1 << 20);
    let small = Once::builder(sqlite(&path)).memory_limit(8 << 20).build().unwrap();
    let request = Once::call_of("s", Some("big"), "pay", &big);
    match small.transitions().begin(&request) {
        Err(OnceError::Limit(GuestLimit::Memory(bytes))) => assert_eq!(bytes, 8 << 20),
        other => panic!("expected the memory limit, got {other:?}"),
    }
    assert!(small.inspect("s", "big").unwrap().is_none(), "a write happened");
    let roomy = Once::builder(sqlite(&path)).build().unwrap();
    assert!(matches!(roomy.transitions().begin(&request), Ok(Decision::Execute(_))));
    assert_eq!(roomy.inspect("s", "big").unwrap().unwrap().state, State::InFlight);
    // The small handle's pool is usable again after the failure.
    assert!(small.inspect("s", "big").unwrap().is_some());
}
