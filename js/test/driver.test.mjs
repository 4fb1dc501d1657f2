// The call protocol as this package drives it: the component's typed `driver` (start, report, resume),
// every value lowered and lifted by jco, none written or read by hand.
import assert from "node:assert/strict";
import { test } from "node:test";
import { EngineError, Once, sent } from "../dist/index.js";
import { outcomeOf } from "../dist/once.js";

test("each of sent's answers is its typed outcome", () => {
  assert.deepEqual(outcomeOf(sent.success({ id: "r\"1" })), { tag: "success", val: '{"id":"r\\"1"}' });
  assert.deepEqual(outcomeOf(sent.successJson('{"id":1}')), { tag: "success", val: '{"id":1}' });
  assert.deepEqual(outcomeOf(sent.rejected("no")), { tag: "rejected", val: "no" });
  assert.deepEqual(outcomeOf(sent.ambiguous("timeout")), { tag: "ambiguous", val: "timeout" });
  assert.deepEqual(outcomeOf(sent.notSent()), { tag: "not-sent" });
});

test("an answer none of sent's constructors makes is recorded ambiguous, saying what it was: the request may have left", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const odd = [undefined, null, { outcome: "success", response: { id: 1 } }, { outcome: "maybe" }, { outcome: "success", response: 10n }];
  for (const [i, answer] of odd.entries()) {
    let sends = 0;
    const called = await once.call({ scope: "s", key: `k${i}`, tool: "refund_order", args: { n: i }, send: () => (sends++, answer) });
    assert.equal(called.kind, "done");
    const ending = called.account.ending;
    assert.equal(ending.tag, "unknown", ending.tag);
    assert.match(ending.val.reason, /the sender answered .*none of sent\.success\/rejected\/ambiguous\/notSent/);
    assert.equal(called.account.effect, "unknown");
    assert.equal(sends, 1);
  }
});

test("the driver's error is thrown as its EngineError, and the handle goes on", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const never = () => assert.fail("sent");
  await assert.rejects(once.resume("s", "no-such-key", never), (e) => e instanceof EngineError && e.payload.tag === "not-found");
  const called = await once.call({ scope: "s", key: "k", tool: "refund_order", args: { a: 1 }, send: () => sent.success({ ok: 1 }) });
  assert.equal(called.account.ending.tag, "confirmed");
  const again = await once.call({ scope: "s", key: "k", tool: "refund_order", args: { a: 1 }, send: never });
  assert.equal(again.account.ending.val.replayed, true);
  // The grant's timeout (a u64) reaches the sender as the policy's, and its attempt and provider key as granted.
  await once.setTool("slow_refund", { policy: { dispatchTimeoutMs: 1234 } });
  let seen;
  await once.call({ scope: "s", key: "k2", tool: "slow_refund", args: {}, send: (d) => ((seen = d), sent.success({})) });
  assert.equal(seen.timeoutMs, 1234);
  assert.equal(seen.attempt, 1);
  assert.match(seen.providerKey, /\S/);
});

test("a success whose response holds a lone surrogate is recorded, the surrogate as U+FFFD: never lost over its form", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const called = await once.call({ scope: "s", key: "k", tool: "refund_order", args: {}, send: () => sent.successJson('{"id":"r\uD800"}') });
  assert.equal(called.account.ending.tag, "confirmed");
  assert.equal(called.account.ending.val.receipt, '{"id":"r\uFFFD"}');
  assert.deepEqual(outcomeOf(sent.ambiguous("cut \uDC00")), { tag: "ambiguous", val: "cut \uFFFD" });
});
