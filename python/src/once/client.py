"""The `Once` handle: the call protocol over the component, and the ledger's imports.

`call` is the protocol's loop: start the call, send each grant (and report
what happened), sleep through each wait, stop at the account the guest
states. Every decision is the component's; this file moves data, sends and
sleeps. The loop is written once, as a generator of actions (call the guest,
send, sleep) that `call` runs inline and `acall` runs on an event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Generator, Mapping, Optional, Union

from wasmtime.component import Record, Variant

from . import _wit, errors
from ._runtime import DEFAULT_FUEL, DEFAULT_MEMORY, VERSION, Instance, Runtime
from .ledger import Event, Ledger, LedgerFailure, MemoryLedger, Row, SqliteLedger
from .model import (
    Called, Dispatch, Escalation, Evidence, Policy, RecordView, Route, Sent, State, SweepResult, ToolDescriptor, ToolPlan,
    Unrecorded,
)

log = logging.getLogger("once")

Send = Callable[[Dispatch], Any]
ASend = Callable[[Dispatch], Awaitable[Any]]
Lookup = Callable[[str, str, str], Evidence]
Escalate = Callable[[Escalation], bool]
Args = Union[str, Mapping[str, Any], list[Any]]
# One action of the protocol loop: ("guest", fn) | ("send", (dispatch, send-by and the answer's deadline on
# time.monotonic(); no send-by for a DIRECT call)) | ("sleep", seconds).
Action = tuple[str, Any]


def _log_escalation(e: Escalation) -> bool:
    log.error("once: operator attention needed: id=%s scope=%s key=%s tool=%s reason=%s deadline=%s",
              e.id, e.scope, e.key, e.tool, e.reason, e.deadline)
    return True


def _args_text(args: Args, field: str = "args") -> str:
    """`args` (JSON text, or a value JSON-encoded) as the JSON text the guest reads; `InvalidRequest` naming `field`."""
    if isinstance(args, str):
        return _wit.utf8_text(field, args)
    try:
        text = _wit.to_json(args)
    except (TypeError, ValueError) as e:
        raise errors.InvalidRequest(f"{field}: not JSON-serializable: {e}") from e
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate in a str value (the encoder keeps non-ASCII as is): written as a JSON escape
            # instead, which the guest's I-JSON check refuses as `lone-surrogate` with its JSON pointer.
            return _wit.to_ascii_json(args)
    return text


def _sent(value: Any) -> Sent:
    """A dispatcher's answer: a `Sent`, else its return value is the provider's success response."""
    return value if isinstance(value, Sent) else Sent.success(value)


def _blocking(send: Any) -> None:
    """Refuse an async dispatcher given to a blocking call, before anything is granted: its coroutine would never
    run. (One that returns an awaitable some other way is caught when it does: `_NeverRan`.)"""
    if inspect.iscoroutinefunction(send):
        raise errors.InvalidRequest("the dispatcher is an async function: use acall (or protect on an async "
                                    "function); nothing was recorded or sent")


class _NeverRan(Exception):
    """Raised into the protocol when a dispatcher certainly did not run: nothing was sent, so the attempt is
    reported not-sent, and `error` is raised to the caller once it is."""

    def __init__(self, error: errors.OnceError) -> None:
        super().__init__(str(error))
        self.error = error


def _why(e: Exception) -> str:
    """A store's exception as the words of a failure answer (never empty: an empty `some("")` still fails, but says
    nothing)."""
    return str(e) or type(e).__name__


def _failed(message: str) -> Variant:
    return Variant("failed", _wit.record(message=message))


# `ledger-json.get` and `ledger-json.commit` answer the JSON form of a `got` / `committed` (wit/once.wit).
_MISSING, _APPLIED, _CONFLICT = '"Missing"', '"Applied"', '"Conflict"'


def _got(r: Row) -> str:
    """`got.found(stored)`: the row's version and body."""
    return f'{{"Found":{{"version":{r.version},"body":{_wit.to_json(r.body)}}}}}'


def _failed_text(message: str) -> str:
    """`got.failed` / `committed.failed`, in the JSON form."""
    return _wit.to_json({"Failed": {"message": message}})


def _row_record(r: Row) -> Record:
    return _wit.record(table=r.table, scope=r.scope, key=r.key, version=r.version, state=r.state, due_at=r.due_at,
                       owner=r.owner, body=r.body)


