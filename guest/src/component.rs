//! The wasm shell: WIT exports call the engine, WIT imports are the [`Host`].

use alloc::string::String;
use alloc::vec::Vec;

use crate::bindings::exports::once::core::engine::Guest;
use crate::bindings::once::core::{clock, ledger, operator, provider};
use crate::engine;
use crate::host::Host;
use crate::types::*;

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

/// The host as seen from inside the component: the WIT imports.
struct Imports;

impl Host for Imports {
    fn now(&self) -> u64 {
        clock::now()
    }
    fn settings(&self) -> Settings {
        clock::get_settings()
    }
    fn get(&self, table: Table, scope: &str, key: &str) -> Result<Option<Row>, String> {
        ledger::get(table, scope, key)
    }
    fn commit(&self, batch: &Batch) -> Result<(), CommitError> {
        ledger::commit(batch)
    }
    fn scan(
        &self,
        table: Table,
        states: &[State],
        due_before: u64,
        owner: Option<String>,
        limit: u32,
    ) -> Result<Vec<Row>, String> {
        ledger::scan(table, states, due_before, owner.as_deref(), limit)
    }
    fn audit(&self, scope: &str, key: &str) -> Result<Vec<AuditEvent>, String> {
        ledger::audit(scope, key)
    }
    fn lookup(&self, tool: &str, provider_key: &str, args: &str) -> Evidence {
        provider::lookup(tool, provider_key, args)
    }
    fn escalate(&self, escalation: &Escalation) -> bool {
        operator::escalate(escalation)
    }
}

struct Component;

impl Guest for Component {
    fn default_policy() -> ToolPolicy {
        crate::policy::default_policy()
    }
    fn check_policy(policy: ToolPolicy) -> Result<(), Error> {
        crate::policy::check_policy(&policy, &Imports.settings())
    }
    fn route_of(policy: ToolPolicy, descriptor: Option<ToolDescriptor>) -> Route {
        match crate::policy::route(&policy, descriptor.as_ref(), &Imports.settings()) {
            Ok(routing) => routing.route(),
            // An unreadable descriptor cannot be classified: never direct.
            Err(_) => Route::Block,
        }
    }
    fn begin(request: BeginRequest) -> Result<Decision, Error> {
        engine::begin(&Imports, request)
    }
    fn finish(scope: String, key: String, fence: String, outcome: Outcome) -> Result<FinishAck, Error> {
        engine::finish(&Imports, &scope, &key, &fence, outcome)
    }
    fn reconcile(scope: String, key: String) -> Result<Decision, Error> {
        engine::reconcile(&Imports, &scope, &key)
    }
    fn await_holder(scope: String, key: String) -> Result<Awaited, Error> {
        engine::await_holder(&Imports, &scope, &key)
    }
    fn sweep(limit: u32) -> Result<SweepReport, Error> {
        engine::sweep(&Imports, limit)
    }
    fn prune(limit: u32) -> Result<PruneReport, Error> {
        engine::prune(&Imports, limit)
    }
    fn inspect(scope: String, key: String) -> Result<Option<RecordView>, Error> {
        engine::inspect(&Imports, &scope, &key)
    }
    fn resolve(scope: String, key: String, resolution: Resolution, note: String, force: bool) -> Result<State, Error> {
        engine::resolve(&Imports, &scope, &key, resolution, &note, force)
    }
    fn canonicalize(json: Vec<u8>) -> Result<String, JsonError> {
        engine::canonicalize(&Imports, &json)
    }
    fn fingerprint(tool: String, args: String) -> Result<String, JsonError> {
        engine::fingerprint(&Imports, &tool, &args)
    }
}

crate::bindings::export!(Component with_types_in crate::bindings);

// `memcmp` and friends come from wasi-libc's string routines, which import nothing.
#[link(name = "c")]
unsafe extern "C" {}
