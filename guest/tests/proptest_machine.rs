//! Random interleavings of begin / finish / reconcile / sweep / prune, clock
//! advances and storage failures over three keys (two scopes), with the
//! DESIGN.md invariants checked after every step:
//!
//! - never two outstanding executes (live, unreported leases) for one key;
//! - no execute for a key once its effect is confirmed;
//! - a receipt never changes once set (records, replays);
//! - every record is in a consistent DESIGN.md state;
//! - audit versions are contiguous 1..=version and chained state to state;
//! - each quota bucket's `used` equals the reservations held by records in
//!   that window (plus those of records pruned while holding one).

//!
//! The host, model and invariants live in `model/` (the fuzz targets in
//! `fuzz/` run the same ones); this file only generates the operations.

mod model;

use model::machine::{DAY, Ev, FenceChoice, KEYS, Knobs, Op, Out, SECOND, run};
use model::truthful::{Fate, Read, TOp, truthful_run};
use proptest::prelude::*;

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        2 => (0u8..3).prop_map(Ev::Confirmed),
        4 => prop_oneof![
            Just(0i64),
            Just(-1),
            Just(-1_000),
            Just(-60_000),
            Just(-120_000),
            Just(5_000),
        ]
        .prop_map(Ev::Absent),
        2 => Just(Ev::Unknown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let fence = prop_oneof![6 => Just(FenceChoice::Current), 3 => (0..8usize).prop_map(FenceChoice::Stale), 1 => Just(FenceChoice::Bogus)];
    let out = prop_oneof![
        3 => (0u8..3).prop_map(Out::Success),
        2 => Just(Out::Rejected),
        3 => Just(Out::Ambiguous),
        1 => Just(Out::NotSent),
    ];
    let advance = prop_oneof![
        4 => 0..2_000u64,
        3 => 34_000..37_000u64,
        3 => 59_000..63_000u64,
        1 => Just(15 * 60 * SECOND),
        1 => Just(DAY),
        1 => Just(7 * DAY + 1),
    ];
    prop_oneof![
        5 => (key.clone(), ev()).prop_map(|(k, e)| Op::Begin(k, e)),
        5 => (key.clone(), fence, out).prop_map(|(k, f, o)| Op::Finish(k, f, o)),
        3 => (key, ev()).prop_map(|(k, e)| Op::Reconcile(k, e)),
        2 => ev().prop_map(Op::Sweep),
        1 => Just(Op::Prune),
        4 => advance.prop_map(Op::Advance),
        1 => any::<bool>().prop_map(|applied| Op::FailNextCommit { applied }),
    ]
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (any::<bool>(), prop::bool::weighted(0.25), 1..=4u32).prop_map(
        |(provider_claims_key, verify_first, attempt_budget)| Knobs {
            provider_claims_key,
            verify_first,
            attempt_budget,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_the_invariants(knobs in knobs(), ops in prop::collection::vec(op(), 1..60)) {
        run(knobs, ops).map_err(TestCaseError::fail)?;
    }
}

// ---------------------------------------------------------------- a truthful provider

fn read() -> impl Strategy<Value = Read> {
    (
        prop_oneof![Just(0u64), Just(500), Just(5_000), Just(60_000)],
        prop::bool::weighted(0.2),
    )
        .prop_map(|(lag, cannot_tell)| Read { lag, cannot_tell })
}

fn top() -> impl Strategy<Value = TOp> {
    // Most steps go to one key, so whole recoveries happen often.
    let key = prop_oneof![4 => Just(0usize), 1 => Just(1), 1 => Just(2)];
    let fate = prop_oneof![
        1 => Just(Fate::Commit(0)),
        2 => (0..=60_000u64).prop_map(Fate::Commit),
        2 => (45_000..=60_000u64).prop_map(Fate::Commit),
        1 => Just(Fate::Reject),
    ];
    let wait = prop_oneof![Just(0u64), 0..40_000u64];
    let advance = prop_oneof![
        4 => 0..3_000u64,
        3 => 30_000..40_000u64,
        3 => 55_000..65_000u64,
        1 => Just(15 * 60 * SECOND),
    ];
    prop_oneof![
        4 => (key.clone(), read()).prop_map(|(k, r)| TOp::Begin(k, r)),
        2 => (key.clone(), fate.clone()).prop_map(|(k, f)| TOp::Send(k, f)),
        4 => (key.clone(), fate, wait, any::<u8>()).prop_map(|(k, f, w, p)| TOp::Attempt(k, f, w, p)),
        4 => (key.clone(), prop::option::weighted(0.3, 0..6usize), any::<u8>()).prop_map(|(k, w, p)| TOp::Report(k, w, p)),
        3 => (key, read()).prop_map(|(k, r)| TOp::Reconcile(k, r)),
        2 => read().prop_map(TOp::Sweep),
        1 => Just(TOp::Prune),
        4 => advance.prop_map(TOp::Advance),
        1 => any::<bool>().prop_map(|applied| TOp::FailNextCommit { applied }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Against a provider that tells the truth (with lag and lost replies),
    /// no interleaving makes a second effect for one operation.
    #[test]
    fn truthful_provider_never_sees_two_effects(
        verify_first in prop::bool::weighted(0.25),
        budget in 1..=4u32,
        ops in prop::collection::vec(top(), 1..80),
    ) {
        truthful_run(verify_first, budget, ops).map_err(TestCaseError::fail)?;
    }
}
