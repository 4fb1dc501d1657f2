//! Loading the once component: one engine and one compiled component per
//! process, a compiled-artifact cache on disk, and pre-linked instances.
//!
//! # Guest limits
//!
//! Every export call runs on a fuel budget and every instance under a
//! memory limit ([`GuestLimits`]). Fuel, not epoch interruption: it counts
//! only instructions the guest executes, so a slow ledger or provider
//! lookup (host time) never cuts a legitimate call short, and the same call
//! always stops at the same point. A guest that exhausts either is stopped
//! with a typed [`GuestLimit`] error; any other trap is a component error.
//! Either way the host discards the instance. Nothing is half-written: the
//! guest's only write is `ledger.commit`, one atomic batch applied entirely
//! inside the host, and a trap can only happen between two host calls.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use anyhow::Context as _;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

use crate::bindings::types::{
    AdoptReport, Awaited, Call, Configuration, Configured, Decision, Error, Evidence, FinishAck, JsonError,
    OperatorQueue, Outcome, PruneReport, QueueFilter, Reading, RecordView, Resolution, Settings, State, Step,
    SweepResult,
};
use crate::bindings::{Once as OnceWorld, OncePre};
use crate::io::{HostState, Imports};
use crate::once::OnceError;

/// Per-call resource limits of the guest component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLimits {
    /// Fuel (about one unit per wasm instruction) that one export call may burn.
    pub fuel: u64,
    /// Largest linear memory of one instance, in bytes.
    pub memory_bytes: usize,
}

impl GuestLimits {
    /// The defaults: 2^33 fuel per call and 256 MiB of memory per instance.
    /// The heaviest single-record call measured, a `begin` whose 1 MiB of
    /// args is an array of 500,000 numbers, burns 1.2e9 fuel (0.3 s) and
    /// peaks at 44 MiB; the budget is about 7 times that, some 2.5 s of
    /// guest CPU before a runaway call is stopped.
    pub const DEFAULT: GuestLimits = GuestLimits {
        fuel: 1 << 33,
        memory_bytes: 256 << 20,
    };
}

impl Default for GuestLimits {
    fn default() -> Self {
        GuestLimits::DEFAULT
    }
}

/// Which per-call limit stopped the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GuestLimit {
    /// The call burned its whole fuel budget (e.g. an endless loop).
    #[error("fuel budget of {0} per call")]
    Fuel(u64),
    /// The instance tried to grow its memory past the limit (bytes).
    #[error("memory limit of {0} bytes")]
    Memory(usize),
}

impl GuestLimit {
    /// The limit behind a failed call, if one stopped it (rather than another trap).
    fn of(error: &wasmtime::Error, limits: &GuestLimits) -> Option<GuestLimit> {
        if let Some(limit) = error.downcast_ref::<GuestLimit>() {
            return Some(*limit);
        }
        match error.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Some(GuestLimit::Fuel(limits.fuel)),
            _ => None,
        }
    }
}

/// A failed call into the component: the limit that stopped it, or the trap.
fn failure(error: &wasmtime::Error, limits: &GuestLimits) -> OnceError {
    match GuestLimit::of(error, limits) {
        Some(limit) => OnceError::Limit(limit),
        None => OnceError::Component(format!("{error:#}")),
    }
}

/// A failure to load the component.
fn load_failure(error: anyhow::Error) -> OnceError {
    OnceError::Component(format!("{error:#}"))
}

/// What a component store holds: the imports' state and the memory limiter.
struct StoreData {
    /// Everything the imports reach.
    imports: Imports,
    memory: MemoryLimiter,
}

/// Refuses memory growth past the limit by trapping with [`GuestLimit::Memory`],
/// so the caller learns which limit it was rather than seeing a guest panic.
struct MemoryLimiter {
    max_bytes: usize,
    /// Largest linear memory granted so far (memories never shrink).
    granted: usize,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            return Err(GuestLimit::Memory(self.max_bytes).into());
        }
        self.granted = self.granted.max(desired);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(maximum.is_none_or(|m| desired <= m))
    }
}

/// The component, as built by cargo from `guest/` (see `host/once/build.rs`).
pub const COMPONENT: &[u8] = include_bytes!(env!("ONCE_COMPONENT_PATH"));

/// A compiled, pre-linked once component; cheap to instantiate.
pub struct Runtime {
    engine: Engine,
    component: Component,
    pre: OncePre<StoreData>,
    /// Whether the compiled code counts fuel ([`Runtime::load_unmetered`] does not).
    metered: bool,
}

