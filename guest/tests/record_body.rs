//! The hand-written row body (`body::record_json`) is exactly serde_json's
//! text of the record: on every record the state machine writes in the
//! native suites' scenarios below, and on records with every optional field
//! set, every enum value and strings that need escaping.

mod common;

use common::*;
use once_guest::body::record_json;
use once_guest::policy::{ApprovalRule, Policy, Quota};
use once_guest::record::{Approval, Attempt, OpRecord, ReceiptFlaw, Reservation};
use once_guest::store::decode;
use once_guest::testing::MemoryHost;
use once_guest::types::{Confirmation, IdentityMode, KeySource, Route, State, Table};

fn same_as_serde(rec: &OpRecord) {
    let serde = serde_json::to_string(rec).unwrap();
    assert_eq!(record_json(rec), serde);
    // And it reads back as the record.
    let back: OpRecord = serde_json::from_str(&record_json(rec)).unwrap();
    assert_eq!(&back, rec);
}

fn every_operation_row(h: &MemoryHost) {
    for row in h.rows().into_iter().filter(|r| r.table == Table::Operation) {
        let rec = decode(&row).unwrap().rec;
        assert_eq!(record_json(&rec), row.body, "as the engine wrote it");
        same_as_serde(&rec);
    }
}

#[test]
fn bodies_the_engine_writes_are_serdes() {
    let h = MemoryHost::new();
    // Confirmed, with a receipt that needs escaping.
    let g = execute_of(go(&h, refund("k1", ARGS)));
    fin(&h, "k1", &g.fence, success(r#"{"note":"caf\u00e9 \"x\"\n","id":1}"#));
    // Failed, then retried in flight.
    let g = execute_of(go(&h, refund("k2", ARGS)));
    fin(&h, "k2", &g.fence, rejected());
    execute_of(go(&h, refund("k2", ARGS)));
    // Unknown after an ambiguous answer.
    let g = execute_of(go(&h, refund("k3", ARGS)));
    fin(&h, "k3", &g.fence, ambiguous());
    // Quota: a reservation and a spend.
    let mut quota = policy();
    quota.quota = Some(Quota {
        spend_field: "/amount".into(),
        ceiling: "500.00".into(),
        decimals: 2,
        window_ms: DAY,
        bucket: Some("shared \"b\"".into()),
    });
    execute_of(go(&h, with_policy(refund("k4", ARGS), quota)));
    // Confirmed with receipts that are not strict I-JSON, stored verbatim and flagged
    // (a lone surrogate escape; not JSON, with raw control characters), and one over
    // the limit, abridged.
    for (key, receipt) in [
        ("k5", r#"{"memo":"\ud800","id":1,"id":2}"#.to_string()),
        ("k6", "\u{0}\t\"not json\" \\ \u{1f600}\u{2028}".to_string()),
        ("k7", "x".repeat((1 << 20) + 1)),
    ] {
        let g = execute_of(go(&h, refund(key, ARGS)));
        fin(&h, key, &g.fence, success(&receipt));
        assert!(body(&view(&h, key))["receipt_flaw"].is_object(), "{key} is flagged");
    }
    every_operation_row(&h);
}

fn base() -> OpRecord {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("k1", ARGS)));
    let row = h.rows().into_iter().find(|r| r.table == Table::Operation).unwrap();
    decode(&row).unwrap().rec
}

#[test]
fn every_field_set_and_every_enum_value() {
    let tricky = "\u{0}\u{1f}\u{7f} \"quoted\" back\\slash \u{8}\u{c}\n\r\t é \u{2028} \u{1f600}";
    let mut rec = base();
    same_as_serde(&rec);
    rec.attempts.push(Attempt {
        n: 2,
        fence: tricky.into(),
        granted_at: u64::MAX,
        lease_until: 0,
        ended_at: Some(u64::MAX),
        outcome: Some(tricky.into()),
        owed: true,
        approval: Some(Approval {
            note: tricky.into(),
            fingerprint: tricky.into(),
            at: 0,
            valid_until: u64::MAX,
        }),
    });
    rec.approval_reason = Some(tricky.into());
    rec.approval = Some(Approval {
        note: String::new(),
        fingerprint: "f".into(),
        at: u64::MAX,
        valid_until: 1,
    });
    rec.previous_fences = vec![tricky.into(), String::new()];
    rec.reported_previous = vec!["1-x".into()];
    rec.receipt = Some(tricky.into());
    rec.receipt_flaw = Some(ReceiptFlaw {
        problem: tricky.into(),
        abridged: true,
        unparsed: true,
        bytes: u64::MAX,
        sha256: tricky.into(),
    });
    rec.confirmed_by = Some(u32::MAX);
    rec.absence_forced = true;
    rec.error = Some(tricky.into());
    rec.unknown_reason = Some(String::new());
    rec.since = Some(1);
    rec.deadline = Some(u64::MAX);
    rec.next_check = Some(0);
    rec.checks = u32::MAX;
    rec.last_read_position = Some(9_007_199_254_740_993);
    rec.escalated = true;
    rec.escalation_acked = true;
    rec.escalation_id = Some(tricky.into());
    rec.possible_duplicate = true;
    rec.supersedes = Some(tricky.into());
    rec.superseded_by = Some("k0".into());
    rec.spend = Some("340282366920938463463374607431768211455".into());
    rec.reservation = Some(Reservation {
        bucket: tricky.into(),
        window_start: u64::MAX,
        window_ms: 1,
        units: "0".into(),
    });
    rec.key_in_args = true;
    rec.replays = 7;
    rec.conflicts = u32::MAX;
    rec.policy = Policy {
        key_argument: Some(tricky.into()),
        key_sent_by_host: true,
        effect_fields: Some(vec!["/a".into(), tricky.into()]),
        verify_first: true,
        provider_claims_key: true,
        lookup: false,
        attempt_budget: u32::MAX,
        quota: Some(Quota {
            spend_field: "/amount".into(),
            ceiling: "1".into(),
            decimals: u8::MAX,
            window_ms: u64::MAX,
            bucket: Some(tricky.into()),
        }),
        descriptor_pin: Some(tricky.into()),
        approval: ApprovalRule::Above {
            field: tricky.into(),
            above: "100.00".into(),
        },
        approval_valid_ms: 1,
        approval_wait_ms: 2,
        provider_account: Some(tricky.into()),
        ..rec.policy.clone()
    };
    rec.policy.effect_fields = Some(Vec::new());
    same_as_serde(&rec);
    for state in [
        State::InFlight,
        State::Confirmed,
        State::Failed,
        State::Unknown,
        State::Absent,
        State::Superseded,
        State::AwaitingApproval,
        State::Denied,
    ] {
        rec.state = state;
        same_as_serde(&rec);
    }
    for approval in [ApprovalRule::Never, ApprovalRule::Always] {
        rec.policy.approval = approval;
        same_as_serde(&rec);
    }
    rec.policy.approval_valid_ms = once_guest::policy::DEFAULT_APPROVAL_VALID_MS;
    rec.policy.approval_wait_ms = once_guest::policy::DEFAULT_APPROVAL_WAIT_MS;
    same_as_serde(&rec);
    for source in [KeySource::Application, KeySource::Derived] {
        rec.key_source = source;
        same_as_serde(&rec);
    }
    for via in [
        None,
        Some(Confirmation::Answer),
        Some(Confirmation::Provider),
        Some(Confirmation::Operator),
    ] {
        rec.confirmed_via = via;
        same_as_serde(&rec);
    }
    for identity in [IdentityMode::Required, IdentityMode::Derived] {
        rec.policy.identity = identity;
        same_as_serde(&rec);
    }
    for route in [None, Some(Route::Direct), Some(Route::Protect), Some(Route::Block)] {
        rec.policy.route = route;
        same_as_serde(&rec);
    }
    rec.attempts.clear();
    same_as_serde(&rec);
    // A receipt kept whole leaves `abridged` out.
    rec.receipt_flaw.as_mut().unwrap().abridged = false;
    same_as_serde(&rec);
}

/// A confirmed record as 0.3.0 wrote it, every field spelled out (the
/// bench's call: `refund` of `{"order":1234,"amount":200,"currency":"EUR"}`).
const SPELLED_OUT: &str = r#"{"scope":"tenant","key":"op1448","key_source":"Application","tool":"refund","fingerprint":"6543acc179c37fceec3d0396a019559ddf74d4be2bd87d8efb275fb0efd36b0d","args":"{\"amount\":200,\"currency\":\"EUR\",\"order\":1234}","provider_key":"once-4cc54f227c5480b1a3c90e97a36442fa1666f4ab45552f48fe03a7d35f52d672","key_in_args":false,"owner":"default","state":"Confirmed","attempts":[{"n":1,"fence":"1-c3cad6323eff411243170bba1ec13c79","granted_at":1796294268776,"lease_until":1796294303776,"ended_at":1796294268777,"outcome":"success","owed":false}],"receipt":"{\"refund_id\":\"r_1\"}","confirmed_by":1,"confirmed_via":"Answer","absence_forced":false,"error":null,"unknown_reason":null,"since":null,"deadline":null,"next_check":null,"checks":0,"last_read_position":null,"escalated":false,"escalation_acked":false,"escalation_id":null,"possible_duplicate":false,"supersedes":null,"superseded_by":null,"spend":null,"reservation":null,"policy":{"route":null,"identity":"Derived","key_argument":null,"key_sent_by_host":false,"effect_fields":null,"verify_first":false,"provider_claims_key":false,"lookup":false,"max_in_flight_ms":60000,"dispatch_timeout_ms":30000,"lease_ms":35000,"attempt_budget":3,"derived_window_ms":86400000,"resolve_deadline_ms":900000,"reconcile_interval_ms":1000,"retention_ms":604800000,"tombstone_retention_ms":7776000000,"quota":null,"descriptor_pin":null},"replays":0,"conflicts":0,"created_at":1796294268776,"updated_at":1796294268777,"transitioned_at":1796294268777}"#;

#[test]
fn a_body_leaves_out_absent_false_and_zero_and_spelled_out_bodies_read_the_same() {
    let rec: OpRecord = serde_json::from_str(SPELLED_OUT).unwrap();
    let compact = record_json(&rec);
    same_as_serde(&rec);
    // Every member dropped was null, false or 0 in the spelled-out body, except
    // `lookup`, whose absence would read as true.
    let full: serde_json::Value = serde_json::from_str(SPELLED_OUT).unwrap();
    let short: serde_json::Value = serde_json::from_str(&compact).unwrap();
    let dropped = |a: &serde_json::Value, b: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
        let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
        a.iter()
            .filter(|(k, _)| !b.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut gone = dropped(&full, &short);
    gone.extend(dropped(&full["policy"], &short["policy"]));
    gone.extend(dropped(&full["attempts"][0], &short["attempts"][0]));
    assert_eq!(gone.len(), 28, "{gone:?}");
    for (name, value) in &gone {
        assert!(
            value.is_null() || *value == false || *value == 0,
            "{name} was {value}, yet left out"
        );
    }
    assert_eq!(short["policy"]["lookup"], false);
    // A third shorter (1,465 bytes spelled out, 958 compact).
    assert!(
        compact.len() * 3 <= SPELLED_OUT.len() * 2,
        "{} bytes: {compact}",
        compact.len()
    );
    // The compact text reads back as the very record the spelled-out one is.
    let back: OpRecord = serde_json::from_str(&compact).unwrap();
    assert_eq!(back, rec);
    let row = once_guest::types::Row {
        table: Table::Operation,
        scope: rec.scope.clone(),
        key: rec.key.clone(),
        version: 2,
        state: Some(State::Confirmed),
        due_at: None,
        owner: Some("default".into()),
        body: SPELLED_OUT.into(),
    };
    assert_eq!(decode(&row).unwrap().rec, back);
}
