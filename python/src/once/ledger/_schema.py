"""The ledger's DDL: the once repository's `schema/` files, shipped inside this package as `once/schema/`.

The Rust host includes the same files and the npm package ships them, so every host creates and upgrades a
ledger with the same statements. How a ledger applies them is schema/README.md (shipped beside them); this
module is that rule, as host/once/src/storage/ddl.rs is for Rust.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Optional

from ._base import LedgerFailure

_STEP = re.compile(r"(\d{3})-[a-z0-9-]+\.sql")


@dataclass(frozen=True)
class Step:
    """What one migration runs: the version it brings the ledger to, whether it is the new-ledger layout, the SQL."""

    version: int
    fresh: bool
    sql: str


@dataclass(frozen=True)
class Migrations:
    """One backend's files: `000-*.sql` (run first), `ledger.sql` (a new ledger's layout), the numbered steps."""

    bootstrap: Optional[str]
    fresh: Optional[str]
    steps: tuple[tuple[int, str], ...]

    @property
    def current(self) -> int:
        """The version the files bring a ledger to: the highest step's."""
        return self.steps[-1][0] if self.steps else 0

    def plan(self, found: int) -> list[Step]:
        """What a ledger recorded at `found` runs, in order (the bootstrap apart): a new ledger the fresh layout
        if there is one, else every step; any other the steps above `found`."""
        if found == 0 and self.fresh is not None:
            return [Step(self.current, True, self.fresh)]
        return [Step(n, False, sql) for n, sql in self.steps if n > found]


@lru_cache(maxsize=None)
def migrations(backend: str) -> Migrations:
    """The files of `schema/<backend>` this package ships (`sqlite` or `postgres`)."""
    folder = resources.files("once") / "schema" / backend
    try:
        entries = sorted((f.name, f) for f in folder.iterdir() if f.name.endswith(".sql"))
    except OSError as e:
        raise LedgerFailure(f"{backend}: this package ships no schema files (once/schema/{backend}): {e}; "
                            "reinstall once-exactly") from e
    bootstrap, fresh, steps = None, None, []
    for name, f in entries:
        text = f.read_text(encoding="utf-8")
        step = _STEP.fullmatch(name)
        if name == "ledger.sql":
            fresh = text
        elif step and int(step.group(1)) == 0:
            bootstrap = text
        elif step:
            steps.append((int(step.group(1)), text))
        else:
            raise LedgerFailure(f"{backend}: unexpected schema file once/schema/{backend}/{name}")
    return Migrations(bootstrap, fresh, tuple(sorted(steps)))


def witness_table() -> str:
    """The SQLite witness file's table (`schema/witness/sqlite.sql`), as every host creates it."""
    try:
        return (resources.files("once") / "schema" / "witness" / "sqlite.sql").read_text(encoding="utf-8")
    except OSError as e:
        raise LedgerFailure(f"witness: this package ships no schema file (once/schema/witness/sqlite.sql): {e}; "
                            "reinstall once-exactly") from e


def for_schema(sql: str, quoted: str) -> str:
    """A `postgres/` file's text for one schema: every `{schema}` replaced by its quoted identifier."""
    return sql.replace("{schema}", quoted)


def statements(sql: str) -> list[str]:
    """An `sqlite/` file's statements (its one rule: no `;` but the one ending each statement)."""
    return [s for s in sql.split(";") if s.strip()]
