//! A call that keeps losing compare-and-swaps to other writers: it decides
//! again instead of being refused, for as long as the engine's contention
//! window lasts, and only then says `blocked(storage)` — with nothing written.

mod common;

use std::cell::Cell;

use common::*;
use once_guest::engine::{adopt, begin, sweep};
use once_guest::host::{CommitError, Host};
use once_guest::testing::MemoryHost;
use once_guest::types::{AuditEvent, Batch, BlockReason, Escalation, Evidence, Row, Settings, State, Stored, Table};

/// `MemoryHost` whose next `lose` commits lose their race (as if another writer had just
/// committed: `rival`, if any, is that write), whose clock moves `tick` ms at every reading after the
/// first `frozen_reads`, and which counts its clock readings and commits.
struct Busy {
    mem: MemoryHost,
    lose: Cell<u32>,
    tick: u64,
    reads: Cell<u32>,
    commits: Cell<u32>,
    rival: Option<fn(&MemoryHost)>,
}

impl Busy {
    fn new(lose: u32, tick: u64) -> Self {
        let mem = MemoryHost::new();
        Busy {
            mem,
            lose: Cell::new(lose),
            tick,
            reads: Cell::new(0),
            commits: Cell::new(0),
            rival: None,
        }
    }
}

impl Host for Busy {
    fn now(&self) -> u64 {
        self.reads.set(self.reads.get() + 1);
        self.mem.advance(self.tick);
        self.mem.now()
    }
    fn settings(&self) -> Settings {
        self.mem.settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        self.mem.get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        self.commits.set(self.commits.get() + 1);
        if self.lose.get() > 0 {
            self.lose.set(self.lose.get() - 1);
            if let Some(rival) = self.rival {
                rival(&self.mem);
            }
            return Err(CommitError::Conflict);
        }
        self.mem.commit(batch)
    }
    fn scan(&self, t: Table, s: &[State], due: u64, owner: Option<String>, limit: u32) -> Result<Vec<Row>, String> {
        self.mem.scan(t, s, due, owner, limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        self.mem.audit(scope, key)
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        self.mem.lookup(tool, provider_key, args)
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        self.mem.escalate(escalation)
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.mem.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.mem.secret_cache()
    }
}

/// Forty lost races in a row (b58a043 gave up after sixteen): the claim still goes through, once.
#[test]
fn a_call_that_loses_forty_races_is_granted_not_refused() {
    let h = Busy::new(40, 10);
    let decision = begin(&h, quota_refund("k")).unwrap();
    let grant = execute_of(decision);
    assert_eq!(grant.attempt, 1);
    assert_eq!(h.commits.get(), 41);
    assert_eq!(view(&h.mem, "k").state, State::InFlight);
}

/// Contention that outlasts the window (30 s of the ledger clock after the first sixteen races):
/// `blocked(storage)`, and nothing was written.
#[test]
fn contention_past_the_window_is_blocked_storage_with_nothing_written() {
    let h = Busy::new(u32::MAX, 1_000);
    let started = h.mem.now();
    let blocked = blocked_of(begin(&h, quota_refund("k")).unwrap(), BlockReason::Storage);
    assert!(blocked.detail.contains("concurrent writers"), "{blocked:?}");
    let (races, waited) = (h.commits.get(), h.mem.now() - started);
    assert!(
        races > 16 && races < 2_000,
        "past the first sixteen, short of the cap: {races}"
    );
    assert!(
        (30_000..60_000).contains(&waited),
        "gave up once the window had passed: {waited} ms"
    );
    assert_nothing_written(&h.mem);
}

/// A clock that stands still cannot keep a call racing for ever: it stops at the cap.
#[test]
fn a_frozen_clock_stops_at_the_race_cap() {
    let h = Busy::new(u32::MAX, 0);
    let decision = begin(&h, quota_refund("k")).unwrap();
    blocked_of(decision, BlockReason::Storage);
    assert_eq!(h.commits.get(), 2_000);
    assert_nothing_written(&h.mem);
}

/// An uncontended call reads the clock no more often than it did before the window existed.
#[test]
fn the_window_costs_an_uncontended_call_no_clock_reading() {
    let quiet = Busy::new(0, 0);
    execute_of(begin(&quiet, quota_refund("k")).unwrap());
    let sixteen = Busy::new(15, 0);
    execute_of(begin(&sixteen, quota_refund("k")).unwrap());
    let per_race = (sixteen.reads.get() - quiet.reads.get()) / 15;
    let seventeen = Busy::new(16, 0);
    execute_of(begin(&seventeen, quota_refund("k")).unwrap());
    assert_eq!(
        seventeen.reads.get() - sixteen.reads.get(),
        per_race + 1,
        "the window's one reading comes with the seventeenth race"
    );
}

/// A refund under a quota: every claim writes the bucket, so no blind claim.
fn quota_refund(key: &str) -> once_guest::engine::BeginRequest {
    pay(key, "10.00", &quota_policy("1000.00"))
}

/// A sweep that loses its race to an adoption (the record is another owner's now) leaves the record
/// alone: its read came before the race, and nothing after it reads or writes that owner's record.
#[test]
fn a_sweep_that_loses_its_race_to_an_adoption_leaves_the_adopted_record_alone() {
    let mut h = Busy::new(0, 0);
    let mut readable = policy();
    readable.lookup = true;
    unknown_record(&h.mem, "k", readable);
    h.mem.advance(MAX_IN_FLIGHT + SECOND);
    let read_before = h.mem.lookups().len();
    // The sweep's first write loses to an operator moving owner "default"'s records to "b".
    h.lose.set(1);
    h.rival = Some(|mem| {
        let moved = adopt(mem, "default", "b", "moved by an operator", 10).unwrap();
        assert_eq!(moved.adopted, 1);
    });
    sweep(&h, 10).unwrap();
    assert_eq!(h.mem.lookups().len(), read_before + 1, "one read, before the race");
    let v = view(&h.mem, "k");
    assert_eq!((v.owner.as_str(), v.state), ("b", State::Unknown));
    assert_eq!(kinds(&v).last(), Some(&"adopted"), "{:?}", kinds(&v));
}
