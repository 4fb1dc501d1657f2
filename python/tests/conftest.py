"""Shared fixtures: the repository's binaries, PostgreSQL, fresh ledgers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Iterator

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
    """The README's Rust embedding example (host/once/examples/embed.rs): a refund over ./once.db."""
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
