//! What the guest states so hosts need not work it out (issue 33, "hosts
//! only do I/O"): an account's `awaits_operator`, and a record view's
//! `resolvable`, which `resolve` must honour exactly.

mod common;

use common::*;
use once_guest::engine::{BeginRequest, inspect, resolve, sweep};
use once_guest::protocol::{report, resume, start_request};
use once_guest::testing::MemoryHost;
use once_guest::types::{Account, Ending, Error, Evidence, Outcome, Resolution, Resolvable, State, Step, WaitReason};

fn done(step: Step) -> Account {
    match step {
        Step::Done(a) => a,
        other => panic!("expected done, got {other:?}"),
    }
}

fn without_lookup() -> once_guest::policy::Policy {
    let mut p = policy();
    p.lookup = false;
    p
}

fn first_grant(h: &MemoryHost, r: BeginRequest) -> once_guest::types::Grant {
    match start_request(h, r).unwrap() {
        Step::Dispatch(g) => g,
        other => panic!("expected dispatch, got {other:?}"),
    }
}

// ---------------------------------------------------------------- awaits an operator

#[test]
fn an_unknown_no_read_can_settle_awaits_an_operator_and_only_an_operator_settles_it() {
    let h = MemoryHost::new();
    let g = first_grant(&h, with_policy(refund("k", ARGS), without_lookup()));
    let a = done(report(&h, "s", "k", &g.fence, ambiguous()).unwrap());
    assert!(matches!(a.ending, Ending::Unknown(_)), "{a:?}");
    assert!(a.awaits_operator, "{a:?}");
    // The same call again says so too, and nothing the host can do moves it: not a sweep, not a resume.
    let again = done(start_request(&h, with_policy(refund("k", ARGS), without_lookup())).unwrap());
    assert!(again.awaits_operator, "{again:?}");
    h.advance(DEADLINE + DAY);
    sweep(&h, 10).unwrap();
    let later = done(resume(&h, "s", "k").unwrap());
    assert!(later.awaits_operator, "{later:?}");
    assert_eq!(view(&h, "k").state, State::Unknown);
    assert!(h.lookups().is_empty());
    // An operator can: it is resolvable, and once resolved the call no longer awaits anyone.
    let r = view(&h, "k").resolvable;
    assert!(r.confirmed && r.absent && !r.absent_needs_force, "{r:?}");
    resolve(&h, "s", "k", Resolution::Confirmed(RECEIPT.into()), "seen", false).unwrap();
    let settled = done(resume(&h, "s", "k").unwrap());
    assert!(matches!(settled.ending, Ending::Confirmed(_)) && !settled.awaits_operator);
}

#[test]
fn an_unknown_a_read_can_settle_does_not_await_an_operator() {
    let h = MemoryHost::new();
    let g = first_grant(&h, refund("k", ARGS));
    h.script_lookup(Evidence::Unknown("provider down".into()));
    // The lost reply is read at once; the read cannot tell, so the call waits for the next read.
    let Step::Wait(w) = report(&h, "s", "k", &g.fence, ambiguous()).unwrap() else {
        panic!("expected a wait for the next read")
    };
    assert_eq!(w.reason, WaitReason::Reconciliation);
    assert!(matches!(w.meanwhile.ending, Ending::Unknown(ref u) if u.next_read.is_some()));
    assert!(!w.meanwhile.awaits_operator, "{w:?}");
}

#[test]
fn an_unknown_begun_without_a_lookup_stops_awaiting_an_operator_once_its_host_has_one() {
    let h = MemoryHost::new();
    let g = first_grant(&h, with_policy(refund("k", ARGS), without_lookup()));
    assert!(done(report(&h, "s", "k", &g.fence, ambiguous()).unwrap()).awaits_operator);
    h.configure_lookup(true);
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    // This host reads it now: confirmed, and nobody is waited for.
    let a = done(start_request(&h, with_policy(refund("k", ARGS), without_lookup())).unwrap());
    assert!(matches!(a.ending, Ending::Confirmed(_)), "{a:?}");
    assert!(!a.awaits_operator);
}

