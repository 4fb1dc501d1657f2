"""One DBOS application process for the DBOS crash tests: a workflow whose refund step is a real provider write.

    python dbos_process.py MODE SYSDB SCHEMA EFFECTS LEDGER WORKFLOW_ID   (SCHEMA: "-" on SQLite)

MODE `once`: the step is `@protected_step` over the once ledger LEDGER (an SQLite file) with a lookup that
reads the provider's table; `once-no-lookup`: the same without a lookup; `plain`: a plain `@DBOS.step`, no once.
With ONCE_DBOS_KILL_AFTER_COMMIT set, the provider SIGKILLs this process right after its refund row committed
(before the step returns, so before DBOS records the step). Otherwise the process launches DBOS (which recovers
the pending workflow of this executor and application version), waits for the workflow and prints its outcome as
JSON: {"result": ...} or {"error": "...", "type": "..."}.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from typing import Any, Callable

from dbos import DBOS, DBOSConfig, SetWorkflowID

import once
from once.adapters.dbos import protected_step

MODE, SYSDB, SCHEMA, EFFECTS, LEDGER, WORKFLOW_ID = sys.argv[1:7]
# Every process of a test shares this host's clock and the lease is short, so recovery waits little.
POLICY = once.Policy(dispatch_timeout_ms=300, max_in_flight_ms=500, reconcile_interval_ms=100)


def provider_refund(order_id: int, amount: int, idempotency_key: str) -> dict[str, Any]:
    """The provider: one committed row per refund, keyed by the idempotency key it was sent."""
    with sqlite3.connect(EFFECTS) as db:
        row = db.execute("INSERT INTO refunds (order_id, amount, request_id) VALUES (?, ?, ?)",
                         (order_id, amount, idempotency_key)).lastrowid
    if os.environ.get("ONCE_DBOS_KILL_AFTER_COMMIT"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"refund_id": f"r-{row}", "order_id": order_id, "amount": amount}


def lookup(tool: str, provider_key: str, args: str) -> once.Evidence:
    """The provider's authoritative read: the refund sent with this idempotency key, if any."""
    read_at = handle.now()
    with sqlite3.connect(EFFECTS) as db:
        row = db.execute("SELECT id, order_id, amount FROM refunds WHERE request_id = ?", (provider_key,)).fetchone()
    if row is None:
        return once.Evidence.absent(read_at)
    return once.Evidence.confirmed({"refund_id": f"r-{row[0]}", "order_id": row[1], "amount": row[2]})


config: DBOSConfig = {"name": "once-dbos-test", "system_database_url": SYSDB, "application_version": "once-test-1",
                      "log_level": "WARNING"}
if SCHEMA != "-":
    config["dbos_system_schema"] = SCHEMA
DBOS(config=config)

step: Callable[..., Any]
if MODE == "plain":

    @DBOS.step()
    def refund_order(order_id: int, amount: int, idempotency_key: str = "") -> dict[str, Any]:
        """The same refund with no once: DBOS alone."""
        return provider_refund(order_id, amount, idempotency_key or f"{DBOS.workflow_id}/{DBOS.step_id}")

    step = refund_order
else:
    handle = once.Once.sqlite(LEDGER, lookup=lookup if MODE == "once" else None, settings={"clock_skew_ms": 0},
                              policies={"refund_order": POLICY}, wait=10)

    @DBOS.step()
    @protected_step(handle)
    def refund_order(order_id: int, amount: int, idempotency_key: str = "") -> dict[str, Any]:  # noqa: F811
        """The refund, protected: `idempotency_key` is filled with once's provider key at dispatch."""
        return provider_refund(order_id, amount, idempotency_key)

    step = refund_order


@DBOS.workflow()
def refund_workflow(order_id: int, amount: int) -> dict[str, Any]:
    """Refund the order; the step's receipt is the workflow's output."""
    receipt: dict[str, Any] = step(order_id, amount)
    return {"receipt": receipt}


def main() -> int:
    DBOS.launch()
    if os.environ.get("ONCE_DBOS_KILL_AFTER_COMMIT"):
        with SetWorkflowID(WORKFLOW_ID):
            DBOS.start_workflow(refund_workflow, 1234, 200).get_result()
        return 3  # unreachable: the provider killed this process
    try:
        out: dict[str, Any] = {"result": DBOS.retrieve_workflow(WORKFLOW_ID).get_result(polling_interval_sec=0.05)}
    except Exception as e:
        out = {"error": str(e), "type": type(e).__name__}
    print(json.dumps(out), flush=True)
    # Everything is recorded (DBOS's system database, the ledger, the provider); DBOS's orderly shutdown joins its
    # queue threads for seconds, which this test process does not need.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
