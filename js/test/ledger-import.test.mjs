// The ledger import (src/ledger.ts) over the package's SQLite store: a typed batch as jco hands it, u64s
// exact both ways, a row that is not its put's refused whole, and the JSON encoding answered failed.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { ledgerImports, ledgerJsonImports } from "../dist/ledger.js";
import { SqliteStore } from "../dist/stores/sqlite.js";
import { tempDir } from "./helpers.mjs";

const I64_MAX = 9223372036854775807n;

/** A typed batch as jco hands it to `ledger.commit`: an absent record due at `dueAt`, a tombstone check, its event. */
const batch = (dueAt, key = "k") => ({
  puts: [
    {
      table: "operation", scope: "s", key, expected: undefined,
      row: { table: "operation", scope: "s", key, version: 1n, state: "absent", dueAt, owner: "default", body: '{"owed":true}' },
    },
    { table: "tombstone", scope: "s", key, expected: undefined, row: undefined },
  ],
  events: [{ scope: "s", key, version: 1n, at: 1796282924516n, kind: "begin", fromState: undefined, toState: "absent",
    attempt: undefined, detail: "{}" }],
  deferrable: false,
});

test("the ledger import over the package's SQLite store: a row due at i64::MAX is written, read and scanned exactly", (t) => {
  const store = new SqliteStore({ path: join(tempDir(t), "ledger.db") });
  t.after(() => store.close());
  const ledger = ledgerImports(store);
  assert.deepEqual(ledger.get("operation", "s", "k"), { tag: "missing" });
  assert.deepEqual(ledger.commit(batch(I64_MAX)), { tag: "applied" });
  assert.deepEqual(ledger.get("operation", "s", "k"), { tag: "found", val: { version: 1n, body: '{"owed":true}' } });
  // The same insert again: the row exists.
  assert.deepEqual(ledger.commit(batch(I64_MAX)), { tag: "conflict" });
  const scanned = ledger.scan("operation", ["absent"], I64_MAX, "default", 10);
  assert.equal(scanned.tag, "found");
  assert.equal(scanned.val.rows[0].dueAt, I64_MAX);
  // One before it lists nothing: the stored value is i64::MAX, not a rounding of it.
  assert.equal(ledger.scan("operation", [], I64_MAX - 1n, undefined, 10).val.rows.length, 0);
  // A row that is not its put's is refused whole, saying which; a due-at past i64 is the store's refusal.
  for (const [field, value, put] of [["table", "quota", 0], ["scope", "elsewhere", 0], ["key", "k4", 0], ["key", "k4", 2]]) {
    const stray = batch(1n, "k3");
    // A third put, writing a row of its own, so a stray row can come after a row-less put.
    stray.puts.push({ ...stray.puts[0], table: "quota", row: { ...stray.puts[0].row, table: "quota", state: undefined } });
    stray.puts[put].row[field] = value;
    const refused = ledger.commit(stray);
    assert.equal(refused.tag, "failed", `${field} of puts/${put}`);
    assert.match(refused.val.message, new RegExp(`^ledger\\.commit: puts/${put}: the row is not the put's`));
  }
  const past = ledger.commit(batch(I64_MAX + 1n, "k2"));
  assert.equal(past.tag, "failed");
  assert.match(past.val.message, /due_at 9223372036854775808 exceeds i64::MAX/);
  assert.deepEqual(ledger.get("operation", "s", "k2"), { tag: "missing" });
  for (const [table, scope, key] of [["operation", "s", "k3"], ["quota", "s", "k3"], ["operation", "elsewhere", "k3"], ["operation", "s", "k4"]]) {
    assert.deepEqual(ledger.get(table, scope, key), { tag: "missing" }, `${table}/${scope}/${key}`);
  }
  // A put with no row passes the check: a well-placed batch with one (the tombstone check) applies.
  assert.deepEqual(ledger.commit(batch(1n, "k5")), { tag: "applied" });
  assert.equal(store.counts().events, 2);
  // The JSON encoding is not this host's: it answers failed, never missing or applied.
  const json = ledgerJsonImports();
  assert.match(JSON.parse(json.get("operation", "s", "k")).Failed.message, /typed ledger only/);
  assert.match(JSON.parse(json.commit("{}", [])).Failed.message, /typed ledger only/);
});
