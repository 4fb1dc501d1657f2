// Older history (DESIGN.md "Authority"; docs/design.md "Older history") through the npm package: a ledger
// restored from an older backup must not re-send what the newer history had. An SQLite ledger's witness,
// `<ledger>.witness`, keeps the record of every attempt the engine hands out where copying the backup over
// the ledger file does not reach; before it grants, the engine finds there what the restored ledger lost,
// writes it back (`restored-from-witness`), and a read of the provider settles it once its lease has ended.
//
// The control writes down what cannot be detected: restore the witness along with the ledger (here: delete
// it) and the retry is sent again.
import assert from "node:assert/strict";
import { copyFileSync, existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import Database from "better-sqlite3";
import { Once, evidence } from "../dist/index.js";
import { MemoryStore } from "../dist/stores/memory.js";
import { SqliteStore, witnessPath } from "../dist/stores/sqlite.js";
import { tempDir } from "./helpers.mjs";

const SCOPE = "shop";

/**
 * A payment provider that applies every refund request it gets (it deduplicates nothing), keeping the key
 * each was sent under as metadata its read can search by: a duplicate send is a second refund.
 */
function paymentProvider() {
  const refunds = [];
  const provider = {
    refunds,
    /** How many times the provider was read. */
    reads: 0,
    /** The refund for one order, as the application's protected function sends it. */
    refund: async ({ order_id, amount }, dispatch) => {
      const receipt = { refund_id: `re_${refunds.length + 1}`, order_id, amount };
      refunds.push({ providerKey: dispatch.providerKey, receipt });
      return receipt;
    },
    /** The provider's authoritative read: the refund sent under this key, if any. */
    lookup: ({ providerKey, now }) => {
      provider.reads += 1;
      const found = refunds.find((r) => r.providerKey === providerKey);
      return found ? evidence.confirmed(found.receipt) : evidence.absent(now);
    },
    ofOrder: (order_id) => refunds.filter((r) => r.receipt.order_id === order_id),
  };
  return provider;
}

/**
 * A handle on the SQLite ledger at `path` whose refunds go to `provider`. A short dispatch timeout and lease
 * (the least the engine accepts: timeout + 200 ms margin), so a restored attempt's lease ends within the call's
 * wait instead of half a minute later.
 */
function open(path, provider) {
  return Once.sqlite(path, {
    tools: { refund_order: { lookup: provider.lookup, policy: { dispatchTimeoutMs: 1000, leaseMs: 1200 } } },
    waitMs: 20_000,
  });
}

const refundOf = (once, provider) =>
  once.protect("refund_order", provider.refund, { key: ({ order_id }) => `refund-order-${order_id}`, scope: SCOPE });

/** An operator's online backup of the ledger file (SQLite's backup API: a consistent copy of a ledger in use). */
async function backUp(path, to) {
  const db = new Database(path, { readonly: true });
  try {
    await db.backup(to);
  } finally {
    db.close();
  }
}

/** Copy the backup over the ledger (the handle closed), its WAL and shared memory gone with the newer history. */
function restore(backup, path) {
  rmSync(`${path}-wal`, { force: true });
  rmSync(`${path}-shm`, { force: true });
  copyFileSync(backup, path);
}

/**
 * The history both cases share: an earlier refund (so the backup is of a ledger in use), the backup, then the
 * refund of order 1234 that the backup does not hold, applied once. The handle is closed after it.
 */
async function historyAfterTheBackup(t) {
  const dir = tempDir(t);
  const [path, backup] = [join(dir, "ledger.db"), join(dir, "backup.db")];
  const provider = paymentProvider();
  const once = await open(path, provider);
  try {
    const refund = refundOf(once, provider);
    await refund({ order_id: 1000, amount: 15 });
    await backUp(path, backup);
    const receipt = await refund({ order_id: 1234, amount: 200 });
    assert.deepEqual(receipt, { refund_id: "re_2", order_id: 1234, amount: 200 });
    assert.equal(provider.ofOrder(1234).length, 1);
    // The witness is a file of its own beside the ledger: what copying the backup over the ledger leaves alone.
    assert.equal(witnessPath(path), `${path}.witness`);
    assert.ok(existsSync(`${path}.witness`));
    return { path, backup, provider, receipt };
  } finally {
    await once.close();
  }
}

test("older history: restoring an older ledger backup and retrying re-ran a payment (the witness replays it)", async (t) => {
  const { path, backup, provider, receipt } = await historyAfterTheBackup(t);
  restore(backup, path);

  const once = await open(path, provider);
  t.after(() => once.close());
  // The restored ledger has never heard of order 1234.
  assert.equal(await once.inspect(SCOPE, "refund-order-1234"), undefined);
  const refundsBefore = provider.refunds.length;
  const readsBefore = provider.reads;
  const again = await refundOf(once, provider)({ order_id: 1234, amount: 200 });

  // One refund at the provider, and the retry answered with its receipt, read back from the provider.
  assert.equal(provider.ofOrder(1234).length, 1, JSON.stringify(provider.refunds));
  assert.equal(provider.refunds.length, refundsBefore);
  assert.deepEqual(again, receipt);
  assert.ok(provider.reads > readsBefore, "the provider was read before anything could be sent again");
  const view = await once.inspect(SCOPE, "refund-order-1234");
  const kinds = view.audit.map((e) => e.kind);
  assert.ok(kinds.includes("restored-from-witness"), JSON.stringify(kinds));
  assert.equal(view.state, "confirmed", JSON.stringify(kinds));
  assert.equal(view.attempts, 1, "no attempt granted after the restored one");
  assert.deepEqual(JSON.parse(view.receipt), receipt);
  // And the same call again is a plain replay now.
  assert.deepEqual(await refundOf(once, provider)({ order_id: 1234, amount: 200 }), receipt);
  assert.equal(provider.ofOrder(1234).length, 1);
  // The earlier refund, which the backup holds, is the backup's.
  assert.equal(provider.ofOrder(1000).length, 1);
});

test("older history, the control: a witness restored with the ledger (here: deleted) tells nothing, and the retry is sent again", async (t) => {
  const { path, backup, provider } = await historyAfterTheBackup(t);
  restore(backup, path);
  for (const f of [`${path}.witness`, `${path}.witness-wal`, `${path}.witness-shm`]) rmSync(f, { force: true });

  const once = await open(path, provider);
  t.after(() => once.close());
  await refundOf(once, provider)({ order_id: 1234, amount: 200 });
  // What cannot be detected, asserted so it stays written down: two refunds of one order.
  assert.equal(provider.ofOrder(1234).length, 2, JSON.stringify(provider.refunds));
  const view = await once.inspect(SCOPE, "refund-order-1234");
  assert.ok(!view.audit.some((e) => e.kind === "restored-from-witness"), JSON.stringify(view.audit.map((e) => e.kind)));
});

test("the SQLite witness file: the hosts' shared table, the later grant kept, forgotten before a time", async (t) => {
  const path = join(tempDir(t), "ledger.db");
  const store = new SqliteStore({ path });
  t.after(() => store.close());
  assert.equal(store.witnessSeen("s", "k"), undefined);
  store.witnessKeep("s", "k", '{"attempt":2}', 200n);
  // An earlier grant (a slower host, a late keep) never replaces a later one; the same or a later one does.
  store.witnessKeep("s", "k", '{"attempt":1}', 100n);
  assert.equal(store.witnessSeen("s", "k"), '{"attempt":2}');
  store.witnessKeep("s", "k", '{"attempt":2,"again":true}', 200n);
  assert.equal(store.witnessSeen("s", "k"), '{"attempt":2,"again":true}');
  store.witnessKeep("s", "other", "{}", 150n);
  assert.throws(() => store.witnessKeep("s", "far", "{}", 1n << 63n), /exceeds i64::MAX/);

  // Another host (Rust, Python) reads the same file as plain SQLite: one table, these columns, WAL.
  const other = new Database(`${path}.witness`, { readonly: true });
  t.after(() => other.close());
  assert.equal(other.pragma("journal_mode", { simple: true }), "wal");
  const columns = other.prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info('witness') ORDER BY cid").all();
  assert.deepEqual(columns.map((c) => [c.name, c.type, c.notnull, c.pk]), [
    ["scope", "TEXT", 1, 1], ["key", "TEXT", 1, 2], ["at", "INTEGER", 1, 0], ["body", "TEXT", 1, 0],
  ]);
  assert.deepEqual(other.prepare("SELECT scope, key, at, body FROM witness ORDER BY key").all(), [
    { scope: "s", key: "k", at: 200, body: '{"attempt":2,"again":true}' },
    { scope: "s", key: "other", at: 150, body: "{}" },
  ]);

  // Forget one key's, if kept before `before` (not at it).
  store.witnessForget("s", "other", 150n);
  assert.equal(store.witnessSeen("s", "other"), "{}");
  store.witnessForget("s", "other", 151n);
  assert.equal(store.witnessSeen("s", "other"), undefined);
  assert.equal(store.witnessSeen("s", "k"), '{"attempt":2,"again":true}');
  store.witnessForget("s", "k", 1n << 64n);
  assert.equal(store.witnessSeen("s", "k"), undefined);
});

test("a memory ledger's witness keeps the same way", () => {
  const store = new MemoryStore();
  store.witnessKeep("s", "k", "b2", 200n);
  store.witnessKeep("s", "k", "b1", 100n);
  assert.equal(store.witnessSeen("s", "k"), "b2");
  store.witnessForget("s", "k", 200n);
  assert.equal(store.witnessSeen("s", "k"), "b2");
  store.witnessForget("s", "k", 201n);
  assert.equal(store.witnessSeen("s", "k"), undefined);
});
