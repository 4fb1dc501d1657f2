//! Records a ledger already holds stay readable: every field added since
//! reads as its default, and an old record goes on through the protocol.

use once_guest::engine::{finish, inspect};
use once_guest::host::Host;
use once_guest::testing::MemoryHost;
use once_guest::types::{FinishAck, Outcome, Row, State, Table};

/// An in-flight record exactly as the first release (0.1, c66fba3) wrote it.
const V01_BODY: &str = r#"{"scope":"s","key":"k","key_source":"Application","tool":"refund","fingerprint":"5bbd8ad7af26342035c8defdb77b3170c31fcfa17e451b76c742669e270dfc92","args":"{\"amount\":200,\"order\":1}","provider_key":"once-ac2a5b7998e6f596b62de5f5e71d83df691f7ad3882114e42edfb0bea6ee429e","state":"InFlight","attempts":[{"n":1,"fence":"1-3176a415ccde69ddd683b4a12b07f440","granted_at":1000000,"lease_until":1035000,"ended_at":null,"outcome":null}],"receipt":null,"error":null,"unknown_reason":null,"since":null,"deadline":null,"next_check":null,"checks":0,"last_read_position":null,"escalated":false,"escalation_acked":false,"escalation_id":null,"possible_duplicate":false,"supersedes":null,"superseded_by":null,"spend":"20000","reservation":{"bucket":"refund","window_start":0,"window_ms":86400000,"units":"20000"},"policy":{"route":null,"identity":"Required","key_argument":null,"effect_fields":null,"verify_first":false,"provider_claims_key":false,"max_in_flight_ms":60000,"dispatch_timeout_ms":30000,"lease_ms":35000,"attempt_budget":3,"resolve_deadline_ms":900000,"reconcile_interval_ms":1000,"retention_ms":604800000,"tombstone_retention_ms":7776000000,"quota":{"spend_field":"/amount","ceiling":"500.00","decimals":2,"window_ms":86400000,"bucket":null},"descriptor_pin":null},"replays":0,"conflicts":0,"created_at":1000000,"updated_at":1000000,"transitioned_at":1000000}"#;

/// The first release's record of (s, k), in flight, as its host stored it.
fn put_v01_record(h: &MemoryHost) {
    h.put_row(Row {
        table: Table::Operation,
        scope: "s".into(),
        key: "k".into(),
        version: 1,
        state: Some(State::InFlight),
        due_at: Some(1_035_000),
        owner: Some("default".into()),
        body: V01_BODY.into(),
    });
}

#[test]
fn a_record_written_by_the_first_release_is_read_and_finished() {
    let h = MemoryHost::new();
    put_v01_record(&h);
    let view = inspect(&h, "s", "k").unwrap().expect("readable");
    assert_eq!((view.state, view.owner.as_str()), (State::InFlight, "default"));
    let body: serde_json::Value = serde_json::from_str(&view.body).unwrap();
    // Fields the first release did not write read as their defaults.
    assert_eq!(body["policy"]["lookup"], true);
    assert_eq!(body["policy"]["derived_window_ms"], 86_400_000);
    // Read as false (unknown: the max_in_flight rule applies), and false is left out of a body.
    assert_eq!(body.get("key_in_args"), None);
    let ack = finish(
        &h,
        "s",
        "k",
        "1-3176a415ccde69ddd683b4a12b07f440",
        Outcome::Success(r#"{"id":1}"#.into()),
    );
    assert_eq!(ack, Ok(FinishAck::Recorded(State::Confirmed)));
    assert!(
        h.get(Table::Operation, "s", "k")
            .unwrap()
            .unwrap()
            .body
            .contains("\"confirmed_via\"")
    );
}

/// A record made before provider keys had a secret keeps the unsalted key it
/// was dispatched with through every later transition and dispatch: the
/// provider holds its effect (or its dedupe slot) under that key, and a
/// re-derived one would be a second effect.
#[test]
fn a_record_from_before_the_secret_keeps_its_unsalted_provider_key() {
    let legacy = once_guest::identity::legacy_provider_key("s", "k", 1);
    assert!(
        V01_BODY.contains(&format!("\"provider_key\":\"{legacy}\"")),
        "the fixture is keyed the old way"
    );
    let h = MemoryHost::new();
    put_v01_record(&h);
    let ack = finish(
        &h,
        "s",
        "k",
        "1-3176a415ccde69ddd683b4a12b07f440",
        Outcome::Rejected("card declined".into()),
    );
    assert_eq!(ack, Ok(FinishAck::Recorded(State::Failed)));
    // The retry dispatches attempt 2 under the stored, old key, not the ledger secret's.
    let retry = once_guest::engine::begin(
        &h,
        once_guest::engine::BeginRequest {
            scope: "s".into(),
            keys: vec![("api".into(), "k".into())],
            tool: "refund".into(),
            args: r#"{"order":1,"amount":200}"#.into(),
            supersedes: None,
            acknowledge_confirmed: false,
            policy: once_guest::policy::default_policy(),
            descriptor: None,
        },
    )
    .unwrap();
    let once_guest::types::Decision::Execute(grant) = retry else {
        panic!("expected a second attempt, got {retry:?}");
    };
    assert_eq!((grant.attempt, grant.provider_key.as_str()), (2, legacy.as_str()));
    let view = inspect(&h, "s", "k").unwrap().unwrap();
    assert_eq!(view.provider_key, legacy);
    let body: serde_json::Value = serde_json::from_str(&view.body).unwrap();
    assert_eq!(
        body.get("key_secret"),
        None,
        "it names no secret: it was made without one"
    );
}
