"""The Python in the guide and the READMEs, as a reader copies it.

Every ```python block of the files tests/docs/check.py lists (the README, python/README.md, js/README.md
and every page of docs/) is type-checked by mypy (`--check-untyped-defs`: the bodies of unannotated functions too) against this package and the frameworks the
adapter extras install, each block a module of its own. The README's quick start is python/README.md's,
and run as printed in this interpreter (the `pip install ./python` the README's install line makes), twice
over one ledger: the first run sends the refund once, the second sends nothing.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from conftest import CI, load_module, repo_file, run_script


def python_blocks() -> list[tuple[str, str]]:
    """(file:line, code) of every ```python block of the documentation check's files."""
    check = load_module(repo_file("tests/docs/check.py"), "docs_check")
    found: list[tuple[str, str]] = []
    for path in check.example_files():
        for line, language, body in check.blocks(path.read_text(encoding="utf-8")):
            if language == "python":
                found.append((f"{path.relative_to(check.REPO)}:{line}", body + "\n"))
    return found


def test_the_docs_hold_python_blocks_for_the_quick_start_and_the_frameworks() -> None:
    where = [w for w, _ in python_blocks()]
    assert any(w.startswith("README.md:") for w in where), where
    assert any(w.startswith("docs/frameworks/") for w in where), where


def importable(code: str) -> list[str]:
    """The top-level modules `code` imports that this interpreter cannot find."""
    names = re.findall(r"^(?:from|import)\s+([A-Za-z_]\w*)", code, re.MULTILINE)
    return sorted({n for n in names if importlib.util.find_spec(n) is None})


def test_every_python_block_passes_mypy(tmp_path: Path) -> None:
    blocks = []
    for where, code in python_blocks():
        missing = importable(code)
        if missing:
            # An adapter extra this interpreter lacks (Pydantic AI needs Python 3.11): its block is not checked
            # here, and under CI nothing may be missing.
            assert not CI, f"{where} imports {missing}, which are not installed, and CI is set"
            continue
        blocks.append((where, code))
    for i, (where, code) in enumerate(blocks):
        (tmp_path / f"block_{i}.py").write_text(f"# {where}\n{code}", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--check-untyped-defs", "--no-incremental", "--explicit-package-bases",
         *sorted(p.name for p in tmp_path.glob("block_*.py"))],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    # Name each finding by the documentation line it came from.
    report = done.stdout
    for i, (where, _) in enumerate(blocks):
        report = report.replace(f"block_{i}.py", f"{where} (block_{i}.py)")
    assert done.returncode == 0, report + done.stderr


def test_a_block_with_a_type_error_fails_the_check(tmp_path: Path) -> None:
    # The check above must be able to fail: a wrong argument type.
    (tmp_path / "wrong.py").write_text("from once import Once\n\nonce = Once.sqlite(42)\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "wrong.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "arg-type" in done.stdout, done.stdout


def test_the_readme_quick_start_is_the_packages_and_runs_as_printed(tmp_path: Path) -> None:
    extractor = load_module(repo_file("tests/packages/readme_block.py"), "readme_block")
    readme = extractor.block(repo_file("README.md").read_text(encoding="utf-8"), "### Python", "python")
    package = extractor.block(repo_file("python/README.md").read_text(encoding="utf-8"), "## Quick start", "python")
    assert readme == package, "README.md's Python quick start differs from python/README.md's (which the packages stage runs)"
    first = run_script(tmp_path, readme)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "sent 1 time(s) by this run", first.stdout
    again = run_script(tmp_path, readme)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "sent 0 time(s) by this run", again.stdout
    receipt = first.stdout.splitlines()[0]
    assert first.stdout.splitlines()[:2] == again.stdout.splitlines()[:2] == [receipt, receipt], \
        "every call, sent or replayed, answers the same stored receipt"
