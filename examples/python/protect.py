"""A refund sent once, over a durable SQLite ledger: python protect.py once_guest.wasm [ledger.db]"""
import json, sqlite3, sys, time, wasmtime, wasmtime.component as wc
from wasmtime.component import Record, Variant
class Rec(Record): __init__, __getattr__ = lambda r, fields: r.__dict__.update(fields), lambda r, _: None  # unset: None
db = sqlite3.connect(sys.argv[2] if len(sys.argv) > 2 else "once-example.db", isolation_level=None)
db.executescript("""CREATE TABLE IF NOT EXISTS rows (tbl, scope, key, version, state, due_at, owner, body,
  PRIMARY KEY (tbl, scope, key)); CREATE TABLE IF NOT EXISTS audit (scope, key, version, at, kind, from_state,
  to_state, attempt, detail, PRIMARY KEY (scope, key, version));""")  # the engine's rows and its audit trail
db.row_factory = lambda cursor, r: Rec({c[0]: v for c, v in zip(cursor.description, r)})  # read as WIT records
ROWS = 'SELECT tbl AS "table", scope, key, version, state, due_at AS "due-at", owner, body FROM rows WHERE tbl=?'
q = lambda sql, *args: db.execute(sql, args)
def answers(f):  # a store failure is the ledger import's `failed` answer, and nothing is applied
    def run(*args):
        try: return f(*args)
        except sqlite3.Error as e: return db.in_transaction and db.rollback() or Variant("failed", Rec({"message": str(e)}))
    return run
def put(p, at):  # one compare-and-swap write: insert if absent, else update or delete at the expected version
    if p.row is None: return q("DELETE FROM rows WHERE tbl=? AND scope=? AND key=? AND version=?", *at, p.expected)
    if p.expected is None: return q("INSERT OR IGNORE INTO rows VALUES (?,?,?,?,?,?,?,?)", *vars(p.row).values())
    return q("UPDATE rows SET version=?, state=?, due_at=?, owner=?, body=? WHERE tbl=? AND scope=? AND key=? AND "
             "version=?", *list(vars(p.row).values())[3:], *at, p.expected)  # a record's fields come in WIT order
def commit(_, batch):  # one atomic batch: every put and every new audit event, or nothing
    done = q("BEGIN IMMEDIATE") and all(put(p, (p.table, p.scope, p.key)).rowcount == 1 for p in batch.puts) and all(q(
        "INSERT OR IGNORE INTO audit VALUES (?,?,?,?,?,?,?,?,?)", *vars(e).values()).rowcount == 1 for e in batch.events)
    return q("COMMIT" if done else "ROLLBACK") and Variant("applied" if done else "conflict")
now = lambda *_, last=[0]: last.__setitem__(0, max(last[0], time.time_ns() // 10**6)) or last[0]  # ms, never backwards
imports = {"ledger": {"commit": commit,  # the engine's I/O, and nothing else
    "get": lambda _, *at: (r := q(ROWS + " AND scope=? AND key=?", *at).fetchone()) and Variant("found", r) or Variant("missing"),
    "scan": lambda _, table, states, before, owner, limit: Variant("found", Rec({"rows": q(ROWS + " AND due_at<=? AND (?='[]' "
        "OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner=?) ORDER BY due_at, scope, key LIMIT ?", table,
        min(before, 2**63 - 1), (s := json.dumps(states)), s, owner, owner, limit).fetchall()})),
    "audit": lambda _, s, k: Variant("found", Rec({"events": q('SELECT scope, key, version, at, kind, from_state AS "from-state",'
        ' to_state AS "to-state", attempt, detail FROM audit WHERE scope=? AND key=? ORDER BY version', s, k).fetchall()}))},
    "clock": {"now": now}, "provider": {"lookup": lambda _, tool, key, args: Variant("unknown", "read your provider here")},
    "operator": {"escalate": lambda _, e: print("operator, look at:", e.scope, e.key, e.reason) or True}}
with (linker := wc.Linker(engine := wasmtime.Engine())).root() as root:
    for iface, funcs in imports.items():
        with root.add_instance(f"once:core/{iface}@0.2.0") as i: [i.add_func(n, answers(f)) for n, f in funcs.items()]
instance = linker.instantiate(store := wasmtime.Store(engine), wc.Component.from_file(engine, sys.argv[1]))
x = lambda iface, name, *args: instance.get_func(store, instance.get_export_index(  # an export; a result<_, error>
    store, name, instance.get_export_index(store, f"once:core/{iface}@0.2.0")))(store, *args)  # is Variant("ok"|"err", _)
ok = lambda r: r.payload if r.tag == "ok" else sys.exit(f"refused: {r.payload.tag} {r.payload.payload}")
configured = x("engine", "configure", Rec({"settings": x("engine", "default-settings"), "defaults": Rec({}), "tools": [Rec(
    {"tool": "refund_order", "policy": Rec({"key-argument": "idempotency_key", "dispatch-timeout-ms": 10_000})})]}))
if isinstance(configured, Variant): sys.exit(f"configure refused: {configured}")  # (lifts untagged: record or error)
def protect(scope, key, tool, args, send, patience_ms=3000):  # the whole protocol, and no rule of the engine
    step, give_up = ok(x("protocol", "start", Rec({"scope": scope, "keys": [("api", key)], "tool": tool,
                       "args": json.dumps(args), "acknowledge-confirmed": False}))), now() + patience_ms
    while step.tag in ("dispatch", "wait") and (s := step.payload):
        if step.tag == "dispatch":  # send exactly the grant, unless it is too late to start: then it was not sent
            outcome = Variant("not-sent") if now() >= getattr(s, "send-by") else send(json.loads(s.args), getattr(s, "timeout-ms"))
            step = ok(x("protocol", "report", s.scope, s.key, s.fence, outcome))
        elif s.next > give_up: return s.meanwhile  # stop waiting; show what is known so far
        else: step = time.sleep(max(0, s.next - now()) / 1000) or ok(x("protocol", "resume", s.scope, s.key))
    return step.payload if step.tag == "done" else send(args, None)  # done: the account; direct: send it unprotected
sent, refund = [], lambda args, timeout_ms: sent.append(args) or Variant("success", '{"refund_id":"r-1"}')  # your API
for attempt in ("first call", "retry"):  # the retry reuses the operation key minted before the first attempt
    a = protect("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, refund)
    print(f"{attempt}: {a.ending.tag}, effect {a.effect}, again {a.repeat}:", vars(a.ending.payload))  # the account
sys.exit(print(f"sent {len(sent)} time(s) by this run") or len(sent) > 1 or a.effect != "happened")  # 1, then 0 by a rerun
