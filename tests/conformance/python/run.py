"""The conformance suite (tests/conformance/) through the once component, hosted by Python.

The `wasmtime` package (PyPI) loads the component file; this runner supplies
only its imports: a compare-and-swap record store (in memory, or SQLite via
the standard library's sqlite3), a manual clock, scripted provider evidence,
a recording escalation sink and a witness that keeps nothing — and configures
each instance (`configure`) with the settings and the tool policy a step
needs. Every decision comes from the component. wasmtime-py takes and gives every WIT value as it is (tagged
`Variant`s where cases share a Python class); nothing of it is patched. A
ledger-json run (the Python package's encodings) uses the crossings that
carry the WIT's "JSON form" as text (`protocol.start`, `report`, `resume`,
`ledger-json.get` and `.commit`; the top comment of wit/once.wit), written
and read with the `json` module and turned into the neutral form here
(`neutral`), by the same WIT names the typed values render to; a typed run
calls `driver` and answers the typed `ledger`.

    python run.py --component once_guest.wasm [--store memory|sqlite|all]
                  [--transcripts DIR] [--filter TEXT] [--negative]

Exit status 0 only when every scenario passed on every store asked for (and,
with --negative, when the deliberately broken store was caught).
"""

import argparse
import hashlib
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from importlib import metadata

import wasmtime
import wasmtime.component as wc
from wasmtime.component import Record, ResultType, Variant

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
VERSION = "2.0.0"
# Which interface exports each function.
INTERFACES = {
    "engine": ("default-settings", "configure", "inspect", "resolve", "prune", "canonicalize", "fingerprint"),
    "protocol": ("start", "report", "resume", "sweep"),
    "transitions": ("begin", "finish", "reconcile", "await-holder"),
}
# The typed call protocol: `protocol`'s start, report and resume in WIT types, which a typed run calls.
DRIVER = ("start", "report", "resume")


# ---------------------------------------------------------------- neutral JSON


def canonical(value):
    """The transcript's byte form: sorted keys, no whitespace, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def render(v):
    """A wasmtime-py value as neutral JSON (records by WIT field name, variants as {case: payload})."""
    if isinstance(v, Record):
        return {k: render(x) for k, x in vars(v).items()}
    if isinstance(v, Variant):
        return v.tag if v.payload is None else {v.tag: render(v.payload)}
    if isinstance(v, (list, tuple)):
        return [render(x) for x in v]
    if isinstance(v, bytes):
        raise TypeError("bytes in an export's answer")
    return v


def classes(ty):
    """The Python classes wasmtime-py lifts a value of type `ty` to (`object`: a case without payload)."""
    out = set()
    if ty is None:
        out.add(object)
    else:
        ty.add_classes(out)
    return out


def tagged(cases):
    """Whether wasmtime-py lifts and lowers a variant of these case types tagged (as `Variant`):
    when two cases share a Python class. Otherwise a value is its bare payload."""
    seen = set()
    for ty in cases:
        c = classes(ty)
        if c & seen:
            return True
        seen |= c
    return False


def outcome_of(result_ty, value):
    """An export's result<T, E> as ("ok" | "err", payload). wasmtime-py lifts a result whose
    two sides hold disjoint Python classes untagged (the bare value): then the value's class
    says which side it is."""
    if tagged([result_ty.ok, result_ty.err]):
        assert isinstance(value, Variant) and value.tag in ("ok", "err"), value
        return value.tag, value.payload
    ok, err = classes(result_ty.ok), classes(result_ty.err)
    if object not in err:
        return ("err" if isinstance(value, tuple(err)) else "ok"), value
    if object not in ok:
        return ("ok" if isinstance(value, tuple(ok)) else "err"), value
    raise TypeError("a result wasmtime-py cannot tell apart")


def render_answer(answer):
    """An export's answer as neutral JSON: a result's ok value as is, its error as {"error": E}."""
    side, payload = answer
    if side == "err":
        return {"error": render(payload)}
    return render(payload)


# ---------------------------------------------------------------- the JSON form


def kebab(name):
    """A JSON-form case name as its WIT name: `InFlight` -> `in-flight`, `InvalidUtf8` -> `invalid-utf8`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


# Which fields of the JSON form hold enum cases or variants, per type (every other field is data, kept as
# it is); record fields are renamed snake_case -> kebab-case.
ENUM = "enum"
CONFIRMED_INFO = {"via": ENUM, "confirmed_by": ENUM, "earlier_attempts": ENUM}
ENDING = ("variant", {"Confirmed": CONFIRMED_INFO, "Rejected": {}, "NotSent": {}, "Unknown": {}, "InFlight": {},
                      "Conflict": {"state": ENUM}, "Blocked": {"reason": ENUM}, "Unrecorded": {},
                      "AwaitsApproval": {}})
ACCOUNT = {"key_source": ENUM, "ending": ENDING, "effect": ENUM, "repeat": ENUM}
STEP = ("variant", {"Dispatch": {}, "Wait": {"reason": ENUM, "meanwhile": ACCOUNT}, "Done": ACCOUNT, "Direct": None})
ERROR = ("variant", {"InvalidJson": {"kind": ENUM}, "InvalidRequest": None, "InvalidPolicy": None, "Storage": None,
                     "NotFound": None, "FenceMismatch": None, "InvalidTransition": None, "NotConfigured": None})
STATES = {"InFlight", "Confirmed", "Failed", "Unknown", "Absent", "Superseded", "AwaitingApproval", "Denied"}
TABLES_JSON = {"Operation": "operation", "Tombstone": "tombstone", "Quota": "quota"}


def neutral(v, schema):
    """A value in the JSON form as neutral JSON (WIT names), by its schema above."""
    if schema is None or v is None:
        return v
    if schema == ENUM:
        return kebab(v)
    if isinstance(schema, dict):
        return {k.replace("_", "-"): neutral(x, schema.get(k)) for k, x in v.items()}
    cases = schema[1]
    if isinstance(v, str):
        if v not in cases or cases[v] is not None and cases[v] != {}:
            raise TypeError(f"{v!r} is not a case without payload")
        return kebab(v)
    ((tag, payload),) = v.items()
    return {kebab(tag): neutral(payload, cases[tag])}


