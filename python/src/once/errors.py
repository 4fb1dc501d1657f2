"""The exceptions of the package: an engine error, a refused input, a failed part."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Called


class OnceError(Exception):
    """Every error this package raises."""


class InvalidJson(OnceError):
    """A JSON input (args, receipt, schema) is malformed: what was wrong and where."""

    def __init__(self, kind: str, pointer: str, offset: int, message: str) -> None:
        super().__init__(f"invalid JSON ({kind}) at {pointer or '/'} (byte {offset}): {message}")
        self.kind = kind
        self.pointer = pointer
        self.offset = offset
        self.detail = message


class InvalidRequest(OnceError):
    """A request field is unusable (an empty or oversized key, a bad pointer, args that are not JSON text)."""


class InvalidPolicy(OnceError):
    """A tool policy or the configuration is inconsistent; the message names the field."""


class StorageError(OnceError):
    """The ledger failed on a read or a write."""


class NotFound(OnceError):
    """No record for this scope and key."""


class FenceMismatch(OnceError):
    """The fence belongs to no attempt of this record."""


class InvalidTransition(OnceError):
    """An operator command that the record's state does not allow."""


class NotConfigured(OnceError):
    """An export was called before `configure` (a bug of this package if it ever shows)."""


class GuestLimit(OnceError):
    """The component exceeded its fuel or memory budget for one call; nothing was half-written."""


class ComponentError(OnceError):
    """The component trapped or could not be loaded."""


class Unconfirmed(OnceError):
    """A protected function's call did not end with the effect confirmed; `called` says how it ended."""

    def __init__(self, called: Called) -> None:
        super().__init__(called.describe())
        self.called = called


class Refused(Exception):
    """Raised by a protected function when the provider answered and definitely did nothing (a rejection)."""
