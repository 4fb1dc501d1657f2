//! Every host loop only sends, sleeps and reports what the engine's steps
//! say: none reads a record's state to decide what to do next. A loop that
//! did would be a second copy of the rules, free to drift from the guest's
//! (as the 0.1 hosts' loops did). This test reads the loops' source and
//! fails if one names a record state or reads records; display code (what a
//! caller is shown) and operator commands are not loops and are not checked.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The Rust files that drive calls: the `Once` loops (blocking and async), the gateway's request
/// handler and background worker, the demo's agents and settle loop, the
/// retry-cost study's protected client.
const RUST_LOOPS: [&str; 6] = [
    "host/once/src/once.rs",
    "host/once/src/call_async.rs",
    "host/gateway/src/handler.rs",
    "host/gateway/src/worker.rs",
    "host/cli/src/demo/agent.rs",
    "host/cli/src/demo/retry_cost/protected.rs",
];

/// What deciding by record state looks like in Rust: a state named, a state
/// field read, a record fetched to look at.
const RUST_TELLS: [&str; 3] = ["State::", ".state", ".inspect("];

#[test]
fn no_rust_host_loop_decides_by_record_state() {
    for file in RUST_LOOPS {
        // Unit tests below the code may set up records as they like.
        let text = read(file);
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for tell in RUST_TELLS {
                assert!(
                    !line.contains(tell),
                    "{file}:{}: a host loop reads record state ({tell:?}): {}",
                    n + 1,
                    line.trim()
                );
            }
        }
    }
}

/// The async loop and the gateway's handler and worker wait for nothing inside a step: the provider
/// read is a `read` step they await (configuration `reads: steps`), so no step of the component holds a
/// thread while the upstream answers, and nothing calls `block_on` inside tokio's blocking pool.
#[test]
fn no_async_host_waits_inside_a_step() {
    for file in [
        "host/once/src/call_async.rs",
        "host/gateway/src/handler.rs",
        "host/gateway/src/worker.rs",
    ] {
        let text = read(file);
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            for tell in ["block_on(", "impl Provider for", "blocking_recv("] {
                assert!(
                    !line.contains(tell),
                    "{file}:{}: an async host waits inside a step ({tell:?}): {}",
                    n + 1,
                    line.trim()
                );
            }
        }
    }
    let gateway = read("host/gateway/src/lib.rs");
    assert!(
        !gateway.contains(".provider("),
        "the gateway reads its upstream as steps: it hands the engine no synchronous provider"
    );
}

/// The body of the function or method a Python or JavaScript file opens
/// with `opener`: its first line and every line after it that is blank or
/// indented deeper than that line.
fn body(text: &str, opener: &str) -> String {
    let start = text.find(opener).unwrap_or_else(|| panic!("no {opener:?}"));
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = |l: &str| l.len() - l.trim_start_matches([' ', '\t']).len();
    let mut lines = text[line_start..].lines();
    let first = lines.next().unwrap_or_default();
    let mut out = vec![first];
    out.extend(lines.take_while(|l| l.trim().is_empty() || indent(l) > indent(first)));
    out.join("\n")
}

/// What deciding by record state, or reading more into an ending than the
/// guest states, looks like in a Python or JavaScript loop.
const SCRIPT_TELLS: [&str; 9] = [
    "state",
    "inspect",
    "absent",
    "in-flight",
    "inflight",
    "superseded",
    "ending",
    "next_read",
    "nextread",
];

fn assert_loops_on_steps_only(file: &str, opener: &str) {
    let text = read(file);
    let loop_body = body(&text, opener);
    assert!(
        loop_body.contains("report") && loop_body.contains("resume"),
        "{file}: {opener:?} is not the protocol loop:\n{loop_body}"
    );
    // Comments may explain; only code decides.
    let code: Vec<&str> = loop_body
        .lines()
        .map(|l| l.split(" # ").next().unwrap_or_default())
        .map(|l| l.split(" // ").next().unwrap_or_default())
        .filter(|l| !l.trim_start().starts_with(['#', '/', '*']))
        .collect();
    let code = code.join("\n").to_lowercase();
    for tell in SCRIPT_TELLS {
        assert!(
            !code.contains(tell),
            "{file}: the protocol loop names {tell:?}:\n{loop_body}"
        );
    }
}

#[test]
fn the_python_and_node_examples_loop_on_steps_only() {
    assert_loops_on_steps_only("examples/python/protect.py", "def protect(");
    assert_loops_on_steps_only("examples/node/protect.mjs", "function protect(");
}

/// The packages' own loops, the ones their users run: the Python package's
/// generator (shared by `call` and `acall`) and the npm package's `drive`.
#[test]
fn the_python_and_npm_packages_loop_on_steps_only() {
    assert_loops_on_steps_only("python/src/once/client.py", "    def _loop(");
    assert_loops_on_steps_only("js/src/once.ts", "  private async drive(");
}

/// The Rust example that drives the protocol by hand with generated types.
#[test]
fn the_rust_driver_example_loops_on_steps_only() {
    let text = read("host/once/examples/driver.rs");
    let code = text.split("let account = loop").nth(1).expect("driver.rs: its loop");
    for tell in RUST_TELLS.iter().chain(&["Ending::", "next_read"]) {
        assert!(!code.contains(tell), "driver.rs: the loop reads {tell:?}");
    }
}

/// The check itself: it finds a state read where there is one.
#[test]
fn the_check_finds_a_state_read() {
    let python = "def protect(a):\n    if rec.state == 'absent':\n        send()\nx = 1\n";
    assert!(body(python, "def protect(").contains("absent"));
    assert!(!body(python, "def protect(").contains("x = 1"));
    let js = "function protect(a) {\n  if (s.tag === 'wait') f();\n}\nconst y = 2;\n";
    assert!(body(js, "function protect(").contains("'wait'"));
    assert!(!body(js, "function protect(").contains("const y"));
    assert!(RUST_TELLS.iter().any(|t| "match view.state {".contains(t)));
    // A method's body ends where its indentation does.
    let class = "class A:\n    def _loop(self):\n        if a.ending == 1:\n\n            x()\n    def other(self):\n        y()\n";
    let method = body(class, "    def _loop(");
    assert!(method.contains("a.ending") && method.contains("x()") && !method.contains("y()"));
    let ts = "class B {\n  private async drive(s) {\n    if (s.state) go();\n  }\n  other() { z(); }\n}\n";
    assert!(body(ts, "  private async drive(").contains("s.state"));
    assert!(!body(ts, "  private async drive(").contains("z()"));
}
