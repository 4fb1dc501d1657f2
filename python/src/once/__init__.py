"""once: exactly-once execution of an agent's side-effecting tool calls, on the once component.

    from once import Once
    once = Once.sqlite("ledger.db")

    @once.protect(key=lambda order_id, amount: f"refund-{order_id}")
    def refund_order(order_id: int, amount: int) -> dict:
        ...
"""

from .client import Once
from .errors import (
    ComponentError, FenceMismatch, GuestLimit, InvalidJson, InvalidPolicy, InvalidRequest, InvalidTransition,
    NotConfigured, NotFound, OnceError, Refused, StorageError, Unconfirmed,
)
from .model import (
    Account, ApprovalAbove, ApprovalRule, AuditEvent, AwaitsApproval, Blocked, BlockReason, Called, Confirmation, Confirmed, Conflict, Dispatch, Effect, Ending,
    Escalation, Evidence, IdentityMode, InFlight, KeySource, NotSent, Policy, Quota, RecordView, Rejected, Repeat,
    ReplayVia, Resolvable, Route, Sent, State, SweepResult, ToolDescriptor, ToolPlan, Unknown, Unrecorded,
)
from .protect import current_key, operation

__all__ = [
    "Account", "ApprovalAbove", "ApprovalRule", "AuditEvent", "AwaitsApproval", "Blocked", "BlockReason", "Called", "ComponentError", "Confirmation", "Confirmed",
    "Conflict", "Dispatch", "Effect", "Ending", "Escalation", "Evidence", "FenceMismatch", "GuestLimit", "IdentityMode",
    "InFlight", "InvalidJson", "InvalidPolicy", "InvalidRequest", "InvalidTransition", "KeySource", "NotConfigured",
    "NotFound", "NotSent", "Once", "OnceError", "Policy", "Quota", "RecordView", "Refused", "Rejected", "Repeat",
    "ReplayVia", "Resolvable", "Route", "Sent", "State", "StorageError", "SweepResult", "ToolDescriptor", "ToolPlan",
    "Unconfirmed", "Unknown", "Unrecorded", "current_key", "operation",
]
__version__ = "0.2.0"
