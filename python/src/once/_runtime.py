"""The component, compiled once per process (and cached on disk), and its instances.

The compiled artifact is kept in `$ONCE_CACHE_DIR`, else
`$XDG_CACHE_HOME/once` or `~/.cache/once`, named by a hash of the component
and the wasmtime version, so a stale or foreign artifact is never loaded; a
file that does not deserialize is recompiled. Set `ONCE_CACHE_DIR=` (empty)
to compile in memory only.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable, Optional

import wasmtime
import wasmtime.component as wc

from . import _wit, errors

VERSION = "2.0.0"
INTERFACES = {
    "engine": ("default-settings", "configure", "queue", "inspect", "resolve", "prune", "canonicalize", "fingerprint"),
    "protocol": ("start", "report", "resume", "sweep"),
    "transitions": ("begin", "finish", "reconcile", "await-holder"),
}
# The Rust host's defaults: 2^33 fuel per export call, 256 MiB of memory per instance.
DEFAULT_FUEL = 1 << 33
DEFAULT_MEMORY = 256 << 20


def component_path() -> Path:
    """The packaged component, or `$ONCE_COMPONENT` when set (a development build)."""
    override = os.environ.get("ONCE_COMPONENT")
    if override:
        return Path(override)
    return Path(str(resources.files("once").joinpath("once_guest.wasm")))


def cache_dir() -> Optional[Path]:
    """Where compiled artifacts are kept; None: no disk cache."""
    if "ONCE_CACHE_DIR" in os.environ:
        d = os.environ["ONCE_CACHE_DIR"]
        return Path(d) if d else None
    base = os.environ.get("XDG_CACHE_HOME") or (os.path.join(os.path.expanduser("~"), ".cache"))
    return Path(base) / "once"


class Runtime:
    """One engine and the compiled component, shared by every handle of the process."""

    _shared: Optional[Runtime] = None
    _lock = threading.Lock()

    def __init__(self, wasm: bytes, cache: Optional[Path]) -> None:
        config = wasmtime.Config()
        config.consume_fuel = True
        self.engine = wasmtime.Engine(config)
        self.from_cache = False
        self.component = self._load(wasm, cache)

    @classmethod
    def shared(cls) -> Runtime:
        """The process-wide runtime, compiled (or loaded from the cache) on first use."""
        with cls._lock:
            if cls._shared is None:
                path = component_path()
                try:
                    wasm = path.read_bytes()
                except OSError as e:
                    raise errors.ComponentError(
                        f"the once component is missing at {path} ({e.strerror}); reinstall the package "
                        "(pip install builds it with cargo) or set ONCE_COMPONENT to a built once_guest.wasm"
                    ) from e
                cls._shared = Runtime(wasm, cache_dir())
            return cls._shared

    def _load(self, wasm: bytes, cache: Optional[Path]) -> wc.Component:
        if cache is None:
            return self._compile(wasm)
        digest = hashlib.sha256(wasm + b"\0wasmtime " + metadata.version("wasmtime").encode() + b"\0fuel").hexdigest()
        path = cache / f"once-py-{digest[:32]}.cwasm"
        if path.is_file():
            try:
                component = wc.Component.deserialize_file(self.engine, str(path))
                self.from_cache = True
                return component
            except wasmtime.WasmtimeError:
                pass  # stale or damaged: recompiled below
        component = self._compile(wasm)
        # The cache is an optimisation: failing to write it is not an error.
        try:
            cache.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=".once-py-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(component.serialize())
            os.replace(tmp, path)
        except OSError:
            pass
        return component

    def _compile(self, wasm: bytes) -> wc.Component:
        try:
            return wc.Component(self.engine, wasm)
        except wasmtime.WasmtimeError as e:
            raise errors.ComponentError(f"compiling the once component failed: {e}") from e


class Instance:
    """One instance of the component in its own store; dropped after any trap or exhausted limit.

    Every export is looked up once per instance (`export`); the protocol's three exports, which answer JSON
    text, are called through `text`, every other one through `call`.
    """

    def __init__(self, runtime: Runtime, linker: wc.Linker, fuel: int, memory: int) -> None:
        self.store = wasmtime.Store(runtime.engine)
        self.store.set_limits(memory_size=memory)
        self.fuel = fuel
        self.store.set_fuel(fuel)
        try:
            self.instance = linker.instantiate(self.store, runtime.component)
        except wasmtime.WasmtimeError as e:
            raise errors.ComponentError(f"instantiating the once component failed: {e}") from e
        self.exports: dict[str, _wit.Export] = {}
        self.configured: Optional[int] = None
        self.start = self.export("start").func
        self.report = self.export("report").func
        self.resume = self.export("resume").func

    def export(self, name: str) -> _wit.Export:
        """Export `name`, with its parameter types and how its result lifts."""
        found = self.exports.get(name)
        if found is None:
            iface = next(i for i, names in INTERFACES.items() if name in names)
            index = self.instance.get_export_index(self.store, f"once:core/{iface}@{VERSION}")
            if index is None:
                raise errors.ComponentError(f"the once component exports no once:core/{iface}@{VERSION}: "
                                            "a component of another version (rebuild or reinstall the package)")
            export = self.instance.get_export_index(self.store, name, index)
            f = None if export is None else self.instance.get_func(self.store, export)
            if f is None:
                raise errors.ComponentError(f"the once component's {iface} interface has no function {name!r}")
            ty = f.type(self.store)
            found = self.exports[name] = _wit.Export(f, dict(ty.params), ty.result)
        return found

    def _enter(self, name: str, f: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        self.store.set_fuel(self.fuel)
        try:
            return f(self.store, *args)
        except UnicodeEncodeError as e:
            # The lowering refused a string with no UTF-8 form (a lone surrogate) before the guest ran, so nothing
            # was recorded. The callers check the fields they build first; this names a typed export's parameter.
            export = self.exports.get(name)
            for param, arg in zip(export.params if export else (), args):
                if isinstance(arg, str):
                    _wit.utf8_text(f"{name}: {param}", arg)
            raise errors.InvalidRequest(f"{name}: an argument holds a lone surrogate U+{ord(e.object[e.start]):04X} "
                                        "(it has no UTF-8 form)") from None
        except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
            if "all fuel consumed" in str(e):
                raise errors.GuestLimit(
                    f"{name}: the once component exceeded its fuel budget of {self.fuel} per call"
                ) from e
            raise errors.ComponentError(f"{name}: the once component trapped: {str(e).splitlines()[0]}") from e

    def step(self, name: str, f: Callable[..., Any], *args: Any) -> _wit.Step:
        """Call a protocol export (`self.start`, `self.report`, `self.resume`): its step, or its error raised."""
        text = self._enter(name, f, args)
        return _wit.step(text, name)

    def call(self, name: str, *args: Any) -> Any:
        """Call a typed export; a result<T, E> is unwrapped, its error raised as the typed exception."""
        e = self.export(name)
        value = self._enter(name, e.func, args)
        if e.is_result:
            ok, payload = e.split(value)
            if not ok:
                raise _wit.error(payload, name)
            return payload
        return value

    def case(self, name: str, param: str, tag: str, payload: Any) -> Any:
        """A variant argument of export `name`, tagged or bare as its type needs."""
        return self.export(name).case(param, tag, payload)
