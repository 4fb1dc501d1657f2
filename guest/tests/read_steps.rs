//! The provider read as a protocol step (configuration `reads: steps`): a
//! decision that needs the provider stops with `read`, writes nothing on the
//! read's strength, and `read-back` goes on from the ledger as it is then,
//! using the evidence only where the same read is still needed.

mod common;

use common::*;
use once_guest::host::Host;
use once_guest::protocol::{read_back, report, resume, start_request, sweep};
use once_guest::testing::MemoryHost;
use once_guest::types::{
    BlockReason, Confirmation, Effect, Ending, Error, Evidence, Grant, Outcome, Reading, Repeat, State, Step, Table,
};

fn stepping() -> MemoryHost {
    MemoryHost::new().with_read_steps()
}

/// A grant sent and its reply lost: the step after it.
fn lost(h: &MemoryHost, key: &str) -> (Grant, Step) {
    let g = dispatch(start_request(h, refund(key, ARGS)).unwrap());
    h.advance(SECOND);
    let step = report(
        h,
        &g.scope,
        &g.key,
        &g.fence,
        Outcome::Ambiguous("connection reset".into()),
    )
    .unwrap();
    (g, step)
}

#[test]
fn a_lost_reply_s_read_is_the_host_s_step_and_what_it_found_is_brought_back() {
    let h = stepping();
    let (g, step) = lost(&h, "k");
    let r = read_step(step);
    assert_eq!(
        (
            r.scope.as_str(),
            r.key.as_str(),
            r.tool.as_str(),
            r.provider_key.as_str(),
            r.args.as_str()
        ),
        ("s", "k", "refund", g.provider_key.as_str(), g.args.as_str())
    );
    assert_eq!(r.asked_at, h.now());
    assert!(h.lookups().is_empty(), "the guest waited for no provider inside a step");
    assert_eq!(
        view(&h, "k").state,
        State::Unknown,
        "nothing written on a read not made yet"
    );

    let Step::Done(a) = read_back(&h, None, r, Evidence::Confirmed(RECEIPT.into())).unwrap() else {
        panic!("a found effect is done")
    };
    let Ending::Confirmed(c) = &a.ending else {
        panic!("{a:?}")
    };
    assert_eq!(
        (c.confirmed_by, a.effect, a.repeat),
        (Confirmation::Provider, Effect::Happened, Repeat::Replays)
    );
    assert_eq!(view(&h, "k").state, State::Confirmed);
    assert!(h.lookups().is_empty());
}

#[test]
fn an_absence_brought_back_counts_from_its_own_read_position_not_from_when_it_came_back() {
    let h = stepping();
    let (_, step) = lost(&h, "k");
    let r = read_step(step);
    let read_at = h.now();
    // The read found nothing; it comes back after max_in_flight, when an earlier request may have committed.
    h.advance(MAX_IN_FLIGHT + SECOND);
    let Step::Wait(w) = read_back(&h, None, r, Evidence::Absent(read_at)).unwrap() else {
        panic!("an absence as of the read is no proof past max_in_flight")
    };
    assert_eq!(w.meanwhile.effect, Effect::Unknown);
    assert_eq!(view(&h, "k").state, State::Unknown);
}

#[test]
fn a_record_that_moved_on_while_the_host_read_is_answered_as_it_stands() {
    let h = stepping();
    let (_, step) = lost(&h, "k");
    let first = read_step(step);
    // Another caller reads and finds the effect first.
    let other = read_step(resume(&h, "s", "k").unwrap());
    read_back(&h, None, other, Evidence::Confirmed(RECEIPT.into())).unwrap();
    // The first read, made earlier, found nothing: the record is confirmed, and stays so.
    let h_now = h.now();
    let Step::Done(a) = read_back(&h, None, first, Evidence::Absent(h_now)).unwrap() else {
        panic!("a confirmed record is done")
    };
    assert!(matches!(a.ending, Ending::Confirmed(_)), "{a:?}");
    assert_eq!(view(&h, "k").state, State::Confirmed);
}

#[test]
fn evidence_of_another_read_is_not_used() {
    let h = stepping();
    let (_, step) = lost(&h, "k");
    let mut r = read_step(step);
    r.provider_key = "once-someone-else".into();
    let again = read_step(read_back(&h, None, r, Evidence::Confirmed(RECEIPT.into())).unwrap());
    assert_ne!(
        again.provider_key, "once-someone-else",
        "the record's own read is asked for again"
    );
    assert_eq!(view(&h, "k").state, State::Unknown);
}

