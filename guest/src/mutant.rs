//! Deliberate bugs for the model checker to find (`model/`): a checker that
//! finds nothing proves nothing, so each mutant breaks one rule the checker
//! must catch.
//!
//! Test-only: without the `mutants` feature (every build that ships, the
//! component included) [`on`] is a constant `false` and each site compiles
//! away. With it, a mutant is switched on per thread, for the duration of a
//! closure ([`with`]), so tests running side by side never see each other's.

/// One deliberate bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// An unknown record's owed dispatch is granted without reading the provider.
    DispatchUnknownWithoutRead,
    /// ABSENT is proven as soon as the read is after the last dispatch,
    /// without waiting out `max_in_flight`.
    SkipMaxInFlight,
    /// An expired (pruned) key answers "effect: none", whatever its tombstone says.
    TombstoneSaysNone,
    /// A second success on a confirmed record is ignored, not flagged.
    ForgetSecondSuccess,
    /// `sweep` takes every owner's records, not only its own.
    SweepTakesOtherOwners,
    /// A quota reservation is added to its bucket twice.
    DoubleReservation,
    /// A call on a record whose lease is live is granted an attempt of its own.
    GrantWhileLeaseLive,
    /// `report` takes any fence of an in-flight record as the current one.
    SkipFenceCheck,
    /// A transition or prune drops an unacknowledged possible-duplicate escalation.
    DropEscalationOnTransition,
    /// The provider key leaves out the scope: two scopes' keys read each other's effects.
    ReadAcrossScopes,
    /// `adopt` takes an unknown record as absent: its new owner sends it again without a read.
    AdoptStartsOver,
    /// The attempt after a not-sent one is granted at once: a down upstream or
    /// a hung-up client spends the attempt budget in milliseconds.
    NotSentRetriesAtOnce,
    /// A grant whose commit took its send window is handed out as committed:
    /// its host finds `send-by` past and spends an attempt on "not sent".
    NoLeaseRenewal,
    /// Another owner's record that owes a dispatch is answered "effect: none" and
    /// "refused": its caller is told to mint a new key while that owner sends it.
    OtherOwnersOwedSaysNone,
    /// A read brought back by `read-back` is taken as of the moment it was brought back, not
    /// its own read position: an absence read before a late commit proves nothing of it.
    ReadBackTakenAsNow,
    /// A successor supersedes a failed or absent original whose earlier request
    /// may have committed unseen: its new provider key makes a second effect.
    SupersedeDespiteLateEffect,
    /// Such a supersede waits out max-in-flight but then goes ahead without
    /// reading whether the earlier request committed before that.
    SupersedeUnreadAfterMaxInFlight,
    /// A call the tool's approval rule holds for a person is granted without an approval.
    NoApprovalGate,
    /// An approval is taken however long ago it was given.
    ApprovalNeverExpires,
    /// An approval is kept after the attempt it was granted on: an owed
    /// redispatch after a lost reply goes out on the same approval.
    ApprovalReused,
    /// A provider read through another account than the record's proves it absent: a rotated
    /// credential that cannot see the old effect lets the operation be sent again.
    OtherAccountReadProvesAbsent,
    /// A call through another provider account than the record's is answered from the record
    /// (a replay of that account's receipt) instead of refused.
    OtherAccountAnswered,
    /// The witness is not asked before a new key's first attempt: a ledger restored from
    /// before the call sends again an attempt the newer history had sent.
    WitnessUnread,
    /// The witness is not asked before a retry or an owed redispatch: a ledger restored to a
    /// record short of its last attempt sends another.
    WitnessUnreadOnRetry,
    /// A grant leaves the engine without its record kept in the witness: a restore of the
    /// ledger taken before it loses it whole.
    WitnessNotKept,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 25] = [
        Mutant::DispatchUnknownWithoutRead,
        Mutant::SkipMaxInFlight,
        Mutant::TombstoneSaysNone,
        Mutant::ForgetSecondSuccess,
        Mutant::SweepTakesOtherOwners,
        Mutant::DoubleReservation,
        Mutant::GrantWhileLeaseLive,
        Mutant::ReadAcrossScopes,
        Mutant::SkipFenceCheck,
        Mutant::DropEscalationOnTransition,
        Mutant::AdoptStartsOver,
        Mutant::NotSentRetriesAtOnce,
        Mutant::NoLeaseRenewal,
        Mutant::OtherOwnersOwedSaysNone,
        Mutant::ReadBackTakenAsNow,
        Mutant::SupersedeDespiteLateEffect,
        Mutant::SupersedeUnreadAfterMaxInFlight,
        Mutant::NoApprovalGate,
        Mutant::ApprovalNeverExpires,
        Mutant::ApprovalReused,
        Mutant::OtherAccountReadProvesAbsent,
        Mutant::OtherAccountAnswered,
        Mutant::WitnessUnread,
        Mutant::WitnessUnreadOnRetry,
        Mutant::WitnessNotKept,
    ];
}

#[cfg(all(feature = "mutants", not(target_arch = "wasm32")))]
std::thread_local! {
    static ACTIVE: core::cell::Cell<Option<Mutant>> = const { core::cell::Cell::new(None) };
}

/// Whether `mutant` is switched on in this thread.
#[inline(always)]
pub fn on(mutant: Mutant) -> bool {
    #[cfg(all(feature = "mutants", not(target_arch = "wasm32")))]
    {
        ACTIVE.with(|a| a.get() == Some(mutant))
    }
    #[cfg(not(all(feature = "mutants", not(target_arch = "wasm32"))))]
    {
        let _ = mutant;
        false
    }
}

/// Run `f` with `mutant` switched on in this thread (none: the engine as written).
#[cfg(all(feature = "mutants", not(target_arch = "wasm32")))]
pub fn with<T>(mutant: Option<Mutant>, f: impl FnOnce() -> T) -> T {
    let before = ACTIVE.with(|a| a.replace(mutant));
    let out = f();
    ACTIVE.with(|a| a.set(before));
    out
}
