// The same ledger format as the Rust host: `once ledger list/show/resolve` on a
// Node-written SQLite file and PostgreSQL schema, and records crossing Rust and Node both ways.
import assert from "node:assert/strict";
import { test } from "node:test";
import { join } from "node:path";
import { Once, sent } from "../dist/index.js";
import { binary, databaseUrl, execFileSync, once, schemaFor, tempDir, withSchema } from "./helpers.mjs";

const ARGS = { order_id: 1234, amount: 200 };

/** Node leaves one record confirmed and one unknown (a lost reply, no lookup); Rust resolves the unknown; Node replays it. */
async function crossing(location, scopeArgs) {
  let sends = 0;
  const node = await Once.open(location);
  const done = await node.call({ scope: "tenant-7", key: "refund-1", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.success({ refund_id: "r-1" })) });
  assert.equal(done.account.ending.tag, "confirmed");
  const lost = await node.call({ scope: "tenant-7", key: "refund-2", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.ambiguous("connection reset after the request was sent")) });
  assert.equal(lost.account.ending.tag, "unknown");
  await node.close();

  // Rust reads what Node wrote.
  const list = once("ledger", "list", "--db", location);
  assert.match(list, /tenant-7\s+refund-1\s+confirmed\s+2/);
  assert.match(list, /tenant-7\s+refund-2\s+unknown/);
  const show = once("ledger", "show", "--db", location, "--scope", "tenant-7", "refund-1");
  assert.match(show, /r-1/);
  // Rust writes: an operator's resolution of Node's unknown record.
  once("ledger", "resolve", "--db", location, "--scope", "tenant-7", "refund-2",
    "--confirmed", '{"refund_id":"r-2","by":"operator"}', "--note", "read from the provider's dashboard", ...scopeArgs);

  // Node reads what Rust wrote: the receipt replays, nothing is sent again.
  const again = await Once.open(location);
  const replay = await again.call({ scope: "tenant-7", key: "refund-2", tool: "refund_order", args: ARGS,
    send: async () => (sends++, sent.success({ refund_id: "WRONG" })) });
  assert.equal(replay.account.ending.tag, "confirmed");
  assert.equal(replay.account.ending.val.replayed, true);
  assert.deepEqual(JSON.parse(replay.account.ending.val.receipt), { refund_id: "r-2", by: "operator" });
  const view = await again.inspect("tenant-7", "refund-2");
  assert.ok(view.audit.some((e) => e.kind === "operator-confirmed"), `an operator event in ${view.audit.map((e) => e.kind)}`);
  await again.close();
  assert.equal(sends, 2);
}

test("SQLite: once ledger list/show/resolve on a Node-written file; Rust and Node records cross", async (t) => {
  await crossing(join(tempDir(t), "ledger.db"), []);
});

test("SQLite: a record the Rust host created (host/once/examples/embed.rs) is answered by Node as Rust left it", async (t) => {
  const dir = tempDir(t);
  const embed = binary("ONCE_EMBED", "examples/embed", "cargo build -p once-host --example embed");
  execFileSync(embed, [], { cwd: dir, stdio: "ignore" });
  // The example's sender sends nothing: Rust spent the attempt budget, each attempt not sent.
  assert.match(once("ledger", "list", "--db", join(dir, "once.db")), /tenant-7\s+refund-order-1234\s+failed/);
  const node = await Once.sqlite(join(dir, "once.db"));
  let sends = 0;
  const called = await node.call({ scope: "tenant-7", key: "refund-order-1234", tool: "refund_order",
    argsJson: '{"order_id":1234,"amount":200}', send: async () => (sends++, sent.success({ refund_id: "r-9" })) });
  assert.equal(called.account.ending.tag, "not-sent");
  assert.equal(called.account.ending.val.attempts, 3);
  assert.equal(called.account.repeat, "refused");
  // A different payload under Rust's key is a conflict with Rust's record.
  const changed = await node.call({ scope: "tenant-7", key: "refund-order-1234", tool: "refund_order",
    args: { order_id: 1234, amount: 300 }, send: async () => (sends++, sent.success({})) });
  assert.equal(changed.account.ending.tag, "conflict");
  assert.equal(changed.account.ending.val.args, '{"amount":200,"order_id":1234}');
  await node.close();
  assert.equal(sends, 0);
});

test("PostgreSQL: once ledger list/show/resolve on a Node-written schema; Rust and Node records cross", async (t) => {
  const url = databaseUrl(t);
  if (!url) return;
  const schema = await schemaFor(t, url);
  await crossing(withSchema(url, schema), []);
});
