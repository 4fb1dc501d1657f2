//! The `queue` export: what needs a person, judged by the engine at the
//! ledger clock, filtered by scope, tool and key, and read-only.

mod common;

use common::*;
use once_guest::engine::{finish, queue, resolve};
use once_guest::host::Host;
use once_guest::testing::MemoryHost;
use once_guest::types::{Attention, Error, FinishAck, QueueEntry, QueueFilter, Resolution, State};

fn keys(entries: &[QueueEntry]) -> Vec<(&str, &str, Attention)> {
    entries
        .iter()
        .map(|e| (e.scope.as_str(), e.key.as_str(), e.attention))
        .collect()
}

/// u1, u2 (scope s) and t1 (scope t) unknown, a1 absent, l1 in flight past
/// its lease, f1 in flight within its lease, c1 confirmed.
fn ledger() -> MemoryHost {
    let h = MemoryHost::new();
    execute_of(go(&h, refund("l1", r#"{"order":9,"amount":1}"#)));
    unknown_record(&h, "u1", policy());
    h.advance(SECOND);
    unknown_record(&h, "u2", policy());
    unknown_record(&h, "a1", policy());
    resolve(&h, "s", "a1", Resolution::Absent, "checked the bank", true).unwrap();
    let t = execute_of(go(&h, req("t", Some("t1"), "pay", ARGS, policy())));
    h.advance(SECOND);
    assert_eq!(
        finish(&h, "t", "t1", &t.fence, ambiguous()).unwrap(),
        FinishAck::Recorded(State::Unknown)
    );
    h.advance(LEASE);
    execute_of(go(&h, refund("f1", r#"{"order":7,"amount":1}"#)));
    let c = execute_of(go(&h, refund("c1", r#"{"order":8,"amount":1}"#)));
    fin(&h, "c1", &c.fence, success(RECEIPT));
    h
}

#[test]
fn the_queue_holds_unknown_then_absent_then_expired_leases_oldest_first() {
    let h = ledger();
    let q = queue(&h, &everything(), 100).unwrap();
    assert_eq!(q.now, h.now());
    assert!(!q.truncated);
    assert_eq!(
        keys(&q.entries),
        [
            ("s", "u1", Attention::Unknown),
            ("s", "u2", Attention::Unknown),
            ("t", "t1", Attention::Unknown),
            ("s", "a1", Attention::Absent),
            ("s", "l1", Attention::LeaseExpired),
        ]
    );
    // Since and deadline are the record's own; an expired lease counts from its end and has no deadline yet.
    for e in &q.entries {
        let b = body(&view_in(&h, &e.scope, &e.key));
        match e.attention {
            Attention::Unknown | Attention::Absent => {
                assert_eq!(Some(e.since), b["since"].as_u64(), "{}", e.key);
                assert_eq!(e.deadline, b["deadline"].as_u64(), "{}", e.key);
                assert!(e.deadline.is_some(), "{}", e.key);
            }
            Attention::LeaseExpired => {
                assert_eq!(e.since, T0 + LEASE);
                assert_eq!(e.deadline, None);
                assert_eq!(e.state, State::InFlight);
            }
            Attention::Approval => panic!("no call awaits approval in this ledger: {e:?}"),
        }
        assert_eq!(e.attempts, 1);
        assert!(!e.escalated);
    }
    let u1 = &q.entries[0];
    assert_eq!((u1.since, u1.deadline), (T0 + SECOND, Some(T0 + SECOND + DEADLINE)));
    assert_eq!(u1.reason.as_deref(), Some("timeout after send"));
    assert_eq!((u1.tool.as_str(), u1.version), ("refund", view(&h, "u1").version));
}

#[test]
fn filters_narrow_the_queue_and_an_empty_scope_list_shows_nothing() {
    let h = ledger();
    let only = |scopes: Option<&[&str]>, tool: Option<&str>, key_prefix: Option<&str>| {
        let filter = QueueFilter {
            scopes: scopes.map(|s| s.iter().map(|x| x.to_string()).collect()),
            tool: tool.map(str::to_string),
            key_prefix: key_prefix.map(str::to_string),
        };
        let q = queue(&h, &filter, 100).unwrap();
        q.entries.iter().map(|e| e.key.clone()).collect::<Vec<_>>()
    };
    assert_eq!(only(Some(&["t"]), None, None), ["t1"]);
    assert_eq!(only(Some(&["s"]), None, None), ["u1", "u2", "a1", "l1"]);
    assert_eq!(only(Some(&[]), None, None), Vec::<String>::new());
    assert_eq!(only(None, Some("pay"), None), ["t1"]);
    assert_eq!(only(None, None, Some("u")), ["u1", "u2"]);
    assert_eq!(only(Some(&["s"]), Some("pay"), None), Vec::<String>::new());
}

#[test]
fn the_queue_writes_nothing_and_leaves_leases_to_the_sweep() {
    let h = ledger();
    let (rows, events) = (h.rows(), h.event_count());
    queue(&h, &everything(), 100).unwrap();
    assert_eq!(h.rows(), rows);
    assert_eq!(h.event_count(), events);
    assert_eq!(view(&h, "l1").state, State::InFlight);
}

#[test]
fn a_limit_below_the_pending_records_says_the_queue_is_truncated() {
    let h = ledger();
    let q = queue(&h, &everything(), 2).unwrap();
    assert!(q.truncated);
    assert!(q.entries.len() <= 2);
    // Six pending rows (f1 included, within its lease): a limit of six examines them all.
    assert!(!queue(&h, &everything(), 6).unwrap().truncated);
}

#[test]
fn a_bad_scope_or_tool_in_the_filter_is_refused_by_name() {
    let h = ledger();
    let bad = QueueFilter {
        scopes: Some(vec![String::new()]),
        ..everything()
    };
    match queue(&h, &bad, 10) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("scope"), "{m}"),
        other => panic!("{other:?}"),
    }
    let bad = QueueFilter {
        tool: Some("x".repeat(10_000)),
        ..everything()
    };
    match queue(&h, &bad, 10) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains("tool"), "{m}"),
        other => panic!("{other:?}"),
    }
}
