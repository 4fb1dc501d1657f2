"""A warm protected call's time from Python, next to the Rust host's, measured in the same run.

    python bench/bench.py [--calls N] [--rust]

Python rows: `Once.call` with a new operation key per call and a success
reported (start + report), over the memory and the SQLite ledger
(`synchronous="FULL"` and `"INTENT_ONLY"`, files in
`target/once-bench-python/`), and a bare sqlite3 FULL commit as the SQLite
baseline. Each row is the median of several batches (time per call = batch
wall time / calls). With `--rust`, the same-run Rust figures come from the
host's criterion bench (`cargo bench -p once-host --bench once`, filtered to
`call/component`, `sqlite/once-full/1` and `sqlite/once-intent-only/1`: a
release build the first time). The load average is printed with the rows.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from once import Once, Sent

REPO = Path(__file__).resolve().parents[2]
BATCHES = 7


def per_call(run: Callable[[int], None], calls: int) -> float:
    """Median seconds per call over BATCHES batches of `calls`, after one warm-up batch."""
    run(calls)
    times = []
    for b in range(BATCHES):
        t = time.perf_counter()
        run(calls)
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def protected(o: Once, tag: str) -> Callable[[int], None]:
    counter = [0]
    response = Sent.success('{"refund_id":"r-1"}')

    def run(calls: int) -> None:
        for _ in range(calls):
            counter[0] += 1
            o.call("bench", f"{tag}-{counter[0]}", "refund_order", '{"order_id":1234,"amount":200}',
                   lambda d: response)

    return run


def bare_full_commit(path: Path) -> Callable[[int], None]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
    counter = [0]

    def run(calls: int) -> None:
        for _ in range(calls):
            counter[0] += 1
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?, 'x')", (counter[0],))
            db.execute("COMMIT")

    return run


def rust_figures() -> dict[str, float]:
    """Criterion's median estimate (seconds) for the two Rust rows."""
    done = subprocess.run(
        ["cargo", "bench", "--locked", "-p", "once-host", "--bench", "once", "--", "--noplot",
         "^(call/component|sqlite/once-full/1|sqlite/once-intent-only/1)$"],
        cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"cargo bench failed:\n{done.stderr[-2000:]}")
    units = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    found: dict[str, float] = {}
    name = None
    for line in done.stdout.splitlines():
        m = re.match(r"^(\S+/\S+)\s*(time:.*)?$", line.strip())
        if m and not line.startswith(" ") and "/" in m.group(1):
            name = m.group(1)
        t = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if t and name:
            found[name] = float(t.group(1)) * units[t.group(2)]
    return found


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rust", action="store_true", help="also run the Rust host's criterion rows")
    a = ap.parse_args()
    workdir = REPO / "target" / "once-bench-python"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    load = os.getloadavg()[0]
    memory = per_call(protected(Once.memory(), "m"), a.calls)
    sqlite_calls = max(a.calls // 3, 20)
    sqlite_once = per_call(protected(Once.sqlite(str(workdir / "once.db")), "s"), sqlite_calls)
    intent_only = per_call(protected(Once.sqlite(str(workdir / "once-io.db"), synchronous="INTENT_ONLY"), "i"),
                           sqlite_calls)
    bare = per_call(bare_full_commit(workdir / "bare.db"), sqlite_calls)
    rows = [("python: memory ledger", memory), ("python: sqlite FULL", sqlite_once),
            ("python: sqlite INTENT_ONLY", intent_only), ("python: bare sqlite3 FULL commit", bare)]
    nan = float("nan")
    rust: dict[str, float] = {}
    if a.rust:
        rust = rust_figures()
        rows += [("rust: memory (call/component)", rust.get("call/component", nan)),
                 ("rust: sqlite FULL (sqlite/once-full/1)", rust.get("sqlite/once-full/1", nan)),
                 ("rust: sqlite intent-only (sqlite/once-intent-only/1)", rust.get("sqlite/once-intent-only/1", nan))]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; warm protected call (start + report), "
          f"median of {BATCHES} batches; load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"{'row':<52} {'per call':>12} {'calls/s':>10}")
    for name, s in rows:
        print(f"{name:<52} {fmt(s):>12} {1 / s:>10,.0f}")
    print(f"python sqlite / bare sqlite3 FULL commit: FULL {sqlite_once / bare:.2f}x, "
          f"INTENT_ONLY {intent_only / bare:.2f}x")
    if a.rust:
        print(f"python / rust, memory: {memory / rust.get('call/component', nan):.2f}x; "
              f"sqlite FULL: {sqlite_once / rust.get('sqlite/once-full/1', nan):.2f}x; "
              f"sqlite intent-only: {intent_only / rust.get('sqlite/once-intent-only/1', nan):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