def step_answer(text):
    """A protocol export's answer (the JSON form of result<step, error>) as ("ok" | "err", neutral payload)."""
    answer = json.loads(text)
    if set(answer) == {"Ok"}:
        return "ok", neutral(answer["Ok"], STEP)
    if set(answer) == {"Err"}:
        return "err", neutral(answer["Err"], ERROR)
    raise TypeError(f"not a result: {text[:200]}")


def state_name(v):
    if v is None:
        return None
    if v not in STATES:
        raise ValueError(f"{v!r} is not a state")
    return kebab(v)


def batch_of(text, bodies):
    """`ledger-json.commit`'s arguments as neutral puts and events (rows by WIT field name), and whether the batch
    is deferrable. Anything else raises ValueError: the batch is refused whole."""
    try:
        head = json.loads(text)
        written = sum(1 for p in head["puts"] if p["row"] is not None)
        if written != len(bodies):
            raise ValueError(f"the batch writes {written} row(s) but {len(bodies)} bodies came with it")
        rest = iter(bodies)
        puts = []
        for p in head["puts"]:
            table = TABLES_JSON[p["table"]]
            r = p["row"]
            row = None if r is None else {
                "table": table, "scope": p["scope"], "key": p["key"], "version": r["version"],
                "state": state_name(r["state"]), "due-at": r["due_at"], "owner": r["owner"], "body": next(rest),
            }
            puts.append({"table": table, "scope": p["scope"], "key": p["key"], "expected": p["expected"], "row": row})
        events = [{"scope": e["scope"], "key": e["key"], "version": e["version"], "at": e["at"], "kind": e["kind"],
                   "from-state": state_name(e["from_state"]), "to-state": state_name(e["to_state"]),
                   "attempt": e["attempt"], "detail": e["detail"]} for e in head["events"]]
        return puts, events, bool(head["deferrable"])
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not the JSON form of a batch-head: {type(e).__name__} {e}") from e


def typed_batch(b):
    """`ledger.commit`'s typed batch (wasmtime-py's records, WIT field names) as neutral puts and events."""
    fields = ("table", "scope", "key", "version", "state", "due-at", "owner", "body")
    puts = [{"table": p.table, "scope": p.scope, "key": p.key, "expected": p.expected,
             "row": None if p.row is None else {f: getattr(p.row, f) for f in fields}} for p in b.puts]
    events = [{f: getattr(e, f) for f in ("scope", "key", "version", "at", "kind", "from-state", "to-state", "attempt",
                                          "detail")} for e in b.events]
    return puts, events


def record_from(d):
    r = Record()
    for k, v in d.items():
        setattr(r, k, v)
    return r


def case(v):
    if isinstance(v, str):
        return v, None
    if isinstance(v, dict) and len(v) == 1:
        return next(iter(v.items()))
    raise ValueError(f"expected a variant case, got {v!r}")


# ---------------------------------------------------------------- stores

TABLES = ("operation", "tombstone", "quota")
# The error texts of scripted failures, as the component sees them (the Rust
# host shows its storage errors as "storage: ..."; every runner uses these).
READ_FAILURE = "storage: injected read failure"
COMMIT_FAILURE = "storage: injected commit failure"
LOST_REPLY = "storage: injected lost commit reply"


class MemoryStore:
    """Rows and audit events in dicts; one batch applies entirely or not at all."""

    def __init__(self, path=None):
        self.rows = {}
        self.audit_events = {}

    def get(self, table, scope, key):
        row = self.rows.get((table, scope, key))
        return dict(row) if row else None

    def commit(self, puts, events):
        staged = {}
        for put in puts:
            k = (put["table"], put["scope"], put["key"])
            current = staged[k] if k in staged else self.rows.get(k)
            if (current["version"] if current else None) != put["expected"]:
                return "conflict"
            staged[k] = put["row"]
        new_events = {}
        for e in events:
            k = (e["scope"], e["key"], e["version"])
            if k in self.audit_events or k in new_events:
                return "conflict"
            new_events[k] = e
        for k, row in staged.items():
            if row is None:
                self.rows.pop(k, None)
            else:
                self.rows[k] = dict(row)
        self.audit_events.update(new_events)
        return None

    def scan(self, table, states, due_before, owner, limit):
        rows = [
            r
            for (t, _, _), r in self.rows.items()
            if t == table
            and r["due-at"] is not None
            and r["due-at"] <= due_before
            and (not states or r["state"] in states)
            and (owner is None or r["owner"] == owner)
        ]
        rows.sort(key=lambda r: (r["due-at"], r["scope"].encode(), r["key"].encode()))
        return [dict(r) for r in rows[:limit]]

    def audit(self, scope, key):
        events = [e for (s, k, _), e in self.audit_events.items() if s == scope and k == key]
        return sorted(events, key=lambda e: e["version"])

    def counts(self):
        n = {t: 0 for t in TABLES}
        for t, _, _ in self.rows:
            n[t] += 1
        return n, len(self.audit_events)


