"""AWS Powertools idempotency beside once's Python package: one function, one run.

    python bench/peer.py [--calls N] [--batches B] [--redis HOST:PORT] [--dir DIR] [--profile]

`cargo bench` runs this (host/once/benches/peer.rs) in a venv of pinned
packages (bench/requirements-peer.txt plus ./python) and prints its rows in
the bench's summary style; it can also run by hand in such a venv.

The same function, `refund(order)`, is wrapped by each library's decorator:
Powertools' `idempotent_function` (the idempotency key is the hash of the
whole `order`, its default) and once's `Once.protect` (the operation key is
`order["request_id"]`). Per subject, two rows: `new` (a fresh key per call:
the body runs once and the outcome is stored) and `replay` (a key stored
before: the stored response comes back, the body does not run). Subjects:
Powertools on Redis (`CachePersistenceLayer`, its only persistence layer
besides DynamoDB), the same with `use_local_cache` (its in-process LRU in
front of Redis), once on its SQLite ledger (`synchronous="FULL"`, and
`"INTENT_ONLY"`: the intent fsynced, the success not waited for) and once on
its memory ledger; `baseline/bare` calls the body unwrapped. Without
`--redis` the Powertools rows are skipped, with the reason printed.

Each row: median over `--batches` batches of `--calls` calls (time per call
= batch wall time / calls) after one warm-up batch. Every call's result and
the body's run count are checked, so a row cannot time something else.
Output: one JSON object per line (`{"row", "per_call_s", ...}`,
`{"skip", "reason"}`, `{"note"}`), for the Rust bench to read.

`--profile`: instead of timing, a cProfile of once's `new` rows, with the
time split by whose code spends it (the package's own Python, wasmtime-py
with the ctypes calls and the guest it runs, the sqlite3 module, the rest).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
import uuid
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from once import Once

Order = dict[str, Any]
Wrapped = Callable[..., Any]


class Body:
    """The protected function, `refund(order)`: a refund whose receipt names its request; counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

        def refund(order: Order) -> dict[str, Any]:
            self.runs += 1
            return {"refund_id": f"r-{order['request_id']}", "amount": order["amount"]}

        self.refund = refund


class Keys:
    """Fresh orders (a new key each) and a pool of orders already stored (for replays)."""

    def __init__(self, tag: str) -> None:
        self.tag, self.n = tag, 0

    def fresh(self) -> Order:
        self.n += 1
        return {"request_id": f"{self.tag}-{self.n}", "order_id": 1234, "amount": 200, "currency": "EUR"}


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def median_per_call(run: Callable[[int], None], calls: int, batches: int) -> float:
    """Median seconds per call over `batches` batches of `calls`, after one warm-up batch."""
    run(calls)
    times = []
    for _ in range(batches):
        t = time.perf_counter()
        run(calls)
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def new_key_rows(call: Wrapped, body: Body, keys: Keys) -> Callable[[int], None]:
    """Calls with a fresh key each: the body must run every time."""

    def run(calls: int) -> None:
        before = body.runs
        for _ in range(calls):
            order = keys.fresh()
            got = call(order=order)
            if got != {"refund_id": f"r-{order['request_id']}", "amount": 200}:
                raise AssertionError(f"new key {order['request_id']}: unexpected result {got!r}")
        if body.runs - before != calls:
            raise AssertionError(f"{calls} new keys ran the body {body.runs - before} times")

    return run


def replay_rows(call: Wrapped, body: Body, keys: Keys, pool_size: int) -> Callable[[int], None]:
    """Calls with keys stored before (stored here first): the body must never run."""
    pool = [keys.fresh() for _ in range(pool_size)]
    for order in pool:
        call(order=order)
    cycle = iter_forever(pool)

    def run(calls: int) -> None:
        stored = body.runs
        for _ in range(calls):
            order = next(cycle)
            got = call(order=order)
            if got != {"refund_id": f"r-{order['request_id']}", "amount": 200}:
                raise AssertionError(f"replay of {order['request_id']}: unexpected result {got!r}")
        if body.runs != stored:
            raise AssertionError(f"replays ran the body {body.runs - stored} times")

    return run


def iter_forever(pool: list[Order]) -> Iterator[Order]:
    while True:
        yield from pool


class LambdaContextStandIn:
    """What `register_lambda_context` reads: the time left, as if 60 s remained of a Lambda invocation.

    With it Powertools stamps an in-progress expiry on each INPROGRESS record, as it does in Lambda;
    without it every call warns and an INPROGRESS record is only freed by the record's TTL.
    """

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def powertools_subjects(redis_at: str, prefix: str, body: Body) -> dict[str, Wrapped]:
    """`idempotent_function` over Redis, without and with the local LRU cache."""
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

    host, _, port = redis_at.rpartition(":")
    subjects = {}
    for name, local in (("powertools-redis", False), ("powertools-redis-lru", True)):
        config = IdempotencyConfig(expires_after_seconds=600, use_local_cache=local, local_cache_max_items=1024)
        config.register_lambda_context(LambdaContextStandIn())
        with warnings.catch_warnings():
            # 3.37.0 marks the class deprecated under its old name, which `CachePersistenceLayer` still aliases.
            warnings.simplefilter("ignore", DeprecationWarning)
            layer = CachePersistenceLayer(host=host, port=int(port), ssl=False)
        subjects[name] = idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config,
                                             key_prefix=f"{prefix}-{name}")(body.refund)
    return subjects


