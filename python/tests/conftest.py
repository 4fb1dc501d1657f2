"""Shared fixtures: the repository's binaries, PostgreSQL, fresh ledgers."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
CI = bool(os.environ.get("CI"))


def binary(env: str, relative: str) -> Path:
    """A built binary of the repository: `$env`, else `<repo>/<relative>`; a clear failure when missing."""
    path = Path(os.environ.get(env) or REPO / relative)
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it (cargo build -p once-cli -p once-refund-example) or set {env}")
    return path


@pytest.fixture(scope="session")
def once_bin() -> Path:
    """The `once` CLI."""
    return binary("ONCE_BIN", "target/debug/once")


@pytest.fixture(scope="session")
def refund_service_bin() -> Path:
    """The refund service (examples/refund)."""
    return binary("ONCE_REFUND_SERVICE", "target/debug/refund-service")


@pytest.fixture(scope="session")
def embed_bin() -> Path:
    """The guide's Rust embedding example (host/once/examples/embed.rs, docs/rust.md): a refund over ./once.db."""
    return binary("ONCE_EMBED_EXAMPLE", "target/debug/examples/embed")


@pytest.fixture(scope="session")
def pg_url() -> str:
    """ONCE_TEST_DATABASE_URL; without it a test skips, or fails under CI."""
    url = os.environ.get("ONCE_TEST_DATABASE_URL")
    if not url:
        if CI:
            pytest.fail("ONCE_TEST_DATABASE_URL is not set and CI is: PostgreSQL tests must run")
        pytest.skip("skipped: no database (set ONCE_TEST_DATABASE_URL)")
    return url


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema name, dropped after the test."""
    import psycopg

    name = f"py_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def load_module(path: Path, name: str) -> ModuleType:
    """A Python file of the repository (a runner, a script) as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def repo_file(relative: str) -> Path:
    """A file of the repository outside python/ (a docs page, a shared test script): its path, or skip.

    An unpacked sdist ships python/tests but not the rest of the repository, so there such a test skips with a
    notice; under CI, where the whole repository is checked out, a missing file is a failure.
    """
    path = REPO / relative
    if not path.is_file():
        if CI:
            pytest.fail(f"{path} is missing and CI is set: run the tests from a checkout of the repository",
                        pytrace=False)
        pytest.skip(f"skipped: {relative} is not here (not a checkout of the repository, e.g. an unpacked sdist)")
    return path


def docs_example(page: str, heading: str = "## Example") -> str:
    """The first ```python block under `heading` of the docs page `page` (e.g. "docs/frameworks/dbos.md"), as
    printed, by the same extractor as the packages' README test (tests/packages/readme_block.py)."""
    extractor = load_module(repo_file("tests/packages/readme_block.py"), "readme_block")
    code: str = extractor.block(repo_file(page).read_text(encoding="utf-8"), heading, "python")
    return code


def run_script(directory: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Write `code` to `directory`/example.py and run it there in this interpreter, as a user would run it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "example.py").write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, "example.py"], cwd=directory, capture_output=True, text=True,
                          timeout=timeout)


def kill_when(p: subprocess.Popen[str], ready: Callable[[], bool], never: str, timeout: float = 60) -> None:
    """SIGKILL `p` as soon as `ready()` (the crash point a test aims at); fail with `p`'s stderr if it exits first,
    or with `never` if the point is not reached within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline, never
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    assert p.returncode == -signal.SIGKILL


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


def require(module: str, extra: str) -> None:
    """Import `module` (an optional extra's package) or skip; under CI a missing extra fails."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        if CI:
            pytest.fail(f"{module} is not installed and CI is set: pip install -r python/requirements-test.txt",
                        pytrace=False)
        pytest.skip(f"skipped: the {extra} extra is not installed", allow_module_level=True)
