//! A record that went unknown while no lookup was configured becomes
//! readable once a host has one (issue "The Python and npm packages as users
//! meet them", item 4): before, it waited for an operator for ever and the
//! sweep reported `reconciled = 0`.

mod common;

use common::*;
use once_guest::engine::{reconcile, sweep};
use once_guest::host::Host;
use once_guest::testing::MemoryHost;
use once_guest::types::{Decision, Evidence, State};

fn without_lookup() -> once_guest::policy::Policy {
    let mut p = policy();
    p.lookup = false;
    p
}

#[test]
fn the_sweep_reads_an_unknown_begun_without_a_lookup_once_one_is_configured() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", without_lookup());
    let before = sweep(&h, 10).unwrap();
    assert_eq!(before.reconciled, 0);
    assert!(h.lookups().is_empty(), "no lookup is configured: nothing is read");

    h.configure_lookup(true);
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    let after = sweep(&h, 10).unwrap();
    assert_eq!((after.reconciled, after.confirmed), (1, 1));
    let v = view(&h, "k");
    assert_eq!(v.state, State::Confirmed);
    assert_eq!(h.lookups().len(), 1);
}

#[test]
fn an_escalated_unknown_begun_without_a_lookup_is_still_found() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", without_lookup());
    h.advance(DEADLINE + SECOND);
    sweep(&h, 10).unwrap();
    assert!(view(&h, "k").escalated, "past its deadline it went to an operator");
    // Escalated and never read: nothing is due any more, yet a lookup configured now reads it.
    h.advance(DAY);
    h.configure_lookup(true);
    h.script_lookup(Evidence::Unknown("the provider is down".into()));
    let first = sweep(&h, 10).unwrap();
    assert_eq!(first.reconciled, 1);
    let v = view(&h, "k");
    assert_eq!(v.state, State::Unknown);
    // Read once, it has a next read: the caller is told when, and the sweep reads it then.
    let next = body(&v)["next_check"].as_u64().expect("a next read is scheduled");
    assert!(next > h.now());
    let again = sweep(&h, 10).unwrap();
    assert_eq!(again.reconciled, 0, "not read again before its next read");
    h.advance(next - h.now());
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    assert_eq!(sweep(&h, 10).unwrap().confirmed, 1);
}

#[test]
fn a_call_on_the_key_reads_it_once_a_lookup_is_configured() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", without_lookup());
    let waiting = unknown_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(waiting.next_read, None, "no lookup: it waits for an operator");
    assert!(h.lookups().is_empty());

    h.configure_lookup(true);
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    match reconcile(&h, "s", "k").unwrap() {
        Decision::Replay(r) => assert_eq!(r.receipt, RECEIPT),
        other => panic!("expected the provider's receipt, got {other:?}"),
    }
}

#[test]
fn a_record_with_no_lookup_anywhere_is_never_read() {
    let h = MemoryHost::new();
    unknown_record(&h, "k", without_lookup());
    for _ in 0..3 {
        h.advance(DEADLINE);
        sweep(&h, 10).unwrap();
    }
    assert!(h.lookups().is_empty());
    assert_eq!(view(&h, "k").state, State::Unknown);
}
