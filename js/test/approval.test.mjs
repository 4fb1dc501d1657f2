// A person approves high-value calls (DESIGN.md "Authority") through the npm package: nothing is sent until an
// approval of the exact recorded payload; a larger amount under the key never runs on it; a denial refuses.
import assert from "node:assert/strict";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { AwaitingApprovalError, BlockedError, ConflictError, InvalidArgumentsError, Once } from "../dist/index.js";

const approvalAbove100 = { policy: { approval: { above: { field: "/amount", above: "100.00" } } } };

test("above the threshold a call waits for a person, then is sent once; a denial refuses it", async (t) => {
  const once = await Once.memory({ tools: { refund_order: approvalAbove100 } });
  t.after(() => once.close());
  const calls = [];
  const refund = once.protect("refund_order", async (args) => (calls.push(args), { refund_id: `r-${args.order_id}` }), {
    key: (args) => `refund-${args.order_id}`,
  });
  await assert.rejects(refund({ order_id: 1, amount: 250 }), (e) =>
    e instanceof AwaitingApprovalError && e.account.repeat === "waits" && e.account.awaitsOperator &&
      /a person must approve this exact call first \(\/amount is 250, above 100.00\)/.test(e.message));
  assert.deepEqual(calls, []);
  assert.equal(await once.approve("default", "refund-1", "ops@example: checked"), "absent");
  await assert.rejects(refund({ order_id: 1, amount: 900 }), ConflictError);
  assert.deepEqual(await refund({ order_id: 1, amount: 250 }), { refund_id: "r-1" });
  assert.deepEqual(await refund({ order_id: 1, amount: 250 }), { refund_id: "r-1" });
  assert.deepEqual(calls, [{ order_id: 1, amount: 250 }]);

  await assert.rejects(refund({ order_id: 2, amount: 500 }), AwaitingApprovalError);
  assert.equal(await once.deny("default", "refund-2", "ops@example: no"), "denied");
  await assert.rejects(refund({ order_id: 2, amount: 500 }), (e) => e instanceof BlockedError && e.account.ending.val.reason === "approval-denied");
  assert.equal(calls.length, 1);
});

test("an approval rule that is not one is refused with where", async () => {
  await assert.rejects(Once.memory({ tools: { t: { policy: { approval: "sometimes" } } } }), InvalidArgumentsError);
});

test("a record is bound to its provider account: another account's call is blocked, never replayed", async (t) => {
  const path = join(await mkdtemp(join(tmpdir(), "once-account-")), "ledger.db");
  const a = await Once.sqlite(path, { tools: { refund_order: { policy: { providerAccount: "acct_live_A" } } } });
  const b = await Once.sqlite(path, { tools: { refund_order: { policy: { providerAccount: "acct_live_B" } } } });
  t.after(() => (a.close(), b.close()));
  const calls = [];
  const send = async (args) => (calls.push(args), { refund_id: "r-1" });
  const opts = { key: (args) => `refund-${args.order_id}` };
  assert.deepEqual(await a.protect("refund_order", send, opts)({ order_id: 1, amount: 40 }), { refund_id: "r-1" });
  await assert.rejects(b.protect("refund_order", send, opts)({ order_id: 1, amount: 40 }), (e) =>
    e instanceof BlockedError && e.account.ending.val.reason === "other-account" && e.account.effect === "happened");
  assert.deepEqual(await a.protect("refund_order", send, opts)({ order_id: 1, amount: 40 }), { refund_id: "r-1" });
  assert.equal(calls.length, 1);
  await assert.rejects(Once.memory({ tools: { t: { policy: { providerAccount: 7 } } } }), InvalidArgumentsError);
});
