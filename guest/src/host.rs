//! The I/O the rules need, as one trait: the WIT imports of world `once`.

use alloc::string::String;
use alloc::vec::Vec;

use crate::reads::Reads;
use crate::secret::SecretCache;
use crate::store::RecordCache;
use crate::types::{AuditEvent, Batch, Escalation, Evidence, Row, Settings, State, Stored, Table};

/// Why a batch did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitError {
    /// A put's expected version did not match (or a row to insert existed, or
    /// an event did): nothing applied.
    Conflict,
    /// The store failed: nothing applied, or the outcome is unknown.
    Storage(String),
}

/// Everything the engine asks of its host. Implemented by the wasm shell
/// (WIT imports) and by [`crate::testing::MemoryHost`].
pub trait Host {
    /// Now, in the ledger's clock domain (ms since the epoch).
    fn now(&self) -> u64;
    /// Engine settings: limits and the declared clock skew.
    fn settings(&self) -> Settings;
    /// Read one row: its version and body.
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String>;
    /// Apply a batch atomically.
    fn commit(&self, batch: &Batch) -> Result<(), CommitError>;
    /// Due rows of a table in some states.
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String>;
    /// The audit trail of one operation.
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String>;
    /// The provider's authoritative read (the `provider.lookup` import).
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence;
    /// With configuration `reads: steps`, where a protocol export's provider reads stop its
    /// decision ([`crate::reads`]); none (the default): the engine calls [`Host::lookup`] and waits.
    fn reads(&self) -> Option<&Reads> {
        None
    }
    /// Deliver an escalation; true when acknowledged.
    fn escalate(&self, escalation: &Escalation) -> bool;
    /// Whether this host, as configured now, can read the provider for
    /// `tool`. A record keeps the policy it was begun under; one begun while
    /// no lookup was configured becomes readable once a host has one (the
    /// default, false: only the record's own policy says so).
    fn lookup_configured(&self, _tool: &str) -> bool {
        false
    }
    /// The provider account (a credential's fingerprint) this host, as
    /// configured now, sends and reads `tool` through; none (the default):
    /// it names none. A record begun under an account is sent and read as
    /// proof of absence only through that account ([`crate::record::OpRecord::other_account`]).
    fn provider_account(&self, _tool: &str) -> Option<String> {
        None
    }
    /// What the ledger's witness (the `witness` import: a copy kept outside
    /// the ledger of every attempt handed out) holds for (scope, key): the
    /// record body last kept, or none. The default: a host with no witness,
    /// which keeps nothing ([`crate::engine`]'s `witness` module says what that loses).
    fn witnessed(&self, _scope: &str, _key: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
    /// Keep `body` for (scope, key) durably, unless what is kept was granted
    /// after `at`; an error: it could not, and the grant must not leave the engine.
    fn keep_witness(&self, _scope: &str, _key: &str, _body: &str, _at: u64) -> Result<(), String> {
        Ok(())
    }
    /// Forget what the witness kept for (scope, key) if it was kept as of before `before`.
    fn forget_witnessed(&self, _scope: &str, _key: &str, _before: u64) -> Result<(), String> {
        Ok(())
    }
    /// `len` cryptographically secure random bytes (fewer, or none, when the
    /// host has none to give: the engine then refuses to derive a key).
    /// Asked only to create the ledger's provider-key secret ([`crate::secret`]).
    fn entropy(&self, len: u32) -> Vec<u8>;
    /// Where the engine keeps the record it last committed, so reading it
    /// back skips parsing it; none (the default): every read is parsed.
    fn record_cache(&self) -> Option<&RecordCache> {
        None
    }
    /// Where the engine keeps the ledger's provider-key secret once read;
    /// none (the default): it is read from the ledger whenever a key is derived.
    fn secret_cache(&self) -> Option<&SecretCache> {
        None
    }
}
