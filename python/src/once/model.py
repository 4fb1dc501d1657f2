"""The typed values of the API: policies, what a dispatcher answers, and how a call ended.

Every field mirrors a field of `wit/once.wit` (snake_case for kebab-case); the
meanings are the WIT's and DESIGN.md's, stated by the guest, never decided here.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional, Union


def _stand_in(value: object) -> dict[str, Any]:
    """What stands for a value with no JSON projection: its type's name and its repr."""
    try:
        shown = repr(value)
    except Exception:  # a broken __repr__ must not turn a done effect into an ambiguous one
        shown = object.__repr__(value)
    return {"once_unserializable": {"type": type(value).__qualname__, "repr": shown}}


def _projection(value: object) -> object:
    """The JSON form of one value `json` cannot write (called by the encoder, which walks the result)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)  # a Decimal as its exact digits: never through a float
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return list(value)
    return _stand_in(value)


# One encoder for every receipt made here (json.dumps with options builds a new encoder per call).
_compact = json.JSONEncoder(separators=(",", ":"), default=_projection).encode


def receipt_text(value: object) -> str:
    """A success's response (a function's return value) as the JSON text stored, returned and replayed.

    The effect happened, so no value is refused: what `json` cannot write is projected (a dataclass as a
    dict of its fields, a date, time or datetime as its ISO 8601 text, a Decimal or UUID as its string,
    an Enum as its value, a set as a list), anything else is `{"once_unserializable": {"type", "repr"}}`,
    in place, and a value `json` cannot walk at all (a key that is not a string, a cycle) is that
    stand-in whole. A NaN or infinity is written as `json` writes it; the engine keeps such text inside
    its `once_unparsed_receipt` stand-in and flags the receipt (docs/limits.md: a provider's receipt).
    """
    try:
        return _compact(value)
    except (TypeError, ValueError, RecursionError):
        return _compact(_stand_in(value))


class State(str, enum.Enum):
    """A record's state (DESIGN.md "Record states")."""

    IN_FLIGHT = "in-flight"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    ABSENT = "absent"
    SUPERSEDED = "superseded"
    AWAITING_APPROVAL = "awaiting-approval"
    DENIED = "denied"


class Route(str, enum.Enum):
    """How a tool is routed."""

    DIRECT = "direct"
    PROTECT = "protect"
    BLOCK = "block"


class IdentityMode(str, enum.Enum):
    """Where a call's operation key must come from."""

    REQUIRED = "required"
    DERIVED = "derived"


class KeySource(str, enum.Enum):
    """Where an operation key came from."""

    APPLICATION = "application"
    DERIVED = "derived"


class Effect(str, enum.Enum):
    """Did the effect happen, as far as the ledger knows."""

    HAPPENED = "happened"
    NONE = "none"
    UNKNOWN = "unknown"


class Repeat(str, enum.Enum):
    """What the same call again would do."""

    REPLAYS = "replays"
    WAITS = "waits"
    RETRIES = "retries"
    REFUSED = "refused"


class ReplayVia(str, enum.Enum):
    """How a stored receipt was matched."""

    KEY = "key"
    DERIVED_ARGS = "derived-args"
    PROVIDER = "provider"


class Confirmation(str, enum.Enum):
    """How the ledger learnt that the effect happened."""

    ANSWER = "answer"
    PROVIDER = "provider"
    OPERATOR = "operator"


class BlockReason(str, enum.Enum):
    """Why a call was refused before anything was sent."""

    ROUTE_BLOCKED = "route-blocked"
    DESCRIPTOR_CHANGED = "descriptor-changed"
    QUOTA = "quota"
    ATTEMPT_BUDGET = "attempt-budget"
    IDENTITY_REQUIRED = "identity-required"
    IDENTITY_CONFLICT = "identity-conflict"
    PAYLOAD_REQUIRED = "payload-required"
    SUPERSEDED = "superseded"
    SUPERSEDED_UNRESOLVED = "superseded-unresolved"
    SUPERSEDED_CONFIRMED = "superseded-confirmed"
    SUPERSEDES_MISSING = "supersedes-missing"
    EXPIRED = "expired"
    UNVERIFIED = "unverified"
    STORAGE = "storage"
    FAILED = "failed"
    OTHER_OWNER = "other-owner"
    APPROVAL_DENIED = "approval-denied"
    OTHER_ACCOUNT = "other-account"


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Quota:
    """A spend ceiling per scope per window (the guest fills and checks the rest)."""

    spend_field: str
    ceiling: str
    window_ms: int
    decimals: Optional[int] = None
    bucket: Optional[str] = None


@dataclass(frozen=True)
class ApprovalAbove:
    """A person must approve a call whose amount at `field` (a JSON pointer to an effect field) is above `above`
    (a decimal string); a call whose field is missing or not a number needs approval too."""

    field: str
    above: str


#: When a person must approve a call before it is sent: never (the default), always, or above an amount.
ApprovalRule = Union[Literal["never", "always"], ApprovalAbove]


@dataclass(frozen=True)
class Policy:
    """One tool's policy as configured; every field left None is filled by the guest, and the result is checked."""

    route: Optional[Route] = None
    identity: Optional[IdentityMode] = None
    key_argument: Optional[str] = None
    key_sent_by_host: Optional[bool] = None
    effect_fields: Optional[list[str]] = None
    verify_first: Optional[bool] = None
    provider_claims_key: Optional[bool] = None
    lookup: Optional[bool] = None
    max_in_flight_ms: Optional[int] = None
    dispatch_timeout_ms: Optional[int] = None
    lease_ms: Optional[int] = None
    attempt_budget: Optional[int] = None
    derived_window_ms: Optional[int] = None
    resolve_deadline_ms: Optional[int] = None
    reconcile_interval_ms: Optional[int] = None
    retention_ms: Optional[int] = None
    tombstone_retention_ms: Optional[int] = None
    quota: Optional[Quota] = None
    descriptor_pin: Optional[str] = None
    approval: Optional[ApprovalRule] = None
    approval_valid_ms: Optional[int] = None
    approval_wait_ms: Optional[int] = None
    #: The provider account this host sends and reads the tool through: a stable name or fingerprint of its
    #: credential, never the credential. A record keeps the account it was begun under; a call through another
    #: account is blocked (`other-account`), and a read through another one never proves the effect absent.
    provider_account: Optional[str] = None


# The `policy-input` fields, in order (WIT names with `_` for `-`).
POLICY_FIELDS = tuple(f.name for f in fields(Policy))


@dataclass(frozen=True)
class ToolDescriptor:
    """A tool's definition as its server advertises it (routing by annotations, pinning)."""

    name: str
    input_schema: str
    annotations: Optional[str] = None


@dataclass(frozen=True)
class ToolPlan:
    """How the guest decided to handle one tool: its route, why it blocks, and its complete policy (WIT names)."""

    tool: str
    route: Route
    blocked: Optional[str]
    policy: dict[str, object]


# ---------------------------------------------------------------- what the host's parts answer


@dataclass(frozen=True)
class Sent:
    """What the provider answered one dispatch: `success`, `rejected` (definite, no effect), `ambiguous`, `not-sent`."""

    kind: str
    text: str = ""

    @staticmethod
    def success(response: Union[str, object]) -> Sent:
        """The effect happened; `response` is JSON text, or a value that is JSON-encoded (`receipt_text`)."""
        return Sent("success", response if isinstance(response, str) else receipt_text(response))

    @staticmethod
    def returned(value: object) -> Sent:
        """The effect happened; a function's return value (a string too) is JSON-encoded (`receipt_text`)."""
        return Sent("success", receipt_text(value))

    @staticmethod
    def rejected(error: str) -> Sent:
        """The provider answered and did nothing."""
        return Sent("rejected", error)

    @staticmethod
    def ambiguous(reason: str) -> Sent:
        """Timeout, disconnect, 5xx after send, a crash: the effect may exist."""
        return Sent("ambiguous", reason)

    @staticmethod
    def not_sent() -> Sent:
        """Nothing left this host (too late, or refused before any byte was sent)."""
        return Sent("not-sent")


@dataclass(frozen=True)
class Evidence:
    """What an authoritative read of the provider found: `confirmed(receipt)`, `absent(read_position)`, `unknown`."""

    kind: str
    receipt: str = ""
    read_position: int = 0
    reason: str = ""

    @staticmethod
    def confirmed(receipt: Union[str, object]) -> Evidence:
        """The effect exists; its receipt (JSON text, or a value that is JSON-encoded by `receipt_text`)."""
        return Evidence("confirmed", receipt=receipt if isinstance(receipt, str) else receipt_text(receipt))

    @staticmethod
    def absent(read_position: int) -> Evidence:
        """No effect as of `read_position` (ms, ledger clock): every commit at or before it is visible."""
        return Evidence("absent", read_position=read_position)

    @staticmethod
    def unknown(reason: str) -> Evidence:
        """The read could not tell."""
        return Evidence("unknown", reason=reason)


@dataclass(frozen=True)
class Dispatch:
    """One grant to send: send exactly these args (the key argument already carries the provider key)."""

    scope: str
    key: str
    tool: str
    attempt: int
    provider_key: str
    args: str
    send_by: int
    timeout_ms: int
    #: A DIRECT call (a read-only tool), sent unprotected: nothing is recorded or reported, and it has no key,
    #: attempt or provider key ("", 0 and ""); its scope is the call's. Tell the two kinds apart by this.
    direct: bool = False

    def arguments(self) -> dict[str, object]:
        """The args to send, decoded."""
        value = json.loads(self.args)
        if not isinstance(value, dict):
            raise TypeError(f"{self.tool}: the dispatched args are not a JSON object")
        return value


@dataclass(frozen=True)
class Escalation:
    """An escalation to the operator; delivered at least once, deduplicated on `id`."""

    id: str
    scope: str
    key: str
    tool: str
    state: State
    reason: str
    deadline: int


# ---------------------------------------------------------------- how a call ended


@dataclass(frozen=True)
class Confirmed:
    """The effect happened."""

    receipt: str
    replayed: bool
    via: Optional[ReplayVia]
    confirmed_by: Confirmation
    at: int
    window_until: Optional[int]
    attempt: Optional[int]
    earlier_attempts: Effect
    possible_duplicate: bool

    def value(self) -> object:
        """The receipt, decoded."""
        return json.loads(self.receipt)


@dataclass(frozen=True)
class Rejected:
    """The provider refused and did nothing."""

    error: str
    attempt: int


@dataclass(frozen=True)
class NotSent:
    """The latest attempt was not sent: final when the account's repeat is `refused` (no attempt
    was sent, none is left); a retry's interim answer when it is `retries` (the same call sends
    the next attempt; an earlier one may have been sent, and `effect` says what is known of it)."""

    attempts: int


@dataclass(frozen=True)
class Unknown:
    """The effect may exist; nothing is sent until it is known."""

    since: int
    deadline: int
    reason: str
    next_read: Optional[int]


@dataclass(frozen=True)
class InFlight:
    """Another attempt still holds the operation."""

    lease_until: int


@dataclass(frozen=True)
class Conflict:
    """The key names another call (tool or payload): nothing was sent."""

    key: str
    tool: str
    fingerprint: str
    args: str
    state: State
    created_at: int


@dataclass(frozen=True)
class Blocked:
    """Refused before anything was sent."""

    reason: BlockReason
    detail: str
    receipt: Optional[str]


@dataclass(frozen=True)
class Unrecorded:
    """The effect happened; the ledger could not record it yet (it is reconciled later)."""

    response: str


@dataclass(frozen=True)
class AwaitsApproval:
    """Nothing more is sent until a person approves this exact call (`Once.approve`, `once ledger approve`,
    the UI); an earlier attempt may have been sent (the account's `effect` says what is known of it). The same
    call again waits for that decision; once approved, the next attempt is sent, never twice."""

    asked_at: int
    reason: str
    #: How long an approval may be used once given.
    valid_ms: int
    #: Past this (ledger clock), nobody having approved, the call is denied.
    wait_until: int


Ending = Union[Confirmed, Rejected, NotSent, Unknown, InFlight, Conflict, Blocked, Unrecorded, AwaitsApproval]


@dataclass(frozen=True)
class Account:
    """Everything a caller shows about how a call ended, as facts the guest states."""

    scope: str
    key: Optional[str]
    key_source: Optional[KeySource]
    tool: str
    ending: Ending
    effect: Effect
    repeat: Repeat
    #: Nothing but an operator can settle this call now (an unknown outcome no read of the provider is
    #: scheduled for): the guest states it; a host keeps no watch on such a call and says an operator must.
    awaits_operator: bool


@dataclass(frozen=True)
class Called:
    """How one protected call ended: the guest's account; or the provider's success that could not be reported;
    or, for a DIRECT tool, what the unprotected send answered."""

    account: Optional[Account] = None
    unreported: Optional[Unrecorded] = None
    direct: Optional[Sent] = None
    report_error: Optional[str] = None
    raised: Optional[BaseException] = field(default=None, compare=False)

    @property
    def ending(self) -> Optional[Ending]:
        """The account's ending, if there is an account."""
        return self.account.ending if self.account else None

    @property
    def confirmed(self) -> Optional[Confirmed]:
        """The confirmation, if the call ended confirmed."""
        return self.ending if isinstance(self.ending, Confirmed) else None

    @property
    def effect(self) -> Effect:
        """Did the effect happen: the account's word; a success that was not reported happened; direct: unknown."""
        if self.account is not None:
            return self.account.effect
        return Effect.HAPPENED if self.unreported is not None else Effect.UNKNOWN

    @property
    def receipt(self) -> Optional[str]:
        """The provider's receipt (JSON text), when the effect happened."""
        ending = self.ending
        if isinstance(ending, Confirmed):
            return ending.receipt
        if isinstance(ending, Unrecorded):
            return ending.response
        if self.unreported is not None:
            return self.unreported.response
        if self.direct is not None and self.direct.kind == "success":
            return self.direct.text
        return None

    def describe(self) -> str:
        """One line: how the call ended, the effect, and what a repeat would do (the guest's facts)."""
        if self.account is None:
            if self.unreported is not None:
                return f"the effect happened but could not be reported to the ledger: {self.report_error}"
            return f"direct (unprotected) call answered {self.direct.kind if self.direct else 'nothing'}"
        a = self.account
        name = type(a.ending).__name__.lower()
        detail = ""
        if isinstance(a.ending, Blocked):
            detail = f" ({a.ending.reason.value}: {a.ending.detail})"
        elif isinstance(a.ending, Rejected):
            detail = f" ({a.ending.error})"
        elif isinstance(a.ending, Unknown):
            detail = f" ({a.ending.reason})"
        elif isinstance(a.ending, AwaitsApproval):
            detail = f" (a person must approve this exact call first: {a.ending.reason})"
        return (
            f"{a.tool} {a.scope}/{a.key or '-'}: {name}{detail}; effect {a.effect.value}; "
            f"the same call again {a.repeat.value}"
        )


# ---------------------------------------------------------------- operators


@dataclass(frozen=True)
class AuditEvent:
    """The audit event of one transition."""

    scope: str
    key: str
    version: int
    at: int
    kind: str
    from_state: Optional[State]
    to_state: Optional[State]
    attempt: Optional[int]
    detail: str


@dataclass(frozen=True)
class Resolvable:
    """Which resolutions `resolve` accepts for a record now, at the ledger clock (the guest's own guards)."""

    #: `confirmed` is accepted (the record is unknown, absent, failed, or in flight past its lease).
    confirmed: bool
    #: `absent` is accepted (the record is unknown, or in flight past its lease).
    absent: bool
    #: `absent` is accepted only with `force`: an earlier request may still commit.
    absent_needs_force: bool
    #: `approve` and `deny` are accepted: the record awaits approval.
    approve: bool = False


@dataclass(frozen=True)
class RecordView:
    """A record as shown to an operator, with its audit trail."""

    scope: str
    key: str
    key_source: KeySource
    tool: str
    fingerprint: str
    args: str
    provider_key: str
    owner: str
    state: State
    version: int
    attempts: int
    receipt: Optional[str]
    error: Optional[str]
    escalated: bool
    possible_duplicate: bool
    supersedes: Optional[str]
    superseded_by: Optional[str]
    replays: int
    conflicts: int
    created_at: int
    updated_at: int
    #: What `resolve` would accept now, as the guest states it.
    resolvable: Resolvable
    body: str
    audit: list[AuditEvent] = field(default_factory=list)


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: `owed` lists the owed dispatches it found; `sent`, how each one `settle` granted and sent
    ended (not one another host took first, nor one a call of the same `Once` is driving: that call sends it)."""

    expired: int
    reconciled: int
    confirmed: int
    escalated: int
    owed: list[tuple[str, str]]
    sent: list[Called] = field(default_factory=list)
