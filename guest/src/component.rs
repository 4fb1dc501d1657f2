//! The wasm shell: WIT exports call the engine and the protocol, WIT imports
//! are the [`Host`]. The instance's configuration lives here, set once by
//! `configure`.

use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;

use crate::bindings::exports::once::core::{driver, engine as engine_export, protocol as protocol_export, transitions};
use crate::bindings::once::core::{clock, entropy, ledger, ledger_json, operator, provider, witness};
use crate::config::Config;
use crate::host::{CommitError, Host};
use crate::types::*;
use crate::{engine, protocol, wire};

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// The canonical ABI's allocator export. A `std` guest gets it from the
/// standard library; this `no_std` one supplies it over the global allocator.
///
/// # Safety
/// Called only by the component runtime, with a pointer and size that an
/// earlier call returned (or null and 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old_ptr: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old_ptr, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}

/// The instance's configuration. A component instance runs one export at a
/// time on one thread, so a cell in a static is all the sharing there is.
struct Slot(RefCell<Option<Config>>);

// SAFETY: this component has no threads (wasm32-wasip2 core modules are single-threaded).
unsafe impl Sync for Slot {}

static CONFIG: Slot = Slot(RefCell::new(None));

/// The record the instance last committed (see [`crate::store::RecordCache`]).
struct Records(crate::store::RecordCache);

// SAFETY: as for `Slot`: the component has no threads.
unsafe impl Sync for Records {}

static RECORDS: Records = Records(crate::store::RecordCache::new());

/// The ledger's provider-key secret, once read (see [`crate::secret`]).
struct Secret(crate::secret::SecretCache);

// SAFETY: as for `Slot`: the component has no threads.
unsafe impl Sync for Secret {}

static SECRET: Secret = Secret(crate::secret::SecretCache::new());

/// The configuration, or the error every export gives before `configure`.
fn with_config<R>(f: impl FnOnce(&Config) -> Result<R, Error>) -> Result<R, Error> {
    match CONFIG.0.borrow().as_ref() {
        Some(config) => f(config),
        None => Err(Error::NotConfigured),
    }
}

/// Whether the host answers the ledger's `get` and `commit` as JSON text
/// (`ledger-json`) rather than typed (`ledger`), as its configuration said.
/// Nothing reads or writes the ledger before `configure`.
fn json_ledger() -> bool {
    CONFIG
        .0
        .borrow()
        .as_ref()
        .is_some_and(|c| c.ledger_encoding == LedgerEncoding::Json)
}

/// The reads of the protocol export running now (see [`crate::reads`]).
struct ProtocolReads(crate::reads::Reads);

// SAFETY: as for `Slot`: the component has no threads.
unsafe impl Sync for ProtocolReads {}

static READS: ProtocolReads = ProtocolReads(crate::reads::Reads::new());

/// The host as seen from inside the component: the WIT imports, and the configured settings.
/// `protocol`: it serves the call protocol (`driver`, `protocol`), whose provider reads are
/// steps when the configuration says so; every other export reads through `provider.lookup`.
struct Imports {
    protocol: bool,
}

/// The host of the engine's and the single transitions' exports.
const IMPORTS: Imports = Imports { protocol: false };
/// The host of the call protocol's exports.
const PROTOCOL: Imports = Imports { protocol: true };

