// A protected function's result that is not JSON: the effect happened, so the record ends confirmed and
// the stated projection (receiptText in src/json.ts) is what is stored, returned and replayed.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Once, sent } from "../dist/index.js";

async function confirmed(once, scope, key, replays) {
  const view = await once.inspect(scope, key);
  assert.equal(view.state, "confirmed");
  assert.equal(view.attempts, 1);
  assert.equal(view.replays, replays);
  return JSON.parse(view.receipt);
}

test("protect: a Date, an undefined field and a bigint are confirmed and their projection replayed", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const calls = [];
  const refund = once.protect(
    "refund_order",
    async ({ order_id }) => (calls.push(order_id), { refund_id: `r-${order_id}`, at: new Date(0), note: undefined, cents: 9007199254740993n }),
    { key: ({ order_id }) => `refund-${order_id}` },
  );
  const projected = { refund_id: "r-7", at: "1970-01-01T00:00:00.000Z", cents: "9007199254740993" };
  // The first call resolves with what is stored, as a replay does: a retry cannot tell the two apart.
  assert.deepEqual(await refund({ order_id: 7 }), projected);
  assert.deepEqual(await confirmed(once, "default", "refund-7", 0), projected);
  assert.deepEqual(await refund({ order_id: 7 }), projected);
  assert.deepEqual(calls, [7]);
  assert.deepEqual(await confirmed(once, "default", "refund-7", 1), projected);
});

test("protect: each value that is not JSON has its stated projection", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const cyclic = { id: 1 };
  cyclic.self = cyclic;
  const cases = [
    [new Date(Date.UTC(2026, 11, 4, 22)), "2026-12-04T22:00:00.000Z"],
    [12n, "12"],
    [[1, undefined, () => 1], [1, null, null]],
    [{ n: NaN, inf: -Infinity, f() {} }, { n: null, inf: null }],
    // Nothing JSON.stringify would write: the stand-in, naming the type.
    [Symbol("s"), { once_unserializable: { type: "symbol", repr: "Symbol(s)" } }],
    [cyclic, { once_unserializable: { type: "Object", repr: "<ref *1> { id: 1, self: [Circular *1] }" } }],
  ];
  for (const [i, [value, projected]] of cases.entries()) {
    let calls = 0;
    const returns = once.protect("returns", async () => (calls++, value), { key: () => `k-${i}` });
    assert.deepEqual(await returns({}), projected, String(i));
    assert.deepEqual(await returns({}), projected, String(i));
    assert.equal(calls, 1, String(i));
    assert.deepEqual(await confirmed(once, "default", `k-${i}`, 1), projected);
  }
});

test("call: a sender's sent.success of a value that is not JSON is confirmed", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  let sends = 0;
  const call = () => once.call({
    scope: "s", key: "k", tool: "refund_order", args: { order_id: 1 },
    send: async () => (sends++, sent.success({ at: new Date(0), id: 5n })),
  });
  const first = await call();
  assert.equal(first.account.ending.tag, "confirmed");
  const again = await call();
  assert.equal(again.account.ending.tag, "confirmed");
  assert.equal(again.account.ending.val.replayed, true);
  assert.deepEqual(JSON.parse(again.account.ending.val.receipt), { at: "1970-01-01T00:00:00.000Z", id: "5" });
  assert.equal(sends, 1);
});
