//! The Rust API end to end: a real component, real SQLite files.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use once::storage::Storage;
use once::storage::sqlite::{SqliteOptions, SqliteStorage};
use once::types::{BlockReason, Decision, Effect, Ending, Evidence, IdentityMode, Outcome, Repeat, ReplayVia, State};
use once::{Called, ManualClock, Once, Sent, policy_input};

const TOOL: &str = "refund_order";
const ARGS: &str = r#"{"order_id":1234,"amount":200}"#;

fn sqlite(path: &Path) -> SqliteStorage {
    SqliteStorage::open(path, SqliteOptions::default()).unwrap()
}

/// A confirmed call with this receipt, replayed or not, matched how.
#[track_caller]
fn assert_confirmed(called: &Called, receipt: &str, replayed: bool, via: Option<ReplayVia>) {
    match called.confirmed() {
        Some(c) if c.receipt == receipt && c.replayed == replayed && c.via == via => {}
        _ => panic!("expected confirmed({receipt}, replayed: {replayed}, via: {via:?}), got {called:?}"),
    }
    assert_eq!(called.effect(), Effect::Happened);
}

/// How a protected call ended.
#[track_caller]
fn ending(called: &Called) -> &Ending {
    called
        .ending()
        .unwrap_or_else(|| panic!("not a protected call: {called:?}"))
}

