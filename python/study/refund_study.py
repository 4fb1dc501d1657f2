"""The seed study's refund loop in Python, through the OpenAI Agents SDK's real tool-calling path.

    python study/refund_study.py [--trials N] [--refund-service PATH]

Every trial gets a fresh `refund-service` (examples/refund: unsafe mode, it
records the idempotency key and never dedupes, like the study's server) with
its fault proxy in front, a fresh once ledger (SQLite), and an agent: an
`agents.Agent` run by `Runner.run` whose model is scripted (no network, no
API key) with one of the study's policies: always retry a failed refund,
never retry, or read the order and then decide. Like a real model, it mints
a fresh `idempotency_key` for every call it makes. The refund tool is a plain
`function_tool` (unprotected) or the same function through
`once.adapters.openai_agents.protected_function_tool`, keyed by the run
context (the application's operation key). The verdict is read from the
service's own SQLite ledger: exactly one $200 refund, duplicates, omissions,
and false completions (the agent's final report contradicts the ledger).
The table has the shape of `once demo`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from agents import Agent, Runner, function_tool, set_tracing_disabled  # noqa: E402

from once import Dispatch, Evidence, Once, Policy  # noqa: E402
from once.adapters.openai_agents import protected_function_tool  # noqa: E402
from scripted_model import ScriptedModel, Turn  # noqa: E402

# No network: the SDK's trace export would try to reach OpenAI.
set_tracing_disabled(True)
ORDER_ID, AMOUNT = 1234, 200
POLICIES = ("always_retry", "never_retry", "read_then_decide")
FAULTS = ("pre_effect_disconnect", "post_commit_disconnect")
CLIENT_TIMEOUT = 0.15
RETRIES = 6
REFUND = "refund_order"


# ---------------------------------------------------------------- the provider (the refund service, over HTTP)


class Ambiguous(Exception):
    """The request may have reached the service: a disconnect or a timeout after sending, or a 5xx."""


class Rejected(Exception):
    """The service answered and did nothing (4xx)."""


def request(base: str, method: str, path: str, body: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One HTTP request; a refused connection raises ConnectionRefusedError (nothing was sent)."""
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CLIENT_TIMEOUT)
    try:
        conn.connect()
    except ConnectionRefusedError:
        raise
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        text = reply.read().decode()
    except (OSError, http.client.HTTPException) as e:
        raise Ambiguous(f"{type(e).__name__}: {e}") from e
    finally:
        conn.close()
    if reply.status >= 500:
        raise Ambiguous(f"HTTP {reply.status}: {text}")
    if reply.status >= 400:
        raise Rejected(f"HTTP {reply.status}: {text}")
    return json.loads(text)  # type: ignore[no-any-return]


