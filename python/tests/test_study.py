"""The seed study at a small N (study/refund_study.py): the SDK's tool-calling path against the real refund service.

Unprotected agents reproduce the study's failures (always-retry duplicates a refund whose reply was lost
after commit; never-retry omits one whose request never arrived); protected, every trial is exactly one
refund with no false completion, counted in the service's own ledger.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


from conftest import load_module, require  # noqa: E402

require("agents", "openai-agents")

STUDY = Path(__file__).resolve().parents[1] / "study" / "refund_study.py"
TRIALS = 3


def study_module() -> ModuleType:
    return load_module(STUDY, "refund_study")


def test_protected_cells_are_exactly_once_and_unprotected_fail_as_in_the_study(refund_service_bin: Path) -> None:
    s = study_module()
    cells = s.study(refund_service_bin, TRIALS)
    table = s.table(cells)
    for (policy, protected, fault), c in cells.items():
        where = f"{policy} {'protected' if protected else 'unprotected'} {fault}\n{table}"
        assert c.trials == TRIALS, where
        if protected:
            assert (c.exactly_once, c.duplicates, c.omissions, c.false_completions) == (TRIALS, 0, 0, 0), where
    unprotected = {(p, f): c for (p, prot, f), c in cells.items() if not prot}
    assert unprotected[("always_retry", "post_commit_disconnect")].duplicates == TRIALS, table
    assert unprotected[("always_retry", "post_commit_disconnect")].false_completions == TRIALS, table
    assert unprotected[("always_retry", "pre_effect_disconnect")].exactly_once == TRIALS, table
    assert unprotected[("never_retry", "pre_effect_disconnect")].omissions == TRIALS, table
    assert unprotected[("never_retry", "post_commit_disconnect")].false_completions == TRIALS, table
    assert table.splitlines()[0] == "each fault: exactly-once/trials  dup omit false"
