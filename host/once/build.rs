//! Builds the guest component (`guest/`) for `wasm32-wasip2` with the same
//! cargo, into its own target directory, and hands its path to the host
//! crate as `ONCE_COMPONENT_PATH`.
//!
//! Plain cargo is enough: rustc emits a component for `wasm32-wasip2`
//! directly, so no `cargo component` or `wasm-tools` step is needed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    // host/once -> the workspace root, which holds guest/, wit/ and Cargo.lock.
    let root = manifest_dir
        .ancestors()
        .nth(2)
        .expect("host/once/ lives two levels below the workspace root")
        .to_path_buf();
    for path in ["guest/src", "guest/Cargo.toml", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=ONCE_COMPONENT");

    // A prebuilt component (e.g. one built once per CI run and shared by
    // several runners) may be supplied instead.
    if let Some(prebuilt) = env::var_os("ONCE_COMPONENT") {
        println!(
            "cargo:rustc-env=ONCE_COMPONENT_PATH={}",
            PathBuf::from(prebuilt).display()
        );
        return;
    }

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if !target_installed(&rustc) {
        eprintln!("error: the {TARGET} target is missing; install it with: rustup target add {TARGET}");
        panic!("the {TARGET} target is missing; install it with: rustup target add {TARGET}");
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // <target>/<profile>/build/once-host-*/out -> <target>/once-guest
    let target_dir = out_dir.ancestors().nth(4).unwrap_or(&out_dir).join("once-guest");

    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--locked",
            "--release",
            "-p",
            "once-guest",
            "--lib",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // The component is small and called often: optimise it whatever the host profile.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort");
    // Flags meant for the host build (coverage, clippy's driver, a host
    // --target) must not leak into the wasm build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("could not run cargo to build the guest component");
    if !status.success() {
        panic!("building the guest component (cargo build -p once-guest --target {TARGET}) failed");
    }
    let wasm = target_dir.join(TARGET).join("release").join("once_guest.wasm");
    let dest = out_dir.join("once.wasm");
    std::fs::copy(&wasm, &dest).unwrap_or_else(|e| panic!("copying {} failed: {e}", wasm.display()));
    println!("cargo:rustc-env=ONCE_COMPONENT_PATH={}", dest.display());
}

/// Whether the standard library for the wasm target is installed in rustc's sysroot.
fn target_installed(rustc: &std::ffi::OsStr) -> bool {
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return true; // Let cargo report whatever is wrong.
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .join("lib")
        .is_dir()
}
