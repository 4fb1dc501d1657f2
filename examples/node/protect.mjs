// Protect a side-effecting call with the once component, hosted by Node.js. Transpile the component first:
//   npx jco transpile once_guest.wasm -o gen --instantiation sync --name once && node protect.mjs gen
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const dir = resolve(process.argv[2] ?? "gen");
const { instantiate } = await import(pathToFileURL(join(dir, "once.js")).href);
const rows = new Map(); // the ledger (in memory here): versioned rows ...
const events = new Map(); // ... and append-only audit events
const id = (...parts) => parts.join("\u0000");
const by = (field) => (a, b) => (a[field] < b[field] ? -1 : a[field] > b[field] ? 1 : 0);

const ledger = {
  get: (table, scope, key) => rows.get(id(table, scope, key)),
  commit({ puts, events: batchEvents }) {
    // One atomic batch of compare-and-swap puts and audit events: all of it, or nothing.
    const stale = puts.some((p) => rows.get(id(p.table, p.scope, p.key))?.version !== p.expected);
    const repeated = batchEvents.some((e) => events.has(id(e.scope, e.key, e.version)));
    if (stale || repeated) throw { payload: { tag: "conflict" } }; // a thrown payload is the WIT error
    for (const p of puts) rows.set(id(p.table, p.scope, p.key), p.row); // undefined: deleted
    for (const e of batchEvents) events.set(id(e.scope, e.key, e.version), e);
  },
  scan: (table, states, before, owner, limit) =>
    [...rows.values()]
      .filter((r) => r?.table === table && r.dueAt !== undefined && r.dueAt <= before)
      .filter((r) => states.length === 0 || states.includes(r.state))
      .filter((r) => owner === undefined || r.owner === owner)
      .sort(by("dueAt"))
      .slice(0, limit),
  audit: (scope, key) => [...events.values()].filter((e) => e.scope === scope && e.key === key).sort(by("version")),
};
const imports = {
  "once:core/ledger": ledger,
  "once:core/clock": {
    now: () => BigInt(Date.now()),
    getSettings: () => ({ maxInputBytes: 1 << 20, maxDepth: 128, maxKeyBytes: 512, clockSkewMs: 0n, owner: "default" }),
  },
  // Reconciliation's authoritative read of your provider goes here.
  "once:core/provider": { lookup: (tool, providerKey, args) => ({ tag: "unknown", val: "no lookup configured" }) },
  "once:core/operator": { escalate: (e) => (console.log("operator, look at:", e.scope, e.key, e.reason), true) },
};
const once = instantiate((path) => new WebAssembly.Module(readFileSync(join(dir, path))), imports).engine;

// begin; send only on execute, then finish; a repeat of a done call gets the stored receipt. Bad input throws.
function protect(scope, key, tool, args, send) {
  const request = { scope, keys: [["api", key]], tool, args: JSON.stringify(args), policy: once.defaultPolicy() };
  const d = once.begin({ ...request, acknowledgeConfirmed: false });
  if (d.tag !== "execute") return [d.tag, d.tag === "replay" ? d.val.receipt : d.val]; // in-flight, unknown, ...
  const outcome = send(JSON.parse(d.val.args), d.val.providerKey); // success, rejected, ambiguous, not-sent
  once.finish(scope, key, d.val.fence, outcome);
  return [outcome.tag, outcome.val];
}

const sent = [];
const refund = (args, idempotencyKey) => (sent.push(args), { tag: "success", val: '{"refund_id":"r-1"}' });
for (const attempt of ["first call", "retry"]) { // the retry reuses the key minted before the first attempt
  const args = { order_id: 1234, amount: 200 };
  console.log(`${attempt}:`, protect("tenant-7", "refund-1234", "refund_order", args, refund));
}
if (sent.length !== 1) throw new Error(`the refund was sent ${sent.length} times`);
