// A refund sent once, over a durable SQLite ledger (better-sqlite3 12). Transpile the component first:
//   npx jco transpile once_guest.wasm -o gen --instantiation sync --name once && node protect.mjs gen [ledger.db]
// Every value crosses typed, in jco's mapping of the WIT: camelCase fields, { tag, val } variants, u64 as BigInt.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import Database from "better-sqlite3";
const dir = resolve(process.argv[2] ?? "gen"), { instantiate } = await import(pathToFileURL(join(dir, "once.js")).href);
const path = process.argv[3] ?? "once-example.db", db = new Database(path).exec(readFileSync(new URL("../../schema/sqlite/ledger.sql",
  import.meta.url), "utf8")); // the engine's rows and its audit trail: the tables the once packages make (schema/sqlite)
const wdb = new Database(`${path}.witness`); // every grant's record, in a file of its own that restoring an older ledger leaves
wdb.pragma("journal_mode = WAL"); wdb.pragma("synchronous = FULL"); // alone (the format the once packages keep beside theirs)
wdb.exec(readFileSync(new URL("../../schema/witness/sqlite.sql", import.meta.url), "utf8"));
const witnessed = (f, failed) => (...args) => { try { return f(...args); } catch (e) { return failed(String(e)); } };
const q = ((cache) => (text) => (cache[text] ??= db.prepare(text).safeIntegers(true)))({}); // u64s as BigInt, like jco
const sql = (v) => (typeof v === "number" ? BigInt(v) : v ?? null); // an integer as SQLite's, or NULL for an unset option
const wit = (r) => r && { table: r.tbl, scope: r.scope, key: r.key, version: r.version, state: r.state ?? undefined,
  dueAt: r.due_at ?? undefined, owner: r.owner ?? undefined, body: r.body }; // a stored row as the WIT's `row`
function put({ table, scope, key, expected, row }) { // insert if absent, update or delete at the expected version; or
  const at = [table, scope, key]; // assert the row is absent (no row, no expected version)
  if (!row && expected === undefined) return { changes: q("SELECT 1 FROM rows WHERE tbl = ? AND scope = ? AND key = ?").get(...at) ? 0 : 1 };
  if (!row) return q("DELETE FROM rows WHERE tbl = ? AND scope = ? AND key = ? AND version = ?").run(...at, expected);
  const fields = [row.version, row.state, row.dueAt, row.body, row.owner].map(sql);
  if (expected === undefined) return q("INSERT OR IGNORE INTO rows VALUES (?,?,?,?,?,?,?,?)").run(...at, ...fields);
  return q("UPDATE rows SET version = ?, state = ?, due_at = ?, body = ?, owner = ? WHERE tbl = ? AND scope = ? AND key = ? AND "
    + "version = ?").run(...fields, ...at, expected);
}
const CONFLICT = new Error("conflict"), apply = db.transaction(({ puts, events }) => { // one atomic batch: every put applies,
  const event = (e) => q("INSERT OR IGNORE INTO audit VALUES (?,?,?,?,?,?,?,?,?)").run(...[e.scope, e.key, e.version, e.at, // or none
    e.kind, e.fromState, e.toState, e.attempt, e.detail].map(sql));
  if (!puts.every((p) => put(p).changes === 1) || !events.every((e) => event(e).changes === 1)) throw CONFLICT;
});
const failed = (e) => ({ tag: "failed", val: { message: String(e) } }); // a store failure: the `failed` answer
const answers = (f) => (...args) => { try { return f(...args); } catch (e) { return e === CONFLICT ? { tag: "conflict" } : failed(e); } };
const now = ((last) => () => (last = [last, BigInt(Date.now())].reduce((a, b) => (a > b ? a : b))))(0n); // never backwards
const ledger = Object.fromEntries(Object.entries({ // the engine's I/O, and nothing else
  get: (...at) => ((r) => (r ? { tag: "found", val: { version: r.version, body: r.body } } : { tag: "missing" }))(
    q("SELECT version, body FROM rows WHERE tbl = ? AND scope = ? AND key = ?").get(...at)),
  commit: (batch) => (apply.immediate(batch), { tag: "applied" }),
  scan: (table, states, before, owner, limit) => ({ tag: "found", val: { rows: q("SELECT * FROM rows WHERE tbl = ? AND due_at <= ? "
    + "AND (? = '[]' OR state IN (SELECT value FROM json_each(?))) AND (? IS NULL OR owner = ?) ORDER BY due_at, scope, key LIMIT ?")
    .all(table, before < 2n ** 63n ? before : 2n ** 63n - 1n, ...[JSON.stringify(states), sql(owner)].flatMap((v) => [v, v]), limit)
    .map(wit) } }),
  audit: (scope, key) => ({ tag: "found", val: { events: q("SELECT * FROM audit WHERE scope = ? AND key = ? ORDER BY version")
    .all(scope, key).map((e) => ({ scope: e.scope, key: e.key, version: e.version, at: e.at, kind: e.kind, fromState: e.from_state
      ?? undefined, toState: e.to_state ?? undefined, attempt: e.attempt === null ? undefined : Number(e.attempt), detail: e.detail })) } }),
}).map(([name, f]) => [name, answers(f)]));
const unused = () => '{"Failed":{"message":"this host answers the typed ledger"}}'; // ledger-json's get, commit: never called
const { engine, driver } = instantiate((path) => new WebAssembly.Module(readFileSync(join(dir, path))), {
  "once:core/ledger": ledger, "once:core/ledger-json": { get: unused, commit: unused }, "once:core/clock": { now },
  "once:core/provider": { lookup: (tool, providerKey, args) => ({ tag: "unknown", val: "no lookup in this example" }) }, // yours
  "once:core/operator": { escalate: (e) => (console.log("operator, look at:", e.scope, e.key, e.reason), true) },
  "once:core/entropy": { fill: (n) => new Uint8Array(randomBytes(n)) }, // the ledger's provider-key secret is made of these
  "once:core/witness": {
    seen: witnessed((scope, key) => ((r) => (r ? { tag: "kept", val: r.body } : { tag: "nothing" }))(
      wdb.prepare("SELECT body FROM witness WHERE scope = ? AND key = ?").get(scope, key)), (why) => ({ tag: "failed", val: why })),
    keep: witnessed((scope, key, body, at) => void wdb.prepare("INSERT INTO witness VALUES (?,?,?,?) ON CONFLICT (scope, key) "
      + "DO UPDATE SET at = excluded.at, body = excluded.body WHERE excluded.at >= witness.at").run(scope, key, at, body), (why) => why),
    forget: witnessed((scope, key, before) => void wdb.prepare("DELETE FROM witness WHERE scope = ? AND key = ? AND at < ?")
      .run(scope, key, before < 2n ** 63n ? before : 2n ** 63n - 1n),
      (why) => why) } });