class SqliteStore:
    """One SQLite file: a batch is one BEGIN IMMEDIATE transaction of version-checked writes."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # semantics under test, not power loss
        # The ledger's tables as every host makes them: the repository's schema/sqlite (a new file's layout).
        with open(os.path.join(REPO, "schema", "sqlite", "ledger.sql"), encoding="utf-8") as f:
            self.db.executescript(f.read())

    COLUMNS = "tbl, scope, key, version, state, due_at, owner, body"

    @staticmethod
    def _row(r):
        return {"table": r[0], "scope": r[1], "key": r[2], "version": r[3], "state": r[4], "due-at": r[5],
                "owner": r[6], "body": r[7]}

    def get(self, table, scope, key):
        r = self.db.execute(
            f"SELECT {self.COLUMNS} FROM rows WHERE tbl=? AND scope=? AND key=?",
            (table, scope, key),
        ).fetchone()
        return self._row(r) if r else None

    def commit(self, puts, events):
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for put in puts:
                t, s, k, exp, row = put["table"], put["scope"], put["key"], put["expected"], put["row"]
                if exp is None and row is not None:
                    n = db.execute(
                        f"INSERT INTO rows ({self.COLUMNS}) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                        (t, s, k, row["version"], row["state"], row["due-at"], row["owner"], row["body"]),
                    ).rowcount
                elif row is not None:
                    n = db.execute(
                        "UPDATE rows SET version=?, state=?, due_at=?, owner=?, body=? "
                        "WHERE tbl=? AND scope=? AND key=? AND version=?",
                        (row["version"], row["state"], row["due-at"], row["owner"], row["body"], t, s, k, exp),
                    ).rowcount
                elif exp is not None:
                    n = db.execute(
                        "DELETE FROM rows WHERE tbl=? AND scope=? AND key=? AND version=?", (t, s, k, exp)
                    ).rowcount
                else:
                    n = 0 if self.get(t, s, k) else 1
                if n != 1:
                    db.execute("ROLLBACK")
                    return "conflict"
            for e in events:
                n = db.execute(
                    "INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    (e["scope"], e["key"], e["version"], e["at"], e["kind"], e["from-state"], e["to-state"],
                     e["attempt"], e["detail"]),
                ).rowcount
                if n != 1:
                    db.execute("ROLLBACK")
                    return "conflict"
            db.execute("COMMIT")
            return None
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def scan(self, table, states, due_before, owner, limit):
        # SQLite integers are i64: stored due-ats never pass i64::MAX, so clamping the bound is exact.
        q = f"SELECT {self.COLUMNS} FROM rows WHERE tbl=? AND due_at IS NOT NULL AND due_at<=?"
        args = [table, min(due_before, (1 << 63) - 1)]
        if states:
            q += " AND state IN (%s)" % ",".join("?" * len(states))
            args += list(states)
        if owner is not None:
            q += " AND owner=?"
            args.append(owner)
        q += " ORDER BY due_at, scope, key LIMIT ?"
        args.append(limit)
        return [self._row(r) for r in self.db.execute(q, args)]

    def audit(self, scope, key):
        cur = self.db.execute(
            "SELECT scope, key, version, at, kind, from_state, to_state, attempt, detail FROM audit "
            "WHERE scope=? AND key=? ORDER BY version",
            (scope, key),
        )
        names = ("scope", "key", "version", "at", "kind", "from-state", "to-state", "attempt", "detail")
        return [dict(zip(names, r)) for r in cur]

    def counts(self):
        n = {t: 0 for t in TABLES}
        for t, c in self.db.execute("SELECT tbl, count(*) FROM rows GROUP BY tbl"):
            n[t] = c
        return n, self.db.execute("SELECT count(*) FROM audit").fetchone()[0]


class Scripted:
    """A store plus what scenarios script: failures, lost replies, a racing writer, a lost ledger."""

    def __init__(self, kind, directory, broken):
        self.kind, self.dir, self.broken = kind, directory, broken
        self.generation = 0
        self.fail_commits = 0
        self.lose_replies = 0
        self.fail_reads = False
        self.race = None
        self.wipe()

    def wipe(self):
        self.generation += 1
        path = os.path.join(self.dir, f"ledger-{self.generation}.db")
        self.inner = SqliteStore(path) if self.kind == "sqlite" else MemoryStore()

    def commit(self, puts, events):
        hook, self.race = self.race, None
        if hook:
            hook()
        if self.fail_commits:
            self.fail_commits -= 1
            return COMMIT_FAILURE
        if self.broken:
            # A deliberately broken store (negative tests): every put applies whatever the version.
            for put in puts:
                current = self.inner.get(put["table"], put["scope"], put["key"])
                put["expected"] = current["version"] if current else None
        if self.broken == "no-conflicts":
            # ... and a repeated audit event is silently dropped.
            events = [e for e in events if not any(a["version"] == e["version"] for a in self.inner.audit(e["scope"], e["key"]))]
        outcome = self.inner.commit(puts, events)
        if outcome is None and self.lose_replies:
            self.lose_replies -= 1
            return LOST_REPLY
        return outcome


# ---------------------------------------------------------------- the component


class Runtime:
    def __init__(self, path):
        self.engine = wasmtime.Engine()
        self.component = wc.Component.from_file(self.engine, path)


def to_row(r):
    return None if r is None else record_from(dict(r))


class Host:
    """The imports of world `once` for one scenario run."""

    def __init__(self, run):
        self.run = run

    def linker(self, engine):
        run = self.run
        linker = wc.Linker(engine)

        def reads_fail():
            return run.storage.fail_reads

        def failed(message):
            return Variant("failed", record_from({"message": message}))

        def failed_text(message):
            # `ledger-json`'s `get` and `commit` answer the JSON form of a `got` / `committed`.
            return json.dumps({"Failed": {"message": message}})

        # A run answers get and commit in the encoding it configured; the other one's answer `failed`, as a
        # host's must (wit/once.wit), and the call fails the scenario whatever the guest makes of the answer.
        def wrong(encoding):
            if run.encoding == encoding:
                return None
            why = f"the guest called the {encoding} encoding's get or commit in a {run.encoding} run"
            run.failures.append(f"{run.name}: {why}")
            return why

        def get(_, table, scope, key):
            if why := wrong("json"):
                return failed_text(why)
            if reads_fail():
                return failed_text(READ_FAILURE)
            row = run.storage.inner.get(table, scope, key)
            if row is None:
                return '"Missing"'
            return json.dumps({"Found": {"version": row["version"], "body": row["body"]}})

        def commit(_, batch, bodies):
            if why := wrong("json"):
                return failed_text(why)
            try:
                puts, events, _deferrable = batch_of(batch, list(bodies))
            except ValueError as e:
                return failed_text(f"ledger-json.commit: {e}")
            outcome = run.storage.commit(puts, events)
            if outcome is None:
                return '"Applied"'
            return '"Conflict"' if outcome == "conflict" else failed_text(outcome)

        def scan(_, table, states, due_before, owner, limit):
            if reads_fail():
                return failed(READ_FAILURE)
            rows = run.storage.inner.scan(table, list(states), due_before, owner, limit)
            return Variant("found", record_from({"rows": [to_row(r) for r in rows]}))

        def audit(_, scope, key):
            if reads_fail():
                return failed(READ_FAILURE)
            events = [record_from(e) for e in run.storage.inner.audit(scope, key)]
            return Variant("found", record_from({"events": events}))

        def lookup(_, tool, provider_key, args):
            run.lookups.append({"tool": tool, "provider-key": provider_key, "args": args})
            if run.evidence:
                return run.evidence.pop(0)
            return Variant("unknown", "no scripted evidence")

        def escalate(_, e):
            run.escalations.append(render(e))
            return run.ack

        def typed_get(_, table, scope, key):
            if why := wrong("typed"):
                return failed(why)
            if reads_fail():
                return failed(READ_FAILURE)
            row = run.storage.inner.get(table, scope, key)
            if row is None:
                return Variant("missing")
            return Variant("found", record_from({"version": row["version"], "body": row["body"]}))

        def typed_commit(_, batch):
            if why := wrong("typed"):
                return failed(why)
            # As the Rust and Node hosts: a written row must be its put's (the JSON form cannot say otherwise).
            for i, p in enumerate(batch.puts):
                if p.row is not None and (p.row.table, p.row.scope, p.row.key) != (p.table, p.scope, p.key):
                    return failed(f"ledger.commit: puts/{i}: the row is not the put's")
            puts, events = typed_batch(batch)
            outcome = run.storage.commit(puts, events)
            if outcome is None:
                return Variant("applied")
            return Variant("conflict") if outcome == "conflict" else failed(outcome)

        with linker.root() as root:
            with root.add_instance(f"once:core/ledger@{VERSION}") as i:
                i.add_func("get", typed_get)
                i.add_func("commit", typed_commit)
                i.add_func("scan", scan)
                i.add_func("audit", audit)
            with root.add_instance(f"once:core/ledger-json@{VERSION}") as i:
                i.add_func("get", get)
                i.add_func("commit", commit)
            with root.add_instance(f"once:core/clock@{VERSION}") as i:
                i.add_func("now", lambda _: run.now)
            with root.add_instance(f"once:core/provider@{VERSION}") as i:
                i.add_func("lookup", lookup)
            with root.add_instance(f"once:core/operator@{VERSION}") as i:
                i.add_func("escalate", escalate)
            with root.add_instance(f"once:core/entropy@{VERSION}") as i:
                # Fixed, as in every runner: the ledger's secret, so every provider key, is the same.
                i.add_func("fill", lambda _, n: (ENTROPY * (n // len(ENTROPY) + 1))[:n])
            with root.add_instance(f"once:core/witness@{VERSION}") as i:
                # A witness that keeps nothing, as in every runner: the scenarios hold no older history.
                i.add_func("seen", lambda _, scope, key: Variant("nothing"))
                i.add_func("keep", lambda _, scope, key, body, at: None)
                i.add_func("forget", lambda _, scope, key, before: None)
        return linker


# What every runner's `entropy.fill` answers (cycled to the length asked); see README.md.
ENTROPY = b"once conformance: a fixed secret"
# The key of the row the component keeps the ledger's provider-key secret in (table quota, scope "").
SECRET_KEY = "once:provider-key-secret"


class Agent:
    """One instance of the component in its own wasmtime store, and the configuration
    (neutral JSON) it was last configured with, so it is reconfigured only when a step
    needs another one."""

    def __init__(self, runtime, linker, encoding):
        self.encoding = encoding
        # A typed run calls `driver`'s start, report and resume; a ledger-json run `protocol`'s.
        self.typed = encoding == "typed"
        self.store = wasmtime.Store(runtime.engine)
        self.instance = linker.instantiate(self.store, runtime.component)
        self.funcs = {}
        self.configured = None

    def func(self, name):
        """Export `name`, with its parameter types and result type."""
        found = self.funcs.get(name)
        if found is None:
            iface = "driver" if self.typed and name in DRIVER else next(i for i, names in INTERFACES.items() if name in names)
            index = self.instance.get_export_index(self.store, f"once:core/{iface}@{VERSION}")
            f = self.instance.get_func(self.store, self.instance.get_export_index(self.store, name, index))
            ty = f.type(self.store)
            found = self.funcs[name] = (f, dict(ty.params), ty.result)
        return found

    def call(self, name, *args):
        """An export's plain value, or, for one whose WIT result is result<T, E>, ("ok" | "err", payload)."""
        f, _, result_ty = self.func(name)
        value = f(self.store, *args)
        return outcome_of(result_ty, value) if isinstance(result_ty, ResultType) else value

    def case(self, name, param, tag, payload):
        """A variant argument of export `name`, tagged or bare as wasmtime-py lowers its type."""
        ty = self.func(name)[1][param]
        if tagged([t for _, t in ty.cases]):
            return Variant(tag, payload)
        return payload

    def configure(self, configuration):
        """The `configure` export with a neutral configuration: ("ok", configured) or ("err", error)."""
        answer = self.call("configure", configuration_record(configuration, self.encoding))
        if answer[0] == "ok":
            self.configured = canonical(configuration)
        return answer

    def ensure(self, configuration):
        """Configure as `configuration` unless already so; a refusal is the step's answer."""
        if self.configured == canonical(configuration):
            return None
        answer = self.configure(configuration)
        return None if answer[0] == "ok" else render_answer(answer)


