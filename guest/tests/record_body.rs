//! The hand-written row body (`body::record_json`) is exactly serde_json's
//! text of the record: on every record the state machine writes in the
//! native suites' scenarios below, and on records with every optional field
//! set, every enum value and strings that need escaping.

mod common;

use common::*;
use once_guest::body::record_json;
use once_guest::policy::{Policy, Quota};
use once_guest::record::{Attempt, OpRecord, Reservation};
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
    });
    rec.previous_fences = vec![tricky.into(), String::new()];
    rec.reported_previous = vec!["1-x".into()];
    rec.receipt = Some(tricky.into());
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
    ] {
        rec.state = state;
        same_as_serde(&rec);
    }
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
}
