//! Every small configuration, explored exhaustively up to its depth: no
//! property breaks. One test per configuration, so they run side by side.

use once_model::configs;
use once_model::trace::check;

fn holds(name: &str) {
    let config = configs::small()
        .into_iter()
        .find(|c| c.name == name)
        .expect("a configuration of that name");
    let report = check(config);
    println!("{}", report.summary());
    let traces: Vec<String> = report.counterexamples.iter().map(|c| c.render()).collect();
    assert!(traces.is_empty(), "{}\n{}", report.summary(), traces.join("\n"));
    // A configuration that starts deep in the protocol (a prefix) explores little from there.
    assert!(
        report.unique > 10,
        "{}: too few states to mean anything",
        report.summary()
    );
}

#[test]
fn one_key_two_callers() {
    holds("one key, two callers");
}

#[test]
fn slow_ledger() {
    holds("slow ledger");
}

#[test]
fn lagging_reads() {
    holds("lagging reads");
}

#[test]
fn provider_claims_the_key() {
    holds("provider claims the key");
}

#[test]
fn supersede() {
    holds("supersede");
}

#[test]
fn supersede_after_a_claimed_absence() {
    holds("supersede after a claimed absence");
}

#[test]
fn quota_pair() {
    holds("quota pair");
}

#[test]
fn derived_key_across_its_window() {
    holds("derived key across its window");
}

#[test]
fn prune_and_reuse() {
    holds("prune and reuse");
}

#[test]
fn renamed_and_adopted() {
    holds("renamed and adopted");
}

#[test]
fn another_owners_owed_dispatch() {
    holds("another owner's owed dispatch");
}

#[test]
fn two_hosts() {
    holds("two hosts");
}

#[test]
fn operator() {
    holds("operator");
}

#[test]
fn forced_absence() {
    holds("forced absence");
}

#[test]
fn pending_possible_duplicate() {
    holds("pending possible duplicate");
}

#[test]
fn stale_holder() {
    holds("stale holder");
}

#[test]
fn reads_beside_a_lost_reply() {
    holds("reads beside a lost reply");
}

#[test]
fn lagging_reads_inside_the_steps() {
    holds("lagging reads inside the steps");
}

#[test]
fn one_key_two_callers_inside_the_steps() {
    holds("one key, two callers inside the steps");
}

#[test]
fn two_scopes() {
    holds("two scopes");
}

#[test]
fn approval_above_a_threshold() {
    holds("approval above a threshold");
}

#[test]
fn approval_of_an_owed_redispatch() {
    holds("approval of an owed redispatch");
}

#[test]
fn credential_rotation_while_unknown() {
    holds("credential rotation while unknown");
}

#[test]
fn a_ledger_restored_from_an_older_backup() {
    holds("a ledger restored from an older backup");
}

#[test]
fn a_ledger_restored_to_before_the_last_attempt() {
    holds("a ledger restored to before the last attempt");
}

#[test]
fn every_configuration_has_a_test() {
    let tested = [
        "one key, two callers",
        "one key, two callers inside the steps",
        "slow ledger",
        "lagging reads",
        "lagging reads inside the steps",
        "provider claims the key",
        "supersede",
        "supersede after a claimed absence",
        "quota pair",
        "derived key across its window",
        "prune and reuse",
        "two hosts",
        "renamed and adopted",
        "operator",
        "forced absence",
        "pending possible duplicate",
        "stale holder",
        "another owner's owed dispatch",
        "reads beside a lost reply",
        "two scopes",
        "approval above a threshold",
        "approval of an owed redispatch",
        "credential rotation while unknown",
        "a ledger restored from an older backup",
        "a ledger restored to before the last attempt",
    ];
    for config in configs::small() {
        assert!(tested.contains(&config.name), "{} has no test", config.name);
    }
}
