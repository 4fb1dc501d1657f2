// A refund sent once, over a durable SQLite ledger (better-sqlite3 12). Transpile the component first:
//   npx jco transpile once_guest.wasm -o gen --instantiation sync --name once && node protect.mjs gen [ledger.db]
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import Database from "better-sqlite3";
const dir = resolve(process.argv[2] ?? "gen"), { instantiate } = await import(pathToFileURL(join(dir, "once.js")).href);
const db = new Database(process.argv[3] ?? "once-example.db").exec(readFileSync(new URL("../../schema/sqlite/ledger.sql",
  import.meta.url), "utf8")); // the engine's rows and its audit trail: the tables the once packages make (schema/sqlite),
// rows (tbl, scope, key, version, state, due_at, body, owner) and audit (scope, key, version, at, kind, from_state, ...)
const q = ((cache) => (text) => (cache[text] ??= db.prepare(text).safeIntegers(true)))({}); // u64s as BigInt, like jco
const NAMES = { tbl: "table", due_at: "dueAt", from_state: "fromState", to_state: "toState" }; // columns: jco's fields
const wit = (r) => r && Object.fromEntries(Object.entries(r).map(([k, v]) => [NAMES[k] ?? k, v ?? undefined])); // NULL: unset
const sql = (v) => (typeof v === "number" ? BigInt(v) : v ?? null); // an integer as SQLite's, or NULL for an unset option
const kebab = (name) => name && name.replace(/(?<!^)(?=[A-Z])/g, "-").toLowerCase(); // the JSON form's InFlight is in-flight
const exact = (text) => JSON.parse(text.replace(/"(?:[^"\\]|\\.)*"|-?\d{16,}/g, (m) => (m[0] === '"' ? m : `{"u64":"${m}"}`)),
  (_, v) => (v?.u64 !== undefined ? BigInt(v.u64) : v)); // JSON text, integers past 2^53 (due-at i64::MAX) exact
function put({ table, scope, key, expected, row }, body) { // insert if absent, update or delete at the expected version; or
  const at = [kebab(table), scope, key]; // assert the row is absent (no row, no expected version)
  if (!row && expected === null) return { changes: q("SELECT 1 FROM rows WHERE tbl = ? AND scope = ? AND key = ?").get(...at) ? 0 : 1 };
  if (!row) return q("DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?").run(...at, sql(expected));
  const fields = [row.version, kebab(row.state), row.due_at, body, row.owner].map(sql);
  if (expected === null) return q("INSERT OR IGNORE INTO rows VALUES (?,?,?,?,?,?,?,?)").run(...at, ...fields);
  return q("UPDATE rows SET version = ?, state = ?, due_at = ?, body = ?, owner = ? WHERE tbl = ? AND scope = ? AND key = ? AND "
    + "version = ?").run(...fields, ...at, sql(expected));
}
const CONFLICT = new Error("conflict"), apply = db.transaction((puts, bodies, events) => { // one atomic batch: every put
  const event = (e) => q("INSERT OR IGNORE INTO audit VALUES (?,?,?,?,?,?,?,?,?)").run(...Object.entries(e) // applies, or none
    .map(([k, v]) => sql(k.endsWith("state") ? kebab(v) : v))); // an audit event's fields come in WIT order
  if (!puts.every((p) => put(p, p.row && bodies.shift()).changes === 1) || !events.every((e) => event(e).changes === 1)) throw CONFLICT;
});
const answers = (f, text) => (...args) => { try { return f(...args); } catch (e) { // a store failure: the `failed` answer
  if (e === CONFLICT) return '"Conflict"'; // (get and commit answer the JSON form of `got` / `committed`)
  return text ? JSON.stringify({ Failed: { message: String(e) } }) : { tag: "failed", val: { message: String(e) } }; } };
