// Bad input gets a typed error that says what and where; nothing is written and nothing is sent.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import {
  InvalidArgumentsError, InvalidJsonError, InvalidPolicyError, InvalidRequestError, Once, StorageError, sent,
} from "../dist/index.js";
import { once as cli, tempDir } from "./helpers.mjs";

test("bad calls: typed errors, no record, no dispatch (SQLite ledger, read back by the Rust CLI)", async (t) => {
  const ledger = join(tempDir(t), "ledger.db");
  const o = await Once.sqlite(ledger);
  let sends = 0;
  const send = async () => (sends++, sent.success({}));
  const base = { scope: "s", key: "k", tool: "refund_order", args: {}, send };
  const cases = [
    [{ ...base, args: { amount: NaN } }, InvalidArgumentsError, /args at \/amount: NaN is not a JSON number/],
    [{ ...base, args: { a: { b: undefined } } }, InvalidArgumentsError, /args at \/a\/b: a undefined is not JSON/],
    [{ ...base, args: { n: 10n } }, InvalidArgumentsError, /args at \/n: a bigint is not JSON/],
    [{ ...base, args: { d: new Date(0) } }, InvalidArgumentsError, /args at \/d: a Date object is not JSON/],
    [{ ...base, argsJson: '{"a":1,"a":2}' }, InvalidJsonError, /duplicate-key/],
    [{ ...base, argsJson: '{"amount":9007199254740993}' }, InvalidJsonError, /inexact-number/],
    [{ ...base, argsJson: '{"a":' }, InvalidJsonError, /syntax/],
    [{ ...base, key: "" }, InvalidRequestError, /empty/],
    [{ ...base, key: " \u00a0" }, InvalidRequestError, /operation key from application is only whitespace/],
    [{ ...base, scope: "\u3000" }, InvalidRequestError, /scope is only whitespace/],
    [{ ...base, key: "k".repeat(100_000) }, InvalidRequestError, /key/],
    [{ ...base, scope: "" }, InvalidRequestError, /scope/],
    [{ ...base, send: "not a function" }, InvalidArgumentsError, /send/],
    // Fields of the wrong type (no compiler checked them): refused before the typed call is lowered.
    [{ ...base, key: 7 }, InvalidArgumentsError, /^call: key must be a string, not number$/],
    [{ ...base, scope: null }, InvalidArgumentsError, /^call: scope must be a string, not null$/],
    [{ ...base, tool: { name: "refund_order" } }, InvalidArgumentsError, /^call: tool must be a string, not object$/],
    [{ ...base, args: undefined, argsJson: { a: 1 } }, InvalidArgumentsError, /^call: argsJson must be a string, not object$/],
    [{ ...base, supersedes: 3 }, InvalidArgumentsError, /^call: supersedes must be a string, not number$/],
    [{ ...base, acknowledgeConfirmed: "yes" }, InvalidArgumentsError, /^call: acknowledgeConfirmed must be a boolean, not string$/],
    // A lone surrogate is not text: lowered, jco would make it U+FFFD, and "a\uD800" and "a\uDBFF" one key.
    [{ ...base, key: "a\uD800" }, InvalidArgumentsError, /^call: key holds a lone surrogate at index 1/],
    [{ ...base, key: "\uDC00\uD800" }, InvalidArgumentsError, /^call: key holds a lone surrogate at index 0/],
    [{ ...base, scope: "s\uDFFF" }, InvalidArgumentsError, /^call: scope holds a lone surrogate/],
    [{ ...base, tool: "refund\uD83D" }, InvalidArgumentsError, /^call: tool holds a lone surrogate/],
    [{ ...base, args: undefined, argsJson: '{"a":"\uD800"}' }, InvalidArgumentsError, /^call: argsJson holds a lone surrogate/],
    [{ ...base, supersedes: "old\uDC00" }, InvalidArgumentsError, /^call: supersedes holds a lone surrogate/],
    // In args it is JSON's escape, which the engine refuses as I-JSON does.
    [{ ...base, args: { s: "\uD800" } }, InvalidJsonError, /lone-surrogate/],
  ];
  for (const [call, type, message] of cases) {
    await assert.rejects(o.call(call), (e) => {
      assert.ok(e instanceof type, `${e.name}: ${e.message}`);
      assert.match(e.message, message);
      return true;
    });
  }
  // A pair is text, and so is its escape in JSON text; `null` for `supersedes` is none.
  const pair = await o.call({ ...base, scope: "s2", tool: "pair_tool", key: "k\uD83D\uDE00", args: { s: "\uD83D\uDE00" }, supersedes: null });
  assert.equal(pair.account.ending.tag, "confirmed");
  assert.equal(pair.account.key, "k\uD83D\uDE00");
  await assert.rejects(o.resume("s", "k\uD800", send), (e) => e instanceof InvalidArgumentsError && /^resume: key holds a lone surrogate/.test(e.message));
  await assert.rejects(o.resume("s", 5, send), (e) => e instanceof InvalidArgumentsError && /^resume: key must be a string, not number$/.test(e.message));
  const json = await o.call({ ...base, argsJson: '{"a":1,"a":2}' }).catch((e) => e);
  assert.equal(json.json.kind, "duplicate-key");
  assert.equal(json.json.pointer, "");
  assert.equal(await o.inspect("s", "k"), undefined);
  assert.equal(await o.inspect("s", "a\uFFFD"), undefined);
  await o.close();
  assert.equal(sends, 1, "only the well-formed call was sent");
  assert.doesNotMatch(cli("ledger", "list", "--db", ledger), /refund_order|\bs\s+k\b/);
});

