//! A person approves high-value calls (DESIGN.md "Authority"): the tool's
//! `approval` rule holds an attempt until an approval of that exact payload,
//! still valid, is recorded; each approval lets one attempt that may reach
//! the provider go out, so an owed redispatch after a lost reply asks again;
//! a denial ends the operation and releases its spend.

mod common;

use common::*;
use once_guest::engine::{queue, reconcile, resolve};
use once_guest::host::Host;
use once_guest::policy::ApprovalRule;
use once_guest::protocol::start_request;
use once_guest::testing::MemoryHost;
use once_guest::types::{
    Attention, BlockReason, Decision, Effect, Ending, Error, Evidence, Outcome, Repeat, Resolution, State,
};

fn awaiting(d: Decision) -> once_guest::types::ApprovalInfo {
    match d {
        Decision::AwaitingApproval(info) => info,
        other => panic!("expected awaiting-approval, got {other:?}"),
    }
}

fn approve(h: &MemoryHost, key: &str) {
    assert_eq!(
        resolve(
            h,
            "s",
            key,
            Resolution::Approve,
            "ops@example: checked with the customer",
            false
        ),
        Ok(State::Absent)
    );
}

#[test]
fn above_the_threshold_nothing_is_sent_until_a_person_approves_then_exactly_once() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    let info = awaiting(go(&h, pay("k", "250.00", &p)));
    assert_eq!(info.asked_at, T0);
    assert_eq!(info.reason, "/amount is 250.00, above 100.00");
    assert_eq!(view(&h, "k").attempts, 0, "nothing granted");
    // The spend is held while a person decides.
    assert_eq!(quota_used(&h), 25_000);
    // The same call again waits for the same decision.
    awaiting(go(&h, pay("k", "250.00", &p)));
    let q = queue(&h, &everything(), 10).unwrap();
    assert_eq!(q.entries.len(), 1);
    assert_eq!(q.entries[0].attention, Attention::Approval);
    assert_eq!(q.entries[0].reason.as_deref(), Some("/amount is 250.00, above 100.00"));
    assert_eq!(q.entries[0].deadline, Some(T0 + DAY), "denied unless approved by then");

    approve(&h, "k");
    let g = execute_of(go(&h, pay("k", "250.00", &p)));
    assert_eq!(g.attempt, 1);
    fin(&h, "k", &g.fence, success(RECEIPT));
    assert_eq!(replay_of(go(&h, pay("k", "250.00", &p))).receipt, RECEIPT);
    let v = view(&h, "k");
    assert_eq!(v.attempts, 1);
    assert_eq!(quota_used(&h), 25_000, "counted once");
    assert!(
        kinds(&v).starts_with(&["approval-asked", "approved", "owed-dispatch"]),
        "{:?}",
        kinds(&v)
    );
    let approved = v.audit.iter().find(|e| e.kind == "approved").unwrap();
    let detail: serde_json::Value = serde_json::from_str(&approved.detail).unwrap();
    assert_eq!(detail["note"], "ops@example: checked with the customer");
    assert_eq!(detail["fingerprint"], v.fingerprint.as_str());
    check_audit(&v);
}

#[test]
fn at_or_below_the_threshold_the_call_is_sent_at_once() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    execute_of(go(&h, pay("k1", "100.00", &p)));
    execute_of(go(&h, pay("k2", "99.99", &p)));
}

#[test]
fn a_changed_amount_never_runs_on_the_old_approval() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    awaiting(go(&h, pay("k", "150.00", &p)));
    approve(&h, "k");
    // The same key with a larger amount is another payload: a conflict, nothing sent.
    assert!(matches!(go(&h, pay("k", "900.00", &p)), Decision::Conflict(_)));
    // A new key with the larger amount is a new operation, and asks a person again.
    awaiting(go(&h, pay("k2", "900.00", &p)));
    // A derived key (no application key) follows the args: a new amount, a new approval.
    let mut derived = pay("k", "901.00", &p);
    derived.keys.clear();
    awaiting(go(&h, derived));
    assert_eq!(view(&h, "k").attempts, 0);
}