impl Host for Imports {
    fn now(&self) -> u64 {
        clock::now()
    }
    fn settings(&self) -> Settings {
        // Every export checks the configuration first; the defaults are never used for a decision.
        CONFIG
            .0
            .borrow()
            .as_ref()
            .map_or_else(crate::config::default_settings, |c| c.settings.clone())
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Stored>, String> {
        if json_ledger() {
            return wire::got(&ledger_json::get(table, scope, key));
        }
        wire::read(ledger::get(table, scope, key))
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        if json_ledger() {
            let (head, bodies) = wire::batch(batch);
            return wire::committed(&ledger_json::commit(&head, &bodies));
        }
        wire::applied(ledger::commit(batch))
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String> {
        match ledger::scan(table, states, due_before, owner.as_deref(), limit) {
            Scanned::Found(rows) => Ok(rows.rows),
            Scanned::Failed(f) => Err(f.message),
        }
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        match ledger::audit(scope, key) {
            Audited::Found(trail) => Ok(trail.events),
            Audited::Failed(f) => Err(f.message),
        }
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        provider::lookup(tool, provider_key, args)
    }
    fn reads(&self) -> Option<&crate::reads::Reads> {
        let steps = CONFIG
            .0
            .borrow()
            .as_ref()
            .is_some_and(|c| c.reads == ProviderReads::Steps);
        (self.protocol && steps).then_some(&READS.0)
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        operator::escalate(escalation)
    }
    fn lookup_configured(&self, tool: &str) -> bool {
        CONFIG.0.borrow().as_ref().is_some_and(|c| c.policy(tool).lookup)
    }
    fn provider_account(&self, tool: &str) -> Option<String> {
        CONFIG
            .0
            .borrow()
            .as_ref()
            .and_then(|c| c.policy(tool).provider_account.clone())
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        entropy::fill(len)
    }
    fn witnessed(&self, scope: &str, key: &str) -> Result<Option<String>, String> {
        match witness::seen(scope, key) {
            witness::Witnessed::Nothing => Ok(None),
            witness::Witnessed::Kept(body) => Ok(Some(body)),
            witness::Witnessed::Failed(why) => Err(why),
        }
    }
    fn keep_witness(&self, scope: &str, key: &str, body: &str, at: u64) -> Result<(), String> {
        witness::keep(scope, key, body, at).map_or(Ok(()), Err)
    }
    fn forget_witnessed(&self, scope: &str, key: &str, before: u64) -> Result<(), String> {
        witness::forget(scope, key, before).map_or(Ok(()), Err)
    }
    fn record_cache(&self) -> Option<&crate::store::RecordCache> {
        Some(&RECORDS.0)
    }
    fn secret_cache(&self) -> Option<&crate::secret::SecretCache> {
        Some(&SECRET.0)
    }
}

struct Component;

impl engine_export::Guest for Component {
    fn default_settings() -> Settings {
        crate::config::default_settings()
    }
    fn configure(configuration: Configuration) -> Result<Configured, Error> {
        let (config, configured) = Config::new(configuration)?;
        *CONFIG.0.borrow_mut() = Some(config);
        Ok(configured)
    }
    fn queue(filter: QueueFilter, limit: u32) -> Result<OperatorQueue, Error> {
        with_config(|_| engine::queue(&IMPORTS, &filter, limit))
    }
    fn inspect(scope: String, key: String) -> Result<Option<RecordView>, Error> {
        with_config(|_| engine::inspect(&IMPORTS, &scope, &key))
    }
    fn resolve(scope: String, key: String, resolution: Resolution, note: String, force: bool) -> Result<State, Error> {
        with_config(|_| engine::resolve(&IMPORTS, &scope, &key, resolution, &note, force))
    }
    fn prune(limit: u32) -> Result<PruneReport, Error> {
        with_config(|_| engine::prune(&IMPORTS, limit))
    }
    fn adopt(from_owner: String, to_owner: String, note: String, limit: u32) -> Result<AdoptReport, Error> {
        with_config(|_| engine::adopt(&IMPORTS, &from_owner, &to_owner, &note, limit))
    }
    fn canonicalize(json: Vec<u8>) -> Result<String, JsonError> {
        engine::canonicalize(&IMPORTS, &json)
    }
    fn fingerprint(tool: String, args: String) -> Result<String, JsonError> {
        engine::fingerprint(&IMPORTS, &tool, &args)
    }
}

impl driver::Guest for Component {
    fn start(call: Call) -> Result<Step, Error> {
        with_config(|config| protocol::start(&PROTOCOL, config, call))
    }
    fn report(scope: String, key: String, fence: String, outcome: Outcome) -> Result<Step, Error> {
        with_config(|_| protocol::report(&PROTOCOL, &scope, &key, &fence, outcome))
    }
    fn resume(scope: String, key: String) -> Result<Step, Error> {
        with_config(|_| protocol::resume(&PROTOCOL, &scope, &key))
    }
    fn read_back(call: Option<Call>, reading: Reading, evidence: Evidence) -> Result<Step, Error> {
        with_config(|config| protocol::read_back(&PROTOCOL, call.map(|c| config.request(c)), reading, evidence))
    }
}

/// `driver`'s calls with their values as JSON text (`wire`), for dynamic bindings.
impl protocol_export::Guest for Component {
    fn start(call: String) -> String {
        wire::step(&with_config(|config| {
            protocol::start(&PROTOCOL, config, wire::call(&call)?)
        }))
    }
    fn report(scope: String, key: String, fence: String, outcome: String) -> String {
        wire::step(&with_config(|_| {
            protocol::report(&PROTOCOL, &scope, &key, &fence, wire::outcome(&outcome)?)
        }))
    }
    fn resume(scope: String, key: String) -> String {
        wire::step(&with_config(|_| protocol::resume(&PROTOCOL, &scope, &key)))
    }
    fn read_back(call: String, reading: String, evidence: String) -> String {
        wire::step(&with_config(|config| {
            let call = wire::optional_call(&call)?.map(|c| config.request(c));
            protocol::read_back(&PROTOCOL, call, wire::reading(&reading)?, wire::evidence(&evidence)?)
        }))
    }
    fn sweep(limit: u32, dispatch: bool) -> Result<SweepResult, Error> {
        with_config(|_| protocol::sweep(&PROTOCOL, limit, dispatch))
    }
}

impl transitions::Guest for Component {
    fn begin(call: Call) -> Result<Decision, Error> {
        with_config(|config| engine::begin(&IMPORTS, config.request(call)))
    }
    fn finish(scope: String, key: String, fence: String, outcome: Outcome) -> Result<FinishAck, Error> {
        with_config(|_| engine::finish(&IMPORTS, &scope, &key, &fence, outcome))
    }
    fn reconcile(scope: String, key: String) -> Result<Decision, Error> {
        with_config(|_| engine::reconcile(&IMPORTS, &scope, &key))
    }
    fn await_holder(scope: String, key: String) -> Result<Awaited, Error> {
        with_config(|_| engine::await_holder(&IMPORTS, &scope, &key))
    }
}

crate::bindings::export!(Component with_types_in crate::bindings);

// `memcmp` and friends come from wasi-libc's string routines, which import nothing.
#[link(name = "c")]
unsafe extern "C" {}
