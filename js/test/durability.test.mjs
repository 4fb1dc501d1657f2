// The SQLite ledger's durability modes: which `PRAGMA synchronous` each commit runs at, and what a
// process crash after a deferred commit keeps.
//
// `intent-only` (DESIGN.md "Durability budget") commits what the engine marks deferrable (an attempt's
// own success, a replay's or a conflict's count) at NORMAL and every other batch (an intent, a
// rejection, an unknown, an operator's resolution) at FULL. NORMAL in WAL mode skips the fsync, not the
// write: the commit is in the WAL file when `commit` returns, so a process crash (SIGKILL) loses
// nothing; only a power loss may lose the last deferred commits (not testable here).
//
// The levels are read back from SQLite itself after each commit, on the package's store driven by the
// component through the package's ledger import (the engine's worker hosts the same two).
import { randomBytes } from "node:crypto";
import assert from "node:assert/strict";
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { InvalidArgumentsError, Once, sent } from "../dist/index.js";
import { outcomeOf } from "../dist/once.js";
import { loadComponent } from "../dist/component.js";
import { ledgerImports, ledgerJsonImports } from "../dist/ledger.js";
import { policyInput } from "../dist/policy.js";
import { SqliteStore } from "../dist/stores/sqlite.js";
import { witnessImports } from "../dist/witness.js";
import { JS, child, tempDir } from "./helpers.mjs";