#[test]
fn an_approval_expires() {
    let h = MemoryHost::new();
    let mut p = approval_above("100.00");
    p.approval_valid_ms = 10 * SECOND;
    awaiting(go(&h, pay("k", "150.00", &p)));
    approve(&h, "k");
    h.advance(10 * SECOND);
    let info = awaiting(go(&h, pay("k", "150.00", &p)));
    assert_eq!(info.asked_at, h.now());
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::AwaitingApproval, 0));
    let asked = v.audit.iter().rev().find(|e| e.kind == "approval-asked").unwrap();
    assert!(asked.detail.contains("expired_approval_at"), "{}", asked.detail);
    // Approved again, within its validity, it goes out.
    approve(&h, "k");
    execute_of(go(&h, pay("k", "150.00", &p)));
}

#[test]
fn an_owed_redispatch_after_a_lost_reply_needs_a_new_approval() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    awaiting(go(&h, pay("k", "150.00", &p)));
    approve(&h, "k");
    let g = execute_of(go(&h, pay("k", "150.00", &p)));
    h.advance(SECOND);
    fin(&h, "k", &g.fence, ambiguous());
    h.advance(LEASE + MAX_IN_FLIGHT + SECOND);
    h.script_lookup(Evidence::Absent(h.now()));
    // Proven absent: the dispatch is owed, but the first approval was used up by attempt 1.
    awaiting(reconcile(&h, "s", "k").unwrap());
    assert_eq!(view(&h, "k").attempts, 1);
    approve(&h, "k");
    let g2 = execute_of(go(&h, pay("k", "150.00", &p)));
    assert_eq!((g2.attempt, g2.provider_key.as_str()), (2, g.provider_key.as_str()));
}

#[test]
fn an_attempt_that_was_not_sent_keeps_its_approval() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    awaiting(go(&h, pay("k", "150.00", &p)));
    approve(&h, "k");
    let g = execute_of(go(&h, pay("k", "150.00", &p)));
    fin(&h, "k", &g.fence, Outcome::NotSent);
    h.advance(MAX_IN_FLIGHT);
    let g2 = execute_of(go(&h, pay("k", "150.00", &p)));
    assert_eq!(g2.attempt, 2);
    // A rejection reached the provider: the next attempt asks again.
    fin(&h, "k", &g2.fence, rejected());
    awaiting(go(&h, pay("k", "150.00", &p)));
}

#[test]
fn a_denial_ends_the_operation_and_releases_its_spend() {
    let h = MemoryHost::new();
    let p = approval_above("100.00");
    awaiting(go(&h, pay("k", "250.00", &p)));
    assert_eq!(quota_used(&h), 25_000);
    assert_eq!(
        resolve(&h, "s", "k", Resolution::Deny, "ops@example: not this customer", false),
        Ok(State::Denied)
    );
    assert_eq!(quota_used(&h), 0);
    let b = blocked_of(go(&h, pay("k", "250.00", &p)), BlockReason::ApprovalDenied);
    assert!(
        b.detail.contains("a person denied it: ops@example: not this customer"),
        "{}",
        b.detail
    );
    let a = done(start_request(&h, pay("k", "250.00", &p)).unwrap());
    assert_eq!(
        (a.effect, a.repeat, a.awaits_operator),
        (Effect::None, Repeat::Refused, false)
    );
    assert_eq!(view(&h, "k").attempts, 0);
    // Decided once: neither can be decided again.
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Approve, "ops: changed my mind", false),
        Err(Error::InvalidTransition(_))
    ));
}

#[test]
fn the_caller_is_told_a_person_must_approve_and_that_nothing_was_sent() {
    let h = MemoryHost::new();
    let a = done(start_request(&h, pay("k", "250.00", &approval_above("100.00"))).unwrap());
    let Ending::AwaitsApproval(info) = &a.ending else {
        panic!("{a:?}")
    };
    assert_eq!(info.valid_ms, 3_600 * SECOND);
    assert_eq!(
        (a.effect, a.repeat, a.awaits_operator),
        (Effect::None, Repeat::Waits, true)
    );
}

