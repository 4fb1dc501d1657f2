// Real processes on one SQLite ledger: several racing one key dispatch once;
// one SIGKILLed between dispatch and report is reconciled, never dispatched twice.
import assert from "node:assert/strict";
import { test } from "node:test";
import { appendFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Once, sent } from "../dist/index.js";
import { CALL, POLICY, effectsIn as lines, lookupIn } from "./children/crash-call.mjs";
import { child, tempDir } from "./helpers.mjs";

async function until(what, check, ms = 30_000) {
  const stop = Date.now() + ms;
  while (!check()) {
    if (Date.now() > stop) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

test("five processes racing one key on one SQLite ledger: one dispatch, every caller gets its receipt", async (t) => {
  const dir = tempDir(t);
  const [ledger, log, go] = ["ledger.db", "dispatches.log", "go"].map((f) => join(dir, f));
  const kids = [1, 2, 3, 4, 5].map((id) => child("race.mjs", [ledger, log, go, String(id)]));
  await until("every child ready", () => kids.every((k) => k.out().includes("ready")));
  writeFileSync(go, "");
  const results = await Promise.all(kids.map((k) => k.done));
  for (const r of results) assert.equal(r.code, 0, r.stderr);
  assert.equal(lines(log).length, 1, `dispatches: ${lines(log)}`);
  const ends = results.map((r) => JSON.parse(r.stdout.trim().split("\n").pop()));
  assert.deepEqual(ends.map((e) => e.ending), Array(5).fill("confirmed"));
  assert.equal(ends.filter((e) => e.replayed === false).length, 1, "exactly one caller sent");
  assert.equal(new Set(ends.map((e) => e.receipt)).size, 1, "one receipt for all");
});

for (const when of ["after-effect", "before-effect"]) {
  test(`SIGKILL between dispatch and report (${when}): reconciled, dispatched exactly once in all`, async (t) => {
    const dir = tempDir(t);
    const [ledger, effects] = ["ledger.db", "effects.log"].map((f) => join(dir, f));
    const victim = child("crash.mjs", [ledger, effects, when]);
    await until("the child's dispatch", () => victim.out().includes("sent"));
    victim.proc.kill("SIGKILL");
    const gone = await victim.done;
    assert.equal(gone.signal, "SIGKILL");
    assert.equal(lines(effects).length, when === "after-effect" ? 1 : 0);

    // A restarted host: its lookup reads the provider's effects (linearizable: absent as of now).
    let sends = 0;
    const lookup = lookupIn(effects);
    const once = await Once.sqlite(ledger, { waitMs: 20_000, tools: { refund_order: { policy: POLICY, lookup } } });
    const called = await once.call({
      ...CALL,
      send: async (d) => {
        sends++;
        appendFileSync(effects, `${d.providerKey}\n`);
        return sent.success({ refund_id: "r-7" });
      },
    });
    const view = await once.inspect(CALL.scope, CALL.key);
    await once.close();
    assert.equal(called.kind, "done");
    assert.equal(called.account.ending.tag, "confirmed", JSON.stringify(called.account.ending, (_, v) => (typeof v === "bigint" ? Number(v) : v)));
    assert.equal(lines(effects).length, 1, "one effect at the provider");
    assert.equal(sends, when === "after-effect" ? 0 : 1);
    assert.equal(called.account.ending.val.confirmedBy, when === "after-effect" ? "provider" : "answer");
    assert.ok(view.audit.some((e) => e.kind === "lease-expired" || e.toState === "unknown"), view.audit.map((e) => e.kind).join(","));
  });
}
