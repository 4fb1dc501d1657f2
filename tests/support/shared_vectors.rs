//! Where the third-party test vectors live: `../shared/vectors`, beside
//! the checkout, read in place and never copied into the repository.
//!
//! A clone without them (a user's) skips the tests that need them, saying
//! so; under `CI` (set by `.ci/run`) a missing directory fails instead, so
//! the vectors can never silently stop being checked.
//!
//! Included by path (`#[path = …] mod shared_vectors;`) from each test crate.
#![allow(dead_code)] // Each includer uses what it needs.

use std::path::{Path, PathBuf};

/// The vectors directory.
pub fn dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest
        .ancestors()
        .find(|d| d.join("wit/once.wit").is_file())
        .expect("the test crate is inside the once repository");
    root.join("../shared/vectors")
}

/// True (after a notice) when the vectors are absent and this is not CI: the caller returns.
#[track_caller]
pub fn skip() -> bool {
    if dir().is_dir() {
        return false;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "../shared/vectors not found ({}), and CI is set: the vector tests must run",
        dir().display()
    );
    eprintln!("skipped: ../shared/vectors not found");
    true
}
