//! A hostile component of world `once`: the host must survive it.
//!
//! `driver.start` and `begin` act on the call's tool name and `canonicalize` on
//! its input bytes, so one build covers every case:
//!
//! | command | what the guest does |
//! | --- | --- |
//! | `count` | answers how many calls this instance has served (`canonicalize` only) |
//! | `loop` | spins forever |
//! | `trap` | hits `unreachable` |
//! | `alloc` | allocates without bound |
//! | `recurse` | recurses without bound |
//! | `write-then-X` | commits one batch (an operation row, a quota row, an audit event), then does X |
//!
//! Anything else is refused with an error. `configure` accepts anything;
//! every other export is inert (the JSON `protocol` too: the Rust host
//! drives the typed `driver`, whose answers wasmtime checks as it lifts
//! them, so there is no JSON answer to garble).
#![no_std]
#![allow(missing_docs, clippy::all)]

extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

wit_bindgen::generate!({
    path: "../../../../wit",
    world: "once",
});

use once::core::ledger;
use once::core::types::*;

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// The canonical ABI's allocator, over the global allocator (as in the real guest).
///
/// # Safety
/// Called only by the component runtime with a pointer and size an earlier call returned.
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

/// Calls served by this instance: a reused instance counts on, a fresh one starts at 1.
static CALLS: AtomicU32 = AtomicU32::new(0);

/// One ledger batch of two rows and an audit event, all for (`scope`, `key`).
fn write(scope: &str, key: &str) {
    let row = |table| Row {
        table,
        scope: scope.to_string(),
        key: key.to_string(),
        version: 1,
        state: (table == Table::Operation).then_some(State::InFlight),
        due_at: Some(1),
        owner: None,
        body: "{\"hostile\":true}".to_string(),
    };
    let put = |table| Put {
        table,
        scope: scope.to_string(),
        key: key.to_string(),
        expected: None,
        row: Some(row(table)),
    };
    let batch = Batch {
        puts: vec![put(Table::Operation), put(Table::Quota)],
        events: vec![AuditEvent {
            scope: scope.to_string(),
            key: key.to_string(),
            version: 1,
            at: 1,
            kind: "hostile-write".to_string(),
            from_state: None,
            to_state: Some(State::InFlight),
            attempt: Some(1),
            detail: "{}".to_string(),
        }],
        deferrable: false,
    };
    if !matches!(ledger::commit(&batch), Committed::Applied) {
        core::arch::wasm32::unreachable();
    }
}

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let frame = core::hint::black_box([depth; 64]);
    recurse(depth + 1).wrapping_add(frame[depth as usize % 64])
}

/// Misbehave as `command` says; returns only for commands that do not misbehave.
fn misbehave(command: &str, scope: &str, key: &str) -> Option<String> {
    let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
    let action = match command.strip_prefix("write-then-") {
        Some(rest) => {
            write(scope, key);
            rest
        }
        None => command,
    };
    match action {
        "count" => Some(calls.to_string()),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = core::hint::black_box(n.wrapping_add(1));
            }
        }
        "trap" => core::arch::wasm32::unreachable(),
        "alloc" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(core::hint::black_box(vec![1u8; 1 << 20]));
            }
        }
        "recurse" => Some(recurse(core::hint::black_box(0)).to_string()),
        _ => None,
    }
}

/// A decided policy, for `configure`'s answer (this guest applies none).
fn policy() -> ToolPolicy {
    ToolPolicy {
        route: None,
        identity: IdentityMode::Required,
        key_argument: None,
        key_sent_by_host: false,
        effect_fields: None,
        verify_first: false,
        provider_claims_key: false,
        lookup: false,
        max_in_flight_ms: 60_000,
        dispatch_timeout_ms: 30_000,
        lease_ms: 35_000,
        attempt_budget: 3,
        derived_window_ms: 86_400_000,
        resolve_deadline_ms: 900_000,
        reconcile_interval_ms: 5_000,
        retention_ms: 7 * 86_400_000,
        tombstone_retention_ms: 90 * 86_400_000,
        quota: None,
        descriptor_pin: None,
        approval: ApprovalRule::Never,
        approval_valid_ms: 3_600_000,
        approval_wait_ms: 86_400_000,
        provider_account: None,
    }
}