def policy_record(p):
    """A neutral policy (an object of policy-input overrides) as a WIT policy-input: the rest unset."""
    fields = {k: None for k in POLICY_FIELDS}
    for k, x in p.items():
        if k not in fields:
            raise StepError(f"unknown policy field {k!r}")
        if k == "quota" and x is not None:
            x = record_from({"spend-field": x["spend-field"], "ceiling": x["ceiling"], "decimals": x.get("decimals"),
                             "window-ms": x["window-ms"], "bucket": x.get("bucket")})
        if k == "approval" and x is not None:
            tag, payload = case(x)
            x = Variant(tag, None if payload is None else record_from({"field": payload["field"],
                                                                       "above": payload["above"]}))
        fields[k] = x
    return record_from(fields)


def descriptor_record(v):
    if v is None:
        return None
    return record_from({"name": v["name"], "input-schema": v["input-schema"], "annotations": v.get("annotations")})


def configuration_record(c, encoding):
    return record_from({
        "settings": record_from(c["settings"]),
        "defaults": policy_record(c["defaults"]),
        "tools": [record_from({"tool": t["tool"], "policy": policy_record(t["policy"]),
                               "descriptor": descriptor_record(t["descriptor"])}) for t in c["tools"]],
        "ledger-encoding": encoding,
        "reads": "import",
    })


