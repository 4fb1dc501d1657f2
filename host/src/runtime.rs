//! Loading the once component: one engine and one compiled component per
//! process, a compiled-artifact cache on disk, and pre-linked instances.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store};

use crate::bindings::{Once as OnceWorld, OncePre};
use crate::io::HostState;

/// The component, as built by cargo from `guest/` (see `host/build.rs`).
pub const COMPONENT: &[u8] = include_bytes!(env!("ONCE_COMPONENT_PATH"));

/// A compiled, pre-linked once component; cheap to instantiate.
pub struct Runtime {
    engine: Engine,
    component: Component,
    pre: OncePre<HostState>,
}

/// A live instance of the component with its store.
pub struct Instance {
    /// The store holding the instance and its host state.
    pub store: Store<HostState>,
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
        let mut config = Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config)?;
        let component = match cache {
            Some(dir) => cached_component(&engine, dir)?,
            None => Component::new(&engine, COMPONENT)
                .map_err(anyhow::Error::from)
                .context("compiling the once component")?,
        };
        let mut linker = Linker::new(&engine);
        OnceWorld::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)?;
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
        instance
            .world
            .once_core_engine()
            .call_default_policy(&mut instance.store)?;
        Ok(())
    }

    /// A fresh instance over the given host state.
    pub fn instantiate(&self, state: HostState) -> anyhow::Result<Instance> {
        let mut store = Store::new(&self.engine, state);
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
fn cached_component(engine: &Engine, dir: &Path) -> anyhow::Result<Component> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    COMPONENT.hash(&mut hasher);
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
    let component = Component::new(engine, COMPONENT)
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