fn refused() -> Error {
    Error::InvalidRequest("the hostile guest does not do that".to_string())
}

/// Misbehave as the call's tool says, then refuse.
fn misbehave_on(call: &Call) -> Error {
    let key = call.keys.first().map(|(_, k)| k.as_str()).unwrap_or("no-key");
    misbehave(&call.tool, &call.scope, key);
    refused()
}

/// `start`'s refusal, in the JSON form of a `result<step, error>`.
const REFUSED: &str = "{\"Err\":{\"InvalidRequest\":\"the hostile guest does not do that\"}}";

struct Hostile;

impl exports::once::core::engine::Guest for Hostile {
    fn default_settings() -> Settings {
        Settings {
            max_input_bytes: 1 << 20,
            max_depth: 128,
            max_key_bytes: 512,
            clock_skew_ms: 0,
            owner: "default".to_string(),
        }
    }
    fn configure(_: Configuration) -> Result<Configured, Error> {
        Ok(Configured {
            defaults: policy(),
            tools: Vec::new(),
            body_format: 1,
        })
    }
    fn queue(_: QueueFilter, _: u32) -> Result<OperatorQueue, Error> {
        Err(refused())
    }
    fn inspect(_: String, _: String) -> Result<Option<RecordView>, Error> {
        Ok(None)
    }
    fn resolve(_: String, _: String, _: Resolution, _: String, _: bool) -> Result<State, Error> {
        Err(refused())
    }
    fn prune(_: u32) -> Result<PruneReport, Error> {
        Err(refused())
    }
    fn adopt(_: String, _: String, _: String, _: u32) -> Result<AdoptReport, Error> {
        Err(refused())
    }
    fn canonicalize(json: Vec<u8>) -> Result<String, JsonError> {
        let command = core::str::from_utf8(&json).unwrap_or("");
        misbehave(command, "hostile", command).ok_or_else(|| JsonError {
            kind: JsonErrorKind::Syntax,
            pointer: String::new(),
            offset: 0,
            message: "not a command".to_string(),
        })
    }
    fn fingerprint(_: String, _: String) -> Result<String, JsonError> {
        Err(JsonError {
            kind: JsonErrorKind::Syntax,
            pointer: String::new(),
            offset: 0,
            message: "the hostile guest does not do that".to_string(),
        })
    }
}

impl exports::once::core::driver::Guest for Hostile {
    fn start(call: Call) -> Result<Step, Error> {
        Err(misbehave_on(&call))
    }
    fn report(_: String, _: String, _: String, _: Outcome) -> Result<Step, Error> {
        Err(refused())
    }
    fn resume(_: String, _: String) -> Result<Step, Error> {
        Err(refused())
    }
    fn read_back(_: Option<Call>, _: Reading, _: Evidence) -> Result<Step, Error> {
        Err(refused())
    }
}

impl exports::once::core::protocol::Guest for Hostile {
    fn start(_: String) -> String {
        REFUSED.to_string()
    }
    fn report(_: String, _: String, _: String, _: String) -> String {
        REFUSED.to_string()
    }
    fn resume(_: String, _: String) -> String {
        REFUSED.to_string()
    }
    fn read_back(_: String, _: String, _: String) -> String {
        REFUSED.to_string()
    }
    fn sweep(_: u32, _: bool) -> Result<SweepResult, Error> {
        Err(refused())
    }
}

impl exports::once::core::transitions::Guest for Hostile {
    fn begin(call: Call) -> Result<Decision, Error> {
        Err(misbehave_on(&call))
    }
    fn finish(_: String, _: String, _: String, _: Outcome) -> Result<FinishAck, Error> {
        Err(refused())
    }
    fn reconcile(_: String, _: String) -> Result<Decision, Error> {
        Err(refused())
    }
    fn await_holder(_: String, _: String) -> Result<Awaited, Error> {
        Err(refused())
    }
}

export!(Hostile);

// `memcpy` and friends come from wasi-libc's string routines, which import nothing.
#[link(name = "c")]
unsafe extern "C" {}