#[test]
fn settled_refused_and_pending_calls_do_not_await_an_operator() {
    let h = MemoryHost::new();
    // Confirmed.
    let g = first_grant(&h, refund("c", ARGS));
    assert!(!done(report(&h, "s", "c", &g.fence, success(RECEIPT)).unwrap()).awaits_operator);
    // Rejected.
    let g = first_grant(&h, refund("r", ARGS));
    let a = done(report(&h, "s", "r", &g.fence, rejected()).unwrap());
    assert!(matches!(a.ending, Ending::Rejected(_)) && !a.awaits_operator, "{a:?}");
    // Conflict.
    let a = done(start_request(&h, refund("c", r#"{"order":1,"amount":1}"#)).unwrap());
    assert!(matches!(a.ending, Ending::Conflict(_)) && !a.awaits_operator, "{a:?}");
    // In flight under another attempt's live lease: its holder reports (no lookup changes that).
    first_grant(&h, with_policy(refund("live", ARGS), without_lookup()));
    let Step::Wait(w) = start_request(&h, with_policy(refund("live", ARGS), without_lookup())).unwrap() else {
        panic!("expected a wait for the holder")
    };
    assert!(matches!(w.meanwhile.ending, Ending::InFlight(_)) && !w.meanwhile.awaits_operator);
    // Nothing sent: retried after its back-off.
    let g = first_grant(&h, refund("n", ARGS));
    let Step::Wait(w) = report(&h, "s", "n", &g.fence, Outcome::NotSent).unwrap() else {
        panic!("expected the back-off")
    };
    assert_eq!(w.reason, WaitReason::Retry);
    assert!(!w.meanwhile.awaits_operator);
}

// ---------------------------------------------------------------- resolvable

/// Every record state an operator can meet, built from scratch on a fresh
/// host (the same every time), with what `resolvable` must say of it.
const STATES: &[(&str, State, Resolvable)] = &[
    ("in-flight, lease live", State::InFlight, r(false, false, false)),
    (
        "in-flight, lease ended, max-in-flight not passed",
        State::InFlight,
        r(true, true, true),
    ),
    (
        "in-flight, lease ended, max-in-flight passed",
        State::InFlight,
        r(true, true, false),
    ),
    // The edges, as DESIGN.md words them: a lease is live before its end; an earlier request may
    // still commit until max-in-flight after the last dispatch has *passed* (at that instant too).
    (
        "in-flight, a moment before the lease's end",
        State::InFlight,
        r(false, false, false),
    ),
    ("in-flight, at the lease's end", State::InFlight, r(true, true, true)),
    (
        "in-flight, at max-in-flight's end",
        State::InFlight,
        r(true, true, true),
    ),
    (
        "in-flight, a moment past max-in-flight",
        State::InFlight,
        r(true, true, false),
    ),
    ("unknown, max-in-flight not passed", State::Unknown, r(true, true, true)),
    ("unknown, max-in-flight passed", State::Unknown, r(true, true, false)),
    ("unknown, at max-in-flight's end", State::Unknown, r(true, true, true)),
    (
        "unknown, a moment past max-in-flight",
        State::Unknown,
        r(true, true, false),
    ),
    (
        "unknown, the provider claims keys",
        State::Unknown,
        r(true, true, false),
    ),
    ("unknown, no lookup", State::Unknown, r(true, true, true)),
    ("absent (forced)", State::Absent, r(true, false, false)),
    ("failed", State::Failed, r(true, false, false)),
    ("confirmed", State::Confirmed, r(false, false, false)),
    ("superseded", State::Superseded, r(false, false, false)),
    (
        "awaiting approval",
        State::AwaitingApproval,
        Resolvable {
            approve: true,
            ..r(true, false, false)
        },
    ),
    ("denied", State::Denied, r(true, false, false)),
    ("approved, owed", State::Absent, r(true, false, false)),
];

const fn r(confirmed: bool, absent: bool, absent_needs_force: bool) -> Resolvable {
    Resolvable {
        confirmed,
        absent,
        absent_needs_force,
        approve: false,
    }
}

/// A fresh host whose record `k` is in the named state.
fn build(name: &str) -> MemoryHost {
    let h = MemoryHost::new();
    let rejected_k = |h: &MemoryHost| {
        let e = execute_of(go(h, refund("k", ARGS)));
        assert_eq!(
            fin(h, "k", &e.fence, rejected()),
            once_guest::types::FinishAck::Recorded(State::Failed)
        );
    };
    match name {
        "in-flight, lease live" => {
            execute_of(go(&h, refund("k", ARGS)));
        }
        "in-flight, lease ended, max-in-flight not passed" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE + SECOND);
        }
        "in-flight, lease ended, max-in-flight passed" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE + MAX_IN_FLIGHT + SECOND);
        }
        // Granted at T0: the lease ends at T0 + LEASE (its send-by is earlier); live only before then.
        "in-flight, a moment before the lease's end" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE - 1);
        }
        "in-flight, at the lease's end" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE);
        }
        "in-flight, at max-in-flight's end" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE + MAX_IN_FLIGHT);
        }
        "in-flight, a moment past max-in-flight" => {
            execute_of(go(&h, refund("k", ARGS)));
            h.advance(LEASE + MAX_IN_FLIGHT + 1);
        }
        // Reported ambiguous a second after the grant: that is its last dispatch.
        "unknown, at max-in-flight's end" => {
            unknown_record(&h, "k", policy());
            h.advance(MAX_IN_FLIGHT);
        }
        "unknown, a moment past max-in-flight" => {
            unknown_record(&h, "k", policy());
            h.advance(MAX_IN_FLIGHT + 1);
        }
        "unknown, max-in-flight not passed" => {
            unknown_record(&h, "k", policy());
        }
        "unknown, max-in-flight passed" => {
            unknown_record(&h, "k", policy());
            h.advance(LEASE + MAX_IN_FLIGHT + SECOND);
        }
        "unknown, the provider claims keys" => {
            let mut p = policy();
            p.provider_claims_key = true;
            p.key_sent_by_host = true;
            unknown_record(&h, "k", p);
        }
        "unknown, no lookup" => {
            unknown_record(&h, "k", without_lookup());
        }
        "absent (forced)" => {
            unknown_record(&h, "k", policy());
            resolve(&h, "s", "k", Resolution::Absent, "forced", true).unwrap();
        }
        "failed" => rejected_k(&h),
        "confirmed" => {
            let e = execute_of(go(&h, refund("k", ARGS)));
            fin(&h, "k", &e.fence, success(RECEIPT));
        }
        "superseded" => {
            rejected_k(&h);
            let mut next = refund("k2", ARGS);
            next.supersedes = Some("k".into());
            execute_of(go(&h, next));
        }
        "awaiting approval" => {
            go(&h, with_policy(refund("k", ARGS), always_approved()));
        }
        "denied" => {
            go(&h, with_policy(refund("k", ARGS), always_approved()));
            resolve(&h, "s", "k", Resolution::Deny, "ops: no", false).unwrap();
        }
        "approved, owed" => {
            go(&h, with_policy(refund("k", ARGS), always_approved()));
            resolve(&h, "s", "k", Resolution::Approve, "ops: yes", false).unwrap();
        }
        other => panic!("no state {other}"),
    }
    h
}

