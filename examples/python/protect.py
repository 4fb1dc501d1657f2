"""Protect a side-effecting call with the once component, hosted by Python: python protect.py once_guest.wasm"""
import json, sys, time
import wasmtime, wasmtime.component as wc
from wasmtime.component import Record, Variant, _types

_types.ResultType._tagged = lambda self: True  # lift/lower every WIT result as Variant("ok" | "err", value)
rows, events = {}, {}  # the ledger (in memory here): versioned rows, append-only audit events
due = lambda r: getattr(r, "due-at")

def commit(_, batch):  # one atomic batch of compare-and-swap puts and audit events: all or nothing
    stale = any(getattr(rows.get((p.table, p.scope, p.key)), "version", None) != p.expected for p in batch.puts)
    if stale or any((e.scope, e.key, e.version) in events for e in batch.events):
        return Variant("err", None)  # commit-error.conflict
    for p in batch.puts:
        rows[(p.table, p.scope, p.key)] = p.row  # None: deleted
    events.update({(e.scope, e.key, e.version): e for e in batch.events})
    return Variant("ok", None)

def scan(_, table, states, before, owner, limit):
    hits = [r for r in rows.values() if r and r.table == table and due(r) is not None and due(r) <= before
            and (not states or r.state in states) and (owner is None or r.owner == owner)]
    return Variant("ok", sorted(hits, key=lambda r: (due(r), r.scope, r.key))[:limit])

def record(**fields):
    r = Record()
    r.__dict__.update((k.replace("_", "-"), v) for k, v in fields.items())
    return r

linker = wc.Linker(engine := wasmtime.Engine())
with linker.root() as root:
    with root.add_instance("once:core/ledger@0.1.0") as i:
        i.add_func("get", lambda _, t, s, k: Variant("ok", rows.get((t, s, k))))
        i.add_func("commit", commit)
        i.add_func("scan", scan)
        i.add_func("audit", lambda _, s, k: Variant("ok", [e for id, e in sorted(events.items()) if id[:2] == (s, k)]))
    with root.add_instance("once:core/clock@0.1.0") as i:
        i.add_func("now", lambda _: time.time_ns() // 1_000_000)
        i.add_func("get-settings", lambda _: record(max_input_bytes=1 << 20, max_depth=128, max_key_bytes=512,
                                                    clock_skew_ms=0, owner="default"))
    with root.add_instance("once:core/provider@0.1.0") as i:  # reconciliation's authoritative read of your provider
        i.add_func("lookup", lambda _, tool, provider_key, args: Variant("unknown", "no lookup configured"))
    with root.add_instance("once:core/operator@0.1.0") as i:
        i.add_func("escalate", lambda _, e: print("operator, look at:", e.scope, e.key, e.reason) or True)
instance = linker.instantiate(store := wasmtime.Store(engine), wc.Component.from_file(engine, sys.argv[1]))
exports = instance.get_export_index(store, "once:core/engine@0.1.0")
call = lambda name, *args: instance.get_func(store, instance.get_export_index(store, name, exports))(store, *args)

def protect(scope, key, tool, args, send):  # begin; send only on execute, then finish; a repeat gets the receipt
    d = call("begin", record(scope=scope, keys=[("api", key)], tool=tool, args=json.dumps(args), descriptor=None,
                             policy=call("default-policy"), supersedes=None, acknowledge_confirmed=False)).payload
    if d.tag != "execute":  # replay, in-flight, unknown, blocked, conflict (or the error, on bad input)
        return d.tag, d.payload.receipt if d.tag == "replay" else d.payload
    outcome = send(json.loads(d.payload.args), getattr(d.payload, "provider-key"))  # success, rejected, ambiguous
    call("finish", scope, key, d.payload.fence, outcome)
    return outcome.tag, outcome.payload

sent, refund = [], lambda args, idempotency_key: sent.append(args) or Variant("success", '{"refund_id":"r-1"}')
for attempt in ("first call", "retry"):  # the retry reuses the operation key minted before the first attempt
    print(f"{attempt}:", protect("tenant-7", "refund-1234", "refund_order", {"order_id": 1234, "amount": 200}, refund))
sys.exit(0 if len(sent) == 1 else f"the refund was sent {len(sent)} times")
