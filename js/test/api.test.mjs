// The TypeScript-facing API over a real guest: protect, typed outcomes, lookups, routes.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  BlockedError, ConflictError, Once, Rejected, RejectedError, UnknownOutcomeError, evidence, sent,
} from "../dist/index.js";
import { child } from "./helpers.mjs";

test("protect: sent once, replayed after, a changed payload under the key is a conflict", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const calls = [];
  const refund = once.protect("refund_order", async (args) => (calls.push(args), { refund_id: `r-${args.order_id}` }), {
    key: (args) => `refund-${args.order_id}`,
  });
  assert.deepEqual(await refund({ order_id: 1, amount: 200 }), { refund_id: "r-1" });
  assert.deepEqual(await refund({ order_id: 1, amount: 200 }), { refund_id: "r-1" });
  await assert.rejects(refund({ order_id: 1, amount: 300 }), ConflictError);
  assert.deepEqual(calls, [{ order_id: 1, amount: 200 }]);
});

test("protect: Rejected is a definite refusal; a later call may retry; other throws are unknown", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  let n = 0;
  const flaky = once.protect("refund_order", async () => {
    n++;
    if (n === 1) throw new Rejected("order is locked");
    return { ok: n };
  }, { key: () => "op-1" });
  await assert.rejects(flaky({ a: 1 }), (e) => e instanceof RejectedError && /order is locked/.test(e.message));
  assert.deepEqual(await flaky({ a: 1 }), { ok: 2 });
  const lost = once.protect("lost", async () => {
    throw new Error("socket hang up");
  }, { key: () => "op-2" });
  await assert.rejects(lost({}), (e) => e instanceof UnknownOutcomeError && e.account.effect === "unknown" && /operator/.test(e.message));
  await assert.rejects(lost({}), UnknownOutcomeError); // never retried blind
});

test("a lost reply is reconciled by the lookup: the provider's receipt, no second send", async (t) => {
  const once = await Once.memory({ waitMs: 15_000 });
  t.after(() => once.close());
  const provider = new Map();
  let sends = 0;
  const send = async (d) => {
    sends++;
    provider.set(d.providerKey, { refund_id: "r-1" });
    return sent.ambiguous("reply lost after commit");
  };
  await once.setTool("refund_order", {
    policy: { dispatchTimeoutMs: 200 },
    lookup: ({ providerKey, now }) => (provider.has(providerKey) ? evidence.confirmed(provider.get(providerKey)) : evidence.absent(now)),
  });
  const first = await once.call({ scope: "s", key: "k", tool: "refund_order", args: { amount: 200 }, send });
  const e = first.account.ending;
  const settled = e.tag === "confirmed" ? first : await once.call({ scope: "s", key: "k", tool: "refund_order", args: { amount: 200 }, send });
  assert.equal(settled.account.ending.tag, "confirmed");
  assert.equal(settled.account.ending.val.confirmedBy, "provider");
  assert.deepEqual(JSON.parse(settled.account.ending.val.receipt), { refund_id: "r-1" });
  assert.equal(sends, 1);
});

test("routes: direct tools run unprotected; blocked tools never run; identity required blocks keyless calls", async (t) => {
  const once = await Once.memory({
    tools: { search: { policy: { route: "direct" } }, wipe: { policy: { route: "block" } }, pay: { policy: { identity: "required" } } },
  });
  t.after(() => once.close());
  let runs = 0;
  const search = once.protect("search", async (a) => (runs++, [a.q]));
  assert.deepEqual(await search({ q: "x" }), ["x"]);
  assert.deepEqual(await search({ q: "x" }), ["x"]);
  assert.equal(runs, 2);
  const wipe = once.protect("wipe", async () => runs++, { key: () => "w" });
  await assert.rejects(wipe({}), (e) => e instanceof BlockedError && e.account.ending.val.reason === "route-blocked");
  const pay = once.protect("pay", async () => runs++);
  await assert.rejects(pay({ amount: 1 }), (e) => e instanceof BlockedError && e.account.ending.val.reason === "identity-required");
  assert.equal(runs, 2);
});

test("dispatch: a DIRECT call is marked direct and carries the call's scope; a granted one is not", async (t) => {
  const once = await Once.memory({ tools: { search: { policy: { route: "direct" } } } });
  t.after(() => once.close());
  const seen = [];
  const send = (d) => (seen.push(d), sent.success({ v: 1 }));
  await once.call({ scope: "tenant-7", key: "k", tool: "search", args: { q: 1 }, send });
  await once.call({ scope: "tenant-7", key: "k", tool: "refund", args: { q: 1 }, send });
  const [direct, granted] = seen;
  assert.equal(direct.direct, true);
  assert.equal(direct.scope, "tenant-7");
  assert.deepEqual(direct.args, { q: 1 });
  assert.equal(granted.direct, false);
  assert.equal(granted.scope, "tenant-7");
  assert.equal(granted.attempt, 1);
  // protect keeps a DIRECT call's own result by the flag: the function's value is the answer.
  const search = once.protect("search", async (a, d) => ({ q: a.q, direct: d.direct }));
  assert.deepEqual(await search({ q: 2 }), { q: 2, direct: true });
});