#[test]
fn every_state_is_resolvable_as_the_view_says() {
    for &(name, state, expected) in STATES {
        let h = build(name);
        let v = view(&h, "k");
        assert_eq!(v.state, state, "{name}");
        assert_eq!(v.resolvable, expected, "{name}");
    }
}

/// `resolve` accepts exactly what `resolvable` offers: every state, both
/// resolutions, with and without force, each on a fresh copy of the state.
#[test]
fn resolve_accepts_exactly_what_resolvable_says() {
    let tries = [
        (Resolution::Confirmed(RECEIPT.into()), false),
        (Resolution::Confirmed(RECEIPT.into()), true),
        (Resolution::Absent, false),
        (Resolution::Absent, true),
        (Resolution::Approve, false),
        (Resolution::Deny, false),
    ];
    let mut accepted = 0;
    for &(name, _, _) in STATES {
        for (resolution, force) in &tries {
            let h = build(name);
            let before = inspect(&h, "s", "k").unwrap().unwrap();
            let can = before.resolvable;
            let offered = match resolution {
                Resolution::Confirmed(_) => can.confirmed,
                Resolution::Absent => can.absent && (*force || !can.absent_needs_force),
                Resolution::Approve | Resolution::Deny => can.approve,
            };
            let got = resolve(&h, "s", "k", resolution.clone(), "table", *force);
            let after = view(&h, "k");
            match got {
                Ok(state) => {
                    assert!(
                        offered,
                        "{name}: {resolution:?} force={force} was accepted but not offered"
                    );
                    assert_eq!(state, after.state);
                    assert_eq!(after.version, before.version + 1, "{name}: one audited write");
                    accepted += 1;
                }
                Err(Error::InvalidTransition(why)) => {
                    assert!(
                        !offered,
                        "{name}: {resolution:?} force={force} was offered but refused: {why}"
                    );
                    assert_eq!(after.version, before.version, "{name}: a refusal writes nothing");
                }
                Err(e) => panic!("{name}: {resolution:?} force={force}: {e:?}"),
            }
        }
    }
    // Not vacuous: both answers occur.
    assert!(accepted > 0 && accepted < STATES.len() * tries.len());
}