/// What one export call answers: the export's own result (its WIT `result`),
/// or why the component gave none ([`OnceError::Component`], [`OnceError::Limit`]).
pub type Answer<T, E = Error> = Result<Result<T, E>, OnceError>;

/// A live instance of the component, with its store, its host state and its
/// limits. Every export call starts on a full fuel budget. After an
/// [`OnceError`] the instance must be dropped, never called again: a trap or
/// an exhausted limit may have stopped the guest in the middle of a call.
pub struct Instance {
    store: Store<StoreData>,
    world: OnceWorld,
    limits: GuestLimits,
    /// Which configuration `configure` last installed (see [`Instance::configured`]).
    configured: Option<u64>,
    /// Whether the store counts fuel.
    metered: bool,
}

impl Runtime {
    /// The process-wide runtime, compiled (or loaded from the cache) on first use.
    pub fn shared() -> Result<Arc<Runtime>, OnceError> {
        static SHARED: OnceLock<Arc<Runtime>> = OnceLock::new();
        static LOADING: Mutex<()> = Mutex::new(());
        if let Some(rt) = SHARED.get() {
            return Ok(rt.clone());
        }
        // Threads that race here wait for one compilation instead of each compiling the component;
        // a failed load leaves SHARED empty, so a later call tries again.
        let _loading = LOADING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rt) = SHARED.get() {
            return Ok(rt.clone());
        }
        let rt = Arc::new(Runtime::load(cache_dir().as_deref())?);
        Ok(SHARED.get_or_init(|| rt).clone())
    }

    /// Compile the component, or load its compiled form from `cache` when it matches.
    pub fn load(cache: Option<&Path>) -> Result<Runtime, OnceError> {
        Runtime::load_component(COMPONENT, cache)
    }

    /// Compile another build of a component of world `once` (a test build,
    /// a newer guest), with the same engine configuration and cache.
    pub fn load_component(wasm: &[u8], cache: Option<&Path>) -> Result<Runtime, OnceError> {
        Runtime::compile(wasm, cache, true).map_err(load_failure)
    }

    /// The component compiled without fuel metering: an export call is bounded
    /// only by the memory limit, so a guest that loops never returns. For
    /// measuring what metering costs (BENCHMARKS.md row 2) and for embedders
    /// that accept that; [`Runtime::shared`] and [`Runtime::load`] always meter.
    pub fn load_unmetered(cache: Option<&Path>) -> Result<Runtime, OnceError> {
        Runtime::compile(COMPONENT, cache, false).map_err(load_failure)
    }

    /// Whether every export call runs on a fuel budget ([`GuestLimits::fuel`]).
    pub fn metered(&self) -> bool {
        self.metered
    }

    fn compile(wasm: &[u8], cache: Option<&Path>, metered: bool) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(metered);
        let engine = Engine::new(&config)?;
        let component = match cache {
            Some(dir) => cached_component(&engine, wasm, dir)?,
            None => Component::new(&engine, wasm)
                .map_err(anyhow::Error::from)
                .context("compiling the once component")?,
        };
        let mut linker = Linker::new(&engine);
        OnceWorld::add_to_linker::<StoreData, HasSelf<Imports>>(&mut linker, |data| &mut data.imports)?;
        let pre = OncePre::new(linker.instantiate_pre(&component)?)?;
        Ok(Runtime {
            engine,
            component,
            pre,
            metered,
        })
    }

    /// The names of the interfaces the component imports (`once:core/ledger@2.0.0`, …).
    pub fn imports(&self) -> Vec<String> {
        let ty = self.component.component_type();
        ty.imports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }

    /// The names of the interfaces the component exports.
    pub fn exports(&self) -> Vec<String> {
        let ty = self.component.component_type();
        ty.exports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }

    /// Instantiate over an in-memory ledger once, to prove the runtime works.
    pub fn instantiate_check(&self) -> Result<(), OnceError> {
        self.default_settings().map(|_| ())
    }

    /// The engine's default settings (the component's `default-settings`).
    pub fn default_settings(&self) -> Result<Settings, OnceError> {
        let state = HostState::new(
            std::sync::Arc::new(crate::storage::memory::MemoryStorage::new()),
            std::sync::Arc::new(crate::io::SystemClock::default()),
        );
        self.instantiate(state)?.default_settings()
    }

    /// A fresh instance over the given host state, under the default limits.
    pub fn instantiate(&self, state: HostState) -> Result<Instance, OnceError> {
        self.instantiate_limited(state, &GuestLimits::DEFAULT)
    }

    /// A fresh instance over the given host state, under `limits`.
    pub fn instantiate_limited(&self, state: HostState, limits: &GuestLimits) -> Result<Instance, OnceError> {
        let data = StoreData {
            imports: Imports::new(state),
            memory: MemoryLimiter {
                max_bytes: limits.memory_bytes,
                granted: 0,
            },
        };
        let mut store = Store::new(&self.engine, data);
        store.limiter(|data| &mut data.memory);
        // Instantiation runs guest code too (data segments, start functions).
        if self.metered {
            store.set_fuel(limits.fuel).map_err(|e| failure(&e, limits))?;
        }
        let world = self.pre.instantiate(&mut store).map_err(|e| failure(&e, limits))?;
        Ok(Instance {
            store,
            world,
            limits: *limits,
            configured: None,
            metered: self.metered,
        })
    }
}