const LEVELS = { 0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA" };
const ARGS = '{"order_id":1234,"amount":200}';

/** The package's SQLite store, noting for every commit whether the engine marked it deferrable and the level it ran at. */
class Observed extends SqliteStore {
  commits = [];
  commit(batch) {
    const verdict = super.commit(batch);
    // The connection's level as SQLite has it (the store's own connection: the pragma is per connection).
    const level = LEVELS[this.db.pragma("synchronous", { simple: true })];
    this.commits.push([batch.deferrable, level, batch.events.map((e) => e.kind)]);
    return verdict;
  }
}

const instantiate = loadComponent(join(JS, "gen"));

/** The component over `store`: a clock, no provider read, an escalation sink that acknowledges. */
async function engine(store) {
  const x = (await instantiate)({
    "once:core/types": {},
    "once:core/ledger": ledgerImports(store),
    "once:core/ledger-json": ledgerJsonImports(),
    "once:core/clock": { now: () => BigInt(Date.now()) },
    "once:core/provider": { lookup: () => ({ tag: "unknown", val: "no lookup in this test" }) },
    "once:core/operator": { escalate: () => true },
    "once:core/entropy": { fill: (n) => new Uint8Array(randomBytes(n)) },
    "once:core/witness": witnessImports(store),
  });
  x.configure({ settings: x.defaultSettings(), defaults: { ...policyInput({ lookup: false }, "defaults") }, tools: [], ledgerEncoding: "typed", reads: "import" });
  return x;
}

/** The protocol: start, send each grant as `answer` says, report, until done; the account. */
function call(x, key, args, answer) {
  let step = x.start({ scope: "s", keys: [["application", key]], tool: "refund", args, supersedes: undefined, acknowledgeConfirmed: false });
  while (step.tag === "dispatch") {
    const g = step.val;
    step = x.report(g.scope, g.key, g.fence, outcomeOf(answer(g)));
  }
  assert.equal(step.tag, "done", JSON.stringify(step, (_, v) => (typeof v === "bigint" ? String(v) : v)));
  return step.val;
}

const never = () => assert.fail("sent");

/** A success, its replay, a conflict, a rejection, an ambiguous outcome and an operator's resolution. */
async function everyKindOfCommit(store) {
  const x = await engine(store);
  assert.equal(call(x, "k1", ARGS, () => sent.success({ id: 1 })).ending.tag, "confirmed");
  assert.equal(call(x, "k1", ARGS, never).ending.val.replayed, true);
  assert.equal(call(x, "k1", '{"order_id":1,"amount":5}', never).ending.tag, "conflict");
  assert.equal(call(x, "k2", ARGS, () => sent.rejected("no")).ending.tag, "rejected");
  assert.equal(call(x, "k3", ARGS, () => sent.ambiguous("timeout")).ending.tag, "unknown");
  assert.equal(x.resolve("s", "k3", { tag: "confirmed", val: '{"id":3}' }, "seen at the provider", false), "confirmed");
}

for (const mode of ["intent-only", "INTENT_ONLY"]) {
  test(`${mode}: exactly the batches the engine marks deferrable commit at NORMAL, every other one at FULL`, async (t) => {
    const store = new Observed({ path: join(tempDir(t), "ledger.db"), synchronous: mode });
    t.after(() => store.close());
    await everyKindOfCommit(store);
    // The first call: the ledger's provider-key secret (no audit event: no operation's transition) and
    // its intent at FULL before the dispatch, its own success at NORMAL.
    assert.deepEqual(store.commits.slice(0, 3), [[false, "FULL", []], [false, "FULL", ["begin"]], [true, "NORMAL", ["finish-success"]]]);
    for (const [deferrable, level, what] of store.commits) assert.equal(level, deferrable ? "NORMAL" : "FULL", String(what));
    const kinds = new Set(store.commits.flatMap(([, , ks]) => ks));
    const deferred = new Set(store.commits.filter(([d]) => d).flatMap(([, , ks]) => ks));
    // What the engine may defer: an attempt's own success and observations, nothing else.
    assert.deepEqual([...deferred].sort(), ["conflict", "finish-success", "replay"], JSON.stringify(store.commits));
    for (const k of ["begin", "finish-rejected", "finish-ambiguous", "operator-confirmed"]) {
      assert.ok(kinds.has(k) && !deferred.has(k), `${k} in ${JSON.stringify(store.commits)}`);
    }
  });
}

for (const [mode, level] of [["full", "FULL"], ["normal", "NORMAL"], [undefined, "FULL"]]) {
  test(`${mode ?? "the default"}: every batch commits at ${level}, deferrable or not`, async (t) => {
    const store = new Observed({ path: join(tempDir(t), "ledger.db"), synchronous: mode });
    t.after(() => store.close());
    await everyKindOfCommit(store);
    assert.ok(store.commits.some(([d]) => d) && !store.commits.every(([d]) => d));
    assert.deepEqual([...new Set(store.commits.map(([, l]) => l))], [level], JSON.stringify(store.commits));
  });
}

test("an unknown mode is refused with the modes named; nothing is opened", async (t) => {
  const dir = tempDir(t);
  for (const mode of ["sometimes", "", 2, null]) {
    await assert.rejects(Once.sqlite(join(dir, "ledger.db"), { synchronous: mode }), (e) => {
      assert.ok(e instanceof InvalidArgumentsError, `${e.name}: ${e.message}`);
      assert.match(e.message, /synchronous must be "full", "intent-only" or "normal", not /);
      assert.equal(e.pointer, "/synchronous");
      return true;
    });
  }
  assert.equal(existsSync(join(dir, "ledger.db")), false);
  assert.throws(() => new SqliteStore({ path: join(dir, "ledger.db"), synchronous: "EXTRA" }), /synchronous must be/);
  const o = await Once.sqlite(join(dir, "ledger.db"), { synchronous: "Intent_Only" });
  await o.close();
});

test("intent-only: a process killed after a deferred success loses nothing", async (t) => {
  const dir = tempDir(t);
  const [db, reported] = [join(dir, "ledger.db"), join(dir, "reported.json")];
  const agent = child("deferred.mjs", [db, reported]);
  const deadline = Date.now() + 60_000;
  while (!existsSync(reported) || readFileSync(reported, "utf8") === "") {
    assert.ok(agent.proc.exitCode === null, `the agent exited: ${agent.out()}`);
    assert.ok(Date.now() < deadline, "the agent never reported");
    await sleep(10);
  }
  const ended = JSON.parse(readFileSync(reported, "utf8"));
  assert.equal(ended.ending, "confirmed");
  // The deferred commit is in the WAL file (written, not fsynced): what a process crash cannot take away.
  assert.ok(statSync(`${db}-wal`).size > 0);
  agent.proc.kill("SIGKILL");
  assert.equal((await agent.done).signal, "SIGKILL");

  const o = await Once.sqlite(db);
  t.after(() => o.close());
  const view = await o.inspect("tenant-7", "refund-1234");
  assert.equal(view.state, "confirmed");
  assert.equal(view.receipt, ended.receipt);
  assert.equal(view.providerKey, ended.providerKey);
  assert.deepEqual(view.audit.map((e) => e.kind), ["begin", "finish-success"]);
  const again = await o.call({ scope: "tenant-7", key: "refund-1234", tool: "refund_order", argsJson: ARGS, send: never });
  assert.equal(again.account.ending.tag, "confirmed");
  assert.equal(again.account.ending.val.replayed, true);
  assert.equal(again.account.ending.val.receipt, ended.receipt);
});
