"""Build hook: build the once guest component with cargo and ship the .wasm as package data.

Where the component comes from, in order (the build log says which):
1. `ONCE_COMPONENT`: a built once_guest.wasm (nothing is compiled);
2. an sdist made by this hook (it has `PKG-INFO`): the `src/once/once_guest.wasm`
   it carries; cargo is never called, so `pip install once_exactly-*.tar.gz`
   needs no Rust (an sdist without the file is an error, not a cargo build);
3. inside the once repository (`../Cargo.toml`): `cargo build -p once-guest` for
   wasm32-wasip2, with the same flags and target directory as
   host/once/build.rs, so the Rust host and this package ship the same bytes.
The wheel holds no compiled code of its own: `py3-none-any`.

The ledger's DDL, the repository's `schema/` (one level up: `sqlite/`, `postgres/`, README.md), goes in
as `once/schema/` (the sdist's `src/once/schema/`, which a wheel built from that sdist takes, no repository
needed): the SQLite and PostgreSQL ledgers load it from there with importlib.resources.

The repository's LICENSE (one level up, where hatchling's license globs cannot
reach) goes into the sdist as `LICENSE`, where hatchling itself ships it in a
wheel built from that sdist (`.dist-info/licenses/LICENSE`, named in
METADATA); a wheel built from the checkout gets it at that path from here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

TARGET = "wasm32-wasip2"
PACKAGED = "src/once/once_guest.wasm"
# Where an sdist carries the repository's schema/, and its backends' folders (and the witness file's).
SCHEMA = "src/once/schema"
BACKENDS = ("sqlite", "postgres", "witness")
# The release profile host/once/build.rs builds the guest with.
PROFILE = {
    "CARGO_PROFILE_RELEASE_DEBUG": "false",
    "CARGO_PROFILE_RELEASE_STRIP": "true",
    "CARGO_PROFILE_RELEASE_LTO": "true",
    "CARGO_PROFILE_RELEASE_CODEGEN_UNITS": "1",
    "CARGO_PROFILE_RELEASE_OPT_LEVEL": "3",
    "CARGO_PROFILE_RELEASE_PANIC": "abort",
}


class GuestBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Puts the component into the wheel (and the sdist) as `once/once_guest.wasm`."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        wasm = self._component()
        target = "once/once_guest.wasm" if self.target_name == "wheel" else PACKAGED
        build_data.setdefault("force_include", {})[str(wasm)] = target
        schema_to = "once/schema" if self.target_name == "wheel" else SCHEMA
        for path in self._schema_files():
            relative = path.relative_to(path.parents[1]) if path.parent.name in BACKENDS else Path(path.name)
            build_data["force_include"][str(path)] = f"{schema_to}/{relative.as_posix()}"
        if self.target_name == "wheel":
            build_data["pure_python"] = True
            build_data["tag"] = "py3-none-any"
        license_file = Path(self.root).parent / "LICENSE"
        if (Path(self.root) / "LICENSE").is_file():
            return  # an sdist: hatchling ships it
        if not license_file.is_file():
            raise RuntimeError(f"once-exactly: no license to package: {license_file} is missing")
        shipped = "LICENSE" if self.target_name != "wheel" else \
            f"{self.build_config.builder.artifact_project_id}.dist-info/licenses/LICENSE"
        build_data["force_include"][str(license_file)] = shipped

    def _schema_files(self) -> list[Path]:
        """The ledger's DDL files and their README: the sdist's copy, else the repository's `schema/`."""
        root = Path(self.root)
        folder = root / SCHEMA if (root / "PKG-INFO").is_file() else root.parent / "schema"
        files = [folder / "README.md"] + [p for b in BACKENDS for p in sorted((folder / b).glob("*.sql"))]
        missing = [str(p) for p in files if not p.is_file()]
        if missing or not any(p.suffix == ".sql" for p in files):
            raise RuntimeError(f"once-exactly: no ledger schema to package in {folder} (missing: {missing})")
        return files

    def _component(self) -> Path:
        root = Path(self.root)
        prebuilt = os.environ.get("ONCE_COMPONENT")
        if prebuilt:
            path = Path(prebuilt)
            if not path.is_file():
                raise RuntimeError(f"ONCE_COMPONENT={prebuilt}: no such file")
            self.app.display_info(f"once-exactly: the component is ONCE_COMPONENT={path}, used as given")
            return path
        carried = root / PACKAGED
        if (root / "PKG-INFO").is_file():
            if not carried.is_file():
                raise RuntimeError(f"once-exactly: this sdist carries no component ({PACKAGED} is missing); "
                                   "set ONCE_COMPONENT to a built once_guest.wasm")
            self.app.display_info(f"once-exactly: the component is the sdist's {PACKAGED} (no cargo)")
            return carried
        repo = root.parent
        if (repo / "Cargo.toml").is_file() and (repo / "guest" / "Cargo.toml").is_file():
            return self._cargo_build(repo)
        raise RuntimeError(
            "once-exactly: no component to package: build inside the once repository (needs cargo and the "
            f"{TARGET} target: rustup target add {TARGET}), or set ONCE_COMPONENT to a built once_guest.wasm"
        )

    def _cargo_build(self, repo: Path) -> Path:
        cargo = os.environ.get("CARGO") or shutil.which("cargo")
        if cargo is None:
            raise RuntimeError("once-exactly: cargo is not on PATH; it builds the guest component (or set ONCE_COMPONENT)")
        target_dir = Path(os.environ.get("CARGO_TARGET_DIR") or repo / "target") / "once-guest"
        env = {k: v for k, v in os.environ.items() if k not in (
            "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR", "CARGO_BUILD_RUSTFLAGS")}
        env.update(PROFILE)
        command = [cargo, "build", "--locked", "--release", "-p", "once-guest", "--lib", "--target", TARGET,
                   "--target-dir", str(target_dir)]
        self.app.display_info(f"once-exactly: building the guest component: {' '.join(command)}")
        done = subprocess.run(command, cwd=repo, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"once-exactly: building the guest component failed (exit {done.returncode}): "
                               f"{' '.join(command)}")
        wasm = target_dir / TARGET / "release" / "once_guest.wasm"
        if not wasm.is_file():
            raise RuntimeError(f"once-exactly: cargo succeeded but {wasm} is missing")
        return wasm
