//! Receipts that are not strict I-JSON (issue #29 item 9). A provider's
//! receipt with a lone surrogate (which Node's `JSON.stringify` writes), a
//! duplicate key, over the 1 MiB limit, or not JSON at all is still the
//! evidence that the effect happened. b58a043 refused it: a report was told
//! "unrecorded" and the record never settled, and a lookup returning it left
//! the record unknown for ever. Each test here but the last failed there. Now the record
//! is confirmed, the receipt stored as it came (verbatim; text that is not
//! JSON whole inside a JSON stand-in, since every host parses a replay; over
//! the limit a stand-in with its size and SHA-256) and flagged `receipt_flaw`
//! in the row body and in the audit event that stored it.

mod common;

use common::*;
use once_guest::digest::sha256_hex;
use once_guest::engine::{begin, reconcile, sweep};
use once_guest::host::Host;
use once_guest::protocol::{report, start_request};
use once_guest::testing::MemoryHost;
use once_guest::types::{
    Confirmation, ConfirmedInfo, Decision, Effect, Ending, Evidence, FinishAck, RecordView, Repeat, ReplayVia, State,
    Step,
};
use serde_json::{Value, json};

/// Valid JSON text, not I-JSON: a lone surrogate escape, as Node writes `"\uD800"`.
const LONE_SURROGATE: &str = r#"{"refund_id":"r-1","memo":"\ud800"}"#;
/// Valid JSON text, not I-JSON: a duplicate key.
const DUPLICATE_KEY: &str = r#"{"refund_id":"r-1","refund_id":"r-2"}"#;
/// Not JSON at all.
const NOT_JSON: &str = "refund r-1 done\n";

fn dispatch_fence(step: Step) -> String {
    match step {
        Step::Dispatch(grant) => grant.fence,
        other => panic!("expected dispatch, got {other:?}"),
    }
}

/// A done step that says the effect happened and the same call replays.
fn confirmed(step: Step) -> ConfirmedInfo {
    match step {
        Step::Done(account) => {
            assert_eq!((account.effect, account.repeat), (Effect::Happened, Repeat::Replays));
            match account.ending {
                Ending::Confirmed(info) => info,
                other => panic!("expected confirmed, got {other:?}"),
            }
        }
        other => panic!("expected done, got {other:?}"),
    }
}

/// The record's receipt flaw, as its row body stores it.
fn flaw(v: &RecordView) -> Value {
    body(v)["receipt_flaw"].clone()
}

/// The flaw of a receipt stored verbatim: what the check found, its size and digest.
fn assert_verbatim_flaw(v: &RecordView, text: &str, problem: &str) {
    let f = flaw(v);
    assert!(f["problem"].as_str().unwrap().contains(problem), "{f}");
    assert_eq!(f["abridged"], Value::Null, "kept whole: {f}");
    assert_eq!(f["bytes"], json!(text.len()));
    assert_eq!(f["sha256"], json!(sha256_hex(text.as_bytes())));
}

/// The audit event that stored the receipt carries its flaw.
fn assert_audited(v: &RecordView, kind: &str) {
    let event = v.audit.iter().find(|e| e.kind == kind).expect("the confirming event");
    let detail: Value = serde_json::from_str(&event.detail).unwrap();
    assert_eq!(detail["receipt_flaw"], flaw(v), "{}", event.detail);
}

/// Through the call protocol: a report whose response is `text` is done
/// confirmed with it, the record stores it verbatim and flagged, and the same
/// call replays it as it came.
fn reported_and_replayed_verbatim(text: &str, problem: &str) {
    let h = MemoryHost::new();
    let fence = dispatch_fence(start_request(&h, refund("k", ARGS)).unwrap());
    let own = confirmed(report(&h, "s", "k", &fence, success(text)).unwrap());
    assert_eq!((own.receipt.as_str(), own.replayed), (text, false));
    let v = view(&h, "k");
    assert_eq!((v.state, v.receipt.as_deref()), (State::Confirmed, Some(text)));
    assert_verbatim_flaw(&v, text, problem);
    assert_audited(&v, "finish-success");
    let again = confirmed(start_request(&h, refund("k", ARGS)).unwrap());
    assert_eq!((again.receipt.as_str(), again.replayed), (text, true));
    assert_eq!(again.confirmed_by, Confirmation::Answer);
    // Nothing else was dispatched.
    assert_eq!(view(&h, "k").attempts, 1);
}

#[test]
fn a_reported_receipt_with_a_lone_surrogate_is_confirmed_and_replayed_verbatim() {
    reported_and_replayed_verbatim(LONE_SURROGATE, "lone surrogate");
}

#[test]
fn a_reported_receipt_with_a_duplicate_key_is_confirmed_and_replayed_verbatim() {
    reported_and_replayed_verbatim(DUPLICATE_KEY, "duplicate key");
}

