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
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

use crate::bindings::{Once as OnceWorld, OncePre};
use crate::io::HostState;

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
    pub fn of(error: &wasmtime::Error, limits: &GuestLimits) -> Option<GuestLimit> {
        if let Some(limit) = error.downcast_ref::<GuestLimit>() {
            return Some(*limit);
        }
        match error.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Some(GuestLimit::Fuel(limits.fuel)),
            _ => None,
        }
    }
}

/// What a component store holds: the imports' state and the memory limiter.
pub struct StoreData {
    /// Everything the imports reach.
    pub host: HostState,
    memory: MemoryLimiter,
}

/// Refuses memory growth past the limit by trapping with [`GuestLimit::Memory`],
/// so the caller learns which limit it was rather than seeing a guest panic.
struct MemoryLimiter {
    max_bytes: usize,
    /// Largest linear memory granted so far (memories never shrink).
    granted: usize,
}

impl StoreData {
    /// The instance's linear memory, in bytes: its high-water mark, as wasm memories never shrink.
    pub fn memory_bytes(&self) -> usize {
        self.memory.granted
    }
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

/// The component, as built by cargo from `guest/` (see `host/build.rs`).
pub const COMPONENT: &[u8] = include_bytes!(env!("ONCE_COMPONENT_PATH"));

/// A compiled, pre-linked once component; cheap to instantiate.
pub struct Runtime {
    engine: Engine,
    component: Component,
    pre: OncePre<StoreData>,
}

/// A live instance of the component with its store.
pub struct Instance {
    /// The store holding the instance, its host state and its limits.
    pub store: Store<StoreData>,
    /// Typed handles to the exports.
    pub world: OnceWorld,
}

impl Runtime {
    /// The process-wide runtime, compiled (or loaded from the cache) on first use.
    pub fn shared() -> anyhow::Result<Arc<Runtime>> {
        static SHARED: OnceLock<Arc<Runtime>> = OnceLock::new();
        if let Some(rt) = SHARED.get() {
            return Ok(rt.clone());
        }
        let rt = Arc::new(Runtime::load(cache_dir().as_deref())?);
        Ok(SHARED.get_or_init(|| rt).clone())
    }

    /// Compile the component, or load its compiled form from `cache` when it matches.
    pub fn load(cache: Option<&Path>) -> anyhow::Result<Runtime> {
        Runtime::load_component(COMPONENT, cache)
    }

    /// Compile another build of a component of world `once` (a test build,
    /// a newer guest), with the same engine configuration and cache.
    pub fn load_component(wasm: &[u8], cache: Option<&Path>) -> anyhow::Result<Runtime> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        let engine = Engine::new(&config)?;
        let component = match cache {
            Some(dir) => cached_component(&engine, wasm, dir)?,
            None => Component::new(&engine, wasm)
                .map_err(anyhow::Error::from)
                .context("compiling the once component")?,
        };
        let mut linker = Linker::new(&engine);
        OnceWorld::add_to_linker::<StoreData, HasSelf<HostState>>(&mut linker, |data| &mut data.host)?;
        let pre = OncePre::new(linker.instantiate_pre(&component)?)?;
        Ok(Runtime { engine, component, pre })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The compiled component.
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// Instantiate over an in-memory ledger once, to prove the runtime works.
    pub fn instantiate_check(&self) -> anyhow::Result<()> {
        let state = crate::io::HostState {
            storage: std::sync::Arc::new(crate::storage::memory::MemoryStorage::new()),
            clock: std::sync::Arc::new(crate::io::SystemClock::default()),
            provider: std::sync::Arc::new(crate::io::NoProvider),
            operator: std::sync::Arc::new(crate::io::LogOperator),
            settings: crate::once::default_settings(),
        };
        let mut instance = self.instantiate(state)?;
        instance.store.set_fuel(GuestLimits::DEFAULT.fuel)?;
        instance
            .world
            .once_core_engine()
            .call_default_policy(&mut instance.store)?;
        Ok(())
    }

    /// A fresh instance over the given host state, under the default limits.
    pub fn instantiate(&self, state: HostState) -> anyhow::Result<Instance> {
        Ok(self.instantiate_limited(state, &GuestLimits::DEFAULT)?)
    }

    /// A fresh instance over the given host state, under `limits`. The store
    /// is left with the fuel of one call; refill it before each call.
    pub fn instantiate_limited(&self, state: HostState, limits: &GuestLimits) -> wasmtime::Result<Instance> {
        let data = StoreData {
            host: state,
            memory: MemoryLimiter {
                max_bytes: limits.memory_bytes,
                granted: 0,
            },
        };
        let mut store = Store::new(&self.engine, data);
        store.limiter(|data| &mut data.memory);
        // Instantiation runs guest code too (data segments, start functions).
        store.set_fuel(limits.fuel)?;
        let world = self.pre.instantiate(&mut store)?;
        Ok(Instance { store, world })
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