test("stated: an unknown no read can settle awaits an operator, who is offered what resolve accepts", async (t) => {
  const once = await Once.memory({ tools: { blind: { policy: { lookup: false } } } });
  t.after(() => once.close());
  const lost = await once.call({ scope: "s", key: "k", tool: "blind", args: { n: 1 }, send: () => sent.ambiguous("timeout") });
  assert.equal(lost.kind, "done");
  assert.equal(lost.account.ending.tag, "unknown");
  assert.equal(lost.account.awaitsOperator, true);
  const view = await once.inspect("s", "k");
  assert.deepEqual(view.resolvable, { confirmed: true, absent: true, absentNeedsForce: true, approve: false });
  await assert.rejects(once.resolve("s", "k", "absent", "too early"));
  const ok = await once.call({ scope: "s", key: "k2", tool: "refund", args: { n: 1 }, send: () => sent.success({ ok: 1 }) });
  assert.equal(ok.account.awaitsOperator, false);
  assert.deepEqual((await once.inspect("s", "k2")).resolvable, { confirmed: false, absent: false, absentNeedsForce: false, approve: false });
});

test("build: jco's debug log reads JCO_DEBUG once, at load, and still turns on with it", async () => {
  const quiet = await child("one-call.mjs", [], { env: { ...process.env, JCO_DEBUG: "" } }).done;
  assert.equal(quiet.code, 0, quiet.stderr);
  assert.equal(quiet.stdout, "ending confirmed\n");
  const loud = await child("one-call.mjs", [], { env: { ...process.env, JCO_DEBUG: "1" } }).done;
  assert.equal(loud.code, 0, loud.stderr);
  assert.match(loud.stdout, /ending confirmed\n/);
  assert.match(loud.stdout, /\[.*\(\)\]/, "jco's debug lines, e.g. [clearCurrentTask()] args");
});

// Send-by is checked on this host's clock too, just before the send (as the Rust and Python hosts do): a ledger
// clock read that stalls past send-by (the default lease leaves 200 ms between the grant and send-by; the read
// takes 300 ms, as a slow query could) leaves the attempt not sent, never sent late.
test("a ledger clock read that stalls past send-by sends nothing", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  await once.setTool("refund_order", { policy: { dispatchTimeoutMs: 1000 } });
  assert.equal(Number(once.plan("refund_order").policy.leaseMs), 1200);
  const engine = once.engine;
  const ledgerNow = engine.ledgerNow.bind(engine);
  engine.ledgerNow = () => {
    const read = ledgerNow();
    const until = performance.now() + 300;
    while (performance.now() < until); // a read that holds the thread, as a synchronous query would
    return read;
  };
  const sends = [];
  const called = await once.call({
    scope: "s", key: "stalled", tool: "refund_order", args: { amount: 1 }, waitMs: 0,
    send: (d) => (sends.push(d.key), sent.success({ refund_id: "r-1" })),
  });
  assert.equal(called.account.ending.tag, "not-sent", JSON.stringify(called.account.ending));
  assert.deepEqual(sends, []);
});

// The host stops its sender at the deadline the guest gives, and records nothing while the send still runs.
test("dispatch timeout: the signal is aborted and the call waits for the send to settle; its own answer counts", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  await once.setTool("refund_order", { policy: { dispatchTimeoutMs: 200 } });
  const call = (key, send) => once.call({ scope: "s", key, tool: "refund_order", args: { amount: 200 }, send });
  const log = [];
  // Honours its signal: stopped by the abort at the deadline the guest gives (send-by plus the timeout,
  // as the Rust and Python hosts stop theirs), then the outcome (ambiguous) is recorded.
  const deadlines = {};
  const honours = await call("honours", (d) => new Promise((_, reject) => {
    Object.assign(deadlines, { handed: performance.now(), sendBefore: d.sendBefore, answerBy: d.answerBy });
    d.signal.addEventListener("abort", () => {
      deadlines.aborted = performance.now();
      setTimeout(() => (log.push("honours stopped"), reject(d.signal.reason)), 30);
    });
  }));
  assert.equal(honours.account.ending.tag, "unknown");
  assert.match((await once.inspect("s", "honours")).body, /no answer within 200 ms of send-by: the sender was aborted/);
  // As the host adds them: (sendBefore + 200) - sendBefore is not 200 in floating point for every sendBefore.
  assert.equal(deadlines.answerBy, deadlines.sendBefore + 200, "the answer is due a timeout after send-by");
  // The default lease is the timeout plus a 200 ms margin: send-by is up to 200 ms after the hand-over.
  assert.ok(deadlines.sendBefore > deadlines.handed && deadlines.sendBefore <= deadlines.handed + 200, JSON.stringify(deadlines));
  // Timers may round to the millisecond.
  assert.ok(deadlines.aborted >= deadlines.answerBy - 1, `aborted at its deadline, not before: ${JSON.stringify(deadlines)}`);
  // Ignores its signal and completes: the call waited for it, and the refund it made is confirmed.
  const ignores = await call("ignores", async (d) => {
    await new Promise((r) => setTimeout(r, 600)); // past its deadline: at most 400 ms
    log.push(`ignores answered, aborted=${d.signal.aborted}`);
    return sent.success({ refund_id: "late" });
  });
  assert.equal(ignores.account.ending.tag, "confirmed");
  assert.deepEqual(JSON.parse(ignores.account.ending.val.receipt), { refund_id: "late" });
  // A sender's own failure is its own answer, not the host's timeout.
  const throws = await call("throws", async () => {
    throw new Error("connection reset");
  });
  assert.equal(throws.account.ending.tag, "unknown");
  assert.doesNotMatch((await once.inspect("s", "throws")).body, /no answer within/);
  assert.deepEqual(log, ["honours stopped", "ignores answered, aborted=true"]);
});