/// Text that is not JSON: every host parses a replayed receipt, so it is kept whole inside a JSON
/// stand-in (as a string, with its size and SHA-256); the reporting call gets it as it came.
#[test]
fn a_reported_response_that_is_not_json_is_confirmed_and_replayed_whole_inside_a_stand_in() {
    let h = MemoryHost::new();
    let fence = dispatch_fence(start_request(&h, refund("k", ARGS)).unwrap());
    let own = confirmed(report(&h, "s", "k", &fence, success(NOT_JSON)).unwrap());
    let v = view(&h, "k");
    assert_eq!(v.state, State::Confirmed);
    let stored: Value = serde_json::from_str(v.receipt.as_deref().unwrap()).unwrap();
    assert_eq!(stored, unparsed_stand_in(NOT_JSON));
    assert_eq!(own.receipt, NOT_JSON, "the reporting call gets its response as it came");
    let f = flaw(&v);
    assert!(f["problem"].as_str().unwrap().contains("at root"), "{f}");
    assert_eq!(
        (f["unparsed"].clone(), f["abridged"].clone()),
        (json!(true), Value::Null),
        "{f}"
    );
    assert_audited(&v, "finish-success");
    let again = confirmed(start_request(&h, refund("k", ARGS)).unwrap());
    assert_eq!(
        (again.receipt.as_str(), again.replayed),
        (v.receipt.as_deref().unwrap(), true)
    );
    assert_eq!(view(&h, "k").attempts, 1);
}

/// The stand-in of a receipt that is not JSON.
fn unparsed_stand_in(text: &str) -> Value {
    json!({"once_unparsed_receipt": {"bytes": text.len(), "sha256": sha256_hex(text.as_bytes()), "text": text}})
}

/// `finish` (the single transition) records it too, rather than refusing it.
#[test]
fn finish_records_a_flawed_receipt() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    assert_eq!(
        fin(&h, "k", &e.fence, success(DUPLICATE_KEY)),
        FinishAck::Recorded(State::Confirmed)
    );
    let r = replay_of(go(&h, refund("k", ARGS)));
    assert_eq!((r.receipt.as_str(), r.via), (DUPLICATE_KEY, Some(ReplayVia::Key)));
    assert_verbatim_flaw(&view(&h, "k"), DUPLICATE_KEY, "duplicate key");
}

/// Over the 1 MiB limit the receipt cannot be stored whole: the caller's
/// own answer is its full response; the record keeps a stand-in naming the
/// response's size and SHA-256, which every replay answers.
#[test]
fn a_reported_receipt_over_the_limit_is_confirmed_with_its_size_and_digest() {
    let h = MemoryHost::new();
    let big = format!(r#"{{"refund_id":"r-1","blob":"{}"}}"#, "x".repeat(1 << 20));
    assert!(big.len() > h.settings.borrow().max_input_bytes as usize);
    let digest = sha256_hex(big.as_bytes());
    let fence = dispatch_fence(start_request(&h, refund("k", ARGS)).unwrap());
    let own = confirmed(report(&h, "s", "k", &fence, success(&big)).unwrap());
    assert_eq!(
        own.receipt, big,
        "the call that sent it is answered with its own response"
    );
    let v = view(&h, "k");
    assert_eq!(v.state, State::Confirmed);
    let f = flaw(&v);
    assert_eq!(
        (f["abridged"].clone(), f["bytes"].clone()),
        (json!(true), json!(big.len()))
    );
    assert_eq!(f["sha256"], json!(digest));
    assert!(f["problem"].as_str().unwrap().contains("over the limit"), "{f}");
    assert_audited(&v, "finish-success");
    assert!(v.body.len() < 4096, "the body holds no copy of the response");
    let again = confirmed(start_request(&h, refund("k", ARGS)).unwrap());
    assert!(again.replayed);
    assert_eq!(again.receipt, v.receipt.clone().unwrap());
    let stand_in: Value = serde_json::from_str(&again.receipt).expect("the stand-in is JSON");
    assert_eq!(stand_in["once_abridged_receipt"]["bytes"], json!(big.len()));
    assert_eq!(stand_in["once_abridged_receipt"]["sha256"], json!(digest));
    assert!(
        stand_in["once_abridged_receipt"]["note"]
            .as_str()
            .unwrap()
            .contains("1048576 bytes")
    );
}

/// A lookup that finds the effect settles the record, whatever its receipt's
/// form: b58a043 left it unknown ("the provider's receipt is not valid JSON")
/// and read again, for ever.
#[test]
fn a_lookup_with_a_flawed_receipt_confirms_an_unknown_record() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", policy());
    h.script_lookup(Evidence::Confirmed(LONE_SURROGATE.to_string()));
    let r = replay_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!((r.receipt.as_str(), r.via), (LONE_SURROGATE, Some(ReplayVia::Provider)));
    assert_eq!(r.confirmed_by, Confirmation::Provider);
    let v = view(&h, "k");
    assert_eq!(
        (v.state, v.receipt.as_deref()),
        (State::Confirmed, Some(LONE_SURROGATE))
    );
    assert_verbatim_flaw(&v, LONE_SURROGATE, "lone surrogate");
    assert_audited(&v, "reconciled-confirmed");
    assert_eq!(replay_of(go(&h, refund("k", ARGS))).receipt, LONE_SURROGATE);
}