const policy = { keyArgument: "idempotency_key", dispatchTimeoutMs: 10000n }; // as the user wrote it; the rest unset
engine.configure({ settings: engine.defaultSettings(), defaults: {}, tools: [{ tool: "refund_order", policy }],
  ledgerEncoding: "typed", reads: "import" }); // or throws, as every export does with the engine's error as `.payload`
function protect(scope, key, tool, args, send, patienceMs = 3000n) { // the whole protocol, and no rule of the engine
  let step = driver.start({ scope, keys: [["api", key]], tool, args: JSON.stringify(args), acknowledgeConfirmed: false });
  for (const giveUp = now() + patienceMs; step.tag === "dispatch" || step.tag === "wait"; ) {
    const { tag, val } = step;
    if (tag === "wait" && val.next > giveUp) return val.meanwhile; // stop waiting; show what is known so far
    if (tag === "wait") Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Math.max(0, Number(val.next - now())));
    step = tag === "wait" ? driver.resume(val.scope, val.key) : driver.report(val.scope, val.key, val.fence, // send exactly the
      now() >= val.sendBy ? { tag: "not-sent" } : send(JSON.parse(val.args), val.timeoutMs)); // grant, unless too late to start
  }
  return step.tag === "direct" ? send(args) : step.val; // done: the account; direct: send it unprotected
}
const sent = [], refund = (args, timeoutMs) => (sent.push(args), { tag: "success", val: '{"refund_id":"r-1"}' }); // your API
for (const attempt of ["first call", "retry"]) { // the retry reuses the operation key minted before the first attempt
  const a = protect("tenant-7", "refund-1234", "refund_order", { order_id: 1234, amount: 200 }, refund); // the account:
  console.log(`${attempt}: ${a.ending.tag}, effect ${a.effect}, again ${a.repeat}:`, a.ending.val);
  if (sent.length > 1 || a.effect !== "happened") process.exitCode = 1;
}
console.log(`sent ${sent.length} time(s) by this run`); // once, then never again: the ledger outlives the process