def _event_record(e: Event) -> Record:
    return _wit.record(scope=e.scope, key=e.key, version=e.version, at=e.at, kind=e.kind, from_state=e.from_state,
                       to_state=e.to_state, attempt=e.attempt, detail=e.detail)


@dataclass
class _Mark:
    """One loop's mark on an operation: until when it counts (time.monotonic(); None: while the loop holds it)."""

    id: int
    until: Optional[float] = None


class _Driving:
    """The operations a call loop of this `Once` is driving now: (scope, key) -> each loop's mark on it.

    A call whose reply was lost waits for its provider read to come due, then reads and, if the effect is absent,
    sends the next attempt itself. A `settle` running beside it in the same process (another thread, a background
    task) reads the same due unknown in its sweep, proves the same absence and lists the operation owed: granting and
    sending it there would race the call for it. Either winner keeps the effect single (the ledger's compare-and-swap
    decides), but when `settle` wins, the caller, who made one call, is told its operation "already ran" and was
    replayed: an answer that reads like a duplicate it did not make. So `settle` leaves a driven operation to its
    driver, which answers as the one that sent it.

    A loop drives an operation from its first step that names the key (a grant, a wait) until it returns or raises;
    then the next `settle` takes what it left, as before. While the loop is in a send, its mark counts only until the
    deadline the guest gave the answer: a send is the caller's code, which may hang past it, and the operation (its
    lease over) is then `settle`'s, as it would be without the mark.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._marks: dict[tuple[str, str], list[_Mark]] = {}

    def driven(self, scope: str, key: str) -> bool:
        """Whether a loop of this handle is driving (scope, key) now."""
        now = time.monotonic()
        with self._lock:
            return any(m.until is None or now < m.until for m in self._marks.get((scope, key), []))

    def driver(self) -> _Driver:
        """A loop's mark, which follows the operation its steps are about until it is released."""
        return _Driver(self)

    def _take(self, op: tuple[str, str]) -> int:
        with self._lock:
            mark_id = next(self._ids)
            self._marks.setdefault(op, []).append(_Mark(mark_id))
            return mark_id

    def _set_until(self, op: tuple[str, str], mark_id: int, until: Optional[float]) -> None:
        with self._lock:
            for mark in self._marks.get(op, []):
                if mark.id == mark_id:
                    mark.until = until

    def _give_back(self, op: tuple[str, str], mark_id: int) -> None:
        with self._lock:
            left = [m for m in self._marks.get(op, []) if m.id != mark_id]
            if left:
                self._marks[op] = left
            else:
                self._marks.pop(op, None)


class _Driver:
    """One loop's mark on the operation it drives (`_Driving.driver`)."""

    def __init__(self, driving: _Driving) -> None:
        self._driving = driving
        self._held: Optional[tuple[tuple[str, str], int]] = None

    def follow(self, scope: str, key: str) -> None:
        """Before the loop follows a step naming (scope, key): that operation is this loop's from now on, while the loop
        holds it. A loop can move to another key (a successor waits on the operation it supersedes): the one it left is
        no longer held."""
        if self._held is not None and self._held[0] == (scope, key):
            self._driving._set_until(*self._held, None)
            return
        self.release()
        op = (scope, key)
        self._held = (op, self._driving._take(op))

    def held_until(self, until: Optional[float]) -> None:
        """Around a send: the mark counts until `until` (time.monotonic(): the deadline the guest gave the answer), and
        no longer, however long the send takes; None once the send has returned: held again, while the loop holds it."""
        if self._held is not None:
            self._driving._set_until(*self._held, until)

    def release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._driving._give_back(*held)