const now = ((last) => () => (last = [last, BigInt(Date.now())].reduce((a, b) => (a > b ? a : b))))(0n); // never backwards
const ledger = Object.fromEntries(Object.entries({ // the engine's I/O, and nothing else
  get: (...at) => ((r) => (r ? `{"Found":{"version":${r.version},"body":${JSON.stringify(r.body)}}}` : '"Missing"'))(
    q("SELECT version, body FROM rows WHERE tbl = ? AND scope = ? AND key = ?").get(...at)), // the JSON form of `got`
  commit: (batch, bodies) => ((head) => (apply.immediate(head.puts, [...bodies], head.events), '"Applied"'))(exact(batch)),
  scan: (table, states, before, owner, limit) => ({ tag: "found", val: { rows: q("SELECT * FROM rows WHERE tbl = ? AND due_at <= ? "
    + "AND (? = '[]' OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner = ?) ORDER BY due_at, scope, key LIMIT ?")
    .all(table, before < 2n ** 63n ? before : 2n ** 63n - 1n, ...[JSON.stringify(states), sql(owner)].flatMap((v) => [v, v]), limit)
    .map(wit) } }),
  audit: (scope, key) => ({ tag: "found", val: { events: q("SELECT * FROM audit WHERE scope = ? AND key = ? ORDER BY version")
    .all(scope, key).map((e) => ({ ...wit(e), attempt: e.attempt === null ? undefined : Number(e.attempt) })) } }), // u32
}).map(([name, f]) => [name, answers(f, name === "get" || name === "commit")]));
const unused = () => ({ tag: "failed", val: { message: "answered in ledger-json" } }); // typed get, commit: never called
const { engine, protocol } = instantiate((path) => new WebAssembly.Module(readFileSync(join(dir, path))), {
  "once:core/ledger-json": { get: ledger.get, commit: ledger.commit }, // get and commit as JSON text, as in Python (the npm package answers them typed)
  "once:core/ledger": { ...ledger, get: unused, commit: unused }, "once:core/clock": { now }, // your provider's read goes in lookup:
  "once:core/provider": { lookup: (tool, providerKey, args) => ({ tag: "unknown", val: "no lookup in this example" }) },
  "once:core/operator": { escalate: (e) => (console.log("operator, look at:", e.scope, e.key, e.reason), true) },
  "once:core/entropy": { fill: (n) => new Uint8Array(randomBytes(n)) } }); // the ledger's provider-key secret is made of these
const policy = { keyArgument: "idempotency_key", dispatchTimeoutMs: 10000n }; // as the user wrote it; the rest unset
engine.configure({ settings: engine.defaultSettings(), defaults: {}, tools: [{ tool: "refund_order", policy }],
  ledgerEncoding: "json" }); // or throws
const ok = (text) => ((r) => ("Ok" in r ? r.Ok : process.exit(console.log("refused:", r.Err) ?? 1)))(exact(text)); // result<step, error>
function protect(scope, key, tool, args, send, patienceMs = 3000n) { // the whole protocol, and no rule of the engine
  let step = ok(protocol.start(JSON.stringify({ scope, keys: [["api", key]], tool, args: JSON.stringify(args), supersedes: null,
    acknowledge_confirmed: false }))); // the JSON form of a `call`; each step comes back as the JSON form of a `step`
  for (let giveUp = now() + patienceMs, g, w; (g = step.Dispatch) || (w = step.Wait); ) {
    if (w && BigInt(w.next) > giveUp) return w.meanwhile; // stop waiting; show what is known so far
    if (w) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Math.max(0, Number(BigInt(w.next) - now())));
    step = ok(w ? protocol.resume(w.scope, w.key) : protocol.report(g.scope, g.key, g.fence, // send exactly the grant, unless
      JSON.stringify(now() >= BigInt(g.send_by) ? "NotSent" : send(JSON.parse(g.args), g.timeout_ms)))); // too late to start
  }
  return step === "Direct" ? send(args) : step.Done; // done: the account; direct: send it unprotected
}
const sent = [], refund = (args, timeoutMs) => (sent.push(args), { Success: '{"refund_id":"r-1"}' }); // your API
for (const attempt of ["first call", "retry"]) { // the retry reuses the operation key minted before the first attempt
  const a = protect("tenant-7", "refund-1234", "refund_order", { order_id: 1234, amount: 200 }, refund); // the account:
  const [[ending, info]] = Object.entries(a.ending);
  console.log(`${attempt}: ${ending}, effect ${a.effect}, again ${a.repeat}:`, info);
  if (sent.length > 1 || a.effect !== "Happened") process.exitCode = 1;
}
console.log(`sent ${sent.length} time(s) by this run`); // once, then never again: the ledger outlives the process