#[test]
fn verify_first_asks_before_any_record_and_the_start_goes_on_with_the_call() {
    let h = stepping();
    let mut p = policy();
    p.verify_first = true;
    let call = with_policy(refund("k", ARGS), p);
    let r = read_step(start_request(&h, call.clone()).unwrap());
    assert!(h.row(Table::Operation, "s", "k").is_none(), "no record before the read");

    // A read position before the guest asked proves nothing.
    let early = read_back(&h, Some(call.clone()), r.clone(), Evidence::Absent(r.asked_at - 1)).unwrap();
    let Step::Done(a) = early else { panic!("{early:?}") };
    assert!(
        matches!(&a.ending, Ending::Blocked(b) if b.reason == BlockReason::Unverified),
        "{a:?}"
    );
    assert!(h.row(Table::Operation, "s", "k").is_none());

    let r = read_step(start_request(&h, call.clone()).unwrap());
    h.advance(SECOND);
    let g = dispatch(read_back(&h, Some(call), r.clone(), Evidence::Absent(h.now())).unwrap());
    assert_eq!((g.attempt, g.provider_key.as_str()), (1, r.provider_key.as_str()));
    assert!(h.lookups().is_empty());
}

#[test]
fn a_sweep_lists_due_reads_and_reads_nothing() {
    let h = stepping();
    let (_, step) = lost(&h, "k");
    read_step(step);
    // Past max_in_flight and the declared skew after the dispatch: an absence read now proves it.
    h.advance(MAX_IN_FLIGHT + SECOND);
    let swept = sweep(&h, 10, true).unwrap();
    assert_eq!(swept.reads, vec![("s".to_string(), "k".to_string())]);
    assert_eq!((swept.reconciled, swept.confirmed), (0, 0));
    assert!(swept.dispatches.is_empty());
    assert!(h.lookups().is_empty());
    // The host resumes it: its first step is the read.
    let r = read_step(resume(&h, "s", "k").unwrap());
    let g = dispatch(read_back(&h, None, r, Evidence::Absent(h.now())).unwrap());
    assert_eq!(g.attempt, 2);
}

#[test]
fn read_back_is_refused_where_reads_happen_inside_the_steps() {
    let h = MemoryHost::new();
    let r = Reading {
        scope: "s".into(),
        key: "k".into(),
        tool: "refund".into(),
        provider_key: "pk".into(),
        args: ARGS.into(),
        asked_at: 0,
    };
    let refused = read_back(&h, None, r, Evidence::Absent(0));
    assert!(
        matches!(refused, Err(Error::InvalidRequest(ref why)) if why.contains("reads: import")),
        "{refused:?}"
    );
}

/// A successor with verify-first over an original whose first request may have committed unseen
/// (its absence proven by the provider's claim before max-in-flight) needs two reads: the
/// original's, then its own. The first is recorded on the original before the second is asked
/// for, so the start goes on with one read brought back at a time and never asks for the same
/// one twice.
#[test]
fn a_supersede_reads_the_original_then_verifies_itself() {
    let h = stepping();
    let mut p = policy();
    p.provider_claims_key = true;
    p.key_sent_by_host = true;
    p.verify_first = true;
    let first = |h: &MemoryHost, r| match start_request(h, r).unwrap() {
        Step::Read(reading) => read_back(
            h,
            Some(with_policy(refund("orig", ARGS), p.clone())),
            reading,
            Evidence::Absent(h.now()),
        ),
        other => Ok(other),
    };
    let g1 = dispatch(first(&h, with_policy(refund("orig", ARGS), p.clone())).unwrap());
    h.advance(SECOND);
    let r = read_step(report(&h, &g1.scope, &g1.key, &g1.fence, Outcome::Ambiguous("reset".into())).unwrap());
    h.advance(5 * SECOND);
    let g2 = dispatch(read_back(&h, None, r, Evidence::Absent(h.now())).unwrap());
    assert_eq!(
        g2.provider_key, g1.provider_key,
        "the claim proved it absent at once: owed, same key"
    );
    let done = report(&h, &g2.scope, &g2.key, &g2.fence, Outcome::Rejected("declined".into())).unwrap();
    assert!(matches!(done, Step::Done(_)), "{done:?}");
    assert_eq!(view(&h, "orig").state, State::Failed);

    h.advance(MAX_IN_FLIGHT);
    let mut successor = with_policy(refund("succ", r#"{"order":1234,"amount":150}"#), p.clone());
    successor.supersedes = Some("orig".into());
    let asked = read_step(start_request(&h, successor.clone()).unwrap());
    assert_eq!((asked.key.as_str(), &asked.provider_key), ("orig", &g1.provider_key));
    let mine = read_step(read_back(&h, Some(successor.clone()), asked, Evidence::Absent(h.now())).unwrap());
    assert_eq!(mine.key, "succ", "then its own verify-first read");
    assert_eq!(
        view(&h, "orig").state,
        State::Failed,
        "the original's read is recorded, not yet superseded"
    );
    let g = dispatch(read_back(&h, Some(successor), mine, Evidence::Absent(h.now())).unwrap());
    assert_eq!((g.key.as_str(), g.attempt), ("succ", 1));
    assert_eq!(view(&h, "orig").state, State::Superseded);
}
