// Integers past 2^53 in the ledger: an absent record with nothing pending is due at i64::MAX
// (9223372036854775807), which crosses from the guest as JSON text (JSON.parse would make it
// 9223372036854775808, a value no SQL integer column holds). Node writes it exactly on SQLite and
// PostgreSQL, and Node, Python (the once-exactly package) and Rust (the `once` CLI) all read it back
// and list the owed dispatch; Node then sends it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import Database from "better-sqlite3";
import { Once, sent } from "../dist/index.js";
import { JS, databaseUrl, once as cli, python, schemaFor, tempDir, withSchema } from "./helpers.mjs";

const ARGS = { order_id: 1234, amount: 200 };
const OWED = 9223372036854775807n;

/** Leave `key` absent, escalated and acknowledged: nothing pending but the owed dispatch, so due at i64::MAX. */
async function owe(location, key) {
  const options = { escalate: () => true, tools: { refund_order: { policy: { resolveDeadlineMs: 1 } } } };
  const o = await Once.open(location, options);
  try {
    const lost = await o.call({ scope: "tenant-7", key, tool: "refund_order", args: ARGS,
      send: async () => sent.ambiguous("connection reset after the request was sent") });
    assert.equal(lost.account.ending.tag, "unknown");
    assert.equal(await o.resolve("tenant-7", key, "absent", "the provider's dashboard shows no refund", true), "absent");
    await sleep(20); // past the absent record's deadline: the sweep escalates it, the sink acknowledges
    const swept = await o.sweep();
    assert.equal(swept.escalated, 1);
    assert.deepEqual(swept.owed, [["tenant-7", key]]);
    const [entry] = (await o.queue()).entries;
    assert.equal(entry.attention, "absent");
    assert.equal(entry.escalationAcknowledged, true);
  } finally {
    await o.close();
  }
}

/** Python and Rust read the row and list the owed dispatch; Node sends it, once, and the record is confirmed. */
async function readEverywhere(py, location, key, version) {
  const fromPython = JSON.parse(execFileSync(py, [join(JS, "test", "children", "python-owed.py"), location, "tenant-7", key],
    { encoding: "utf8" }).trim().split("\n").pop());
  assert.deepEqual(fromPython, { state: "absent", version, owed: [["tenant-7", key]] });
  assert.match(cli("ledger", "list", "--db", location), new RegExp(`tenant-7\\s+${key}\\s+absent\\s+${version}\\b`));
  assert.match(cli("ledger", "show", "--db", location, "--scope", "tenant-7", key), /state\s+absent \(escalated\)/);
  assert.match(cli("sweep", "--db", location), new RegExp(`owed 1 .*\\nowed dispatch: tenant-7 ${key}\\n`, "s"));

  const node = await Once.open(location);
  try {
    assert.deepEqual((await node.sweep()).owed, [["tenant-7", key]]);
    let sends = 0;
    const called = await node.resume("tenant-7", key, async (d) => {
      sends++;
      assert.equal(d.attempt, 2);
      return sent.success({ refund_id: "r-owed" });
    });
    assert.equal(called.account.ending.tag, "confirmed");
    assert.equal(sends, 1);
    assert.deepEqual((await node.sweep()).owed, []);
  } finally {
    await node.close();
  }
  assert.match(cli("ledger", "list", "--db", location), new RegExp(`tenant-7\\s+${key}\\s+confirmed`));
}

test("SQLite: a row due at i64::MAX is stored exactly, and Node, Python and Rust read it and list the owed dispatch", async (t) => {
  const py = python(t);
  if (!py) return;
  const file = join(tempDir(t), "ledger.db");
  await owe(file, "refund-owed");
  const db = new Database(file, { readonly: true });
  const row = db.prepare("SELECT state, due_at, version, typeof(due_at) AS kind FROM rows WHERE tbl = 'operation' AND key = ?")
    .safeIntegers(true).get("refund-owed");
  db.close();
  assert.deepEqual(row, { state: "absent", due_at: OWED, version: row.version, kind: "integer" });
  await readEverywhere(py, file, "refund-owed", Number(row.version));
});

test("PostgreSQL: a row due at i64::MAX is stored exactly, and Node, Python and Rust read it and list the owed dispatch", async (t) => {
  const py = python(t);
  const url = databaseUrl(t);
  if (!py || !url) return;
  const schema = await schemaFor(t, url);
  const location = withSchema(url, schema);
  await owe(location, "refund-owed");
  const pg = (await import("pg")).default;
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const { rows } = await c.query(`SELECT state, due_at::text AS due_at, version::int AS version FROM ${schema}.rows WHERE tbl = 'operation' AND key = $1`,
    ["refund-owed"]);
  await c.end();
  assert.equal(rows.length, 1);
  assert.equal(rows[0].state, "absent");
  assert.equal(rows[0].due_at, OWED.toString());
  await readEverywhere(py, location, "refund-owed", rows[0].version);
});