def once_subjects(workdir: Path, body: Body) -> tuple[dict[str, Wrapped], list[Once]]:
    """`Once.protect` over the SQLite ledger (FULL, INTENT_ONLY) and the memory ledger."""
    handles = {"once-sqlite-full": Once.sqlite(str(workdir / "peer-once.db")),
               "once-sqlite-intent-only": Once.sqlite(str(workdir / "peer-once-intent-only.db"),
                                                      synchronous="INTENT_ONLY"),
               "once-memory": Once.memory()}
    subjects = {name: o.protect("refund", key=lambda order: order["request_id"])(body.refund) for name, o in handles.items()}
    return subjects, list(handles.values())


def forget_redis_keys(redis_at: str, prefix: str) -> None:
    """Delete this run's records (the bench shares the machine's Redis)."""
    import redis

    host, _, port = redis_at.rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    names = list(client.scan_iter(match=f"{prefix}-*", count=1000))
    for i in range(0, len(names), 500):
        client.delete(*names[i:i + 500])


def versions() -> str:
    found = []
    for name in ("once-exactly", "wasmtime", "aws-lambda-powertools", "redis"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"python {sys.version.split()[0]}; " + ", ".join(found)


def measure_subject(name: str, call: Wrapped, body: Body, a: argparse.Namespace) -> None:
    """The `new` and `replay` rows of one subject."""
    keys = Keys(f"{name}-{uuid.uuid4().hex[:8]}")
    for kind, rows in (("new", new_key_rows(call, body, keys)), ("replay", replay_rows(call, body, keys, a.calls))):
        emit(row=f"{name}/{kind}", per_call_s=median_per_call(rows, a.calls, a.batches), calls=a.calls,
             batches=a.batches)


def measure(a: argparse.Namespace, workdir: Path) -> None:
    body = Body()
    emit(note=versions())
    bare = new_key_rows(body.refund, body, Keys("bare"))
    emit(row="baseline/bare", per_call_s=median_per_call(bare, a.calls, a.batches), calls=a.calls, batches=a.batches)
    if a.redis:
        prefix = f"once-peer-{uuid.uuid4().hex[:12]}"
        try:
            for name, call in powertools_subjects(a.redis, prefix, body).items():
                measure_subject(name, call, body, a)
        finally:
            forget_redis_keys(a.redis, prefix)
    else:
        emit(skip="powertools", reason="no --redis given (the bench gives it when its Redis answers PING)")
    mine, handles = once_subjects(workdir, body)
    try:
        for name, call in mine.items():
            measure_subject(name, call, body, a)
    finally:
        for o in handles:
            o.close()


def category(filename: str) -> Optional[str]:
    """Whose code a profiled Python frame is; None for builtins and the standard library (charged to callers)."""
    path = filename.replace(os.sep, "/")
    for package, owner in (("once", "once package (Python)"),
                           ("wasmtime", "wasmtime-py (Python, ctypes and the guest's wasm)"),
                           ("aws_lambda_powertools", "Powertools (Python)"), ("redis", "redis-py")):
        if f"/site-packages/{package}/" in path:
            return owner
    if path.endswith("/bench/peer.py"):
        return "bench loop and the function"
    return None


def split_by_owner(stats: pstats.Stats) -> dict[str, float]:
    """Own time per owner; a builtin's or library frame's own time goes to its callers, in proportion."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    shares: dict[Any, dict[str, float]] = {}

    def owners(fn: Any, seen: frozenset[Any]) -> dict[str, float]:
        if fn in shares:
            return shares[fn]
        filename, _, name = fn
        own = category(filename)
        if own is None and "sqlite3" in name:
            own = "sqlite3 module (C: the ledger's SQL and fsync)"
        if own is not None:
            result = {own: 1.0}
        else:
            callers = {c: t[2] for c, t in table[fn][4].items() if c not in seen}
            total = sum(callers.values())
            if total <= 0:
                result = {"other": 1.0}
            else:
                result = {}
                for c, t in callers.items():
                    for k, v in owners(c, seen | {fn}).items():
                        result[k] = result.get(k, 0.0) + v * t / total
        shares[fn] = result
        return result

    split: dict[str, float] = {}
    for fn, (_, _, tottime, _, _) in table.items():
        for k, v in owners(fn, frozenset()).items():
            split[k] = split.get(k, 0.0) + v * tottime
    return split


def profile(a: argparse.Namespace, workdir: Path) -> None:
    body = Body()
    mine, handles = once_subjects(workdir, body)
    try:
        for name, call in mine.items():
            run = new_key_rows(call, body, Keys(f"{name}-{uuid.uuid4().hex[:8]}"))
            run(a.calls)  # warm-up, unprofiled
            profiler = cProfile.Profile()
            profiler.enable()
            run(a.calls)
            profiler.disable()
            split = split_by_owner(pstats.Stats(profiler))
            total = sum(split.values())
            emit(profile=f"{name}/new", calls=a.calls, total_s=total,
                 shares={k: v / total for k, v in sorted(split.items(), key=lambda kv: -kv[1])})
    finally:
        for o in handles:
            o.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per batch")
    ap.add_argument("--batches", type=int, default=7, help="measured batches per row")
    ap.add_argument("--redis", default=None, help="HOST:PORT of the Redis for Powertools' rows")
    ap.add_argument("--dir", default=None, help="directory for the SQLite ledger (default: target/once-bench-peer)")
    ap.add_argument("--profile", action="store_true", help="profile once's new-key rows instead of timing")
    a = ap.parse_args()
    if a.calls < 1 or a.batches < 1:
        ap.error("--calls and --batches must be at least 1")
    workdir = Path(a.dir) if a.dir else Path(__file__).resolve().parents[2] / "target" / "once-bench-peer"
    workdir.mkdir(parents=True, exist_ok=True)
    for stale in workdir.glob("peer-once*.db*"):
        stale.unlink()
    if a.profile:
        profile(a, workdir)
    else:
        measure(a, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