POLICY_FIELDS = ("route", "identity", "key-argument", "key-sent-by-host", "effect-fields", "verify-first",
                 "provider-claims-key", "lookup", "max-in-flight-ms", "dispatch-timeout-ms", "lease-ms",
                 "attempt-budget", "derived-window-ms", "resolve-deadline-ms", "reconcile-interval-ms", "retention-ms",
                 "tombstone-retention-ms", "quota", "descriptor-pin", "approval", "approval-valid-ms",
                 "approval-wait-ms", "provider-account")


# ---------------------------------------------------------------- vectors


class Vectors:
    def __init__(self, directory):
        self.dir = directory

    def text(self, path):
        with open(os.path.join(self.dir, path), "rb") as f:
            return f.read().decode("utf-8")

    def bytes(self, path):
        with open(os.path.join(self.dir, path), "rb") as f:
            return f.read()

    def csv(self, path, key):
        for line in self.text(path).splitlines():
            k, _, v = line.partition(",")
            if k == key:
                return v
        raise ValueError(f"{path}: no row {key!r}")


def hex_bytes(text):
    out = bytearray()
    for word in text.split():
        for i in range(0, len(word), 2):
            out.append(int(word[i : i + 2], 16))
    return bytes(out)


# ---------------------------------------------------------------- a scenario run

class StepError(Exception):
    pass


# The ops that call an export of the component: each must say what it expects.
EXPORTS = ("configure", "start", "report", "resume", "sweep", "begin", "finish", "reconcile", "await-holder", "prune",
           "inspect", "resolve", "canonicalize", "fingerprint")


def special(v):
    if isinstance(v, dict) and len(v) == 1:
        k = next(iter(v))
        if k.startswith("$"):
            return k, v[k]
    return None


def is_error(v):
    return isinstance(v, dict) and list(v) == ["error"]


