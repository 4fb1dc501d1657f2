//! The record machine's model and invariants, shared by the property tests
//! (`proptest_machine.rs`) and the fuzz targets (`fuzz/`, which includes this
//! directory by path): one host, one model, one set of invariants, whatever
//! generates the operations. Failures are plain `Err(String)` so that each
//! driver reports them its own way.
#![allow(dead_code)]

/// `prop_assert!` for plain `Result<_, String>` functions.
macro_rules! ensure {
    ($cond:expr) => {
        if !$cond {
            return Err(format!("assertion failed: {}", stringify!($cond)));
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// `prop_assert_eq!` for plain `Result<_, String>` functions.
macro_rules! ensure_eq {
    ($a:expr, $b:expr) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{} != {}: {:?} != {:?}", stringify!($a), stringify!($b), a, b));
        }
    }};
    ($a:expr, $b:expr, $($fmt:tt)+) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{:?} != {:?}: {}", a, b, format!($($fmt)+)));
        }
    }};
}

/// The ledger half of a model host: clock, settings and store delegate to
/// its `mem: MemoryHost`; commits go through [`commit_or_fail`] with its
/// `fail` cell. A host adds only its own `lookup` and `escalate`.
macro_rules! memory_ledger {
    () => {
        fn now(&self) -> u64 {
            self.mem.now()
        }
        fn settings(&self) -> Settings {
            self.mem.settings()
        }
        fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<once_guest::types::Stored>, String> {
            self.mem.get(table, scope, key)
        }
        fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
            super::commit_or_fail(&self.mem, &self.fail, batch)
        }
        fn scan(
            &self,
            table: Table,
            states: &[State],
            due_before: u64,
            owner: Option<String>,
            limit: u32,
        ) -> Result<Vec<Row>, String> {
            self.mem.scan(table, states, due_before, owner, limit)
        }
        fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
            self.mem.audit(scope, key)
        }
    };
}

pub mod machine;
pub mod truthful;

use std::cell::Cell;

use once_guest::host::CommitError;
use once_guest::host::Host;
use once_guest::testing::MemoryHost;
use once_guest::types::Batch;

/// Commit `batch` to `mem`, unless a failure is armed in `fail`: `Some(false)`
/// applies nothing, `Some(true)` applies it and then reports failure (the
/// outcome is unknown to the caller, as when a connection drops mid-commit).
pub fn commit_or_fail(mem: &MemoryHost, fail: &Cell<Option<bool>>, batch: &Batch) -> Result<(), CommitError> {
    match fail.take() {
        None => mem.commit(batch),
        Some(false) => Err(CommitError::Storage("injected: nothing applied".to_string())),
        Some(true) => {
            mem.commit(batch)?;
            Err(CommitError::Storage("injected: applied, reply lost".to_string()))
        }
    }
}
