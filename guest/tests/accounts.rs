//! A record is bound to the provider account it was begun under (DESIGN.md
//! "Authority"): a call through another account is neither replayed nor sent,
//! every attempt goes out through the record's own account, and a read through
//! another account (a rotated credential) never proves the effect absent.

mod common;

use common::*;
use once_guest::engine::{reconcile, resolve};
use once_guest::host::Host;
use once_guest::policy::Policy;
use once_guest::protocol::{start_request, sweep};
use once_guest::testing::MemoryHost;
use once_guest::types::{BlockReason, Decision, Effect, Ending, Error, Evidence, Repeat, Resolution, State};

const OLD: &str = "sha256:old-credential";
const NEW: &str = "sha256:rotated-credential";

/// The default policy, sent and read through `account`.
fn through(account: &str) -> Policy {
    let mut p = policy();
    p.provider_account = Some(account.to_string());
    p
}

/// `refund` of `key` through `account`, with the host switched to that account as well (the
/// component's begin takes its policy from the same configuration the host's reads do).
fn call(h: &MemoryHost, key: &str, account: &str) -> Decision {
    h.use_account(Some(account));
    go(h, with_policy(refund(key, ARGS), through(account)))
}

#[test]
fn a_call_through_another_account_is_neither_replayed_nor_sent() {
    let h = MemoryHost::new();
    let g = execute_of(call(&h, "k", OLD));
    fin(&h, "k", &g.fence, success(RECEIPT));
    let version = view(&h, "k").version;

    let b = blocked_of(call(&h, "k", NEW), BlockReason::OtherAccount);
    assert!(b.detail.contains(OLD) && b.detail.contains(NEW), "{}", b.detail);
    assert_eq!(b.receipt, None, "another account is not shown the receipt");
    assert_eq!(view(&h, "k").version, version, "nothing written");

    // The caller is told what the ledger knows of the effect: it happened, never "none".
    h.use_account(Some(NEW));
    let a = done(start_request(&h, with_policy(refund("k", ARGS), through(NEW))).unwrap());
    assert!(
        matches!(&a.ending, Ending::Blocked(b) if b.reason == BlockReason::OtherAccount),
        "{a:?}"
    );
    assert_eq!((a.effect, a.repeat), (Effect::Happened, Repeat::Refused));

    // A host that names no account is not the record's either; its own account's host replays.
    h.use_account(None);
    blocked_of(go(&h, refund("k", ARGS)), BlockReason::OtherAccount);
    assert_eq!(replay_of(call(&h, "k", OLD)).receipt, RECEIPT);
    assert_eq!(view(&h, "k").attempts, 1);
}

#[test]
fn a_rotated_credential_never_proves_an_unknown_operation_absent() {
    let h = MemoryHost::new();
    h.use_account(Some(OLD));
    unknown_record(&h, "k", through(OLD));
    h.advance(MAX_IN_FLIGHT + 10 * SECOND);
    let version = view(&h, "k").version;

    // The credential is rotated: the new one's reads may not see the old one's effect, so this host
    // neither reads nor answers it, whatever the provider would say.
    h.use_account(Some(NEW));
    let b = blocked_of(reconcile(&h, "s", "k").unwrap(), BlockReason::OtherAccount);
    assert!(b.detail.contains(OLD) && b.detail.contains(NEW), "{}", b.detail);
    blocked_of(call(&h, "k", NEW), BlockReason::OtherAccount);
    h.advance(DEADLINE);
    let swept = sweep(&h, 10, true).unwrap();
    assert_eq!((swept.reconciled, swept.dispatches.len()), (0, 0), "{swept:?}");
    assert!(h.lookups().is_empty(), "nothing read through the new account");
    let v = view(&h, "k");
    assert_eq!((v.state, v.attempts), (State::Unknown, 1), "not absent, nothing owed");
    assert!(
        h.escalations().iter().any(|e| e.key == "k"),
        "past its deadline it waits for an operator"
    );
    // The sweep left it unread once, audited, with no read scheduled: not due again before its deadline.
    let since: Vec<_> = v.audit[version as usize..].iter().collect();
    assert!(
        since.iter().any(|e| e.kind == "reconcile-inconclusive"
            && e.detail.contains("not read through provider account")
            && e.detail.contains(OLD)
            && e.detail.contains(NEW)),
        "{since:?}"
    );
    assert_eq!(body(&v)["next_check"], serde_json::Value::Null);
    let again = sweep(&h, 10, true).unwrap();
    assert_eq!(view(&h, "k").version, v.version, "no second write: {again:?}");

    // Through the old credential again, a read that finds the refund confirms it.
    h.use_account(Some(OLD));
    h.script_lookup(Evidence::Confirmed(RECEIPT.into()));
    assert_eq!(replay_of(reconcile(&h, "s", "k").unwrap()).receipt, RECEIPT);
    assert_eq!(view(&h, "k").attempts, 1);
}

#[test]
fn a_read_through_another_account_that_reaches_the_engine_proves_nothing() {
    // The sweep and reconcile never read another account's record; a read made anyway (the
    // protocol's read step brought back by a host whose account changed meanwhile) proves nothing.
    let h = MemoryHost::new().with_read_steps();
    h.use_account(Some(OLD));
    unknown_record(&h, "k", through(OLD));
    h.advance(MAX_IN_FLIGHT + 10 * SECOND);
    let reading = read_step(once_guest::protocol::resume(&h, "s", "k").unwrap());
    h.use_account(Some(NEW));
    let step = once_guest::protocol::read_back(&h, None, reading, Evidence::Absent(h.now())).unwrap();
    let a = done(step);
    assert!(
        matches!(&a.ending, Ending::Blocked(b) if b.reason == BlockReason::OtherAccount),
        "{a:?}"
    );
    assert_eq!(a.effect, Effect::Unknown);
    assert_eq!(view(&h, "k").state, State::Unknown);
}

