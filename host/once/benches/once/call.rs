//! Row 2: a warm protected call (`start` + `report`, memory store) through
//! the component vs the same protocol called natively.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::Criterion;
use once::Once;
use once::storage::memory::MemoryStorage;
use once_guest::config::{Config, default_settings};
use once_guest::host::{CommitError, Host};
use once_guest::store::RecordCache;
use once_guest::types::{
    AuditEvent, Batch, Call, Configuration, Escalation, Evidence, LedgerEncoding, Outcome, PolicyInput, ProviderReads,
    Row, Settings, State, Step, Stored, Table,
};

/// The native core's ledger: the host's `MemoryStorage` semantics (ordered
/// maps, a batch checked before it is applied), without the wasm boundary.
/// (`once_guest::testing::MemoryHost` copies its maps on every commit: fine
/// for tests, not a baseline.)
#[derive(Default)]
struct NativeHost {
    rows: RefCell<BTreeMap<(u8, String, String), Row>>,
    audit: RefCell<BTreeMap<(String, String, u64), AuditEvent>>,
    /// The engine's record cache, as the component keeps one per instance.
    records: RecordCache,
}

fn table_id(t: Table) -> u8 {
    match t {
        Table::Operation => 0,
        Table::Tombstone => 1,
        Table::Quota => 2,
    }
}

impl Host for NativeHost {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
    fn settings(&self) -> Settings {
        default_settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        Ok(self
            .rows
            .borrow()
            .get(&(table_id(table), scope.to_string(), key.to_string()))
            .map(|r| Stored {
                version: r.version,
                body: r.body.clone(),
            }))
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        let mut rows = self.rows.borrow_mut();
        let mut audit = self.audit.borrow_mut();
        let mut staged: BTreeMap<(u8, String, String), Option<Row>> = BTreeMap::new();
        for put in &batch.puts {
            let id = (table_id(put.table), put.scope.clone(), put.key.clone());
            let current = match staged.get(&id) {
                Some(row) => row.as_ref().map(|r| r.version),
                None => rows.get(&id).map(|r| r.version),
            };
            if current != put.expected {
                return Err(CommitError::Conflict);
            }
            staged.insert(id, put.row.clone());
        }
        for event in &batch.events {
            if audit.contains_key(&(event.scope.clone(), event.key.clone(), event.version)) {
                return Err(CommitError::Conflict);
            }
        }
        for (id, row) in staged {
            match row {
                Some(row) => rows.insert(id, row),
                None => rows.remove(&id),
            };
        }
        for event in &batch.events {
            audit.insert((event.scope.clone(), event.key.clone(), event.version), event.clone());
        }
        Ok(())
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String> {
        let mut due: Vec<Row> = self
            .rows
            .borrow()
            .values()
            .filter(|r| r.table == table && r.due_at.is_some_and(|d| d <= due_before))
            .filter(|r| states.is_empty() || r.state.is_some_and(|s| states.contains(&s)))
            .filter(|r| owner.is_none() || r.owner == owner)
            .cloned()
            .collect();
        due.sort_by(|a, b| (a.due_at, &a.scope, &a.key).cmp(&(b.due_at, &b.scope, &b.key)));
        due.truncate(limit as usize);
        Ok(due)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        Ok(self
            .audit
            .borrow()
            .range((scope.to_string(), key.to_string(), 0)..=(scope.to_string(), key.to_string(), u64::MAX))
            .map(|(_, e)| e.clone())
            .collect())
    }
    fn lookup(&self, tool: &str, _: &str, _: &str) -> Evidence {
        Evidence::Unknown(format!("no provider lookup is configured for {tool}"))
    }
    fn escalate(&self, _: &Escalation) -> bool {
        true
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        // Fixed bytes: the same secret, so the same provider keys, in every run.
        once_guest::testing::TEST_ENTROPY[..(len as usize).min(32)].to_vec()
    }
    fn record_cache(&self) -> Option<&RecordCache> {
        Some(&self.records)
    }
}

use crate::record::{compare, timed};
use crate::{ARGS, RECEIPT};

/// Register the row's group.
pub fn bench(c: &mut Criterion) {
    let once = Once::builder(MemoryStorage::new()).build().expect("the once component");
    // The same component compiled without fuel metering: what metering costs per call.
    let unmetered = Once::builder(MemoryStorage::new())
        .runtime(std::sync::Arc::new(
            once::runtime::Runtime::load_unmetered(once::runtime::cache_dir().as_deref())
                .expect("the once component, unmetered"),
        ))
        .build()
        .expect("the once component, unmetered");
    let host = NativeHost::default();
    // As `Once` configures it without a provider: no tool has a lookup.
    let (config, _) = Config::new(Configuration {
        settings: default_settings(),
        defaults: PolicyInput {
            lookup: Some(false),
            ..once_guest::policy::unset()
        },
        tools: Vec::new(),
        ledger_encoding: LedgerEncoding::Typed,
        reads: ProviderReads::Steps,
    })
    .expect("the default configuration");
    let mut next = 0u64;
    let samples = 30;
    let mut g = c.benchmark_group("call");
    g.sample_size(samples)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("component", |b| {
        timed(b, "call/component", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                next += 1;
                let key = format!("op-{next}");
                crate::protected_call(&once, &key);
            }
            start.elapsed()
        })
    });
    g.bench_function("component-unmetered", |b| {
        timed(b, "call/component-unmetered", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                next += 1;
                let key = format!("op-{next}");
                crate::protected_call(&unmetered, &key);
            }
            start.elapsed()
        })
    });
    g.bench_function("native", |b| {
        timed(b, "call/native", |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                next += 1;
                let call = Call {
                    scope: "tenant".into(),
                    keys: vec![("application".into(), format!("op-{next}"))],
                    tool: "refund".into(),
                    args: ARGS.into(),
                    supersedes: None,
                    acknowledge_confirmed: false,
                };
                let Ok(Step::Dispatch(grant)) = once_guest::protocol::start(&host, &config, call) else {
                    panic!("start did not grant an attempt");
                };
                let step = once_guest::protocol::report(
                    &host,
                    "tenant",
                    &grant.key,
                    &grant.fence,
                    Outcome::Success(RECEIPT.into()),
                );
                assert!(matches!(black_box(step), Ok(Step::Done(_))), "report");
            }
            start.elapsed()
        })
    });
    g.finish();
    compare("2. warm protected call", "call/component", "call/native", samples);
    compare(
        "2. fuel metering's share",
        "call/component",
        "call/component-unmetered",
        samples,
    );
}