#[test]
fn an_amount_the_rule_cannot_read_needs_approval() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.approval = ApprovalRule::Above {
        field: "/amount".into(),
        above: "100".into(),
    };
    for (key, args, why) in [
        ("k1", r#"{"order":1}"#, "/amount is missing"),
        (
            "k2",
            r#"{"amount":"lots"}"#,
            "/amount: \"lots\" is not a decimal amount",
        ),
        ("k3", r#"{"amount":{"v":1}}"#, "/amount is not a number"),
        ("k4", r#"{"amount":-5}"#, "/amount: \"-5\" is negative"),
    ] {
        let info = awaiting(go(&h, req("s", Some(key), "pay", args, p.clone())));
        assert!(info.reason.starts_with(why), "{key}: {}", info.reason);
    }
    execute_of(go(&h, req("s", Some("k5"), "pay", r#"{"amount":"100"}"#, p)));
}

#[test]
fn a_rule_on_a_field_outside_the_payload_or_a_bad_threshold_is_refused() {
    let h = MemoryHost::new();
    let mut p = approval_above("100.00");
    p.effect_fields = Some(vec!["/to".into()]);
    p.quota = None;
    let e = once_guest::engine::begin(&h, pay("k", "1", &p)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.contains("approval field \"/amount\" must be one of the effect fields")),
        "{e:?}"
    );
    let p = approval_above("ten");
    let e = once_guest::engine::begin(&h, pay("k", "1", &p)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.contains("approval threshold")),
        "{e:?}"
    );
    let mut p = always_approved();
    p.approval_valid_ms = 0;
    assert!(once_guest::engine::begin(&h, refund("k", ARGS)).is_ok());
    assert!(matches!(
        once_guest::engine::begin(&h, with_policy(refund("k9", ARGS), p)),
        Err(Error::InvalidPolicy(_))
    ));
}

#[test]
fn a_decision_needs_a_note_and_a_record_awaiting_one() {
    let h = MemoryHost::new();
    awaiting(go(&h, with_policy(refund("k", ARGS), always_approved())));
    assert!(matches!(
        resolve(&h, "s", "k", Resolution::Approve, "  ", false),
        Err(Error::InvalidRequest(_))
    ));
    execute_of(go(&h, refund("plain", ARGS)));
    assert!(matches!(
        resolve(&h, "s", "plain", Resolution::Approve, "ops", false),
        Err(Error::InvalidTransition(_))
    ));
}

#[test]
fn the_sweep_escalates_a_call_awaiting_approval_and_sends_it_once_approved() {
    let h = MemoryHost::new();
    awaiting(go(&h, with_policy(refund("k", ARGS), always_approved())));
    once_guest::engine::sweep(&h, 10).unwrap();
    let e = h.escalations();
    assert_eq!(e.len(), 1);
    assert_eq!(
        (e[0].reason.as_str(), e[0].state),
        ("approval", State::AwaitingApproval)
    );
    approve(&h, "k");
    let swept = once_guest::engine::sweep(&h, 10).unwrap();
    assert_eq!(swept.owed, vec![("s".to_string(), "k".to_string())]);
    execute_of(reconcile(&h, "s", "k").unwrap());
    // Taken by the sweep's grant: a second grant is not given on the same approval.
    assert!(matches!(
        go(&h, with_policy(refund("k", ARGS), always_approved())),
        Decision::InFlight(_)
    ));
}

#[test]
fn an_earlier_attempts_late_success_confirms_a_call_awaiting_approval_or_denied() {
    for deny in [false, true] {
        let h = MemoryHost::new();
        let mut p = approval_above("100.00");
        p.lookup = false;
        awaiting(go(&h, pay("k", "150.00", &p)));
        approve(&h, "k");
        let g = execute_of(go(&h, pay("k", "150.00", &p)));
        h.advance(SECOND);
        fin(&h, "k", &g.fence, ambiguous());
        // An operator forces the absence early; the owed redispatch waits for a person again.
        resolve(
            &h,
            "s",
            "k",
            Resolution::Absent,
            "ops: the bank shows nothing yet",
            true,
        )
        .unwrap();
        awaiting(go(&h, pay("k", "150.00", &p)));
        if deny {
            resolve(&h, "s", "k", Resolution::Deny, "ops: not again", false).unwrap();
            assert_eq!(quota_used(&h), 0);
        }
        // Attempt 1's holder reports after all: the effect happened, recorded and counted once.
        assert_eq!(
            fin(&h, "k", &g.fence, success(RECEIPT)),
            once_guest::types::FinishAck::Recorded(State::Confirmed)
        );
        let v = view(&h, "k");
        assert_eq!(
            (v.state, v.attempts, v.possible_duplicate),
            (State::Confirmed, 1, false)
        );
        assert!(body(&v).get("approval").is_none(), "no approval left to send on");
        assert_eq!(quota_used(&h), 15_000, "counted once (deny {deny})");
        assert_eq!(replay_of(go(&h, pay("k", "150.00", &p))).receipt, RECEIPT);
    }
}

#[test]
fn a_call_asked_again_after_a_rejection_holds_its_spend_while_a_person_decides() {
    let h = MemoryHost::new();
    let mut p = approval_above("100.00");
    p.quota.as_mut().unwrap().ceiling = "200.00".into();
    awaiting(go(&h, pay("k", "150.00", &p)));
    approve(&h, "k");
    let g = execute_of(go(&h, pay("k", "150.00", &p)));
    fin(&h, "k", &g.fence, rejected());
    assert_eq!(quota_used(&h), 0, "a rejection releases it");
    awaiting(go(&h, pay("k", "150.00", &p)));
    assert_eq!(quota_used(&h), 15_000, "held again while a person decides");
    // Another call cannot take the ceiling meanwhile, so the approved retry is not refused for it.
    blocked_of(go(&h, pay("other", "60.00", &p)), BlockReason::Quota);
    approve(&h, "k");
    assert_eq!(execute_of(go(&h, pay("k", "150.00", &p))).attempt, 2);
    assert_eq!(quota_used(&h), 15_000);
}

#[test]
fn a_tool_held_for_approval_is_never_routed_direct() {
    let h = MemoryHost::new();
    let mut p = always_approved();
    p.route = Some(once_guest::types::Route::Direct);
    let e = once_guest::engine::begin(&h, with_policy(refund("k", ARGS), p)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.contains("approval needs a protected route")),
        "{e:?}"
    );
    // A server that calls the tool read-only does not make it direct either.
    let mut r = with_policy(refund("k", ARGS), always_approved());
    r.descriptor = Some(once_guest::types::ToolDescriptor {
        name: "refund".into(),
        input_schema: "{}".into(),
        annotations: Some(r#"{"readOnlyHint":true}"#.into()),
    });
    awaiting(go(&h, r));
}

#[test]
fn nobody_approving_in_time_denies_the_call_and_releases_its_spend() {
    for by_sweep in [false, true] {
        let h = MemoryHost::new();
        let mut p = approval_above("100.00");
        p.approval_wait_ms = 60 * SECOND;
        let info = awaiting(go(&h, pay("k", "150.00", &p)));
        assert_eq!(info.wait_until, T0 + 60 * SECOND);
        h.advance(60 * SECOND - 1);
        awaiting(go(&h, pay("k", "150.00", &p)));
        assert_eq!(quota_used(&h), 15_000);
        h.advance(1);
        if by_sweep {
            once_guest::engine::sweep(&h, 10).unwrap();
            assert_eq!(view(&h, "k").state, State::Denied);
        }
        let b = blocked_of(go(&h, pay("k", "150.00", &p)), BlockReason::ApprovalDenied);
        assert!(b.detail.contains("nobody approved it within 60000 ms"), "{}", b.detail);
        assert_eq!(quota_used(&h), 0, "released (sweep {by_sweep})");
        let v = view(&h, "k");
        assert_eq!((v.state, v.attempts), (State::Denied, 0));
        assert!(kinds(&v).contains(&"approval-expired"), "{:?}", kinds(&v));
        // Too late to approve.
        assert!(matches!(
            resolve(&h, "s", "k", Resolution::Approve, "ops: sorry, late", false),
            Err(Error::InvalidTransition(_))
        ));
    }
}
