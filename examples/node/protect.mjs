// A refund sent once, over a durable SQLite ledger (better-sqlite3 12). Transpile the component first:
//   npx jco transpile once_guest.wasm -o gen --instantiation sync --name once && node protect.mjs gen [ledger.db]
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import Database from "better-sqlite3";
const dir = resolve(process.argv[2] ?? "gen"), { instantiate } = await import(pathToFileURL(join(dir, "once.js")).href);
const db = new Database(process.argv[3] ?? "once-example.db").exec(`CREATE TABLE IF NOT EXISTS rows (tbl, scope, key, version,
  state, due_at, owner, body, PRIMARY KEY (tbl, scope, key)); CREATE TABLE IF NOT EXISTS audit (scope, key, version, at, kind,
  from_state, to_state, attempt, detail, PRIMARY KEY (scope, key, version))`); // the engine's rows and its audit trail
const q = ((cache) => (text) => (cache[text] ??= db.prepare(text).safeIntegers(true)))({}); // u64s as BigInt, like jco
const NAMES = { tbl: "table", due_at: "dueAt", from_state: "fromState", to_state: "toState" }; // columns: jco's fields
const wit = (r) => r && Object.fromEntries(Object.entries(r).map(([k, v]) => [NAMES[k] ?? k, v ?? undefined])); // NULL: unset
const sql = (v) => (typeof v === "number" ? BigInt(v) : v ?? null); // an integer (a u32), or NULL for an unset option
function put({ table, scope, key, expected, row }) { // insert if absent, else update or delete at the expected version
  if (!row) return q("DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?").run(table, scope, key, expected);
  if (expected === undefined) return q("INSERT OR IGNORE INTO rows VALUES (?,?,?,?,?,?,?,?)").run(...Object.values(row).map(sql));
  return q("UPDATE rows SET version = ?, state = ?, due_at = ?, owner = ?, body = ? WHERE tbl = ? AND scope = ? AND key = ? AND "
    + "version = ?").run(...Object.values(row).slice(3).map(sql), table, scope, key, expected); // fields in WIT order
}
const CONFLICT = new Error("conflict"), apply = db.transaction((puts, events) => { // one atomic batch: every put applies
  const event = (e) => q("INSERT OR IGNORE INTO audit VALUES (?,?,?,?,?,?,?,?,?)").run(...Object.values(e).map(sql));
  if (!puts.every((p) => put(p).changes === 1) || !events.every((e) => event(e).changes === 1)) throw CONFLICT; }); // or none
const answers = (f) => (...args) => { try { return f(...args); } catch (e) { // a store failure: the `failed` answer
  return e === CONFLICT ? { tag: "conflict" } : { tag: "failed", val: { message: String(e) } }; } };
const now = ((last) => () => (last = [last, BigInt(Date.now())].reduce((a, b) => (a > b ? a : b))))(0n); // never backwards
const ledger = Object.fromEntries(Object.entries({ // the engine's I/O, and nothing else
  get: (...at) => ((r) => (r ? { tag: "found", val: wit(r) } : { tag: "missing" }))(q("SELECT * FROM rows WHERE tbl = ? AND "
    + "scope = ? AND key = ?").get(...at)),
  commit: ({ puts, events }) => (apply.immediate(puts, events), { tag: "applied" }),
  scan: (table, states, before, owner, limit) => ({ tag: "found", val: { rows: q("SELECT * FROM rows WHERE tbl = ? AND due_at <= ? "
    + "AND (? = '[]' OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner = ?) ORDER BY due_at, scope, key LIMIT ?")
    .all(table, before < 2n ** 63n ? before : 2n ** 63n - 1n, ...[JSON.stringify(states), sql(owner)].flatMap((v) => [v, v]), limit)
    .map(wit) } }),
  audit: (scope, key) => ({ tag: "found", val: { events: q("SELECT * FROM audit WHERE scope = ? AND key = ? ORDER BY version")
    .all(scope, key).map((e) => ({ ...wit(e), attempt: e.attempt === null ? undefined : Number(e.attempt) })) } }), // u32
}).map(([name, f]) => [name, answers(f)]));
const { engine, protocol } = instantiate((path) => new WebAssembly.Module(readFileSync(join(dir, path))), {
  "once:core/ledger": ledger, "once:core/clock": { now }, // your provider's authoritative read goes in lookup:
  "once:core/provider": { lookup: (tool, providerKey, args) => ({ tag: "unknown", val: "no lookup in this example" }) },
  "once:core/operator": { escalate: (e) => (console.log("operator, look at:", e.scope, e.key, e.reason), true) } });
const policy = { keyArgument: "idempotency_key", dispatchTimeoutMs: 10000n }; // as the user wrote it; the rest unset
engine.configure({ settings: engine.defaultSettings(), defaults: {}, tools: [{ tool: "refund_order", policy }] }); // or throws
function protect(scope, key, tool, args, send, patienceMs = 3000n) { // the whole protocol, and no rule of the engine
  let step = protocol.start({ scope, keys: [["api", key]], tool, args: JSON.stringify(args), acknowledgeConfirmed: false });
  for (let giveUp = now() + patienceMs, s = step.val; step.tag === "dispatch" || step.tag === "wait"; s = step.val) {
    if (step.tag === "wait" && s.next > giveUp) return s.meanwhile; // stop waiting; show what is known so far
    if (step.tag === "wait") Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Math.max(0, Number(s.next - now())));
    step = step.tag === "wait" ? protocol.resume(s.scope, s.key) : protocol.report(s.scope, s.key, s.fence, // send exactly
      now() >= s.sendBy ? { tag: "not-sent" } : send(JSON.parse(s.args), s.timeoutMs)); // the grant, unless too late
  }
  return step.tag === "done" ? step.val : send(args); // done: the account; direct: send it unprotected
}
const sent = [], refund = (args, timeoutMs) => (sent.push(args), { tag: "success", val: '{"refund_id":"r-1"}' }); // your API
for (const attempt of ["first call", "retry"]) { // the retry reuses the operation key minted before the first attempt
  const a = protect("tenant-7", "refund-1234", "refund_order", { order_id: 1234, amount: 200 }, refund); // the account:
  console.log(`${attempt}: ${a.ending.tag}, effect ${a.effect}, again ${a.repeat}:`, a.ending.val);
  if (sent.length > 1 || a.effect !== "happened") process.exitCode = 1;
}
console.log(`sent ${sent.length} time(s) by this run`); // once, then never again: the ledger outlives the process