impl Instance {
    /// The state the imports reach (storage, clock, provider, operator).
    pub fn host(&self) -> &HostState {
        &self.store.data().imports.host
    }

    /// The imports' state, to change between calls.
    pub fn host_mut(&mut self) -> &mut HostState {
        &mut self.store.data_mut().imports.host
    }

    /// The instance's linear memory, in bytes: its high-water mark, as wasm memories never shrink.
    pub fn memory_bytes(&self) -> usize {
        self.store.data().memory.granted
    }

    /// The limits every call of this instance runs under.
    pub fn limits(&self) -> GuestLimits {
        self.limits
    }

    /// Change the fuel every later export call of this instance starts with
    /// (e.g. configure on the full budget, then run untrusted calls on less).
    pub fn set_fuel_per_call(&mut self, fuel: u64) {
        self.limits.fuel = fuel;
    }

    /// The generation of the configuration this instance runs with, if any.
    pub fn configured(&self) -> Option<u64> {
        self.configured
    }

    /// One export call on a full fuel budget.
    fn call<R>(
        &mut self,
        f: impl FnOnce(&OnceWorld, &mut Store<StoreData>) -> wasmtime::Result<R>,
    ) -> Result<R, OnceError> {
        let limits = self.limits;
        if self.metered {
            self.store.set_fuel(limits.fuel).map_err(|e| failure(&e, &limits))?;
        }
        // A panic out of an import (a user's Provider, say) must not leave a turn held by an
        // instance its owner may keep (`crate::turns`).
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&self.world, &mut self.store)));
        self.store.data_mut().imports.end_export();
        match answer {
            Ok(answer) => answer.map_err(|e| failure(&e, &limits)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// The `default-settings` export.
    pub fn default_settings(&mut self) -> Result<Settings, OnceError> {
        self.call(|w, s| w.once_core_engine().call_default_settings(s))
    }

    /// The `configure` export; on success the instance runs configuration `generation`.
    pub fn configure(&mut self, configuration: &Configuration, generation: u64) -> Answer<Configured> {
        let answer = self.call(|w, s| w.once_core_engine().call_configure(s, configuration))?;
        self.configured = answer.is_ok().then_some(generation);
        // The guest keeps its last accepted configuration when it refuses one, and the imports
        // keep answering its encoding (the host forgets the generation: the instance is
        // configured again before it serves a call).
        if answer.is_ok() {
            self.store.data_mut().imports.encoding = Some(configuration.ledger_encoding);
        }
        Ok(answer)
    }

    /// `driver.start`.
    pub fn start(&mut self, call: &Call) -> Answer<Step> {
        self.call(|w, s| w.once_core_driver().call_start(s, call))
    }

    /// `driver.report`.
    pub fn report(&mut self, scope: &str, key: &str, fence: &str, outcome: &Outcome) -> Answer<Step> {
        self.call(|w, s| w.once_core_driver().call_report(s, scope, key, fence, outcome))
    }

    /// `driver.resume`.
    pub fn resume(&mut self, scope: &str, key: &str) -> Answer<Step> {
        self.call(|w, s| w.once_core_driver().call_resume(s, scope, key))
    }

    /// `driver.read-back`.
    pub fn read_back(&mut self, call: Option<&Call>, reading: &Reading, evidence: &Evidence) -> Answer<Step> {
        self.call(|w, s| w.once_core_driver().call_read_back(s, call, reading, evidence))
    }

    /// `protocol.start`, the JSON encoding (tests hold it to `driver`'s).
    #[cfg(test)]
    pub(crate) fn start_json(&mut self, call: &str) -> Result<String, OnceError> {
        self.call(|w, s| w.once_core_protocol().call_start(s, call))
    }

    /// `protocol.read-back`, the JSON encoding (tests hold it to `driver`'s).
    #[cfg(test)]
    pub(crate) fn read_back_json(&mut self, call: &str, reading: &str, evidence: &str) -> Result<String, OnceError> {
        self.call(|w, s| w.once_core_protocol().call_read_back(s, call, reading, evidence))
    }

    /// The `sweep` export.
    pub fn sweep(&mut self, limit: u32, dispatch: bool) -> Answer<SweepResult> {
        self.call(|w, s| w.once_core_protocol().call_sweep(s, limit, dispatch))
    }

    /// The `begin` transition.
    pub fn begin(&mut self, call: &Call) -> Answer<Decision> {
        self.call(|w, s| w.once_core_transitions().call_begin(s, call))
    }

    /// The `finish` transition.
    pub fn finish(&mut self, scope: &str, key: &str, fence: &str, outcome: &Outcome) -> Answer<FinishAck> {
        self.call(|w, s| w.once_core_transitions().call_finish(s, scope, key, fence, outcome))
    }

    /// The `reconcile` transition.
    pub fn reconcile(&mut self, scope: &str, key: &str) -> Answer<Decision> {
        self.call(|w, s| w.once_core_transitions().call_reconcile(s, scope, key))
    }

    /// The `await-holder` transition.
    pub fn await_holder(&mut self, scope: &str, key: &str) -> Answer<Awaited> {
        self.call(|w, s| w.once_core_transitions().call_await_holder(s, scope, key))
    }

    /// The `prune` export.
    pub fn prune(&mut self, limit: u32) -> Answer<PruneReport> {
        self.call(|w, s| w.once_core_engine().call_prune(s, limit))
    }

    /// The `adopt` export.
    pub fn adopt(&mut self, from: &str, to: &str, note: &str, limit: u32) -> Answer<AdoptReport> {
        self.call(|w, s| w.once_core_engine().call_adopt(s, from, to, note, limit))
    }

    /// The `queue` export.
    pub fn queue(&mut self, filter: &QueueFilter, limit: u32) -> Answer<OperatorQueue> {
        self.call(|w, s| w.once_core_engine().call_queue(s, filter, limit))
    }

    /// The `inspect` export.
    pub fn inspect(&mut self, scope: &str, key: &str) -> Answer<Option<RecordView>> {
        self.call(|w, s| w.once_core_engine().call_inspect(s, scope, key))
    }

    /// The `resolve` export.
    pub fn resolve(
        &mut self,
        scope: &str,
        key: &str,
        resolution: &Resolution,
        note: &str,
        force: bool,
    ) -> Answer<State> {
        self.call(|w, s| {
            w.once_core_engine()
                .call_resolve(s, scope, key, resolution, note, force)
        })
    }

    /// The `canonicalize` export.
    pub fn canonicalize(&mut self, json: &[u8]) -> Answer<String, JsonError> {
        self.call(|w, s| w.once_core_engine().call_canonicalize(s, json))
    }

    /// The `fingerprint` export.
    pub fn fingerprint(&mut self, tool: &str, args: &str) -> Answer<String, JsonError> {
        self.call(|w, s| w.once_core_engine().call_fingerprint(s, tool, args))
    }
}

/// Where compiled components are cached: `ONCE_CACHE_DIR`, else the user's
/// cache directory, else none (compile every time).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("ONCE_CACHE_DIR") {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("once"))
}

/// Load the compiled component from `dir`, or compile it and store it there.
/// A stale or foreign artifact is recompiled, never trusted.
fn cached_component(engine: &Engine, wasm: &[u8], dir: &Path) -> anyhow::Result<Component> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    wasm.hash(&mut hasher);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let path = dir.join(format!("once-{:016x}.cwasm", hasher.finish()));
    if path.is_file() {
        // SAFETY: the file was written by `Component::serialize` below, for this
        // exact component and engine configuration (the name carries both), in a
        // cache directory owned by this user; wasmtime also checks compatibility.
        if let Ok(component) = unsafe { Component::deserialize_file(engine, &path) } {
            return Ok(component);
        }
    }
    let component = Component::new(engine, wasm)
        .map_err(anyhow::Error::from)
        .context("compiling the once component")?;
    // The cache is an optimisation: failing to write it is not an error.
    if let Ok(bytes) = component.serialize() {
        let _ = std::fs::create_dir_all(dir).and_then(|()| {
            let tmp = dir.join(format!(".once-{}.tmp", std::process::id()));
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, &path)
        });
    }
    Ok(component)
}
