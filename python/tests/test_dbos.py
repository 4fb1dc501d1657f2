"""The DBOS adapter on real DBOS (its SQLite default and PostgreSQL system databases): a refund step SIGKILLed
after the provider committed and recovered by a new process, a lost reply retried by the step's own retries, and
the same scenarios without once, each counted in the provider's SQLite table."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import docs_example, require, run_script  # noqa: E402

require("dbos", "dbos")

import dbos  # noqa: E402
from dbos import DBOS, SetWorkflowID  # noqa: E402

import once  # noqa: E402
from once.adapters.dbos import UnconfirmedStep, protected_step  # noqa: E402
from refund_table import RefundTable  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "dbos_process.py"
WORKFLOW_ID = "refund-order-1234"
KEY = f"{WORKFLOW_ID}/1/refund_order"
POLICY = once.Policy(dispatch_timeout_ms=300, max_in_flight_ms=500, reconcile_interval_ms=100)


# ------------------------------------------------------------------ a step killed after commit, in real processes


@pytest.fixture(params=["sqlite", "postgres"])
def sysdb(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """DBOS's system database: its SQLite default (a file), or a fresh schema of the PostgreSQL test database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'dbos.sqlite'}", "-"
    return request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")


def worker(mode: str, sysdb: tuple[str, str], tmp_path: Path, *, kill: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("ONCE_DBOS_KILL_AFTER_COMMIT", None)
    if kill:
        env["ONCE_DBOS_KILL_AFTER_COMMIT"] = "1"
    cmd = [sys.executable, str(WORKER), mode, sysdb[0], sysdb[1], str(tmp_path / "refunds.db"),
           str(tmp_path / "once.db"), WORKFLOW_ID]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def crash_and_recover(mode: str, sysdb: tuple[str, str], tmp_path: Path) -> tuple[dict[str, Any], RefundTable]:
    """Run the workflow in a process the provider SIGKILLs right after its refund committed (before DBOS recorded
    the step); then a new process whose DBOS.launch() recovers the workflow. Its outcome, and the provider."""
    provider = RefundTable(tmp_path / "refunds.db")
    first = worker(mode, sysdb, tmp_path, kill=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert provider.count() == 1, "the first process's refund committed before it was killed"
    second = worker(mode, sysdb, tmp_path, kill=False)
    assert second.returncode == 0, second.stderr
    return json.loads(second.stdout.strip().splitlines()[-1]), provider


def test_a_step_killed_after_the_provider_committed_is_recovered_without_a_second_refund(
    tmp_path: Path, sysdb: tuple[str, str]
) -> None:
    out, provider = crash_and_recover("once", sysdb, tmp_path)
    assert provider.count() == 1, "a second refund"
    assert out == {"result": {"receipt": {"refund_id": "r-1", "order_id": 1234, "amount": 200}}}, out
    view = once.Once.sqlite(tmp_path / "once.db").inspect("dbos", KEY)
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    kinds = [e.kind for e in view.audit]
    assert "lease-expired" in kinds and "reconciled-confirmed" in kinds, kinds


def test_the_same_crash_without_once_refunds_twice(tmp_path: Path, sysdb: tuple[str, str]) -> None:
    out, provider = crash_and_recover("plain", sysdb, tmp_path)
    # DBOS re-ran the step it had not recorded: the provider refunded again.
    assert provider.count() == 2, provider.count()
    assert out == {"result": {"receipt": {"refund_id": "r-2", "order_id": 1234, "amount": 200}}}, out


def test_without_a_lookup_the_recovered_step_stays_unknown_and_is_not_sent_again(tmp_path: Path) -> None:
    out, provider = crash_and_recover("once-no-lookup", (f"sqlite:///{tmp_path / 'dbos.sqlite'}", "-"), tmp_path)
    assert provider.count() == 1, "a second refund"
    assert out["type"] == "UnconfirmedStep", out
    assert f"refund_order dbos/{KEY}: unknown" in out["error"] and "effect unknown" in out["error"], out
    view = once.Once.sqlite(tmp_path / "once.db").inspect("dbos", KEY)
    assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1


# ------------------------------------------------------------------ a lost reply, retried by the step itself


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """Launch DBOS in this process over a fresh SQLite system database (after the test registered its functions);
    destroyed with its registry afterwards."""

    def go() -> None:
        DBOS(config={"name": "once-dbos-test", "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}",
                     "application_version": "once-test-1", "log_level": "WARNING"})
        DBOS.launch()

    yield go
    DBOS.destroy(destroy_registry=True)


class LostReplyProvider(RefundTable):
    """The provider's table; its first reply is lost after the commit, and its first read is unavailable."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, lose_replies=1)
        self.reads_unavailable = 1
        self.handle: list[once.Once] = []

    def lookup(self, tool: str, provider_key: str, args: str) -> once.Evidence:
        """The authoritative read by idempotency key; unavailable once, as a provider's read API can be."""
        if self.reads_unavailable:
            self.reads_unavailable -= 1
            return once.Evidence.unknown("the provider's read API timed out")
        read_at = self.handle[0].now()
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT id FROM refunds WHERE request_id = ?", (provider_key,)).fetchone()
        if row is None:
            return once.Evidence.absent(read_at)
        return once.Evidence.confirmed({"refund_id": f"r-{row[0]}"})


def run_refund_workflow(refund_order: Callable[..., dict[str, Any]], launch: Callable[[], None]) -> dict[str, Any]:
    """Run the step `refund_order` in a workflow of id WORKFLOW_ID, in this process (the same for the protected and
    the plain step); the workflow's output."""

    @DBOS.workflow()
    def refund_workflow(order_id: int, amount: int) -> dict[str, Any]:
        receipt: dict[str, Any] = refund_order(order_id, amount)
        return receipt

    launch()
    with SetWorkflowID(WORKFLOW_ID):
        return refund_workflow(1234, 200)


def test_a_lost_reply_is_reconciled_on_the_steps_retry_with_one_refund(
    tmp_path: Path, launch: Callable[[], None]
) -> None:
    provider = LostReplyProvider(tmp_path / "refunds.db")
    # wait=0: a call does not wait for the next read itself; the step's retry (after 0.2 s) is the next read.
    o = once.Once.sqlite(tmp_path / "once.db", lookup=provider.lookup, settings={"clock_skew_ms": 0},
                         policies={"refund_order": POLICY}, wait=0)
    provider.handle.append(o)
    attempts: list[int] = []

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Records the attempt DBOS runs, so the test sees that DBOS did retry the step."""

        def attempt(*a: Any, **kw: Any) -> Any:
            status = DBOS.step_status
            assert status is not None and status.current_attempt is not None
            attempts.append(status.current_attempt)
            return fn(*a, **kw)

        return attempt

    @DBOS.step(name="refund_order", retries_allowed=True, interval_seconds=0.2, max_attempts=3)
    @counted
    @protected_step(o, "refund_order")
    def refund_order(order_id: int, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        return provider.refund(order_id, amount, idempotency_key)

    receipt = run_refund_workflow(refund_order, launch)
    assert receipt == {"refund_id": "r-1"}
    assert provider.count() == 1, "a second refund"
    # The first attempt ended unknown (the read was unavailable): DBOS retried, and the retry reconciled.
    assert attempts == [0, 1], attempts
    view = o.inspect("dbos", KEY)
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
    assert [e.kind for e in view.audit][-1] == "reconciled-confirmed"


def test_without_a_lookup_a_lost_reply_fails_the_workflow_after_the_last_retry_and_no_retry_sends_again(
    tmp_path: Path, launch: Callable[[], None]
) -> None:
    provider = RefundTable(tmp_path / "refunds.db", lose_replies=1)
    o = once.Once.sqlite(tmp_path / "once.db", settings={"clock_skew_ms": 0}, policies={"refund_order": POLICY},
                         wait=0)
    attempts: list[int] = []

    @DBOS.step(name="refund_order", retries_allowed=True, interval_seconds=0.1, max_attempts=3)
    @protected_step(o, "refund_order")
    def refund_order(order_id: int, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        attempts.append(len(attempts))
        return provider.refund(order_id, amount, idempotency_key)

    with pytest.raises(dbos.error.DBOSMaxStepRetriesExceeded) as info:
        run_refund_workflow(refund_order, launch)
    # DBOS ran the step three times; only the first reached the provider, the retries met once's unknown record.
    assert attempts == [0] and provider.count() == 1, (attempts, provider.count())
    # The workflow's error is DBOS's; each attempt's error in it is once's account, never "not done".
    assert len(info.value.errors) == 3 and all(
        isinstance(e, UnconfirmedStep) and str(e).startswith(f"refund_order dbos/{KEY}: unknown (")
        and "effect unknown" in str(e) for e in info.value.errors), info.value.errors
    view = o.inspect("dbos", KEY)
    assert view is not None and view.state is once.State.UNKNOWN and view.attempts == 1


def test_the_same_lost_reply_without_once_refunds_twice(tmp_path: Path, launch: Callable[[], None]) -> None:
    provider = RefundTable(tmp_path / "refunds.db", lose_replies=1)

    @DBOS.step(name="refund_order", retries_allowed=True, interval_seconds=0.2, max_attempts=3)
    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        return provider.refund(order_id, amount)

    receipt = run_refund_workflow(refund_order, launch)
    # DBOS retried a step whose refund had committed: the provider refunded again.
    assert provider.count() == 2, provider.count()
    assert receipt == {"refund_id": "r-2", "order_id": 1234, "amount": 200}


# ------------------------------------------------------------------ the adapter's edges


def test_outside_a_workflow_step_there_is_no_identity_and_nothing_is_sent(tmp_path: Path) -> None:
    o = once.Once.memory()
    sent: list[int] = []

    @protected_step(o, "refund_order")
    def refund_order(order_id: int) -> dict[str, Any]:
        sent.append(order_id)
        return {"refund_id": "r-1"}

    with pytest.raises(once.InvalidRequest, match="outside a DBOS workflow step"):
        refund_order(1)
    assert sent == []
    assert o.plan("refund_order").policy["identity"] == "required"


def test_an_unconfirmed_step_is_onces_text_and_survives_dbos_pickling(
    tmp_path: Path, launch: Callable[[], None]
) -> None:
    o = once.Once.sqlite(tmp_path / "once.db", policies={"refund_order": POLICY}, wait=0)  # no lookup
    provider = RefundTable(tmp_path / "refunds.db", lose_replies=2)

    @DBOS.step(name="refund_order")
    @protected_step(o, "refund_order")
    def refund_order(order_id: int, amount: int) -> dict[str, Any]:
        return provider.refund(order_id, amount)

    @DBOS.step(name="refund_order_text")
    @protected_step(o, "refund_order", unconfirmed_as_text=True)
    def refund_order_text(order_id: int, amount: int) -> Any:
        return provider.refund(order_id, amount)

    @DBOS.workflow()
    def raising(order_id: int, amount: int) -> Any:
        return refund_order(order_id, amount)

    @DBOS.workflow()
    def texting(order_id: int, amount: int) -> Any:
        return refund_order_text(order_id, amount)

    launch()
    with SetWorkflowID("wf-raise"):
        with pytest.raises(UnconfirmedStep) as info:
            raising(1, 10)
    assert "refund_order dbos/wf-raise/1/refund_order: unknown" in str(info.value)
    assert "effect unknown" in str(info.value) and info.value.effect == "unknown"
    # What DBOS recorded is the same account (the exception as DBOS stored it, unpickled).
    recorded = DBOS.retrieve_workflow("wf-raise")
    with pytest.raises(UnconfirmedStep) as again:
        recorded.get_result()
    assert str(again.value) == str(info.value) and again.value.key == "wf-raise/1/refund_order"
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value) and copy.called is None
    with SetWorkflowID("wf-text"):
        text = texting(2, 20)
    assert text.startswith("refund_order dbos/wf-text/1/refund_order: unknown") and "effect unknown" in text
    assert provider.count() == 2


# ------------------------------------------------------------------ the documentation's example, as printed


def test_the_docs_example_runs_as_printed_with_one_refund(tmp_path: Path) -> None:
    run = run_script(tmp_path, docs_example("docs/frameworks/dbos.md"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "{'refund_id': 'r-1'}", run.stdout
    rows = sqlite3.connect(tmp_path / "refunds.db").execute("SELECT order_id, amount FROM refunds").fetchall()
    assert rows == [(1234, 200)]
    view = once.Once.sqlite(tmp_path / "once.db").inspect("dbos", "refund-order-1234/1/refund_order")
    assert view is not None and view.state is once.State.CONFIRMED


def test_an_async_step_with_a_lost_reply_is_reconciled_with_one_refund(
    tmp_path: Path, launch: Callable[[], None]
) -> None:
    provider = LostReplyProvider(tmp_path / "refunds.db")
    provider.reads_unavailable = 0
    o = once.Once.sqlite(tmp_path / "once.db", lookup=provider.lookup, settings={"clock_skew_ms": 0},
                         policies={"refund_order": POLICY})
    provider.handle.append(o)

    @DBOS.step(name="refund_order")
    @protected_step(o, "refund_order")
    async def refund_order(order_id: int, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        return provider.refund(order_id, amount, idempotency_key)

    @DBOS.workflow()
    async def refund_workflow(order_id: int, amount: int) -> dict[str, Any]:
        receipt: dict[str, Any] = await refund_order(order_id, amount)
        return receipt

    launch()

    async def main() -> dict[str, Any]:
        with SetWorkflowID(WORKFLOW_ID):
            return await refund_workflow(1234, 200)

    assert asyncio.run(main()) == {"refund_id": "r-1"}
    assert provider.count() == 1, "a second refund"
    view = o.inspect("dbos", KEY)
    assert view is not None and view.state is once.State.CONFIRMED and view.attempts == 1
