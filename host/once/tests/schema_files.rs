//! The ledger's DDL lives only in `schema/` (schema/README.md): the Rust
//! crate includes those files and the Python and npm packages ship them, so
//! no host can drift from another's tables. This test reads every source
//! file of the repository and fails if one creates a table, an index, a
//! trigger or a function outside `schema/`, unless it is on the list below:
//! tables that are not the ledger's (a provider's, a benchmark's baseline).

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Files whose own tables are not the ledger's, and why.
const NOT_THE_LEDGER: [(&str, &str); 9] = [
    (
        "examples/refund/src/ledger.rs",
        "the refund service's orders and refunds",
    ),
    (
        "examples/refund/src/tool_server/tables.rs",
        "the MCP refund server's requests, effects and responses",
    ),
    (
        "python/tests/refund_table.py",
        "a provider's refunds table for the Python tests",
    ),
    (
        "js/test/adapters.test.mjs",
        "a provider's refunds table for the adapter tests",
    ),
    (
        "host/once/tests/postgres_engine.rs",
        "the test providers' effects tables",
    ),
    ("python/bench/bench.py", "the bare-commit baseline's table"),
    ("host/once/benches/once/sqlite.rs", "the bare-commit baseline's table"),
    ("host/once/benches/once/pg.rs", "the bare-commit baseline's table"),
    ("host/once/tests/schema_files.rs", "this test: the words it looks for"),
];

/// Source files, by extension; build output, dependencies and virtual
/// environments are skipped.
const SOURCE: [&str; 7] = ["rs", "py", "ts", "mjs", "js", "cjs", "sh"];
const SKIPPED_DIRS: [&str; 6] = ["target", "node_modules", "dist", "dist-study", "gen", "__pycache__"];

/// What creating a schema object looks like, in upper case with runs of
/// whitespace made one space.
const DDL: [&str; 6] = [
    "CREATE TABLE",
    "CREATE INDEX",
    "CREATE UNIQUE INDEX",
    "CREATE FUNCTION",
    "CREATE OR REPLACE FUNCTION",
    "CREATE TRIGGER",
];

/// The lines of `text` that create a schema object (1-based), with the words found.
fn ddl_in(text: &str) -> Vec<(usize, &'static str)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let words = line.split_whitespace().collect::<Vec<_>>().join(" ").to_uppercase();
        for ddl in DDL {
            if words.contains(ddl) {
                found.push((n + 1, ddl));
            }
        }
    }
    found
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    // A Python virtual environment holds other packages' sources.
    if dir.join("pyvenv.cfg").exists() {
        return;
    }
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) {
                walk(&path, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| SOURCE.contains(&e.to_string_lossy().as_ref()))
        {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_outside_schema_writes_the_ledgers_ddl() {
    let root = repo().canonicalize().unwrap();
    let mut files = Vec::new();
    walk(&root, &mut files);
    assert!(
        files.len() > 100,
        "found only {} source files under {}",
        files.len(),
        root.display()
    );
    let mut offenders = Vec::new();
    let mut allowed_seen = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("schema/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let found = ddl_in(&text);
        if found.is_empty() {
            continue;
        }
        if NOT_THE_LEDGER.iter().any(|(path, _)| *path == rel) {
            allowed_seen.push(rel);
            continue;
        }
        for (line, ddl) in found {
            offenders.push(format!("{rel}:{line}: {ddl}"));
        }
    }
    assert!(
        offenders.is_empty(),
        "DDL outside schema/ (the ledger's belongs in schema/, loaded from there; a table that is \
         not the ledger's goes on NOT_THE_LEDGER with its reason):\n{}",
        offenders.join("\n")
    );
    // A stale entry would let ledger DDL back into that file unnoticed.
    for (path, why) in NOT_THE_LEDGER {
        assert!(
            allowed_seen.iter().any(|p| p == path),
            "{path} ({why}) is listed but creates nothing: take it off the list"
        );
    }
}

/// The check itself: it finds DDL however it is spaced or cased, and
/// nothing in prose that only mentions a table.
#[test]
fn the_check_finds_ddl() {
    let text = "x = 1\ndb.exec(`create   table rows (k)`)\n  CREATE OR REPLACE\tFUNCTION f()\nthe table we create\n";
    assert_eq!(ddl_in(text), [(2, "CREATE TABLE"), (3, "CREATE OR REPLACE FUNCTION")]);
}