@dataclass
class Service:
    """A refund service and its fault proxy, as processes of their own."""

    process: subprocess.Popen[str]
    base: str
    target: str
    db: Path

    @staticmethod
    def start(binary: Path, directory: Path, fault: str) -> Service:
        db = directory / "effects.db"
        p = subprocess.Popen([str(binary), "--db", str(db), "--mode", "unsafe", "--fault", fault],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout is not None
        service = p.stdout.readline().split()[1]
        proxy = p.stdout.readline().split()[1]
        return Service(p, service, proxy, db)

    def refunds(self) -> tuple[int, int]:
        """(refund rows, refunded cents) for the order, from the service's own ledger."""
        with sqlite3.connect(self.db) as db:
            n, cents = db.execute("SELECT count(*), coalesce(sum(amount_cents), 0) FROM refunds WHERE order_id = ?",
                                  (ORDER_ID,)).fetchone()
        return int(n), int(cents)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# ---------------------------------------------------------------- the agent


@dataclass
class Conversation:
    """The application's run context: the operation key it minted before the first attempt."""

    scope: str
    key: str


def policy_model(policy: str) -> ScriptedModel:
    """The study's policies as a model: each turn reads the tool outputs so far."""

    def refund_call() -> Turn:
        # Like a real model: a fresh idempotency key on every call.
        return [(REFUND, {"order_id": ORDER_ID, "amount": AMOUNT, "idempotency_key": uuid.uuid4().hex})]

    def script(outputs: list[str]) -> Turn:
        refunds = [o for o in outputs if not o.startswith('{"order_id"') and "read_position" not in o]
        done = bool(refunds) and "refund_id" in refunds[-1]
        if not outputs:
            return refund_call()
        if done:
            return "refunded"
        if policy == "never_retry":
            return "failed"
        if policy == "always_retry":
            return refund_call() if len(refunds) < RETRIES else "failed"
        # read_then_decide: read the order after a failed refund, refund again only if it shows none.
        last = outputs[-1]
        if "read_position" in last:
            try:
                order = json.loads(last)
            except ValueError:
                return "unknown"
            if order.get("refunded", 0) >= AMOUNT:
                return "refunded"
            return refund_call() if len(refunds) < 2 else "failed"
        if len(refunds) >= 2:
            return "failed"
        return [("get_order", {"order_id": ORDER_ID})]

    return ScriptedModel(script)


def tools(target: str, protect: Optional[Once]) -> list[Any]:
    def refund_order(order_id: int, amount: int, idempotency_key: str) -> dict[str, Any]:
        """Refund `amount` dollars of an order."""
        return request(target, "POST", "/refunds",
                       {"order_id": order_id, "amount": amount, "idempotency_key": idempotency_key})

    def get_order(order_id: int) -> str:
        """Read an order: its total and what was refunded."""
        return json.dumps(request(target, "GET", f"/orders/{order_id}"))

    if protect is None:
        refund = function_tool(refund_order)
    else:
        refund = protected_function_tool(protect, refund_order,
                                         key=lambda ctx, args: ctx.context.key, scope=lambda ctx: ctx.context.scope)
    return [refund, function_tool(get_order)]


def protected_once(ledger: Path, target: str) -> Once:
    def lookup(tool: str, provider_key: str, args: str) -> Evidence:
        found = request(target, "GET", f"/refunds?key={provider_key}")
        if found["found"]:
            return Evidence.confirmed(found["refund"])
        return Evidence.absent(found["read_position"])

    return Once.sqlite(str(ledger), lookup=lookup, wait=5.0, policies={REFUND: Policy(
        # The key travels in the tool's own idempotency_key argument: what the model put there is replaced.
        key_argument="idempotency_key",
        dispatch_timeout_ms=int(CLIENT_TIMEOUT * 1000),
        # The service commits a request within the client's timeout or never.
        max_in_flight_ms=300,
        reconcile_interval_ms=25,
        attempt_budget=4,
        resolve_deadline_ms=10_000,
    )})


@dataclass
class Verdict:
    """One trial: the service's ledger and the agent's final report."""

    effects: int
    refunded_cents: int
    report: str

    @property
    def exactly_once(self) -> bool:
        return self.effects == 1 and self.refunded_cents == AMOUNT * 100

    @property
    def false_completion(self) -> bool:
        if self.report == "refunded":
            return not self.exactly_once
        if self.report == "failed":
            return self.effects > 0
        return False


def trial(binary: Path, policy: str, protected: bool, fault: str, n: int) -> Verdict:
    with tempfile.TemporaryDirectory() as d:
        service = Service.start(binary, Path(d), fault)
        try:
            o = protected_once(Path(d) / "once.db", service.target) if protected else None
            agent = Agent(name="refunds", instructions="Refund order 1234 by $200.",
                          tools=tools(service.target, o), model=policy_model(policy))
            ctx = Conversation(scope=f"study-trial-{n}", key=f"refund-order-{ORDER_ID}-trial-{n}")
            result = asyncio.run(Runner.run(agent, "Refund order 1234 by $200.", context=ctx))
            report = str(result.final_output)
            if o is not None:
                settle(o, ctx, service.target)
            effects, cents = service.refunds()
            return Verdict(effects, cents, report)
        finally:
            service.stop()


def settle(o: Once, ctx: Conversation, target: str, within: float = 10.0) -> None:
    """once's background work for the trial: reconcile the key and send an owed dispatch (what a worker does)."""
    from once import NotFound, Repeat, Sent

    def send(d: Dispatch) -> Sent:
        try:
            return Sent.returned(request(target, "POST", "/refunds", d.arguments()))
        except Ambiguous as e:
            return Sent.ambiguous(str(e))
        except Rejected as e:
            return Sent.rejected(str(e))
        except ConnectionRefusedError:
            return Sent.not_sent()

    give_up = time.monotonic() + within
    while True:
        try:
            called = o.resume(ctx.scope, ctx.key, send)
        except NotFound:
            return
        if called.account is None or called.account.repeat is not Repeat.WAITS or time.monotonic() >= give_up:
            return
        time.sleep(0.02)


@dataclass
class Cell:
    trials: int = 0
    exactly_once: int = 0
    duplicates: int = 0
    omissions: int = 0
    false_completions: int = 0

    def add(self, v: Verdict) -> None:
        self.trials += 1
        self.exactly_once += v.exactly_once
        self.duplicates += v.effects > 1
        self.omissions += v.effects == 0
        self.false_completions += v.false_completion


def study(binary: Path, trials: int, progress: Callable[[str], None] = lambda s: None) -> dict[tuple[str, bool, str], Cell]:
    cells: dict[tuple[str, bool, str], Cell] = {}
    n = 0
    for policy in POLICIES:
        for protected in (False, True):
            for fault in FAULTS:
                cell = cells.setdefault((policy, protected, fault), Cell())
                for _ in range(trials):
                    n += 1
                    cell.add(trial(binary, policy, protected, fault, n))
                progress(f"{policy} {'(once)' if protected else '(unprotected)'} {fault}: {cell}")
    return cells


def table(cells: dict[tuple[str, bool, str], Cell]) -> str:
    """`once demo`'s table shape: one row per policy × protection, one column per fault."""
    out = "each fault: exactly-once/trials  dup omit false\n"
    out += f"{'policy':<30}" + "".join(f" | {f:^22}" for f in FAULTS) + "\n"
    for policy in POLICIES:
        for protected in (False, True):
            label = f"{policy} {'(once)' if protected else '(unprotected)'}"
            row = f"{label:<30}"
            for fault in FAULTS:
                c = cells[(policy, protected, fault)]
                text = f"{f'{c.exactly_once}/{c.trials}':>5} {c.duplicates:>3} {c.omissions:>3} {c.false_completions:>3}"
                row += f" | {text:^22}"
            out += row + "\n"
    return out


def main() -> int:
    repo = HERE.parents[1]
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--refund-service", type=Path,
                    default=Path(os.environ.get("ONCE_REFUND_SERVICE") or repo / "target/debug/refund-service"))
    a = ap.parse_args()
    if not a.refund_service.is_file():
        print(f"{a.refund_service} is missing: cargo build -p once-refund-example --bins", file=sys.stderr)
        return 2
    started = time.time()
    cells = study(a.refund_service, a.trials, lambda s: print(s, file=sys.stderr))
    print(table(cells), end="")
    print(f"{a.trials} trial(s) per cell in {time.time() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