/// The same through the background sweep, with a receipt that is not JSON at
/// all and another over the limit.
#[test]
fn a_sweep_confirms_records_whose_lookup_returns_a_flawed_receipt() {
    let h = MemoryHost::new();
    unknown_record(&h, "a", policy());
    unknown_record(&h, "b", policy());
    let big = format!("[{}0]", "0,".repeat(1 << 19));
    h.script_lookup(Evidence::Confirmed(NOT_JSON.to_string()));
    h.script_lookup(Evidence::Confirmed(big.clone()));
    let report = sweep(&h, 10).unwrap();
    assert_eq!((report.reconciled, report.confirmed), (2, 2));
    let (a, b) = (view(&h, "a"), view(&h, "b"));
    assert_eq!(a.state, State::Confirmed);
    let stored: Value = serde_json::from_str(a.receipt.as_deref().unwrap()).unwrap();
    assert_eq!(stored, unparsed_stand_in(NOT_JSON));
    assert_eq!(flaw(&a)["unparsed"], json!(true));
    assert_eq!(b.state, State::Confirmed);
    assert_eq!(flaw(&b)["abridged"], json!(true));
    assert_eq!(flaw(&b)["sha256"], json!(sha256_hex(big.as_bytes())));
    assert_eq!(Some(replay_of(go(&h, refund("a", ARGS))).receipt), a.receipt);
}

/// verify-first: a lookup before the first dispatch that finds the effect
/// confirms without a dispatch, whatever its receipt's form (b58a043 answered
/// `blocked(unverified)` to every call, for ever).
#[test]
fn verify_first_confirms_with_a_flawed_receipt() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.verify_first = true;
    h.script_lookup(Evidence::Confirmed(DUPLICATE_KEY.to_string()));
    let r = replay_of(begin(&h, with_policy(refund("k", ARGS), p.clone())).unwrap());
    assert_eq!((r.receipt.as_str(), r.via), (DUPLICATE_KEY, Some(ReplayVia::Provider)));
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Confirmed, 0));
    assert_verbatim_flaw(&v, DUPLICATE_KEY, "duplicate key");
    assert_audited(&v, "verified-confirmed");
    assert!(h.lookups().len() == 1);
    match begin(&h, with_policy(refund("k", ARGS), p)).unwrap() {
        Decision::Replay(r) => assert_eq!(r.receipt, DUPLICATE_KEY),
        other => panic!("expected replay, got {other:?}"),
    }
}

/// An old attempt's success while a newer one is in flight: its flawed
/// receipt is stored and audited as a JSON string (an audit detail stays JSON
/// whatever the receipt), and the possible duplicate is flagged as ever.
#[test]
fn a_late_flawed_success_is_a_possible_duplicate_with_its_receipt_audited_as_text() {
    let h = MemoryHost::new();
    let e1 = execute_of(go(&h, refund("k", ARGS)));
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    let e2 = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(e2.attempt, 2);
    h.advance(100);
    assert_eq!(
        fin(&h, "k", &e1.fence, success(NOT_JSON)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = view(&h, "k");
    assert!(v.possible_duplicate);
    let stored = v.receipt.clone().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stored).unwrap(),
        unparsed_stand_in(NOT_JSON)
    );
    let event = v
        .audit
        .iter()
        .find(|e| e.kind == "late-success-possible-duplicate")
        .unwrap();
    let detail: Value = serde_json::from_str(&event.detail).unwrap();
    assert_eq!(detail["receipt"], json!(stored));
    assert_eq!(detail["receipt_flaw"], flaw(&v));
    // The second attempt's own success: audited beside the stored receipt, which does not change.
    assert_eq!(
        fin(&h, "k", &e2.fence, success(LONE_SURROGATE)),
        FinishAck::Recorded(State::Confirmed)
    );
    let v = view(&h, "k");
    assert_eq!(v.receipt, Some(stored));
    let second = v
        .audit
        .iter()
        .rev()
        .find(|e| e.kind == "late-success-possible-duplicate")
        .unwrap();
    assert_eq!(second.attempt, Some(2));
    let last: Value = serde_json::from_str(&second.detail).unwrap();
    assert_eq!(last["receipt"], json!(LONE_SURROGATE));
    assert_eq!(
        last["receipt_flaw"]["sha256"],
        json!(sha256_hex(LONE_SURROGATE.as_bytes()))
    );
}

/// A strict receipt is stored as written and not flagged.
#[test]
fn a_strict_receipt_is_not_flagged() {
    let h = MemoryHost::new();
    let e = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &e.fence, success(RECEIPT));
    let v = view(&h, "k");
    assert_eq!(v.receipt.as_deref(), Some(RECEIPT));
    assert_eq!(flaw(&v), Value::Null);
    assert_eq!(v.audit.last().unwrap().detail, "{}");
}