#[test]
fn an_absence_read_through_the_records_own_account_still_settles_it() {
    let h = MemoryHost::new();
    h.use_account(Some(OLD));
    unknown_record(&h, "k", through(OLD));
    h.advance(MAX_IN_FLIGHT + 10 * SECOND);
    h.script_lookup(Evidence::Absent(h.now()));
    let g = execute_of(reconcile(&h, "s", "k").unwrap());
    assert_eq!(g.attempt, 2);
}

#[test]
fn an_owed_dispatch_goes_out_only_through_its_own_account() {
    let h = MemoryHost::new();
    h.use_account(Some(OLD));
    unknown_record(&h, "k", through(OLD));
    h.advance(MAX_IN_FLIGHT + 10 * SECOND);
    // An operator settles the absence; the host's credential is rotated before the owed dispatch.
    assert_eq!(
        resolve(&h, "s", "k", Resolution::Absent, "ops: checked the old account", false),
        Ok(State::Absent)
    );
    h.use_account(Some(NEW));
    let swept = sweep(&h, 10, true).unwrap();
    assert!(swept.dispatches.is_empty(), "{swept:?}");
    blocked_of(reconcile(&h, "s", "k").unwrap(), BlockReason::OtherAccount);
    assert_eq!(view(&h, "k").attempts, 1);
    // Back on the record's account, the owed dispatch goes out.
    h.use_account(Some(OLD));
    let swept = sweep(&h, 10, true).unwrap();
    assert_eq!(swept.dispatches.len(), 1);
}

/// Refund "k", begun through the old account under a rule that holds every call for a person: its policy.
fn awaiting_approval_through_old(h: &MemoryHost) -> Policy {
    let mut p = always_approved();
    p.provider_account = Some(OLD.into());
    h.use_account(Some(OLD));
    assert!(matches!(
        go(h, with_policy(refund("k", ARGS), p.clone())),
        Decision::AwaitingApproval(_)
    ));
    p
}

#[test]
fn an_approval_is_used_only_through_the_records_account() {
    let h = MemoryHost::new();
    let p = awaiting_approval_through_old(&h);
    assert_eq!(
        resolve(
            &h,
            "s",
            "k",
            Resolution::Approve,
            "ops: approved for the old account",
            false
        ),
        Ok(State::Absent)
    );
    let mut other = p.clone();
    other.provider_account = Some(NEW.into());
    h.use_account(Some(NEW));
    blocked_of(go(&h, with_policy(refund("k", ARGS), other)), BlockReason::OtherAccount);
    assert!(sweep(&h, 10, true).unwrap().dispatches.is_empty());
    h.use_account(Some(OLD));
    assert_eq!(execute_of(go(&h, with_policy(refund("k", ARGS), p))).attempt, 1);
}

#[test]
fn a_record_that_names_no_account_is_any_accounts() {
    // Records begun before a host named its account (or by hosts that name none) bind none.
    let h = MemoryHost::new();
    let g = execute_of(go(&h, refund("k", ARGS)));
    fin(&h, "k", &g.fence, success(RECEIPT));
    assert_eq!(replay_of(call(&h, "k", NEW)).receipt, RECEIPT);
}

#[test]
fn a_blank_or_unprintable_account_is_refused_before_anything_is_written() {
    let h = MemoryHost::new();
    for bad in ["", "  ", "acct\n1"] {
        let mut p = policy();
        p.provider_account = Some(bad.to_string());
        match once_guest::engine::begin(&h, with_policy(refund("k", ARGS), p)) {
            Err(Error::InvalidPolicy(m)) => assert!(m.contains("provider_account"), "{m}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_nothing_written(&h);
}

#[test]
fn another_accounts_original_is_neither_superseded_nor_shown() {
    let h = MemoryHost::new();
    let g = execute_of(call(&h, "k0", OLD));
    fin(&h, "k0", &g.fence, success(RECEIPT));
    h.use_account(Some(NEW));
    let mut successor = with_policy(refund("k1", r#"{"order":1234,"amount":100}"#), through(NEW));
    successor.supersedes = Some("k0".into());
    let b = blocked_of(go(&h, successor), BlockReason::OtherAccount);
    assert_eq!(b.receipt, None, "another account is not shown the original's receipt");
    assert_eq!(view(&h, "k0").state, State::Confirmed);
    assert!(
        once_guest::engine::inspect(&h, "s", "k1").unwrap().is_none(),
        "no successor recorded"
    );
}

#[test]
fn another_account_is_told_the_effect_may_still_come_while_its_own_may_send_it() {
    // Awaiting a person's approval: its own account's host sends it once approved, so another
    // account's caller is never told "no effect" (it would mint a new key: two refunds).
    let h = MemoryHost::new();
    let mut p = awaiting_approval_through_old(&h);
    p.provider_account = Some(NEW.into());
    h.use_account(Some(NEW));
    let a = done(start_request(&h, with_policy(refund("k", ARGS), p)).unwrap());
    assert!(
        matches!(&a.ending, Ending::Blocked(b) if b.reason == BlockReason::OtherAccount),
        "{a:?}"
    );
    assert_eq!((a.effect, a.repeat), (Effect::Unknown, Repeat::Refused));
}

#[test]
fn a_call_whose_policy_names_another_account_than_its_host_is_refused() {
    let h = MemoryHost::new();
    h.use_account(Some(OLD));
    match once_guest::engine::begin(&h, with_policy(refund("k", ARGS), through(NEW))) {
        Err(Error::InvalidRequest(m)) => assert!(m.contains(OLD) && m.contains(NEW), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_nothing_written(&h);
}
