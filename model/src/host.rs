//! The I/O one action lends the engine: a host's view of the world.
//!
//! An action builds a [`ModelHost`] from the state it starts in, runs the
//! real engine against it, and writes what changed back into the next state.
//! The lookup is truthful: it sees every commit at or before its read
//! position, and says so.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

use once_guest::host::{CommitError, Host};
use once_guest::reads::Reads;
use once_guest::store::RecordCache;
use once_guest::testing::{Ledger, Witness};
use once_guest::types::{AuditEvent, Batch, Escalation, Evidence, Row, Settings, State, Stored, Table};

use crate::world::{Time, World};

/// How a provider read sees the provider during one action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Read {
    /// A linearizable read: every commit up to now.
    Now,
    /// A replica `LAG_MS` behind: it says so in its read position.
    Lagging,
    /// The provider cannot tell.
    CannotTell,
}

/// How far a lagging replica is behind.
pub const LAG_MS: u64 = 2_000;

/// One host's I/O for one action.
pub struct ModelHost<'w> {
    world: &'w World,
    ledger: RefCell<Ledger>,
    clock: Cell<Time>,
    /// How long the next commit that applies takes (the clock moves on by it).
    slow_commit: Cell<Option<Time>>,
    settings: Settings,
    read: Read,
    fault: Cell<Option<bool>>,
    sink_up: bool,
    acked: RefCell<BTreeSet<String>>,
    touched: RefCell<BTreeSet<String>>,
    cache: RecordCache,
    /// With reads as steps, where the protocol's reads stop ([`once_guest::reads`]).
    reads: Option<Reads>,
    /// The provider account this host sends and reads through, and every host's (by index):
    /// a read sees only the effects of requests sent through its own account.
    accounts: Accounts,
    /// The ledger's witness (it never fails here: a failing witness is the guest's tests').
    witness: RefCell<Witness>,
}

/// The provider account one host goes through, and every host's (by index).
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    /// This host's.
    pub mine: Option<String>,
    /// Each host's, by index.
    pub hosts: Vec<Option<String>>,
}

impl<'w> ModelHost<'w> {
    /// Host `host`'s view of `world`, reading the provider as `read` says: inside the protocol's
    /// steps, or (`steps`) as steps of their own.
    pub fn new(world: &'w World, settings: Settings, clock: Time, read: Read, steps: bool, accounts: Accounts) -> Self {
        ModelHost {
            world,
            ledger: RefCell::new(world.ledger.clone()),
            witness: RefCell::new(world.witness.clone()),
            clock: Cell::new(clock),
            slow_commit: Cell::new(world.slow_commit),
            settings,
            read,
            fault: Cell::new(world.fault),
            sink_up: world.sink_up,
            acked: RefCell::new(world.acked.clone()),
            touched: RefCell::new(BTreeSet::new()),
            cache: RecordCache::new(),
            reads: steps.then(Reads::new),
            accounts,
        }
    }

    /// What the action leaves: the ledger, the armed fault, the sink's acknowledgements, the scopes
    /// touched, the slow commit still armed, and the witness.
    #[allow(clippy::type_complexity)]
    pub fn finish(
        self,
    ) -> (
        Ledger,
        Option<bool>,
        BTreeSet<String>,
        BTreeSet<String>,
        Option<Time>,
        Witness,
    ) {
        (
            self.ledger.into_inner(),
            self.fault.get(),
            self.acked.into_inner(),
            self.touched.into_inner(),
            self.slow_commit.get(),
            self.witness.into_inner(),
        )
    }

    fn touch(&self, scope: &str) {
        self.touched.borrow_mut().insert(scope.to_string());
    }
}

impl Host for ModelHost<'_> {
    fn now(&self) -> u64 {
        self.clock.get()
    }

    fn settings(&self) -> Settings {
        self.settings.clone()
    }

    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        // The ledger's provider-key secret is every scope's (guest/src/secret.rs): reading it
        // touches no scope. Any other row of the reserved scope still counts.
        let secret = (table, scope, key)
            == (
                once_guest::secret::SECRET_TABLE,
                once_guest::secret::SECRET_SCOPE,
                once_guest::secret::SECRET_KEY,
            );
        if !secret {
            self.touch(scope);
        }
        Ok(self.ledger.borrow().get(table, scope, key))
    }

    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        for put in &batch.puts {
            self.touch(&put.scope);
        }
        for event in &batch.events {
            self.touch(&event.scope);
        }
        match self.fault.take() {
            // Not applied: the store failed first.
            Some(false) => Err(CommitError::Storage("injected: not applied".into())),
            // Applied, and the answer lost on the way back.
            Some(true) => {
                let _ = self.ledger.borrow_mut().commit(batch);
                Err(CommitError::Storage("injected: applied, answer lost".into()))
            }
            None => {
                self.ledger.borrow_mut().commit(batch)?;
                // Applied after a wait: the ledger's clock has moved on meanwhile.
                if let Some(took) = self.slow_commit.take() {
                    self.clock.set(self.clock.get().saturating_add(took));
                }
                Ok(())
            }
        }
    }

    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String> {
        Ok(self.ledger.borrow().scan(table, states, due_before, owner, limit))
    }

    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        self.touch(scope);
        Ok(self.ledger.borrow().audit(scope, key))
    }

    /// A truthful read. Its position is in this host's clock (which may be
    /// off by the declared skew); what it sees is every commit up to the
    /// matching true time.
    fn lookup(&self, _tool: &str, provider_key: &str, _args: &str) -> Evidence {
        let lag = match self.read {
            Read::CannotTell => return Evidence::Unknown("the provider cannot tell".into()),
            Read::Now => 0,
            Read::Lagging => LAG_MS,
        };
        let seen_until = self.world.now.saturating_sub(lag);
        let visible = |host: usize| self.accounts.hosts.get(host).cloned().flatten() == self.accounts.mine;
        let seen = self
            .world
            .effects_through(provider_key, visible)
            .into_iter()
            .filter(|(_, at)| *at <= seen_until)
            .min_by_key(|(_, at)| *at);
        match seen {
            Some((receipt, _)) => Evidence::Confirmed(receipt),
            None => Evidence::Absent(self.clock.get().saturating_sub(lag)),
        }
    }

    fn escalate(&self, escalation: &Escalation) -> bool {
        if self.sink_up {
            self.acked.borrow_mut().insert(escalation.id.clone());
        }
        self.sink_up
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        // Fixed bytes: the same secret, so the same provider keys, in every run.
        once_guest::testing::TEST_ENTROPY[..(len as usize).min(32)].to_vec()
    }

    fn record_cache(&self) -> Option<&RecordCache> {
        Some(&self.cache)
    }

    fn reads(&self) -> Option<&Reads> {
        self.reads.as_ref()
    }

    fn provider_account(&self, _tool: &str) -> Option<String> {
        self.accounts.mine.clone()
    }

    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, String> {
        Ok(self.witness.borrow().seen(scope, key))
    }

    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: u64) -> Result<(), String> {
        self.witness.borrow_mut().keep(scope, key, body, at);
        Ok(())
    }

    fn forget_witnessed(&self, scope: &str, key: &str, before: u64) -> Result<(), String> {
        self.witness.borrow_mut().forget(scope, key, before);
        Ok(())
    }
}