class Once:
    """A handle on one ledger: configure tools, then `call`, `acall` or `@protect`. Safe to share between threads."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        owner: Optional[str] = None,
        policies: Optional[Mapping[str, Policy]] = None,
        defaults: Optional[Policy] = None,
        lookup: Optional[Lookup] = None,
        escalate: Optional[Escalate] = None,
        wait: float = 10.0,
        settings: Optional[Mapping[str, Any]] = None,
        fuel: int = DEFAULT_FUEL,
        memory: int = DEFAULT_MEMORY,
    ) -> None:
        self.ledger = ledger
        self.wait = wait
        self._lookup = lookup
        self._escalate = escalate or _log_escalation
        self._runtime = Runtime.shared()
        self._fuel, self._memory = fuel, memory
        self._linker = self._make_linker()
        self._pool: list[Instance] = []
        self._lock = threading.Lock()
        self._config_lock = threading.Lock()
        self._driving = _Driving()
        first = self._instance()
        base = {k: v for k, v in vars(first.call("default-settings")).items()}
        for name, value in (settings or {}).items():
            wit = name.replace("_", "-")
            if wit not in base:
                raise errors.InvalidRequest(f"settings: unknown setting {name!r} (known: {', '.join(base)})")
            base[wit] = value
        if owner is not None:
            base["owner"] = owner
        # Without a provider read, an unknown outcome waits for an operator (as the Rust host).
        if lookup is None and (defaults is None or defaults.lookup is None):
            defaults = replace(defaults or Policy(), lookup=False)
        self._settings = base
        self._defaults = defaults or Policy()
        self._tools: dict[str, tuple[Policy, Optional[ToolDescriptor]]] = {
            tool: (p, None) for tool, p in (policies or {}).items()
        }
        self._generation = 0
        self._configured: Any = None
        self._reconfigure(first)
        # Configuring reads no row; everything after may. A ledger holding bodies of a later format than this
        # guest's is refused here, not misread by the first sweep, and a ledger without one gets it.
        try:
            ledger.claim_body_format(int(getattr(self._configured, "body-format")))
        except LedgerFailure as e:
            raise errors.StorageError(str(e)) from e

    # -- constructors

    @classmethod
    def memory(cls, **options: Any) -> Once:
        """Over an in-memory ledger (one process; lost at exit)."""
        return cls(MemoryLedger(), **options)

    @classmethod
    def sqlite(cls, path: Union[str, "os.PathLike[str]"], *, synchronous: str = "FULL", busy_timeout: float = 5.0, **options: Any) -> Once:
        """Over a SQLite file (created if missing; the Rust host's schema; several processes may share it)."""
        try:
            ledger = SqliteLedger(path, synchronous=synchronous, busy_timeout=busy_timeout)
        except LedgerFailure as e:
            raise errors.StorageError(str(e)) from e
        return cls(ledger, **options)

    @classmethod
    def postgres(cls, url: str, *, schema: Optional[str] = None, **options: Any) -> Once:
        """Over PostgreSQL (psycopg 3; schema `once` unless `schema=` or `?schema=` names another)."""
        from .ledger.postgres import PostgresLedger

        try:
            ledger = PostgresLedger(url, schema=schema)
        except LedgerFailure as e:
            raise errors.StorageError(str(e)) from e
        return cls(ledger, **options)

    # -- configuration

    def policy(self, tool: str, policy: Optional[Policy] = None, *, descriptor: Optional[ToolDescriptor] = None,
               **fields: Any) -> ToolPlan:
        """Set one tool's policy (a `Policy`, and/or its fields as keywords); the guest fills and checks it."""
        p = replace(policy or Policy(), **fields)
        with self._config_lock:
            previous = self._tools.get(tool)
            self._tools[tool] = (p, descriptor)
            try:
                with self._lock:
                    instance = self._pool.pop() if self._pool else None
                self._reconfigure(instance or self._instance())
            except errors.OnceError:
                if previous is None:
                    del self._tools[tool]
                else:
                    self._tools[tool] = previous
                raise
        return self.plan(tool)

    def configured(self, tool: str) -> Optional[Policy]:
        """The policy set for `tool` (by `policies=` or `policy(...)`) as given, before the guest fills it; None if
        none was. An adapter that adds fields to a tool's policy starts from this, so it never drops the rest."""
        with self._config_lock:
            entry = self._tools.get(tool)
        return entry[0] if entry is not None else None

    def _descriptor(self, tool: str) -> Optional[ToolDescriptor]:
        """The descriptor set for `tool`, if any (kept when an adapter adds to the tool's policy)."""
        with self._config_lock:
            entry = self._tools.get(tool)
        return entry[1] if entry is not None else None

    def plan(self, tool: str) -> ToolPlan:
        """How the guest handles `tool` (a tool never configured gets the defaults)."""
        for t in self._configured.tools:
            if t.tool == tool:
                return ToolPlan(tool, Route(t.route), t.blocked, _wit.plain(t.policy))
        d = self._configured.defaults
        return ToolPlan(tool, Route(d.route or "protect"), None, _wit.plain(d))

    def _configuration(self) -> Record:
        return _wit.record(
            settings=_settings_record(self._settings),
            defaults=_wit.policy_record(self._defaults),
            tools=[_wit.record(tool=t, policy=_wit.policy_record(p), descriptor=_wit.descriptor_record(d))
                   for t, (p, d) in self._tools.items()],
            # wasmtime-py converts a typed value node by node: the ledger answers as JSON text.
            ledger_encoding="json",
            # The provider is a synchronous callback here: the guest calls it inside the step.
            reads="import",
        )

    def _reconfigure(self, instance: Instance) -> None:
        generation = self._generation + 1
        try:
            self._configured = instance.call("configure", self._configuration())
        except (errors.GuestLimit, errors.ComponentError):
            raise  # the instance may have stopped mid-call: dropped
        except errors.OnceError:
            instance.configured = None  # configured again before its next use
            with self._lock:
                self._pool.append(instance)
            raise
        instance.configured = generation
        self._generation = generation
        with self._lock:
            self._pool.append(instance)

    # -- instances

    def _instance(self) -> Instance:
        return Instance(self._runtime, self._linker, self._fuel, self._memory)

    def _checkout(self) -> Instance:
        """A pooled instance (or a new one), configured with the current configuration."""
        with self._lock:
            instance = self._pool.pop() if self._pool else None
        if instance is None:
            instance = self._instance()
        if instance.configured != self._generation:
            generation = self._generation
            instance.call("configure", self._configuration())
            instance.configured = generation
        return instance

    def _checkin(self, instance: Instance) -> None:
        with self._lock:
            self._pool.append(instance)

    def _guest(self, name: str, *args: Any) -> Any:
        """Call a typed export on a pooled instance configured with the current configuration."""
        instance = self._checkout()
        try:
            result = instance.call(name, *args)
        except (errors.GuestLimit, errors.ComponentError):
            raise  # the instance may have stopped mid-call: dropped, never reused
        except errors.OnceError:
            self._checkin(instance)
            raise
        self._checkin(instance)
        return result

    def _step(self, name: str, *args: Any) -> _wit.Step:
        """Call a protocol export (`start`, `report`, `resume`) on a pooled instance: the step it answers."""
        instance = self._checkout()
        try:
            step = instance.step(name, getattr(instance, name), *args)
        except (errors.GuestLimit, errors.ComponentError):
            raise  # the instance may have stopped mid-call, or answered nonsense: dropped, never reused
        except errors.OnceError:
            self._checkin(instance)
            raise
        self._checkin(instance)
        return step

    def _case(self, name: str, param: str, tag: str, payload: Any) -> Any:
        with self._lock:
            instance = self._pool[-1] if self._pool else None
        return (instance or self._instance()).case(name, param, tag, payload)

    # -- the ledger, the clock, the provider and the operator, as the component's imports

    def _make_linker(self) -> Any:
        import wasmtime.component as wc

        linker = wc.Linker(self._runtime.engine)
        ledger = self.ledger

        def get(_: Any, table: str, scope: str, key: str) -> str:
            try:
                row = ledger.get(table, scope, key)
            except Exception as e:
                return _failed_text(f"{e}")
            return _MISSING if row is None else _got(row)

        def commit(_: Any, batch: str, bodies: list[str]) -> str:
            try:
                puts, events, deferrable = _wit.batch(batch, bodies)
            except ValueError as e:  # refused whole: nothing is written
                return _failed_text(str(e))
            try:
                # The engine says which batches may wait for the disk (DESIGN.md "Durability budget").
                applied = ledger.commit_deferred(puts, events) if deferrable else ledger.commit(puts, events)
            except Exception as e:
                return _failed_text(f"{e}")
            return _APPLIED if applied else _CONFLICT

        def scan(_: Any, table: str, states: list[str], due_before: int, owner: Optional[str], limit: int) -> Variant:
            try:
                rows = ledger.scan(table, list(states), due_before, owner, limit)
            except Exception as e:
                return _failed(f"{e}")
            return Variant("found", _wit.record(rows=[_row_record(r) for r in rows]))

        def audit(_: Any, scope: str, key: str) -> Variant:
            try:
                events = ledger.audit(scope, key)
            except Exception as e:
                return _failed(f"{e}")
            return Variant("found", _wit.record(events=[_event_record(e) for e in events]))

        last = [0]

        def now(_: Any) -> int:
            try:
                last[0] = max(last[0], ledger.now())
            except Exception as e:  # the clock cannot fail: the last reading stands
                log.warning("once: the ledger clock failed (%s); using the last reading", e)
            return last[0]

        def lookup(_: Any, tool: str, provider_key: str, args: str) -> Variant:
            if self._lookup is None:
                return Variant("unknown", "no provider lookup configured")
            try:
                ev = self._lookup(tool, provider_key, args)
            except Exception as e:
                return Variant("unknown", f"the lookup raised {type(e).__name__}: {e}")
            if ev.kind == "confirmed":
                return Variant("confirmed", ev.receipt)
            if ev.kind == "absent":
                return Variant("absent", ev.read_position)
            return Variant("unknown", ev.reason)

        def escalate(_: Any, e: Any) -> bool:
            try:
                return bool(self._escalate(_wit.escalation(e)))
            except Exception as exc:
                log.error("once: the escalation sink raised %s: %s", type(exc).__name__, exc)
                return False

        # The witness (wit/once.wit `witness`): the ledger stores the text, the guest decides. A failure is answered
        # as one (`failed`, or `some(why)`): the guest then grants nothing on what it could not read or keep.
        def seen(_: Any, scope: str, key: str) -> Variant:
            try:
                body = ledger.witness_seen(scope, key)
            except Exception as e:
                return Variant("failed", _why(e))
            return Variant("nothing") if body is None else Variant("kept", body)

        def keep(_: Any, scope: str, key: str, body: str, at: int) -> Optional[str]:
            try:
                ledger.witness_keep(scope, key, body, at)
            except Exception as e:
                return _why(e)
            return None

        def forget(_: Any, scope: str, key: str, before: int) -> Optional[str]:
            try:
                ledger.witness_forget(scope, key, before)
            except Exception as e:
                return _why(e)
            return None

        def typed(_: Any, *args: Any) -> Variant:
            # Configured `ledger-encoding` json: the guest calls `ledger-json` instead.
            return _failed("this host answers get and commit in ledger-json only")

        with linker.root() as root:
            with root.add_instance(f"once:core/ledger@{VERSION}") as i:
                i.add_func("get", typed)
                i.add_func("commit", typed)
                i.add_func("scan", scan)
                i.add_func("audit", audit)
            with root.add_instance(f"once:core/ledger-json@{VERSION}") as i:
                i.add_func("get", get)
                i.add_func("commit", commit)
            with root.add_instance(f"once:core/clock@{VERSION}") as i:
                i.add_func("now", now)
            with root.add_instance(f"once:core/provider@{VERSION}") as i:
                i.add_func("lookup", lookup)
            with root.add_instance(f"once:core/operator@{VERSION}") as i:
                i.add_func("escalate", escalate)
            with root.add_instance(f"once:core/entropy@{VERSION}") as i:
                # Asked once per ledger, for the secret provider keys are derived with (the guest
                # keeps it in the ledger; this host never sees it). The OS's source, nothing weaker.
                i.add_func("fill", lambda _, n: os.urandom(n))
            with root.add_instance(f"once:core/witness@{VERSION}") as i:
                i.add_func("seen", seen)
                i.add_func("keep", keep)
                i.add_func("forget", forget)
        return linker

    # -- the call protocol

    def now(self) -> int:
        """The ledger's clock (ms)."""
        return self.ledger.now()

    def _clocks(self) -> tuple[float, int]:
        """This host's monotonic clock, then the ledger's: deadlines on the first are then early by the second's read
        (a database query), never late. The loop reads them as a guest action, so under acall in a worker thread,
        never on the event loop."""
        handed = time.monotonic()
        return handed, self.now()

    def _loop(self, first: Callable[[], _wit.Step], call: Optional[tuple[str, str, str]],
              patience: float) -> Generator[Action, Any, Called]:
        """The protocol: the guest says what to do next; this only does it. `call` (scope, tool, args) is the
        call as it came, sent as it is if the guest routes it DIRECT; none for an operation from the ledger."""
        # The operation the loop drives is left to it by a `settle` of this handle (`_Driving`) until the loop returns
        # or raises (a cancelled acall's cancellation goes through it): then the next `settle` takes what it left.
        driver = self._driving.driver()
        try:
            step: _wit.Step = yield ("guest", first)
            deadline = time.monotonic() + patience
            give_up_at: Optional[int] = None  # the ledger clock's `deadline`, read at the first wait
            raised: Optional[BaseException] = None
            never_ran: Optional[errors.OnceError] = None
            while True:
                kind = step.kind
                if kind == "dispatch":
                    grant, fence = step.dispatch, step.fence
                    assert grant is not None
                    driver.follow(grant.scope, grant.key)
                    handed, now = yield ("guest", self._clocks)
                    if now >= grant.send_by:
                        sent = Sent.not_sent()
                    else:
                        # Send-by and the deadline the guest gives its answer (send-by plus the timeout, inside the
                        # lease), on this host's monotonic clock: the runner checks send-by again just before the send,
                        # and acall stops an async dispatcher at the deadline.
                        send_before = handed + (grant.send_by - now) / 1000
                        answer_by = send_before + grant.timeout_ms / 1000
                        driver.held_until(answer_by)
                        try:
                            sent = _sent((yield ("send", (grant, send_before, answer_by))))
                        except _NeverRan as e:  # certainly nothing sent: the caller's mistake, raised once reported
                            never_ran, sent = e.error, Sent.not_sent()
                        except BaseException as e:  # the request may have left: the effect may exist
                            raised = e
                            sent = Sent.ambiguous(f"the dispatcher raised {type(e).__name__}: {e}")
                        driver.held_until(None)
                    outcome = _wit.outcome_text(sent)
                    try:
                        step = yield ("guest", functools.partial(
                            self._step, "report", grant.scope, grant.key, fence, outcome))
                    except errors.OnceError as e:
                        if sent.kind == "success":
                            return Called(unreported=Unrecorded(sent.text), report_error=str(e))
                        raise
                    if never_ran is not None:
                        raise never_ran
                    if raised is not None and not isinstance(raised, Exception):
                        raise raised
                elif kind == "wait":
                    driver.follow(step.scope, step.key)
                    _, now = yield ("guest", self._clocks)
                    if give_up_at is None:
                        give_up_at = now + int((deadline - time.monotonic()) * 1000)
                    if step.next > give_up_at or time.monotonic() >= deadline:
                        return Called(account=step.account, raised=raised)
                    pause = max(0.0, (step.next - now) / 1000)
                    yield ("sleep", min(pause, max(0.0, deadline - time.monotonic())))
                    step = yield ("guest", functools.partial(self._step, "resume", step.scope, step.key))
                elif kind == "done":
                    return Called(account=step.account, raised=raised)
                else:  # direct: a read-only tool, sent as it came, nothing recorded
                    if call is None:
                        raise errors.ComponentError("a resumed operation answered direct")
                    scope, tool, args = call
                    timeout = self.plan(tool).policy.get("dispatch-timeout-ms")
                    assert isinstance(timeout, int)
                    d = Dispatch(scope=scope, key="", tool=tool, attempt=0, provider_key="", args=args,
                                 send_by=(1 << 64) - 1, timeout_ms=timeout, direct=True)
                    try:
                        return Called(direct=_sent((yield ("send", (d, None, time.monotonic() + timeout / 1000)))))
                    except _NeverRan as e:
                        raise e.error from None
        finally:
            driver.release()

    def _run(self, loop: Generator[Action, Any, Called], send: Send) -> Called:
        _blocking(send)  # before the loop starts: nothing recorded
        value: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                kind, arg = loop.throw(error) if error is not None else loop.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if kind == "guest":
                    value = arg()
                elif kind == "send":
                    d, send_before, _ = arg
                    value = Sent.not_sent() if _too_late(send_before) else send(d)
                    if inspect.isawaitable(value):
                        # An async dispatcher given to a blocking call: its coroutine never ran, so nothing
                        # was sent (recording the coroutine as its answer would confirm what did not happen).
                        getattr(value, "close", lambda: None)()
                        raise _NeverRan(errors.InvalidRequest(
                            "the dispatcher returned an awaitable: an async dispatcher needs acall (or protect on "
                            "an async function); nothing was sent"))
                else:
                    time.sleep(arg)
            except BaseException as e:
                error = e

    async def _arun(self, loop: Generator[Action, Any, Called], send: Union[Send, ASend]) -> Called:
        value: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                kind, arg = loop.throw(error) if error is not None else loop.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                if kind == "guest":
                    value = await asyncio.to_thread(arg)
                elif kind == "send":
                    d, send_before, answer_by = arg
                    # Checked here, after the event loop got round to it: it may have run late.
                    value = Sent.not_sent() if _too_late(send_before) else send(d)
                    if inspect.isawaitable(value):
                        value = await _within(value, answer_by, d)
                else:
                    await asyncio.sleep(arg)
            except BaseException as e:
                error = e

    def call(self, scope: str, key: Optional[str], tool: str, args: Args, send: Send, *,
             supersedes: Optional[str] = None, acknowledge_confirmed: bool = False,
             wait: Optional[float] = None) -> Called:
        """Run one protected call: `send(dispatch)` is called for each grant the guest gives, at most once each.

        `send` returns a `Sent` (or any value: the provider's success response) and may raise: a raise is
        reported as ambiguous (the request may have left), and the call ends as the guest decides (unknown).
        """
        text = _args_text(args)
        c = _wit.call_text(scope, key, tool, text, supersedes, acknowledge_confirmed)
        loop = self._loop(lambda: self._step("start", c), (scope, tool, text), self.wait if wait is None else wait)
        return self._run(loop, send)

    async def acall(self, scope: str, key: Optional[str], tool: str, args: Args, send: Union[Send, ASend], *,
                    supersedes: Optional[str] = None, acknowledge_confirmed: bool = False,
                    wait: Optional[float] = None) -> Called:
        """`call` for an async dispatcher; the guest and ledger run in a worker thread, waits are `asyncio.sleep`.

        A dispatcher still running at the deadline the guest gives its answer (send-by plus the timeout, inside the
        lease; a DIRECT call's timeout) is cancelled and waited for, and the attempt is ambiguous."""
        text = _args_text(args)
        c = _wit.call_text(scope, key, tool, text, supersedes, acknowledge_confirmed)
        loop = self._loop(lambda: self._step("start", c), (scope, tool, text), self.wait if wait is None else wait)
        return await self._arun(loop, send)

    def resume(self, scope: str, key: str, send: Send, *, wait: Optional[float] = None) -> Called:
        """Go on with an operation from the ledger (after a crash): what the guest says is owed, or its account."""
        loop = self._loop(lambda: self._step("resume", scope, key), None, self.wait if wait is None else wait)
        return self._run(loop, send)

    def settle(self, send: Send, limit: int = 100) -> SweepResult:
        """Expire leases, reconcile due unknowns, escalate past deadlines, and send every owed dispatch (each granted
        just before it is sent; `owed` lists those found, `sent` how each one sent ended).

        An operation a call of this handle is driving now (in another thread or task: its reply was lost and it waits
        for its read to come due) is left to that call, which is granted the attempt and sends it itself, and answers
        as the one that sent it: sent here, the caller of that one call would be told it was a replay."""
        _blocking(send)  # before anything is granted
        r = self._guest("sweep", limit, False)
        sent = []
        for scope, key in r.owed:
            # A call of this handle driving it sends it itself (`_Driving`): it finds the absence this sweep proved.
            if self._driving.driven(scope, key):
                continue
            # Each granted just before it is sent: granting a round's dispatches together let the later ones' send-by
            # pass while the earlier ones were sent ("not sent", an attempt spent). Another host may have taken it since.
            step = self._step("resume", scope, key)
            if step.kind == "dispatch":
                sent.append(self._run(self._loop(_constant(step), None, 0.0), send))
        return SweepResult(r.expired, r.reconciled, r.confirmed, r.escalated, [tuple(x) for x in r.owed], sent)

    def sweep(self, limit: int = 100) -> SweepResult:
        """A sweep that sends nothing: owed dispatches are only listed."""
        r = self._guest("sweep", limit, False)
        return SweepResult(r.expired, r.reconciled, r.confirmed, r.escalated, [tuple(x) for x in r.owed])

    # -- operators and JSON

    def inspect(self, scope: str, key: str) -> Optional[RecordView]:
        """A record and its audit trail, or None."""
        view = self._guest("inspect", scope, key)
        return None if view is None else _wit.record_view(view)

    def resolve(self, scope: str, key: str, *, confirmed: Optional[Union[str, Any]] = None, absent: bool = False,
                note: str, force: bool = False) -> State:
        """An operator's resolution: `confirmed=receipt` (the effect happened) or `absent=True` (it did not)."""
        if (confirmed is None) == (not absent):
            raise errors.InvalidRequest("resolve: give exactly one of confirmed=RECEIPT or absent=True")
        if confirmed is not None:
            resolution = self._case("resolve", "resolution", "confirmed", _args_text(confirmed, "confirmed"))
        else:
            resolution = self._case("resolve", "resolution", "absent", None)
        return State(self._guest("resolve", scope, key, resolution, note, force))

    def approve(self, scope: str, key: str, *, note: str) -> State:
        """A person approves a call awaiting approval, as it is recorded (its payload's fingerprint): its next
        attempt may be sent within the tool's `approval_valid_ms`. `note` says who and why (audited)."""
        return State(self._guest("resolve", scope, key, self._case("resolve", "resolution", "approve", None), note,
                                 False))

    def deny(self, scope: str, key: str, *, note: str) -> State:
        """A person refuses a call awaiting approval: it ends denied, nothing is sent, and any spend it reserved is
        released. `note` says who and why (audited)."""
        return State(self._guest("resolve", scope, key, self._case("resolve", "resolution", "deny", None), note,
                                 False))

    def canonicalize(self, text: Union[str, bytes]) -> str:
        """RFC 8785 canonical form of a JSON text."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        return self._guest("canonicalize", data)  # type: ignore[no-any-return]

    def fingerprint(self, tool: str, args: Args) -> str:
        """sha256(JCS({"tool":…,"args":…})), lower-case hex."""
        return self._guest("fingerprint", tool, _args_text(args))  # type: ignore[no-any-return]

    def protect(self, tool: Optional[str] = None, *, key: Any = None, scope: Any = None,
                policy: Optional[Policy] = None, **fields: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator: the function (sync or async) becomes a protected tool; see `once.protect`."""
        from .protect import protect

        return protect(self, tool, key=key, scope=scope, policy=policy, **fields)

    def close(self) -> None:
        """Release the ledger's connections."""
        self.ledger.close()


def _too_late(send_before: Optional[float]) -> bool:
    """Whether send-by (on `time.monotonic()`; None for a DIRECT call) has come since the grant was handed over: the
    ledger clock's read may have been a slow database query, or the caller's thread or event loop may have run late."""
    return send_before is not None and time.monotonic() >= send_before


async def _within(answer: Awaitable[Any], answer_by: float, d: Dispatch) -> Any:
    """Await an async dispatcher's answer until `answer_by` (`time.monotonic()`), the deadline the guest gives it; past
    it the dispatcher is cancelled and waited for, so none of its code runs on after the attempt is reported:
    cancelled, the attempt is ambiguous (what it sent may have reached the provider); if it answered anyway, its
    answer is the outcome. A dispatcher that ignores its cancellation holds the call until it ends. A caller that is
    cancelled meanwhile cancels the dispatcher too, and its cancellation goes on once the dispatcher has ended."""
    task = asyncio.ensure_future(answer)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, answer_by - time.monotonic()))
    except asyncio.CancelledError:
        await _stop(task)
        raise
    if not done:
        if await _stop(task):
            raise asyncio.CancelledError()
        if task.cancelled():
            return Sent.ambiguous(f"no answer by the deadline the engine gave it (send-by plus its {d.timeout_ms} ms "
                                  "timeout): the dispatcher was cancelled, and what it sent may have reached the provider")
    return task.result()


async def _stop(task: asyncio.Future[Any]) -> bool:
    """Cancel `task` and wait until it has ended, however often the waiting itself is cancelled; whether it was (the
    caller's cancellation, raised once the task has ended)."""
    task.cancel()
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _constant(value: _wit.Step) -> Callable[[], _wit.Step]:
    return lambda: value


def _settings_record(settings: Mapping[str, Any]) -> Record:
    r = Record()
    for k, v in settings.items():
        setattr(r, k, v)
    return r

