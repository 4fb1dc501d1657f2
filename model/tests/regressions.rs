//! Counterexamples the checker found in the engine as it was at b58a043
//! (`cargo run --release -p once-model -- small` there, with this model),
//! each replayed step by step: on b58a043 each trace ends in the broken
//! property its comment names; now none does. Since not-sent attempts back
//! off, a trace that sends again after "not sent" first waits it out (`Tick`,
//! `Resume`), which b58a043 (granting at once) would not allow.

use once_model::configs::{self, Config};
use once_model::host::Read::Now;
use once_model::model::{Action, Action::*, Said, Settle};
use once_model::trace::replay;

fn config(name: &str) -> Config {
    let mut c = configs::small()
        .into_iter()
        .find(|c| c.name == name)
        .expect("a configuration of that name");
    // Since not-sent attempts back off, a trace's next attempt after one costs a tick of its own.
    c.budget.ticks += 2;
    c
}

fn holds(name: &str, actions: &[Action]) {
    if let Some((property, why)) = replay(config(name), actions) {
        panic!("{name}: {property}: {why}");
    }
}

/// b58a043: `blocked(storage)` said "effect: none" while a request of the operation could still commit (the
/// claim's write had applied and its answer was lost).
#[test]
fn a_storage_failure_never_says_none() {
    holds(
        "one key, two callers",
        &[
            Start(1, Now),
            Tick,
            Tick,
            Tick,
            Tick,
            Report(1, Said::NotSent),
            // The next attempt after its back-off (the lease's end comes first).
            Tick,
            Tick,
            Resume(1, Now),
            Send(1),
            FailCommit { applied: true },
            Start(0, Now),
        ],
    );
}

/// b58a043: with a provider that claims keys, an absence proven by the claim and a spent
/// budget answered "effect: none" while the earlier request could still commit (a claim stops a
/// second effect, not a late first one).
#[test]
fn a_claim_is_no_proof_of_no_effect() {
    holds(
        "provider claims the key",
        &[
            Start(1, Now),
            Tick,
            Tick,
            Tick,
            Report(1, Said::NotSent),
            // The next attempt after its back-off.
            Tick,
            Resume(1, Now),
            Send(1),
            Report(1, Said::Ambiguous),
            Read(1, Now),
            ReadBack(1),
            Tick,
            Resume(1, Now),
            Read(1, Now),
            ReadBack(1),
        ],
    );
}

/// b58a043: a confirmed key, pruned, answered "expired … mint a new key" with "effect: none":
/// an agent told so repeats the refund.
#[test]
fn a_pruned_confirmed_key_says_it_happened() {
    holds(
        "prune and reuse",
        &[
            Start(0, Now),
            Send(0),
            Commit(0),
            Report(0, Said::Ambiguous),
            Read(0, Now),
            ReadBack(0),
            Tick,
            Tick,
            Tick,
            Prune,
            Start(0, Now),
        ],
    );
}

/// b58a043: a host whose owner name changed never escalated its unknown record: nobody
/// read, dispatched or escalated it again (the fair schedule ends with it unknown, unescalated).
#[test]
fn a_renamed_owners_record_is_escalated() {
    holds(
        "two hosts",
        &[
            Start(1, Now),
            Tick,
            Tick,
            Tick,
            Tick,
            Tick,
            Tick,
            Sweep(1, Now),
            RenameOwner(1),
        ],
    );
}

/// b58a043: after an absence forced before `max_in_flight`, a spent budget answered "effect:
/// none" while the first request could still commit.
#[test]
fn a_spent_budget_after_a_forced_absence_says_unknown() {
    holds(
        "operator",
        &[
            Start(0, Now),
            Tick,
            Tick,
            Tick,
            Report(0, Said::NotSent),
            // The next attempt after its back-off.
            Tick,
            Resume(0, Now),
            Send(0),
            Report(0, Said::Ambiguous),
            Resolve("s".into(), "k0".into(), Settle::Absent { force: true }),
            Start(0, Now),
        ],
    );
}

/// b58a043: the same with the first request sent late in its lease and the owed dispatch granted
/// before the operator's forced absence.
#[test]
fn a_spent_budget_after_a_late_send_says_unknown() {
    holds(
        "forced absence",
        &[
            Start(0, Now),
            Tick,
            Tick,
            Tick,
            Tick,
            Tick,
            Report(0, Said::NotSent),
            // The next attempt after its back-off.
            Tick,
            Resume(0, Now),
            Tick,
            Send(0),
            Tick,
            Tick,
            Sweep(0, Now),
            Resolve("s".into(), "k0".into(), Settle::Absent { force: true }),
            Report(0, Said::Ambiguous),
        ],
    );
}

/// b58a043: prune removed a confirmed record whose possible-duplicate escalation the sink had
/// not acknowledged: the operator never heard of the second effect.
#[test]
fn a_pending_escalation_survives_prune() {
    holds("pending possible duplicate", &[SinkUp, Tick, Tick, Tick, Tick, Prune]);
}
