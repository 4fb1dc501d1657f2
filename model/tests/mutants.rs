//! The checker has teeth: each deliberate bug in the engine (`once-guest`'s
//! `mutants` feature, src/mutant.rs) is caught, in the configuration named
//! here, by the property named here.

use once_guest::mutant::Mutant;
use once_model::configs;
use once_model::model::PROPERTIES;
use once_model::trace::check_until_broken;

fn caught(mutant: Mutant, config: &str, property: &str) {
    let mut c = configs::small()
        .into_iter()
        .find(|c| c.name == config)
        .expect("a configuration of that name");
    c.mutant = Some(mutant);
    let report = check_until_broken(c);
    let found = report
        .counterexamples
        .iter()
        .find(|cx| cx.property == property)
        .unwrap_or_else(|| {
            let others: Vec<String> = report.counterexamples.iter().map(|cx| cx.render()).collect();
            panic!(
                "{mutant:?} was not caught by {property:?}: {}\n{}",
                report.summary(),
                others.join("\n")
            )
        });
    println!("{mutant:?} caught in {config}:\n{}", found.render());
}

#[test]
fn an_unknown_dispatched_without_a_read() {
    caught(
        Mutant::DispatchUnknownWithoutRead,
        "one key, two callers",
        PROPERTIES[1],
    );
}

#[test]
fn absence_proven_before_max_in_flight() {
    caught(Mutant::SkipMaxInFlight, "reads beside a lost reply", PROPERTIES[1]);
}

#[test]
fn absence_proven_before_max_in_flight_inside_the_steps() {
    caught(
        Mutant::SkipMaxInFlight,
        "one key, two callers inside the steps",
        PROPERTIES[1],
    );
}

#[test]
fn a_read_brought_back_taken_as_of_then() {
    caught(Mutant::ReadBackTakenAsNow, "reads beside a lost reply", PROPERTIES[0]);
}

#[test]
fn a_tombstone_that_says_none() {
    caught(Mutant::TombstoneSaysNone, "prune and reuse", PROPERTIES[0]);
}

#[test]
fn a_second_success_not_flagged() {
    caught(Mutant::ForgetSecondSuccess, "forced absence", PROPERTIES[4]);
}

#[test]
fn a_sweep_that_takes_another_owners_record() {
    caught(Mutant::SweepTakesOtherOwners, "two hosts", PROPERTIES[0]);
}

#[test]
fn another_owners_owed_dispatch_answered_none() {
    caught(
        Mutant::OtherOwnersOwedSaysNone,
        "another owner's owed dispatch",
        PROPERTIES[0],
    );
}

#[test]
fn a_reservation_applied_twice() {
    caught(Mutant::DoubleReservation, "quota pair", PROPERTIES[0]);
}

#[test]
fn a_provider_key_without_its_scope() {
    caught(Mutant::ReadAcrossScopes, "two scopes", PROPERTIES[0]);
}

#[test]
fn a_grant_beside_a_live_lease() {
    caught(Mutant::GrantWhileLeaseLive, "one key, two callers", PROPERTIES[1]);
}

#[test]
fn a_stale_fence_taken_as_current() {
    caught(Mutant::SkipFenceCheck, "stale holder", PROPERTIES[1]);
}

#[test]
fn a_pending_escalation_dropped() {
    caught(
        Mutant::DropEscalationOnTransition,
        "pending possible duplicate",
        PROPERTIES[0],
    );
}

#[test]
fn an_adopted_unknown_taken_as_absent() {
    caught(Mutant::AdoptStartsOver, "renamed and adopted", PROPERTIES[1]);
}

#[test]
fn a_not_sent_attempt_retried_at_once() {
    caught(Mutant::NotSentRetriesAtOnce, "one key, two callers", PROPERTIES[0]);
}

#[test]
fn a_grant_handed_out_after_its_send_window() {
    caught(Mutant::NoLeaseRenewal, "slow ledger", PROPERTIES[0]);
}

#[test]
fn every_mutant_has_a_test() {
    assert_eq!(Mutant::ALL.len(), 25, "a new mutant needs a test above");
}

#[test]
fn a_supersede_over_an_original_that_may_still_commit() {
    caught(
        Mutant::SupersedeDespiteLateEffect,
        "supersede after a claimed absence",
        PROPERTIES[1],
    );
}

#[test]
fn a_supersede_after_max_in_flight_without_a_read() {
    caught(
        Mutant::SupersedeUnreadAfterMaxInFlight,
        "supersede after a claimed absence",
        PROPERTIES[1],
    );
}

#[test]
fn a_call_above_the_threshold_sent_without_approval() {
    caught(Mutant::NoApprovalGate, "approval above a threshold", PROPERTIES[6]);
}

#[test]
fn an_approval_taken_after_it_expired() {
    caught(
        Mutant::ApprovalNeverExpires,
        "approval above a threshold",
        PROPERTIES[6],
    );
}

#[test]
fn an_approval_used_again_for_an_owed_redispatch() {
    caught(Mutant::ApprovalReused, "approval of an owed redispatch", PROPERTIES[6]);
}

#[test]
fn a_read_through_a_rotated_credential_taken_as_proof_of_absence() {
    caught(
        Mutant::OtherAccountReadProvesAbsent,
        "credential rotation while unknown",
        PROPERTIES[0],
    );
}

#[test]
fn another_accounts_call_answered_with_the_receipt() {
    caught(
        Mutant::OtherAccountAnswered,
        "credential rotation while unknown",
        PROPERTIES[0],
    );
}

#[test]
fn a_restored_ledger_granted_without_asking_the_witness() {
    caught(
        Mutant::WitnessUnread,
        "a ledger restored from an older backup",
        PROPERTIES[0],
    );
}

#[test]
fn a_grant_sent_without_being_kept_in_the_witness() {
    caught(
        Mutant::WitnessNotKept,
        "a ledger restored from an older backup",
        PROPERTIES[0],
    );
}

#[test]
fn a_restored_record_short_of_its_last_attempt_granted_another() {
    caught(
        Mutant::WitnessUnreadOnRetry,
        "a ledger restored to before the last attempt",
        PROPERTIES[0],
    );
}
