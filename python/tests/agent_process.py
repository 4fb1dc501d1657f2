"""One agent process for the multi-process tests: a protected refund over a shared ledger.

    python agent_process.py DB KEY EFFECTS MODE [SYNCHRONOUS]   (DB: an SQLite file or a postgres:// URL;
                                                                 SYNCHRONOUS: the SQLite ledger's mode, FULL)

MODE `race`: the dispatch appends this process's provider key to EFFECTS (the provider's effect ledger)
and answers after a pause; prints how the call ended. MODE `hang-after-effect` / `hang-before-effect`:
the dispatch writes EFFECTS.dispatched (with or without the effect first) and hangs until SIGKILLed.
MODE `hang-after-report`: the dispatch makes the effect and answers success; once the call has ended
(its success reported and committed) the process writes EFFECTS.reported and hangs until SIGKILLed.
"""

from __future__ import annotations

import json
import os
import sys
import time

from once import Dispatch, Once, Policy, Sent

# Every process of a test shares this host's clock, so no skew allowance is needed (and leases stay short).
SETTINGS = {"clock_skew_ms": 0}
# The provider can be read (by the recovering process; this one never gets that far).
POLICY = Policy(dispatch_timeout_ms=300, max_in_flight_ms=500, reconcile_interval_ms=100, lookup=True)


def effect(path: str, d: Dispatch) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(d.provider_key + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    db, key, effects, mode = sys.argv[1:5]
    if db.startswith("postgres"):
        o = Once.postgres(db, settings=SETTINGS, policies={"refund_order": POLICY})
    else:
        synchronous = sys.argv[5] if len(sys.argv) > 5 else "FULL"
        o = Once.sqlite(db, synchronous=synchronous, settings=SETTINGS, policies={"refund_order": POLICY})

    def send(d: Dispatch) -> Sent:
        if mode == "hang-after-report":
            effect(effects, d)
            return Sent.success({"refund_id": f"r-{os.getpid()}"})
        if mode == "race":
            effect(effects, d)
            time.sleep(0.2)
            return Sent.success({"refund_id": f"r-{os.getpid()}"})
        if mode == "hang-after-effect":
            effect(effects, d)
        with open(effects + ".dispatched", "w", encoding="utf-8") as f:
            f.write(d.provider_key)
        time.sleep(3600)
        return Sent.ambiguous("unreachable")

    called = o.call("tenant-7", key, "refund_order", {"order_id": 1234, "amount": 200}, send, wait=30)
    ended = json.dumps({"effect": called.effect.value, "receipt": called.receipt, "ending": type(called.ending).__name__})
    if mode == "hang-after-report":
        with open(effects + ".reported", "w", encoding="utf-8") as f:
            f.write(ended)
        time.sleep(3600)
    print(ended)
    return 0


if __name__ == "__main__":
    sys.exit(main())
