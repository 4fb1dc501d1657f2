// Three hosts, one ledger: records cross between Node, Python (the once-exactly package) and Rust
// (the `once` CLI) on one SQLite file and one PostgreSQL schema.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHmac } from "node:crypto";
import { join } from "node:path";
import { test } from "node:test";
import { Once, sent } from "../dist/index.js";
import Database from "better-sqlite3";
import { JS, databaseUrl, once, python, schemaFor, tempDir, withSchema } from "./helpers.mjs";

const ARGS = { order_id: 1234, amount: 200 };

/** One call from the Python package on `location`; how it ended, as python-host.py prints it. */
function fromPython(py, location, key, args, action, receipt) {
  const out = execFileSync(py, [join(JS, "test", "children", "python-host.py"), location, "tenant-7", key,
    JSON.stringify(args), action, ...(receipt ? [JSON.stringify(receipt)] : [])], { encoding: "utf8" });
  return JSON.parse(out.trim().split("\n").pop());
}

async function fromNode(location, key, args, receipt) {
  let sends = 0;
  let providerKey;
  const node = await Once.open(location);
  try {
    const called = await node.call({ scope: "tenant-7", key, tool: "refund_order", args,
      send: async (d) => (sends++, (providerKey ??= d.providerKey), sent.success(receipt ?? { refund_id: "SENT-BY-A-REPLAY" })) });
    return { ending: called.account.ending, sends, providerKey };
  } finally {
    await node.close();
  }
}

async function threeHosts(py, location) {
  // Node confirms; Python replays Node's receipt without sending.
  const node = await fromNode(location, "refund-node", ARGS, { refund_id: "r-node" });
  assert.equal(node.ending.tag, "confirmed");
  let py1 = fromPython(py, location, "refund-node", ARGS, "replay");
  assert.deepEqual(py1, { ending: "Confirmed", receipt: '{"refund_id":"r-node"}', replayed: true, sends: 0, provider_key: null });
  // The same key with another payload is a conflict, whichever host asks.
  py1 = fromPython(py, location, "refund-node", { ...ARGS, amount: 300 }, "replay");
  assert.equal(py1.ending, "Conflict");
  assert.equal(py1.sends, 0);

  // Python confirms; Node replays Python's receipt without sending.
  const py2 = fromPython(py, location, "refund-py", ARGS, "confirm", { refund_id: "r-py" });
  const { provider_key: pyKey, ...py2Call } = py2;
  assert.deepEqual(py2Call, { ending: "Confirmed", receipt: '{"refund_id":"r-py"}', replayed: false, sends: 1 });
  const again = await fromNode(location, "refund-py", ARGS);
  assert.equal(again.ending.tag, "confirmed");
  assert.equal(again.ending.val.replayed, true);
  assert.deepEqual(JSON.parse(again.ending.val.receipt), { refund_id: "r-py" });
  assert.equal(again.sends, 0);

  // Python loses a reply (unknown, no lookup); Rust's operator resolves it; Node replays the resolution.
  const lost = fromPython(py, location, "refund-lost", ARGS, "lose");
  assert.equal(lost.ending, "Unknown");
  assert.equal(lost.sends, 1);
  assert.match(once("ledger", "list", "--db", location), /tenant-7\s+refund-lost\s+unknown/);
  once("ledger", "resolve", "--db", location, "--scope", "tenant-7", "refund-lost",
    "--confirmed", '{"refund_id":"r-lost","by":"operator"}', "--note", "found in the provider's dashboard");
  const settled = await fromNode(location, "refund-lost", ARGS);
  assert.equal(settled.ending.tag, "confirmed");
  assert.deepEqual(JSON.parse(settled.ending.val.receipt), { refund_id: "r-lost", by: "operator" });
  assert.equal(settled.sends, 0);

  const list = once("ledger", "list", "--db", location);
  for (const key of ["refund-node", "refund-py", "refund-lost"]) assert.match(list, new RegExp(`tenant-7\\s+${key}\\s+confirmed`));
  return { node: node.providerKey, python: pyKey };
}

/**
 * The provider key of (scope, key) under the secret an SQLite ledger keeps (guest/src/secret.rs):
 * HMAC-SHA-256 of the RFC 8785 array `["once-provider-key", scope, key]`, computed here apart from
 * the component, so every host's key is checked against one derivation.
 */
function keyUnderLedgerSecret(location, scope, key) {
  const secret = Buffer.from(secretHex(location), "hex");
  return "once-" + createHmac("sha256", secret).update(JSON.stringify(["once-provider-key", scope, key])).digest("hex");
}

/** The secret an SQLite ledger keeps, hex, read from its reserved row. */
function secretHex(location) {
  const db = new Database(location, { readonly: true });
  try {
    const row = db.prepare("SELECT body FROM rows WHERE tbl = 'quota' AND scope = '' AND key = 'once:provider-key-secret'").get();
    assert.ok(row, "the ledger keeps its provider-key secret");
    return JSON.parse(row.body).secret;
  } finally {
    db.close();
  }
}

test("SQLite: one file, three hosts (Node, Python, Rust): each replays, conflicts with and resolves the others' records", async (t) => {
  const py = python(t);
  if (!py) return;
  const location = join(tempDir(t), "ledger.db");
  const keys = await threeHosts(py, location);
  // Node and Python derived their keys with the one secret the ledger keeps (the first host made it),
  // and Rust's CLI shows each record's stored key: the same, and none computable without the secret.
  assert.equal(keys.node, keyUnderLedgerSecret(location, "tenant-7", "refund-node"));
  assert.equal(keys.python, keyUnderLedgerSecret(location, "tenant-7", "refund-py"));
  const shown = once("ledger", "show", "--db", location, "--scope", "tenant-7", "refund-py");
  assert.ok(shown.includes(keys.python), shown);
  assert.ok(!shown.includes(secretHex(location)), "the CLI never shows the secret");
});

test("PostgreSQL: one schema, three hosts (Node, Python, Rust): each replays, conflicts with and resolves the others' records", async (t) => {
  const py = python(t);
  const url = databaseUrl(t);
  if (!py || !url) return;
  await threeHosts(py, withSchema(url, await schemaFor(t, url)));
});
