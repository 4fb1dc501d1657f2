"""The ledgers: memory, SQLite (the standard library's sqlite3) and PostgreSQL (psycopg 3)."""

from ._base import Event, Ledger, LedgerFailure, NewerBodyFormat, Put, Row, SystemClock
from .memory import MemoryLedger
from .sqlite import SqliteLedger

__all__ = ["Event", "Ledger", "LedgerFailure", "MemoryLedger", "NewerBodyFormat", "Put", "Row", "SqliteLedger", "SystemClock"]