class Run:
    def __init__(self, runtime, vectors, name, scenario, kind, directory, broken, encoding="json"):
        self.runtime, self.vectors, self.name, self.scenario = runtime, vectors, name, scenario
        self.encoding = encoding
        self.start = scenario.get("start", 1_000_000)
        self.now = self.start
        self.settings = {}
        self.evidence = []
        self.lookups = []
        self.escalations = []
        self.ack = True
        self.storage = Scripted(kind, directory, broken)
        self.vars = {}
        self.transcript = []
        self.failures = []
        self.linker = Host(self).linker(runtime.engine)
        self.other = None
        # The engine's own default settings, then the scenario's.
        self.settings = render(self.agent().call("default-settings"))
        self.set_settings(self.settings, scenario.get("settings", {}))

    def agent(self):
        return Agent(self.runtime, self.linker, self.encoding)

    def fail(self, label, msg):
        self.failures.append(f"{self.name} step {label}: {msg}")

    def default(self, step, field):
        if field in step:
            return step[field]
        return self.scenario.get("defaults", {}).get(field)

    # -- inputs

    def var(self, path):
        name, *parts = path.split("/")
        if name not in self.vars:
            raise StepError(f"no saved result {name!r}")
        cur = self.vars[name]
        for p in parts:
            if isinstance(cur, dict) and p in cur:
                cur = cur[p]
            elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
                cur = cur[int(p)]
            else:
                raise StepError(f"{path}: nothing at {p!r}")
        return cur

    def resolve(self, v, now):
        sp = special(v)
        if sp:
            op, arg = sp
            if op == "$":
                return self.var(arg)
            if op == "$t":
                return self.start + arg
            if op == "$now":
                return now + arg
            if op == "$file":
                return self.vectors.text(arg)
            raise StepError(f"{op} is not allowed in an input")
        if isinstance(v, list):
            return [self.resolve(x, now) for x in v]
        if isinstance(v, dict):
            return {k: self.resolve(x, now) for k, x in v.items()}
        return v

    def policy(self, v):
        """A step's policy as an object of policy-input overrides: a name from `policies`, an object, or null."""
        if v is None:
            overrides = {}
        elif isinstance(v, str):
            if v not in self.scenario.get("policies", {}):
                raise StepError(f"no policy named {v!r}")
            overrides = self.scenario["policies"][v]
        else:
            overrides = v
        policy_record(overrides)  # refuse an unknown field here, in every runner alike
        return overrides

    @staticmethod
    def set_settings(settings, overrides):
        for k, v in (overrides or {}).items():
            if k not in settings:
                raise StepError(f"unknown setting {k!r}")
            settings[k] = v

    def ensure_settings(self, agent):
        """What a step that is not a call needs: the current settings (any tools)."""
        if agent.configured is not None and json.loads(agent.configured)["settings"] == self.settings:
            return None
        return agent.ensure({"settings": self.settings, "defaults": {}, "tools": []})

    def ensure_tool(self, agent, tool, policy, descriptor):
        """What a begin or start needs: its tool with the step's policy and descriptor
        (none of either: the engine's defaults for every tool)."""
        tools = [] if policy == {} and descriptor is None else [{"tool": tool, "policy": policy, "descriptor": descriptor}]
        return agent.ensure({"settings": self.settings, "defaults": {}, "tools": tools})

    # -- steps

    def execute(self):
        agent = self.agent()
        for i, step in enumerate(self.scenario["steps"]):
            self.step(agent, step, str(i + 1))
        if self.storage.race is not None:
            self.storage.race = None
            self.fail("end", "a race was armed but no commit followed")

    def step(self, agent, step, label):
        now = self.now
        op = step.get("op", "")
        if op in EXPORTS and "expect" not in step:
            self.fail(label, f'{op}: a step that calls the component needs an "expect"')
        lookups_before, escalations_before = len(self.lookups), len(self.escalations)
        try:
            result = self.exec(agent, op, step, label, now)
        except (StepError, ValueError, KeyError, TypeError) as e:
            self.fail(label, f"{op}: {e}")
            return
        except wasmtime.WasmtimeError as e:
            self.fail(label, f"{op}: trap: {e}")
            return
        lookups = self.lookups[lookups_before:]
        escalations = self.escalations[escalations_before:]
        if "as" in step:
            self.vars[step["as"]] = result
            self.vars[step["as"] + ":lookups"] = lookups
            self.vars[step["as"] + ":escalations"] = escalations
        records = []
        checks = step.get("records", [])
        if isinstance(checks, dict):
            checks = [checks]
        errs = []
        for check in checks:
            try:
                scope, key = self.resolve(self.default(check, "scope"), now), self.resolve(check.get("key"), now)
            except StepError:
                scope = key = None
            if not (isinstance(scope, str) and isinstance(key, str)):
                self.fail(label, f"a record check needs a scope and a key: {canonical(check)}")
                continue
            view = self.inspect(agent, scope, key)
            records.append(view)
            if isinstance(view, dict) and "audit" in view:
                problem = audit_invariants(view)
                if problem:
                    self.fail(label, f"record {scope}/{key}: {problem}")
            pattern = {k: v for k, v in check.items() if k not in ("scope", "key", "exists", "kinds")}
            if check.get("exists") is False:
                if view is not None:
                    self.fail(label, f"record {scope}/{key} should not exist, got {canonical(view)}")
                continue
            if view is None or is_error(view):
                self.fail(label, f"record {scope}/{key}: expected a record, got {canonical(view)}")
                continue
            self.match(pattern, view, f"record {scope}/{key}", now, errs)
            if "kinds" in check:
                kinds = [e["kind"] for e in view["audit"]]
                self.match(check["kinds"], kinds, f"record {scope}/{key} kinds", now, errs)
        n, events = self.storage.inner.counts()
        # `quota` counts buckets: the ledger's provider-key secret shares the table, in scope "" (README).
        buckets = n["quota"] - (1 if self.storage.inner.get("quota", "", SECRET_KEY) else 0)
        store = {"operation": n["operation"], "tombstone": n["tombstone"], "quota": buckets, "events": events}
        if "expect" in step:
            self.match(step["expect"], result, "result", now, errs)
        if "lookups" in step:
            self.match(step["lookups"], lookups, "lookups", now, errs)
        if "escalations" in step:
            self.match(step["escalations"], escalations, "escalations", now, errs)
        if "store" in step:
            self.match(step["store"], store, "store", now, errs)
        for e in errs:
            self.fail(label, e)
        self.transcript.append(
            canonical(
                {"scenario": self.name, "step": label, "op": op, "result": result, "lookups": lookups,
                 "escalations": escalations, "records": records, "store": store}
            )
        )

    def inspect(self, agent, scope, key):
        refused = self.ensure_settings(agent)
        if refused is not None:
            return refused
        return render_answer(agent.call("inspect", scope, key))

    def exec(self, agent, op, step, label, now):
        def inp(field):
            return self.resolve(self.default(step, field), now)

        if op == "advance":
            ms = inp("ms")
            if not isinstance(ms, int) or isinstance(ms, bool):
                raise StepError(f"ms: expected an integer, got {canonical(ms)}")
            if not 0 <= self.now + ms < 1 << 64:
                raise StepError(f"advance {ms} from {self.now} leaves the clock's range")
            self.now += ms
            return None
        if op == "lookup":
            for e in inp("evidence"):
                tag, payload = case(e)
                if tag not in ("confirmed", "absent", "unknown"):
                    raise StepError(f"evidence {tag!r}")
                self.evidence.append(Variant(tag, payload))
            return None
        if op == "fail-commits":
            self.storage.fail_commits = inp("n")
            return None
        if op == "lose-commit-replies":
            self.storage.lose_replies = inp("n")
            return None
        if op == "fail-reads":
            self.storage.fail_reads = bool(inp("on"))
            return None
        if op == "ack-escalations":
            self.ack = bool(inp("ack"))
            return None
        if op == "settings":
            self.set_settings(self.settings, inp("set"))
            return None
        if op == "wipe-ledger":
            self.storage.wipe()
            return None
        if op == "race":
            steps = step["steps"]

            def hook():
                if self.other is None:
                    self.other = self.agent()
                for i, inner in enumerate(steps):
                    self.step(self.other, inner, f"{label}.{i + 1}")

            self.storage.race = hook
            return None
        return self.call(agent, op, step, now)

    def call_fields(self, step, now):
        """A start or begin step's `call` as neutral fields, each checked as the typed record's is."""
        def inp(field):
            return self.resolve(self.default(step, field), now)

        def text(v, what):
            if not isinstance(v, str):
                raise StepError(f"{what}: expected a string, got {canonical(v)}")
            return v

        if "keys" in step:
            pairs = self.resolve(step["keys"], now)
            if not isinstance(pairs, list):
                raise StepError("keys: expected a list of [carrier, key]")
            keys = [(text(c, "carrier"), text(k, "key")) for c, k in pairs]
        else:
            key = inp("key")
            keys = [] if key is None else [("api", text(key, "key"))]
        supersedes = inp("supersedes")
        return {
            "scope": text(inp("scope"), "scope"), "keys": keys, "tool": text(inp("tool"), "tool"),
            "args": text(inp("args"), "args"), "supersedes": None if supersedes is None else text(supersedes, "supersedes"),
            "acknowledge-confirmed": bool(inp("acknowledge-confirmed")),
        }

    def call_json(self, step, now):
        """The JSON form of a start step's `call`."""
        return json.dumps({k.replace("-", "_"): v for k, v in self.call_fields(step, now).items()}, ensure_ascii=False)

    def call_of(self, step, now):
        """The `call` record of a begin step, or of a start step in a typed run."""
        return record_from(self.call_fields(step, now))

    def call(self, agent, op, step, now):
        """A step that calls an export. The instance is configured first as the step needs
        (a refusal is the step's result)."""
        def inp(field):
            return self.resolve(self.default(step, field), now)

        if op == "configure":
            refused = None
        elif op in ("begin", "start"):
            refused = self.ensure_tool(agent, inp("tool"), self.policy(inp("policy")), inp("descriptor"))
        elif op in EXPORTS:
            refused = self.ensure_settings(agent)
        else:
            raise StepError(f"unknown op {op!r}")
        if refused is not None:
            return refused

        def outcome(name):
            tag, payload = case(inp("outcome"))
            if tag not in ("success", "rejected", "ambiguous", "not-sent"):
                raise StepError(f"outcome {tag!r}")
            if tag != "not-sent" and not isinstance(payload, str):
                raise StepError(f"outcome {tag}: expected a string, got {canonical(payload)}")
            if name == "report":  # the JSON form of an `outcome`
                return json.dumps("NotSent" if tag == "not-sent" else {"".join(w.capitalize() for w in tag.split("-")): payload},
                                  ensure_ascii=False)
            return agent.case(name, "outcome", tag, payload)

        if op == "configure":
            settings = dict(self.settings)
            self.set_settings(settings, inp("settings"))
            tools = []
            for t in step.get("tools", []):
                tools.append({"tool": t["tool"] if "tool" in t else inp("tool"), "policy": self.policy(t.get("policy")),
                              "descriptor": self.resolve(t.get("descriptor"), now)})
            configuration = {"settings": settings, "defaults": self.policy(step.get("defaults")), "tools": tools}
            return render_answer(agent.configure(configuration))
        if op == "begin":
            return render_answer(agent.call("begin", self.call_of(step, now)))
        # A typed run drives the call with the typed `driver`, a ledger-json run (the Python package's) with
        # `protocol`'s JSON form: both encodings of one protocol (`Agent.func` picks the interface).
        if op == "start" and agent.typed:
            return render_answer(agent.call("start", self.call_of(step, now)))
        if op == "start":
            return render_answer(step_answer(agent.call("start", self.call_json(step, now))))
        if op == "finish":
            return render_answer(agent.call("finish", inp("scope"), inp("key"), inp("fence"), outcome("finish")))
        if op == "report" and agent.typed:
            return render_answer(agent.call("report", inp("scope"), inp("key"), inp("fence"), outcome("finish")))
        if op == "report":
            return render_answer(step_answer(agent.call("report", inp("scope"), inp("key"), inp("fence"),
                                                        outcome("report"))))
        if op == "resume" and agent.typed:
            return render_answer(agent.call("resume", inp("scope"), inp("key")))
        if op == "resume":
            return render_answer(step_answer(agent.call("resume", inp("scope"), inp("key"))))
        if op == "reconcile":
            return render_answer(agent.call("reconcile", inp("scope"), inp("key")))
        if op == "await-holder":
            return render_answer(agent.call("await-holder", inp("scope"), inp("key")))
        if op == "sweep":
            return render_answer(agent.call("sweep", inp("limit") or 100, bool(inp("dispatch"))))
        if op == "prune":
            return render_answer(agent.call("prune", inp("limit") or 100))
        if op == "inspect":
            return render_answer(agent.call("inspect", inp("scope"), inp("key")))
        if op == "resolve":
            tag, payload = case(inp("resolution"))
            if tag not in ("confirmed", "absent", "approve", "deny"):
                raise StepError(f"resolution {tag!r}")
            resolution = agent.case("resolve", "resolution", tag, payload)
            return render_answer(
                agent.call("resolve", inp("scope"), inp("key"), resolution, inp("note"), bool(inp("force")))
            )
        if op == "canonicalize":
            if "text" in step:
                data = self.resolve(step["text"], now).encode("utf-8")
            elif "hex" in step:
                data = hex_bytes(step["hex"])
            elif "file" in step:
                data = self.vectors.bytes(step["file"])
            else:
                raise StepError("canonicalize needs text, hex or file")
            return render_answer(agent.call("canonicalize", data))
        if op == "fingerprint":
            return render_answer(agent.call("fingerprint", inp("tool"), inp("args")))
        raise StepError(f"unknown op {op!r}")

    # -- matching

    def match(self, pattern, actual, path, now, errs):
        sp = special(pattern)
        if sp:
            op, arg = sp

            def want(value):
                if value != actual or type(value) is bool and type(actual) is not bool:
                    errs.append(f"{path}: expected {canonical(value)}, got {canonical(actual)}")

            try:
                if op == "$":
                    return want(self.var(arg))
                if op == "$t":
                    return want(self.start + arg)
                if op == "$now":
                    return want(now + arg)
                if op == "$file":
                    return want(self.vectors.text(arg))
                if op == "$hexfile":
                    return want(hex_bytes(self.vectors.text(arg)).decode("utf-8"))
                if op == "$csv":
                    return want(self.vectors.csv(arg[0], arg[1]))
            except (StepError, OSError, ValueError) as e:
                errs.append(f"{path}: {e}")
                return
            if op == "$not":
                inner = []
                self.match(arg, actual, path, now, inner)
                if not inner:
                    errs.append(f"{path}: {canonical(actual)} should not match {canonical(arg)}")
            elif op == "$contains":
                if not (isinstance(actual, str) and arg in actual):
                    errs.append(f"{path}: {canonical(actual)} does not contain {canonical(arg)}")
            elif op == "$nonempty":
                if not (isinstance(actual, str) and actual):
                    errs.append(f"{path}: expected a non-empty string, got {canonical(actual)}")
            elif op == "$json":
                try:
                    parsed = json.loads(actual)
                except (TypeError, ValueError):
                    errs.append(f"{path}: expected JSON text, got {canonical(actual)}")
                    return
                self.match(arg, parsed, f"{path} (JSON)", now, errs)
            elif op == "$len":
                if not (isinstance(actual, list) and len(actual) == arg):
                    errs.append(f"{path}: expected {arg} elements, got {canonical(actual)}")
            elif op == "$has":
                if not (isinstance(actual, list) and any(self.matches(arg, x, now) for x in actual)):
                    errs.append(f"{path}: no element matches {canonical(arg)} in {canonical(actual)}")
            elif op == "$count":
                n = sum(1 for x in actual if self.matches(arg[0], x, now)) if isinstance(actual, list) else 0
                if n != arg[1]:
                    errs.append(f"{path}: {n} elements match {canonical(arg[0])}, expected {arg[1]}")
            elif op == "$tail":
                if isinstance(actual, list) and len(actual) >= len(arg):
                    self.match(arg, actual[len(actual) - len(arg):], path, now, errs)
                else:
                    errs.append(f"{path}: {canonical(actual)} does not end with {canonical(arg)}")
            elif op in ("$gt", "$ge", "$lt", "$le"):
                try:
                    bound = self.resolve(arg, now)
                except StepError as e:
                    errs.append(f"{path}: {e}")
                    return
                ok = isinstance(actual, int) and not isinstance(actual, bool) and {
                    "$gt": lambda a, b: a > b, "$ge": lambda a, b: a >= b,
                    "$lt": lambda a, b: a < b, "$le": lambda a, b: a <= b,
                }[op](actual, bound)
                if not ok:
                    errs.append(f"{path}: {canonical(actual)} is not {op} {canonical(arg)}")
            else:
                errs.append(f"{path}: unknown matcher {op}")
            return
        if isinstance(pattern, dict) and isinstance(actual, dict):
            for k, pv in pattern.items():
                if k not in actual:
                    errs.append(f"{path}: no field {k!r} in {canonical(actual)}")
                else:
                    self.match(pv, actual[k], f"{path}/{k}", now, errs)
        elif isinstance(pattern, list) and isinstance(actual, list):
            if len(pattern) != len(actual):
                errs.append(f"{path}: expected {len(pattern)} elements, got {len(actual)}: {canonical(actual)}")
                return
            for i, (pv, av) in enumerate(zip(pattern, actual)):
                self.match(pv, av, f"{path}/{i}", now, errs)
        elif pattern != actual or (type(pattern) is bool) != (type(actual) is bool):
            errs.append(f"{path}: expected {canonical(pattern)}, got {canonical(actual)}")

    def matches(self, pattern, actual, now):
        errs = []
        self.match(pattern, actual, "", now, errs)
        return not errs