test("absent args (undefined, null) are an InvalidArgumentsError, not {}: nothing recorded, the tool never runs", async (t) => {
  const o = await Once.memory();
  t.after(() => o.close());
  let runs = 0;
  const refund = o.protect("refund_order", async () => (runs++, { ok: true }), { key: (a) => a?.order_id ?? "k" });
  const send = async () => (runs++, sent.success({}));
  for (const [attempt, where] of [
    [() => refund(undefined), "protect"],
    [() => refund(null), "protect"],
    [() => refund(), "protect"],
    [() => o.call({ scope: "s", key: "k", tool: "refund_order", send }), "call"],
    [() => o.call({ scope: "s", key: "k", tool: "refund_order", args: null, send }), "call"],
  ]) {
    await assert.rejects(attempt(), (e) => {
      assert.ok(e instanceof InvalidArgumentsError, `${where}: ${e.name}: ${e.message}`);
      assert.match(e.message, /^refund_order: args at \/: (undefined|null) is not a tool's arguments/);
      assert.equal(e.pointer, "");
      return true;
    });
  }
  assert.equal(runs, 0);
  assert.equal(await o.inspect("s", "k"), undefined);
  assert.equal(await o.inspect("default", "k"), undefined);
  // `{}` is how a tool with no arguments is called.
  assert.deepEqual(await refund({}), { ok: true });
});

test("bad policies are refused by the engine, with the field named", async (t) => {
  await assert.rejects(
    Once.memory({ tools: { refund_order: { policy: { dispatchTimeoutMs: 10_000, leaseMs: 1_000 } } } }),
    (e) => e instanceof InvalidPolicyError && /lease/.test(e.message),
  );
  await assert.rejects(
    Once.memory({ tools: { refund_order: { policy: { leaseMs: -1 } } } }),
    (e) => e instanceof InvalidArgumentsError && /tools\.refund_order\.leaseMs/.test(e.message),
  );
  await assert.rejects(
    Once.memory({ tools: { refund_order: { policy: { leaseMS: 5 } } } }),
    (e) => e instanceof InvalidArgumentsError && /unknown policy field "leaseMS"/.test(e.message),
  );
  const o = await Once.memory();
  t.after(() => o.close());
  const p = o.protect("refund_order", async () => ({}), { policy: { dispatchTimeoutMs: 10_000, leaseMs: 1_000 } });
  await assert.rejects(p({ amount: 1 }), InvalidPolicyError);
  // The handle still works, under its previous configuration.
  const ok = await o.call({ scope: "s", key: "k2", tool: "other", args: {}, send: async () => sent.success({ ok: true }) });
  assert.equal(ok.account.ending.tag, "confirmed");
});

test("a ledger that cannot be opened is a StorageError naming the file", async (t) => {
  const dir = tempDir(t);
  await assert.rejects(Once.sqlite(dir), (e) => e instanceof StorageError && e.message.includes(dir));
  await assert.rejects(Once.sqlite(join(dir, "no", "such", "dir", "l.db")), StorageError);
});

test("every string an operator's or a tool's method hands the component is text: a lone surrogate is refused, never read as U+FFFD", async (t) => {
  const o = await Once.memory();
  t.after(() => o.close());
  // A record under the key jco would have made of "k\uD800", so a lookup through the replacement would find it.
  await o.call({ scope: "s", key: "k\uFFFD", tool: "refund_order", args: {}, send: () => sent.success({}) });
  for (const [attempt, where] of [
    [() => o.inspect("s", "k\uD800"), /^inspect: key holds a lone surrogate/],
    [() => o.inspect("s\uDC00", "k"), /^inspect: scope holds a lone surrogate/],
    [() => o.resolve("s", "k\uD800", "absent", "seen", true), /^resolve: key holds a lone surrogate/],
    [() => o.resolve("s", "k\uFFFD", "absent", "cut \uD800", true), /^resolve: note holds a lone surrogate/],
    [() => o.queue({ scopes: ["s", "t\uD800"] }), /^queue: scopes\/1 holds a lone surrogate/],
    [() => o.queue({ keyPrefix: "k\uD800" }), /^queue: keyPrefix holds a lone surrogate/],
    [() => o.fingerprint("refund\uD800", {}), /^fingerprint: tool holds a lone surrogate/],
    [() => o.canonicalize('"\uD800"'), /^canonicalize: json holds a lone surrogate/],
    [() => o.setTool("refund\uDBFF", { policy: {} }), /^setTool: tool holds a lone surrogate/],
    [() => o.resolve("s\uD800", "k", "absent", "seen", true), /^resolve: scope holds a lone surrogate/],
    [() => o.queue({ tool: "refund\uDC00" }), /^queue: tool holds a lone surrogate/],
    // Of the wrong type (no compiler checked it): refused the same way, never a failure inside the component.
    [() => o.inspect("s", 7), /^inspect: key must be a string, not number$/],
    [() => o.queue({ scopes: "s" }), /^queue: scopes must be an array of strings, not string$/],
    [() => o.queue({ scopes: [1] }), /^queue: scopes\/0 must be a string, not number$/],
  ]) {
    await assert.rejects(attempt(), (e) => e instanceof InvalidArgumentsError && where.test(e.message), String(where));
  }
  // `null` for an optional filter field is none.
  assert.deepEqual((await o.queue({ tool: null, keyPrefix: null, scopes: null })).entries, []);
});