fn counting(effects: &AtomicU32, reply: Sent) -> impl FnMut(&once::Dispatch<'_>) -> Sent + '_ {
    move |_| {
        effects.fetch_add(1, Ordering::SeqCst);
        reply.clone()
    }
}

#[test]
fn a_repeat_replays_the_receipt_and_dispatches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let once = Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap();
    let effects = AtomicU32::new(0);
    let receipt = r#"{"refund_id":"r_1","amount":200}"#;
    let first = once
        .call(
            "t1",
            Some("refund-1234"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success(receipt.into())),
        )
        .unwrap();
    assert_confirmed(&first, receipt, false, None);
    let again = once
        .call(
            "t1",
            Some("refund-1234"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success("{}".into())),
        )
        .unwrap();
    // The receipt as the provider sent it.
    assert_confirmed(&again, receipt, true, Some(ReplayVia::Key));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // A changed payload under the same key is a conflict, never a retry.
    let changed = once.call(
        "t1",
        Some("refund-1234"),
        TOOL,
        r#"{"order_id":1234,"amount":300}"#,
        counting(&effects, Sent::NotSent),
    );
    let changed = changed.unwrap();
    assert!(
        matches!(ending(&changed), Ending::Conflict(s) if s.args == r#"{"amount":200,"order_id":1234}"#),
        "{changed:?}"
    );
    assert_eq!(
        (changed.effect(), changed.account().unwrap().repeat),
        (Effect::None, Repeat::Refused)
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[test]
fn the_dispatcher_gets_the_provider_key_and_canonical_args() {
    let dir = tempfile::tempdir().unwrap();
    let once = Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap();
    let seen = Mutex::new(Vec::new());
    let args = r#"{"order_id":1234,"amount":200,"idempotency_key":"model-made-this-up"}"#;
    let _ = once
        .call("t1", Some("k"), TOOL, args, |d| {
            seen.lock()
                .unwrap()
                .push((d.provider_key.to_string(), d.args.to_string(), d.attempt));
            Sent::Success("{}".into())
        })
        .unwrap();
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 1);
    let (provider_key, args, attempt) = &seen[0];
    assert_eq!(*attempt, 1);
    assert!(provider_key.starts_with("once-"));
    assert_eq!(
        *args,
        format!(r#"{{"amount":200,"idempotency_key":"{provider_key}","order_id":1234}}"#)
    );
}

#[test]
fn a_lost_reply_is_unknown_and_is_reconciled_before_anything_is_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let effect_at_provider = Arc::new(Mutex::new(None::<String>));
    let lookup_view = effect_at_provider.clone();
    let clock = ManualClock::new(1_000_000);
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .clock(clock.clone())
        // Answer what is known at once rather than sleep until the next read.
        .wait_up_to(Duration::ZERO)
        .provider(
            move |_: &str, _: &str, _: &str| match lookup_view.lock().unwrap().clone() {
                Some(receipt) => Evidence::Confirmed(receipt),
                None => Evidence::Unknown("provider unreachable".into()),
            },
        )
        .build()
        .unwrap();
    let effects = AtomicU32::new(0);
    // The provider commits, the reply is lost, and the lookup is down.
    let lost = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |_| {
            effects.fetch_add(1, Ordering::SeqCst);
            Sent::Ambiguous("connection reset after send".into())
        })
        .unwrap();
    // The protocol read the provider once at once: it could not tell.
    let Ending::Unknown(unknown) = ending(&lost) else {
        panic!("{lost:?}")
    };
    let next_read = unknown.next_read.expect("the tool has a lookup: it is read again");
    assert_eq!(
        (lost.effect(), lost.account().unwrap().repeat),
        (Effect::Unknown, Repeat::Waits)
    );
    // An agent retrying blind before the next read gets unknown again: nothing is sent.
    let retry = once
        .call(
            "t1",
            Some("refund-1"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success("{}".into())),
        )
        .unwrap();
    assert!(matches!(ending(&retry), Ending::Unknown(_)), "{retry:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // The lookup comes back and finds the effect: the retry once the read is due is a replay.
    *effect_at_provider.lock().unwrap() = Some(r#"{"refund_id":"r_9"}"#.into());
    clock.set(next_read);
    let settled = once
        .call(
            "t1",
            Some("refund-1"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success("{}".into())),
        )
        .unwrap();
    assert_confirmed(&settled, r#"{"refund_id":"r_9"}"#, true, Some(ReplayVia::Provider));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    assert_eq!(once.inspect("t1", "refund-1").unwrap().unwrap().state, State::Confirmed);
}

#[test]
fn verify_first_survives_a_lost_ledger_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    // The provider's own record of effects, keyed by the provider key.
    let provider: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    // The secret's bytes kept outside the ledger file (a secret manager): a recreated
    // ledger derives the same provider keys, so the provider's record is found.
    let kept_secret = once::FixedEntropy(b"kept outside the ledger, 32 byte".to_vec());
    let build = |provider: Arc<Mutex<Vec<(String, String)>>>| {
        let lookup = provider.clone();
        Once::builder(sqlite(&db))
            .entropy(kept_secret.clone())
            .provider(
                move |_: &str, key: &str, _: &str| match lookup.lock().unwrap().iter().find(|(k, _)| k == key) {
                    Some((_, receipt)) => Evidence::Confirmed(receipt.clone()),
                    None => Evidence::Absent(u64::MAX / 2),
                },
            )
            .policy(
                TOOL,
                once::types::PolicyInput {
                    verify_first: Some(true),
                    ..policy_input()
                },
            )
            .build()
            .unwrap()
    };
    let dispatch = |provider: Arc<Mutex<Vec<(String, String)>>>| {
        move |d: &once::Dispatch<'_>| {
            provider
                .lock()
                .unwrap()
                .push((d.provider_key.to_string(), r#"{"refund_id":"r_1"}"#.to_string()));
            Sent::Success(r#"{"refund_id":"r_1"}"#.into())
        }
    };
    let once = build(provider.clone());
    let first = once
        .call("t1", Some("refund-1234"), TOOL, ARGS, dispatch(provider.clone()))
        .unwrap();
    assert_confirmed(&first, r#"{"refund_id":"r_1"}"#, false, None);
    drop(once);
    // Lost whole, its witness too (kept, the witness would give the record back: older_history.rs).
    for suffix in ["", "-wal", "-shm", ".witness", ".witness-wal", ".witness-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    assert!(!db.exists());
    let once = build(provider.clone());
    let again = once
        .call("t1", Some("refund-1234"), TOOL, ARGS, dispatch(provider.clone()))
        .unwrap();
    assert_confirmed(&again, r#"{"refund_id":"r_1"}"#, true, Some(ReplayVia::Provider));
    assert_eq!(provider.lock().unwrap().len(), 1, "no second dispatch");
}

/// The provider key `once` sends (t1, k) with, the call answered a success.
fn provider_key_of_a_success(once: &Once) -> String {
    let mut key = String::new();
    let _ = once
        .call("t1", Some("k"), TOOL, ARGS, |d| {
            key = d.provider_key.to_string();
            Sent::Success("{}".into())
        })
        .unwrap();
    key
}

/// The Rust host derives the provider key with the secret its SQLite ledger
/// keeps (the same derivation the Node and Python hosts use on a shared file:
/// js/test/hosts.test.mjs), not the unsalted hash anyone could compute.
#[test]
fn the_provider_key_is_an_hmac_under_the_ledgers_secret() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let once = Once::builder(sqlite(&db)).build().unwrap();
    let key = provider_key_of_a_success(&once);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let body: String = conn
        .query_row(
            "SELECT body FROM rows WHERE tbl = 'quota' AND scope = '' AND key = 'once:provider-key-secret'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let hex = serde_json::from_str::<serde_json::Value>(&body).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let secret = once_guest::secret::KeySecret::from_bytes(bytes);
    assert_eq!(key, once_guest::identity::provider_key(&secret, "t1", "k", 1));
    assert_ne!(key, once_guest::identity::legacy_provider_key("t1", "k", 1));
    // The record names the secret by id, and nothing the host shows carries the secret.
    let view = once.inspect("t1", "k").unwrap().unwrap();
    assert!(view.body.contains(&secret.id));
    assert!(!view.body.contains(&hex) && !format!("{view:?}").contains(&hex));
}

/// What losing the ledger's secret costs (docs/design.md "Provider keys and
/// the ledger's secret"): a ledger recreated without it makes a new secret,
/// so the same (scope, key) gets another provider key, which a provider's
/// record under the old key does not answer. That is why the secret is
/// backed up with the ledger, or its bytes kept outside it (above).
#[test]
fn a_lost_secret_gives_new_provider_keys() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let key_of = || provider_key_of_a_success(&Once::builder(sqlite(&db)).build().unwrap());
    let first = key_of();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    assert_ne!(key_of(), first, "a new ledger, a new secret, another key");
}

#[test]
fn records_and_audit_survive_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    {
        let once = Once::builder(sqlite(&db)).build().unwrap();
        let _ = once
            .call("t1", Some("k1"), TOOL, ARGS, |_| Sent::Success(r#"{"ok":true}"#.into()))
            .unwrap();
        let _ = once
            .call("t1", Some("k2"), TOOL, ARGS, |_| Sent::Rejected("card declined".into()))
            .unwrap();
    }
    let once = Once::builder(sqlite(&db)).build().unwrap();
    let k1 = once.inspect("t1", "k1").unwrap().unwrap();
    assert_eq!(k1.state, State::Confirmed);
    assert_eq!(k1.receipt.as_deref(), Some(r#"{"ok":true}"#));
    let kinds: Vec<&str> = k1.audit.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["begin", "finish-success"]);
    assert_eq!(k1.audit.iter().map(|e| e.version).collect::<Vec<_>>(), [1, 2]);
    let k2 = once.inspect("t1", "k2").unwrap().unwrap();
    assert_eq!(k2.state, State::Failed);
    assert_eq!(k2.error.as_deref(), Some("card declined"));
}

#[test]
fn eight_threads_racing_begin_on_one_key_get_one_execute() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    // Create the schema before the race.
    drop(sqlite(&db));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let db = db.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let once = Once::builder(sqlite(&db)).build().unwrap();
                let call = Once::call_of("t1", Some("race"), TOOL, ARGS);
                barrier.wait();
                once.transitions().begin(&call).unwrap()
            })
        })
        .collect();
    let decisions: Vec<Decision> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let executes = decisions.iter().filter(|d| matches!(d, Decision::Execute(_))).count();
    assert_eq!(executes, 1, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .all(|d| matches!(d, Decision::Execute(_) | Decision::InFlight(_))),
        "{decisions:?}"
    );
}

#[test]
fn a_waiter_gets_the_holders_receipt_instead_of_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(Once::builder(sqlite(&dir.path().join("once.db"))).build().unwrap());
    let effects = Arc::new(AtomicU32::new(0));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let holder = {
        let once = once.clone();
        let effects = effects.clone();
        std::thread::spawn(move || {
            once.call("t1", Some("slow"), TOOL, ARGS, |_| {
                effects.fetch_add(1, Ordering::SeqCst);
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                Sent::Success(r#"{"refund_id":"r_slow"}"#.into())
            })
        })
    };
    started_rx.recv().unwrap();
    let waiter = once
        .call(
            "t1",
            Some("slow"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success("{}".into())),
        )
        .unwrap();
    assert_confirmed(&waiter, r#"{"refund_id":"r_slow"}"#, true, Some(ReplayVia::Key));
    assert_confirmed(
        &holder.join().unwrap().unwrap(),
        r#"{"refund_id":"r_slow"}"#,
        false,
        None,
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[test]
fn bad_input_is_a_typed_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(sqlite(&dir.path().join("once.db")));
    // Never broken: the test keeps its own handle on the storage the engine uses.
    let once = Once::builder(Breakable(storage.clone(), Arc::default()))
        .build()
        .unwrap();
    let huge = format!(r#"{{"note":"{}"}}"#, "x".repeat(16 << 20));
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    for args in [
        r#"{"a":"#,
        r#"{"a":1,"a":2}"#,
        r#"{"a":"\udc00"}"#,
        r#"{"a":NaN}"#,
        deep.as_str(),
        huge.as_str(),
    ] {
        let effects = AtomicU32::new(0);
        let result = once.call(
            "t1",
            Some("bad"),
            TOOL,
            args,
            counting(&effects, Sent::Success("{}".into())),
        );
        assert!(
            matches!(result, Err(once::OnceError::Engine(once::types::Error::InvalidJson(_)))),
            "{}: {result:?}",
            &args[..args.len().min(40)]
        );
        assert_eq!(effects.load(Ordering::SeqCst), 0, "never dispatched");
    }
    assert!(storage.list(None, 10).unwrap().is_empty(), "no record written");
    assert!(storage.audit("t1", "bad").unwrap().is_empty());
}

#[test]
fn the_intent_is_durable_before_execute_is_returned() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let once = Once::builder(sqlite(&db)).build().unwrap();
    let call = Once::call_of("t1", Some("k"), TOOL, ARGS);
    let Decision::Execute(grant) = once.transitions().begin(&call).unwrap() else {
        panic!("expected execute")
    };
    // Another connection (as another process would) sees the claim already.
    let other = sqlite(&db);
    let row = other
        .get(once::types::Table::Operation, "t1", "k")
        .unwrap()
        .expect("the intent row is committed");
    assert_eq!(row.state, Some(State::InFlight));
    assert_eq!(
        once.transitions()
            .finish("t1", "k", &grant.fence, &Outcome::Success("{}".into()))
            .unwrap(),
        once::types::FinishAck::Recorded(State::Confirmed)
    );
}

#[test]
fn an_expired_lease_becomes_unknown_with_a_manual_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = Once::call_of("t1", Some("k"), TOOL, ARGS);
    let t = once.transitions();
    let Decision::Execute(grant) = t.begin(&call).unwrap() else {
        panic!("expected execute")
    };
    assert!(matches!(t.begin(&call).unwrap(), Decision::InFlight(_)));
    clock.set(grant.lease_until);
    assert!(matches!(t.begin(&call).unwrap(), Decision::Unknown(_)));
    // The holder comes back late: a stale claim of failure changes nothing...
    assert_eq!(
        t.finish("t1", "k", &grant.fence, &Outcome::Rejected("late".into()))
            .unwrap(),
        once::types::FinishAck::Ignored(State::Unknown)
    );
    // ...but its success is evidence.
    assert_eq!(
        once.transitions()
            .finish("t1", "k", &grant.fence, &Outcome::Success("{}".into()))
            .unwrap(),
        once::types::FinishAck::Recorded(State::Confirmed)
    );
}

#[test]
fn identity_required_blocks_a_call_without_a_key_and_derived_dedupes() {
    let dir = tempfile::tempdir().unwrap();
    let required = once::types::PolicyInput {
        identity: Some(IdentityMode::Required),
        ..policy_input()
    };
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .policy(TOOL, required)
        .build()
        .unwrap();
    let effects = AtomicU32::new(0);
    let blocked = once
        .call("t1", None, TOOL, ARGS, counting(&effects, Sent::Success("{}".into())))
        .unwrap();
    assert!(
        blocked
            .blocked()
            .is_some_and(|b| b.reason == BlockReason::IdentityRequired),
        "{blocked:?}"
    );
    // A tool left to the defaults derives its key from the args.
    assert_eq!(once.policy("send_message").identity, IdentityMode::Derived);
    let args = r#"{"to":"ana","text":"hi"}"#;
    let _ = once
        .call(
            "t1",
            None,
            "send_message",
            args,
            counting(&effects, Sent::Success(r#"{"id":1}"#.into())),
        )
        .unwrap();
    let again = once
        .call(
            "t1",
            None,
            "send_message",
            args,
            counting(&effects, Sent::Success(r#"{"id":2}"#.into())),
        )
        .unwrap();
    assert_confirmed(&again, r#"{"id":1}"#, true, Some(ReplayVia::DerivedArgs));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[test]
fn an_inconsistent_policy_is_refused_when_loaded_never_adjusted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("once.db");
    let inconsistent = once::types::PolicyInput {
        dispatch_timeout_ms: Some(30_000),
        lease_ms: Some(30_000),
        ..policy_input()
    };
    let refused = Once::builder(sqlite(&path)).policy(TOOL, inconsistent.clone()).build();
    match refused {
        Err(once::OnceError::Engine(once::types::Error::InvalidPolicy(why))) => {
            assert!(why.contains("lease_ms") && why.contains(TOOL), "{why}")
        }
        Err(other) => panic!("expected invalid-policy, got {other:?}"),
        Ok(_) => panic!("an inconsistent policy was accepted"),
    }
    // Set on a running handle: refused too, and the tool keeps the policy it had.
    let once = Once::builder(sqlite(&path)).build().unwrap();
    let before = once.policy(TOOL);
    let err = once.set_tool(TOOL, inconsistent, None).unwrap_err();
    assert!(err.to_string().contains("lease_ms"), "{err}");
    assert_eq!(once.policy(TOOL), before);
    // Only the timeout set: the engine derives a lease that covers it.
    let timed = once::types::PolicyInput {
        dispatch_timeout_ms: Some(1_000),
        ..policy_input()
    };
    let plan = once.set_tool(TOOL, timed, None).unwrap();
    assert!(plan.policy.lease_ms > 1_000, "{plan:?}");
}

/// A function that returned has happened: a response that is not JSON is
/// still its receipt, confirmed and stored verbatim (flagged in the record),
/// and a repeat replays it without a second dispatch. (A success the ledger
/// cannot write is `unrecorded`: tests/hardening_storage.rs.)
#[test]
fn a_success_whose_response_is_not_json_is_confirmed_with_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .clock(clock.clone())
        .wait_up_to(Duration::from_millis(20))
        .build()
        .unwrap();
    let effects = AtomicU32::new(0);
    let called = once
        .call(
            "t1",
            Some("refund-1"),
            TOOL,
            ARGS,
            counting(&effects, Sent::Success("refunded, id r_1".into())),
        )
        .unwrap();
    assert!(
        matches!(ending(&called), Ending::Confirmed(c) if c.receipt == "refunded, id r_1" && !c.replayed),
        "{called:?}"
    );
    assert_eq!(called.effect(), Effect::Happened);
    let view = once.inspect("t1", "refund-1").unwrap().unwrap();
    assert_eq!(view.state, State::Confirmed);
    // Kept whole inside a JSON stand-in, which every host can parse when it replays it.
    let stored = view.receipt.clone().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(parsed["once_unparsed_receipt"]["text"], "refunded, id r_1");
    assert!(view.body.contains(r#""receipt_flaw":{"problem":"#), "{}", view.body);
    // A repeat replays it; nothing is dispatched again.
    let again = once
        .call("t1", Some("refund-1"), TOOL, ARGS, counting(&effects, Sent::NotSent))
        .unwrap();
    assert!(
        matches!(ending(&again), Ending::Confirmed(c) if c.receipt == stored && c.replayed),
        "{again:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

/// A rejection that arrives after the lease expired into unknown is not
/// recorded, so the caller is not told "rejected": the record may still be
/// dispatched once reconciliation proves absence, and a corrected call on top
/// of it would be a second refund.
#[test]
fn a_rejection_the_ledger_did_not_record_is_not_reported_as_rejected() {
    let clock = ManualClock::new(1_000_000);
    let once = Once::builder(once::storage::memory::MemoryStorage::new())
        .clock(clock.clone())
        .wait_up_to(Duration::from_millis(20))
        .policy(
            TOOL,
            once::types::PolicyInput {
                dispatch_timeout_ms: Some(1_000),
                lease_ms: Some(1_200),
                ..policy_input()
            },
        )
        .build()
        .unwrap();
    let called = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |d| {
            // The reply takes longer than the lease; the background sweep expires it meanwhile.
            clock.set(d.send_by + 10_000);
            assert_eq!(once.sweep(10).unwrap().expired, 1);
            Sent::Rejected(r#"{"error":"declined"}"#.into())
        })
        .unwrap();
    assert!(matches!(ending(&called), Ending::Unknown(_)), "{called:?}");
    let view = once.inspect("t1", "refund-1").unwrap().unwrap();
    assert_eq!(view.state, State::Unknown);
}

/// A rejection whose commit fails is not reported either: the caller hears
/// what the record says (still in flight), never the outcome it could not store.
#[test]
fn a_rejection_that_could_not_be_stored_is_reported_as_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(sqlite(&dir.path().join("once.db")));
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = Once::builder(Breakable(store, broken.clone()))
        .wait_up_to(Duration::from_millis(20))
        .build()
        .unwrap();
    let called = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |_| {
            // The ledger stops taking writes between dispatch and report.
            broken.store(true, Ordering::SeqCst);
            Sent::Rejected(r#"{"error":"declined"}"#.into())
        })
        .unwrap();
    broken.store(false, Ordering::SeqCst);
    assert!(matches!(ending(&called), Ending::InFlight(_)), "{called:?}");
    assert_eq!(once.inspect("t1", "refund-1").unwrap().unwrap().state, State::InFlight);
}

/// An SQLite store whose commits fail while the flag is set (and a test's own handle on it).
struct Breakable(Arc<SqliteStorage>, Arc<std::sync::atomic::AtomicBool>);

impl Storage for Breakable {
    fn get(
        &self,
        t: once::types::Table,
        s: &str,
        k: &str,
    ) -> Result<Option<once::types::Row>, once::storage::StorageError> {
        self.0.get(t, s, k)
    }
    fn commit(&self, b: &once::types::Batch) -> Result<(), once::storage::CommitError> {
        if self.1.load(Ordering::SeqCst) {
            return Err(once::storage::CommitError::Storage(once::storage::StorageError(
                "disk full".into(),
            )));
        }
        self.0.commit(b)
    }
    fn scan(
        &self,
        t: once::types::Table,
        st: &[State],
        due: u64,
        owner: Option<&str>,
        limit: u32,
    ) -> Result<Vec<once::types::Row>, once::storage::StorageError> {
        self.0.scan(t, st, due, owner, limit)
    }
    fn audit(&self, s: &str, k: &str) -> Result<Vec<once::types::AuditEvent>, once::storage::StorageError> {
        self.0.audit(s, k)
    }
    fn list(&self, st: Option<State>, limit: u32) -> Result<Vec<once::types::Row>, once::storage::StorageError> {
        self.0.list(st, limit)
    }
    fn stats(&self, scope: Option<&str>) -> Result<once::storage::Stats, once::storage::StorageError> {
        self.0.stats(scope)
    }
    fn claim_body_format(&self, format: u32) -> Result<(), once::storage::StorageError> {
        self.0.claim_body_format(format)
    }
}

/// Not sent is not a rejection: the same operation asks for its next attempt
/// (same key, same provider key) and that one's success confirms it.
#[test]
fn not_sent_then_success_is_confirmed_by_the_next_attempt() {
    let once = Once::builder(once::storage::memory::MemoryStorage::new())
        .build()
        .unwrap();
    let mut seen = Vec::new();
    let called = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |d| {
            seen.push((d.attempt, d.provider_key.to_string()));
            if d.attempt == 1 {
                Sent::NotSent
            } else {
                Sent::Success(r#"{"refund_id":"r_2"}"#.into())
            }
        })
        .unwrap();
    assert_confirmed(&called, r#"{"refund_id":"r_2"}"#, false, None);
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].0, seen[1].0), (1, 2));
    assert_eq!(seen[0].1, seen[1].1, "the same provider key");
    let view = once.inspect("t1", "refund-1").unwrap().unwrap();
    assert_eq!((view.state, view.attempts), (State::Confirmed, 2));

    // Never sent at all: the budget ends it, saying nothing was sent.
    let called = once
        .call("t1", Some("refund-2"), TOOL, ARGS, |_| Sent::NotSent)
        .unwrap();
    assert!(
        matches!(ending(&called), Ending::NotSent(n) if n.attempts == 3),
        "{called:?}"
    );
    assert_eq!(called.effect(), Effect::None);
}

/// A lost reply whose process died: a new handle's background round reads
/// the provider once the old request can no longer commit, proves absence
/// and sends the owed dispatch — once, under the same provider key.
#[test]
fn settle_sends_an_owed_dispatch_after_a_restart_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("once.db");
    let clock = ManualClock::new(1_000_000);
    let build = || {
        Once::builder(sqlite(&db))
            .clock(clock.clone())
            .wait_up_to(Duration::ZERO)
            .provider(|_: &str, _: &str, _: &str| Evidence::Absent(u64::MAX / 2))
            .build()
            .unwrap()
    };
    let first_key = {
        let once = build();
        let mut key = String::new();
        let lost = once
            .call("t1", Some("refund-1"), TOOL, ARGS, |d| {
                key = d.provider_key.to_string();
                Sent::Ambiguous("the process died before the reply".into())
            })
            .unwrap();
        assert!(matches!(ending(&lost), Ending::Unknown(_)), "{lost:?}");
        key
    };
    let once = build();
    // Too early: the lost request could still commit; nothing is owed yet.
    let early = once.settle(10, |_| panic!("sent before absence was proven")).unwrap();
    assert!(early.sent.is_empty(), "{early:?}");
    clock.advance(once.policy(TOOL).max_in_flight_ms + 1);
    let mut sent = Vec::new();
    let settled = once
        .settle(10, |d| {
            sent.push((d.key.to_string(), d.provider_key.to_string(), d.attempt));
            Sent::Success(r#"{"refund_id":"r_1"}"#.into())
        })
        .unwrap();
    assert_eq!(sent, [("refund-1".to_string(), first_key, 2)]);
    assert_eq!(settled.sent.len(), 1);
    assert_confirmed(&settled.sent[0], r#"{"refund_id":"r_1"}"#, false, None);
    // Settled: the next round has nothing to send, and the caller's retry replays.
    assert!(once.settle(10, |_| panic!("sent twice")).unwrap().sent.is_empty());
    let again = once
        .call("t1", Some("refund-1"), TOOL, ARGS, |_| panic!("sent twice"))
        .unwrap();
    assert_confirmed(&again, r#"{"refund_id":"r_1"}"#, true, Some(ReplayVia::Key));
}

/// A DIRECT call reaches the sender marked `direct`, with the call's own scope;
/// a granted attempt is not marked, whatever its values.
#[test]
fn a_direct_dispatch_is_marked_and_carries_the_calls_scope() {
    let dir = tempfile::tempdir().unwrap();
    let direct = once::types::PolicyInput {
        route: Some(once::types::Route::Direct),
        ..policy_input()
    };
    let once = Once::builder(sqlite(&dir.path().join("once.db")))
        .tool("search", direct, None)
        .build()
        .unwrap();
    let mut seen = Vec::new();
    let mut send = |d: &once::Dispatch<'_>| {
        seen.push((d.direct, d.scope.to_string(), d.tool.to_string(), d.attempt));
        Sent::Success(r#"{"v":1}"#.into())
    };
    let called = once
        .call("tenant-7", Some("k"), "search", r#"{"q":1}"#, &mut send)
        .unwrap();
    assert!(matches!(called, Called::Direct(_)), "{called:?}");
    let granted = once.call("tenant-7", Some("k"), TOOL, ARGS, &mut send).unwrap();
    assert!(granted.confirmed().is_some(), "{granted:?}");
    assert_eq!(
        seen,
        [
            (true, "tenant-7".to_string(), "search".to_string(), 0),
            (false, "tenant-7".to_string(), TOOL.to_string(), 1),
        ]
    );
}

/// A blocking send that hangs past the deadline the engine gave its answer no longer holds its
/// operation: once its lease is over and the request can no longer commit, a round of the same
/// handle (another thread) reads, proves absence and sends attempt 2, as it would without the call.
/// (A call holds its operation against the round while it drives it, but a send is the caller's
/// code and may never return.)
#[test]
fn a_send_that_hangs_past_its_deadline_leaves_its_operation_to_the_round() {
    let dir = tempfile::tempdir().unwrap();
    let once = Arc::new(
        Once::builder(sqlite(&dir.path().join("once.db")))
            .provider(|_: &str, _: &str, _: &str| Evidence::Absent(u64::MAX / 2))
            .policy(
                TOOL,
                once::types::PolicyInput {
                    // Send-by 1.95 s after the grant (however slow the machine), the answer due 50 ms later.
                    dispatch_timeout_ms: Some(50),
                    lease_ms: Some(2_000),
                    max_in_flight_ms: Some(1),
                    ..policy_input()
                },
            )
            .build()
            .unwrap(),
    );
    let (in_send, hangs) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let caller = {
        let (once, in_send, hangs) = (once.clone(), in_send.clone(), hangs.clone());
        std::thread::spawn(move || {
            once.call("t1", Some("refund-1"), TOOL, ARGS, |_| {
                in_send.wait();
                // Hangs until the test is done with the round, far past its deadline.
                hangs.wait();
                Sent::NotSent
            })
        })
    };
    in_send.wait();
    let mut sent = Vec::new();
    for _ in 0..500 {
        let round = once
            .settle(10, |d| {
                sent.push(d.attempt);
                Sent::Success(r#"{"refund_id":"r_2"}"#.into())
            })
            .unwrap();
        if !round.sent.is_empty() {
            assert_confirmed(&round.sent[0], r#"{"refund_id":"r_2"}"#, false, None);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sent, [2], "the round sent attempt 2 while the first send still hung");
    hangs.wait();
    // When its send returns at last, the call answers what the round's attempt did.
    let late = caller.join().unwrap().unwrap();
    assert_confirmed(&late, r#"{"refund_id":"r_2"}"#, true, Some(ReplayVia::Key));
    assert!(once.settle(10, |_| panic!("sent twice")).unwrap().sent.is_empty());
}