def audit_invariants(view):
    audit = view["audit"]
    if not audit:
        return "a record without an audit event"
    last = audit[-1]
    if last["version"] != view["version"]:
        return f"last audit version {last['version']} != record version {view['version']}"
    if last["to-state"] != view["state"]:
        return f"last audit event ends in {last['to-state']}, the record is {view['state']}"
    for a, b in zip(audit, audit[1:]):
        if b["version"] <= a["version"]:
            return "audit versions do not rise"
    return None


# ---------------------------------------------------------------- main


def load_scenarios(directory, text_filter):
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            scenario = json.load(f)
        stem = name[: -len(".json")]
        if scenario.get("name") != stem:
            raise SystemExit(f"{name}: \"name\" must be the file name")
        if text_filter in stem:
            out.append((stem, scenario))
    return out


# The deliberately broken stores, and the scenarios that must catch each.
NEGATIVE = {
    "cas-ignores-version": ["race-quota-reservations"],
    "no-conflicts": [
        "race-concurrent-begins",
        "race-concurrent-starts",
        "race-quota-reservations",
        "race-finish-vs-sweep",
        "race-original-retried-while-superseded",
    ],
}


def run_all(runtime, vectors, scenarios, kind, broken, encoding="json"):
    results = []
    for name, scenario in scenarios:
        with tempfile.TemporaryDirectory() as d:
            run = Run(runtime, vectors, name, scenario, kind, d, broken, encoding)
            run.execute()
            results.append((name, run.transcript, run.failures))
            run.storage.inner = None
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--component", required=True)
    ap.add_argument("--scenarios", default=os.path.join(REPO, "tests", "conformance", "scenarios"))
    ap.add_argument("--vectors", default=os.environ.get("ONCE_VECTORS", os.path.join(REPO, "..", "shared", "vectors", "jcs")))
    ap.add_argument("--store", choices=("memory", "sqlite", "all"), default="all")
    ap.add_argument("--transcripts")
    ap.add_argument("--filter", default="")
    ap.add_argument("--negative", action="store_true", help="also check that deliberately broken stores are caught")
    a = ap.parse_args()

    with open(a.component, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    started = time.time()
    runtime = Runtime(a.component)
    print(f"python {sys.version.split()[0]}, wasmtime {metadata.version('wasmtime')}: component {a.component} sha256 {digest}")
    vectors = Vectors(a.vectors)
    scenarios = load_scenarios(a.scenarios, a.filter)
    if not scenarios:
        print("python: no scenarios found")
        return 1
    # Every store on ledger-json (the encoding the Python package answers); memory on the typed ledger too.
    runs = [(kind, "json", kind) for kind in (["memory", "sqlite"] if a.store == "all" else [a.store])]
    if a.store in ("all", "memory"):
        runs.append(("memory", "typed", "memory-typed"))
    passed = failed = 0
    for kind, encoding, label in runs:
        results = run_all(runtime, vectors, scenarios, kind, None, encoding)
        bad = [(n, f) for n, _, f in results if f]
        for _, failures in bad:
            for line in failures:
                print(f"  FAIL {line}")
        ok = len(results) - len(bad)
        print(f"python ({kind}, {encoding}): {ok} passed, {len(bad)} failed")
        passed += ok
        failed += len(bad)
        if a.transcripts:
            os.makedirs(a.transcripts, exist_ok=True)
            with open(os.path.join(a.transcripts, f"python-{label}.jsonl"), "w", encoding="utf-8", newline="\n") as f:
                for _, lines, _ in results:
                    for line in lines:
                        f.write(line + "\n")
    if a.negative:
        names = {n for n, _ in scenarios}
        for broken, must in NEGATIVE.items():
            results = run_all(runtime, vectors, scenarios, "memory", broken)
            caught = sorted(n for n, _, f in results if f)
            missed = sorted(m for m in must if m in names and m not in caught)
            if missed or not caught:
                print(f"python negative ({broken}): went unnoticed by {', '.join(missed) or 'every scenario'}")
                failed += 1
            else:
                print(f"python negative ({broken}): caught by {len(caught)} scenario(s): {', '.join(caught)}")
                passed += 1
    print(f"python: {passed} passed, {failed} failed in {time.time() - started:.1f} s")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
