"""A refund sent once, over a durable SQLite ledger: python protect.py once_guest.wasm [ledger.db]"""
import json, os, re, sqlite3, sys, time, wasmtime, wasmtime.component as wc
from wasmtime.component import Record, Variant
class Rec(Record): __init__, __getattr__ = lambda r, fields: r.__dict__.update(fields), lambda r, _: None  # unset: None
db = sqlite3.connect(path := sys.argv[2] if len(sys.argv) > 2 else "once-example.db", isolation_level=None)
def witnessed(f, failed):  # a witness failure is its own answer: `failed(why)`, or the why of a keep
    def run(*args):
        try: return f(*args)
        except sqlite3.Error as e: return failed(str(e))
    return run
# The engine's rows and its audit trail: the tables the once packages make (the repository's schema/sqlite)
schema = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schema", "sqlite", "ledger.sql")
db.executescript(open(schema, encoding="utf-8").read())  # (tbl, scope, key, version, state, due_at, body, owner)
db.row_factory = lambda cursor, r: Rec({c[0]: v for c, v in zip(cursor.description, r)})  # read as WIT records
# The witness: every grant's record, kept in a file of its own that restoring an older ledger file leaves alone
wdb = sqlite3.connect(path + ".witness", isolation_level=None)  # (the format the once packages keep beside their ledgers)
[wdb.execute(s) for s in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL")]
wdb.executescript(open(os.path.join(os.path.dirname(schema), "..", "witness", "sqlite.sql"), encoding="utf-8").read())
ROWS = 'SELECT tbl AS "table", scope, key, version, state, due_at AS "due-at", owner, body FROM rows WHERE tbl=?'
q = lambda sql, *args: db.execute(sql, args)
wit = lambda name: name and re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()  # the JSON form's InFlight is WIT's in-flight
def answers(f, text):  # a store failure is the ledger import's `failed` answer (get, commit: JSON text), nothing applied
    def run(*args):
        try: return f(*args)
        except sqlite3.Error as e:
            failed = {"message": str(e)}
            return db.in_transaction and db.rollback() or (json.dumps({"Failed": failed}) if text else Variant("failed", Rec(failed)))
    return run
def put(p, body):  # one compare-and-swap write: insert if absent, update or delete at the expected version; or assert absent
    at, r, expected = (wit(p["table"]), p["scope"], p["key"]), p["row"], p["expected"]
    if r is None and expected is None: return not q("SELECT 1 FROM rows WHERE tbl=? AND scope=? AND key=?", *at).fetchone()
    if r is None: return q("DELETE FROM rows WHERE tbl=? AND scope=? AND key=? AND version=?", *at, expected).rowcount == 1
    row = (r["version"], wit(r["state"]), r["due_at"], body, r["owner"])
    if expected is None: return q("INSERT OR IGNORE INTO rows VALUES (?,?,?,?,?,?,?,?)", *at, *row).rowcount == 1
    return q("UPDATE rows SET version=?, state=?, due_at=?, body=?, owner=? WHERE tbl=? AND scope=? AND key=? AND "
             "version=?", *row, *at, expected).rowcount == 1
def commit(_, batch, bodies):  # one atomic batch (JSON text; each written row's body beside it): all of it, or nothing
    head, body = json.loads(batch), iter(bodies)
    done = q("BEGIN IMMEDIATE") and all(put(p, p["row"] and next(body)) for p in head["puts"]) and all(q(
        "INSERT OR IGNORE INTO audit VALUES (?,?,?,?,?,?,?,?,?)", *(wit(v) if k.endswith("state") else v
        for k, v in e.items())).rowcount == 1 for e in head["events"])  # an audit event's fields come in WIT order
    return q("COMMIT" if done else "ROLLBACK") and ('"Applied"' if done else '"Conflict"')  # the JSON form of `committed`
now = lambda *_, last=[0]: last.__setitem__(0, max(last[0], time.time_ns() // 10**6)) or last[0]  # ms, never backwards
unused = lambda *_: Variant("failed", Rec({"message": "answered in ledger-json"}))  # typed get, commit: never called
imports = {"ledger-json": {"commit": commit,  # the engine's I/O, and nothing else
    "get": lambda _, *at: (r := q("SELECT version, body FROM rows WHERE tbl=? AND scope=? AND key=?", *at).fetchone())
        and json.dumps({"Found": vars(r)}) or '"Missing"'},  # the JSON form of `got`
    "ledger": {"get": unused, "commit": unused, "scan": lambda _, table, states, before, owner, limit: Variant("found", Rec({"rows": q(ROWS + " AND due_at<=? AND (?='[]' "
        "OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner=?) ORDER BY due_at, scope, key LIMIT ?", table,
        min(before, 2**63 - 1), (s := json.dumps(states)), s, owner, owner, limit).fetchall()})),
    "audit": lambda _, s, k: Variant("found", Rec({"events": q('SELECT scope, key, version, at, kind, from_state AS "from-state",'
        ' to_state AS "to-state", attempt, detail FROM audit WHERE scope=? AND key=? ORDER BY version', s, k).fetchall()}))},
    "clock": {"now": now}, "provider": {"lookup": lambda _, tool, key, args: Variant("unknown", "read your provider here")},
    "operator": {"escalate": lambda _, e: print("operator, look at:", e.scope, e.key, e.reason) or True},
    "entropy": {"fill": lambda _, n: os.urandom(n)},  # the ledger's provider-key secret is made of these
    "witness": {"seen": witnessed(lambda _, s, k: (r := wdb.execute("SELECT body FROM witness WHERE scope=? AND key=?", (s, k))
        .fetchone()) and Variant("kept", r[0]) or Variant("nothing"), lambda why: Variant("failed", why)),
        "keep": witnessed(lambda _, s, k, body, at: wdb.execute("INSERT INTO witness VALUES (?,?,?,?) ON CONFLICT (scope, key) DO "
            "UPDATE SET at=excluded.at, body=excluded.body WHERE excluded.at >= witness.at", (s, k, at, body)) and None, str),
        "forget": witnessed(lambda _, s, k, before: wdb.execute("DELETE FROM witness WHERE scope=? AND key=? AND at<?",
            (s, k, min(before, 2**63 - 1))) and None, str)}}
with (linker := wc.Linker(engine := wasmtime.Engine())).root() as root:
    for iface, funcs in imports.items():
        with root.add_instance(f"once:core/{iface}@2.0.0") as i: [i.add_func(n, f if iface == "witness" else answers(f,
            iface == "ledger-json")) for n, f in funcs.items()]
instance = linker.instantiate(store := wasmtime.Store(engine), wc.Component.from_file(engine, sys.argv[1]))
x = lambda iface, name, *args: instance.get_func(store, instance.get_export_index(  # an export by name
    store, name, instance.get_export_index(store, f"once:core/{iface}@2.0.0")))(store, *args)
ok = lambda r: (r := json.loads(r))["Ok"] if "Ok" in r else sys.exit(f"refused: {r['Err']}")  # result<step, error>, as JSON
configured = x("engine", "configure", Rec({"settings": x("engine", "default-settings"), "defaults": Rec({}), "tools": [Rec(
    {"tool": "refund_order", "policy": Rec({"key-argument": "idempotency_key", "dispatch-timeout-ms": 10_000})})],
    "ledger-encoding": "json", "reads": "import"}))  # get and commit answer as JSON text (ledger-json): wasmtime-py lifts it fastest
if isinstance(configured, Variant): sys.exit(f"configure refused: {configured}")  # (lifts untagged: record or error)
def protect(scope, key, tool, args, send, patience_ms=3000):  # the whole protocol, and no rule of the engine
    step, give_up = ok(x("protocol", "start", json.dumps({"scope": scope, "keys": [["api", key]], "tool": tool,
                       "args": json.dumps(args), "supersedes": None, "acknowledge_confirmed": False}))), now() + patience_ms
    while isinstance(step, dict) and ("Dispatch" in step or "Wait" in step):
        if g := step.get("Dispatch"):  # send exactly the grant, unless it is too late to start: then it was not sent
            outcome = '"NotSent"' if now() >= g["send_by"] else json.dumps(send(json.loads(g["args"]), g["timeout_ms"]))
            step = ok(x("protocol", "report", g["scope"], g["key"], g["fence"], outcome))
        elif (w := step["Wait"])["next"] > give_up: return w["meanwhile"]  # stop waiting; show what is known so far
        else: step = time.sleep(max(0, w["next"] - now()) / 1000) or ok(x("protocol", "resume", w["scope"], w["key"]))
    return step["Done"] if step != "Direct" else send(args, None)  # done: the account; direct: send it unprotected
sent, refund = [], lambda args, timeout_ms: sent.append(args) or {"Success": '{"refund_id":"r-1"}'}  # your API
for attempt in ("first call", "retry"):  # the retry reuses the operation key minted before the first attempt
    a = protect("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, refund)
    (ending, info), = a["ending"].items()
    print(f"{attempt}: {ending}, effect {a['effect']}, again {a['repeat']}:", info)  # the account
sys.exit(print(f"sent {len(sent)} time(s) by this run") or len(sent) > 1 or a["effect"] != "Happened")  # 1, then 0 by a rerun
