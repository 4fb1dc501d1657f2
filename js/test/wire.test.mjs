// The JSON form (wit/once.wit's top comment) as this package reads and writes it (src/wire.ts): integers
// past 2^53 kept exact both ways, steps and batches read into jco's shapes, and text that is not the
// JSON form refused with a typed error that says what and where.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { ComponentError, EngineError, InvalidJsonError, InvalidRequestError, StorageError } from "../dist/index.js";
import { ledgerImports, ledgerJsonImports } from "../dist/ledger.js";
import { SqliteStore } from "../dist/stores/sqlite.js";
import { WireError, callText, outcomeText, parse, stepOf, stringify } from "../dist/wire.js";
import { tempDir } from "./helpers.mjs";

const I64_MAX = 9223372036854775807n;
const U64_MAX = 18446744073709551615n;

test("parse: integers past 2^53 stay exact (bigint), everything else reads as JSON.parse reads it", () => {
  const v = parse('{"due_at":9223372036854775807,"lease_until":18446744073709551615,"safe":9007199254740991,' +
    '"past":9007199254740993,"neg":-9223372036854775808,"s":"12345678901234567","f":1.5e300,"g":-0.25,"z":0}');
  assert.equal(v.due_at, I64_MAX);
  assert.equal(v.lease_until, U64_MAX);
  assert.equal(v.safe, 9007199254740991);
  assert.equal(v.past, 9007199254740993n);
  assert.equal(v.neg, -9223372036854775808n);
  assert.equal(v.s, "12345678901234567");
  assert.equal(v.f, 1.5e300);
  assert.equal(v.g, -0.25);
  assert.equal(v.z, 0);
  // The exact reader (a run of 16 digits anywhere) and JSON.parse agree on every other value.
  for (const text of [
    '{"scope":"tenant-1234567890123456","esc":"a\\"b\\\\c\\u00e9\\ud83d\\ude00\\n\\/","n":[0,-1,2.5,1E3,1e-7],"o":{},"l":[],' +
      '"t":true,"f":false,"z":null,"deep":[[[{"k":[1,{"x":"y"}]}]]],"dup":1,"dup":2}',
    ' [ "1234567890123456" , { "__proto__" : 1 } ] ',
    '"9999999999999999 is a string"',
  ]) {
    assert.deepEqual(parse(text), JSON.parse(text), text);
  }
  assert.equal(Object.getPrototypeOf(parse('{"__proto__":{"polluted":1},"n":12345678901234567}')), Object.prototype);
  assert.equal({}.polluted, undefined);
});

test("parse: text that is not JSON is a WireError naming where, on both paths", () => {
  for (const text of [
    '{"a":12345678901234567', '{"a":12345678901234567}x', '{"a":12345678901234567,}', '{"a":"\u0001","n":12345678901234567}',
    '{"a":"\\x","n":12345678901234567}', '[12345678901234567 1]', "1234567890123456.", '{"a":01234567890123456}', "",
    '{"a":1', "nul", '{"a":1}}',
  ]) {
    assert.throws(() => parse(text), (e) => e instanceof WireError && e.message.length > 0, JSON.stringify(text));
  }
  assert.throws(() => parse('{"a":12345678901234567,}'), /at offset 23/);
});

test("stringify: a bigint is written as the integer it is", () => {
  assert.equal(stringify({ due_at: I64_MAX, l: [U64_MAX, 1, "x", null], skip: undefined, s: 'q"' }),
    '{"due_at":9223372036854775807,"l":[18446744073709551615,1,"x",null],"s":"q\\""}');
  assert.deepEqual(parse(stringify({ a: U64_MAX, b: [I64_MAX] })), { a: U64_MAX, b: [I64_MAX] });
});

test("what the host sends: a call and every outcome in the JSON form", () => {
  assert.equal(callText("s", "k", "refund", '{"a":1}', undefined, false),
    '{"scope":"s","keys":[["application","k"]],"tool":"refund","args":"{\\"a\\":1}","supersedes":null,"acknowledge_confirmed":false}');
  assert.equal(JSON.parse(callText("s", undefined, "t", "{}", "old", true)).keys.length, 0);
  assert.equal(outcomeText({ outcome: "success", response: '{"id":"r\\"1"}' }), '{"Success":"{\\"id\\":\\"r\\\\\\"1\\"}"}');
  assert.equal(outcomeText({ outcome: "rejected", error: "no" }), '{"Rejected":"no"}');
  assert.equal(outcomeText({ outcome: "ambiguous", reason: "timeout" }), '{"Ambiguous":"timeout"}');
  assert.equal(outcomeText({ outcome: "not-sent" }), '"NotSent"');
  // An answer no constructor of `sent` makes may still have left: reported ambiguous, saying what it was.
  for (const odd of [undefined, null, { outcome: "success", response: { id: 1 } }, { outcome: "maybe" }, { outcome: "success", response: 10n }]) {
    const v = JSON.parse(outcomeText(odd));
    assert.match(v.Ambiguous, /the sender answered .*none of sent\.success/);
  }
});

const grant = (leaseUntil) =>
  `{"Ok":{"Dispatch":{"scope":"s","key":"k","tool":"t","attempt":1,"fence":"1-ab","provider_key":"once-cd","args":"{}",` +
  `"lease_until":${leaseUntil},"send_by":1796282924516,"timeout_ms":30000}}}`;

test("steps: read into jco's shapes, u64s exact as bigint (a lease to u64::MAX, a window to u64::MAX)", () => {
  assert.deepEqual(stepOf(grant("18446744073709551615"), "start"), {
    tag: "dispatch",
    val: { scope: "s", key: "k", tool: "t", attempt: 1, fence: "1-ab", providerKey: "once-cd", args: "{}",
      leaseUntil: U64_MAX, sendBy: 1796282924516n, timeoutMs: 30000n },
  });
  const done = stepOf('{"Ok":{"Done":{"scope":"s","key":null,"key_source":null,"tool":"t","ending":{"Confirmed":{' +
    '"receipt":"{}","replayed":true,"via":"DerivedArgs","confirmed_by":"Provider","at":5,"window_until":18446744073709551615,' +
    '"attempt":null,"earlier_attempts":"None","possible_duplicate":false}},"effect":"Happened","repeat":"Replays","awaits_operator":false}}}', "resume");
  assert.deepEqual(done, {
    tag: "done",
    val: { scope: "s", key: undefined, keySource: undefined, tool: "t",
      ending: { tag: "confirmed", val: { receipt: "{}", replayed: true, via: "derived-args", confirmedBy: "provider", at: 5n,
        windowUntil: U64_MAX, attempt: undefined, earlierAttempts: "none", possibleDuplicate: false } },
      effect: "happened", repeat: "replays", awaitsOperator: false },
  });
  const wait = stepOf('{"Ok":{"Wait":{"scope":"s","key":"k","next":10,"until":9223372036854775807,"reason":"Holder",' +
    '"meanwhile":{"scope":"s","key":"k","key_source":"Application","tool":"t","ending":{"InFlight":{"lease_until":9223372036854775807}},' +
    '"effect":"Unknown","repeat":"Waits","awaits_operator":false}}}}', "start");
  assert.equal(wait.val.until, I64_MAX);
  assert.equal(wait.val.meanwhile.awaitsOperator, false);
  assert.equal(wait.val.reason, "holder");
  assert.deepEqual(wait.val.meanwhile.ending, { tag: "in-flight", val: { leaseUntil: I64_MAX } });
  assert.deepEqual(stepOf('{"Ok":"Direct"}', "start"), { tag: "direct" });
  const blocked = stepOf('{"Ok":{"Done":{"scope":"s","key":"k","key_source":"Derived","tool":"t","ending":{"Blocked":' +
    '{"reason":"SupersededUnresolved","detail":"d","receipt":null}},"effect":"None","repeat":"Refused","awaits_operator":false}}}', "start");
  assert.deepEqual(blocked.val.ending, { tag: "blocked", val: { reason: "superseded-unresolved", detail: "d", receipt: undefined } });
  const blind = stepOf('{"Ok":{"Done":{"scope":"s","key":"k","key_source":"Application","tool":"t","ending":{"Unknown":' +
    '{"since":1,"deadline":2,"reason":"timeout","next_read":null}},"effect":"Unknown","repeat":"Waits","awaits_operator":true}}}', "report");
  assert.equal(blind.val.awaitsOperator, true);
});

test("steps: the engine's error is thrown as its EngineError; text that is not the JSON form is a ComponentError", () => {
  assert.throws(() => stepOf('{"Err":"NotFound"}', "resume"), (e) => e instanceof EngineError && e.payload.tag === "not-found");
  assert.throws(() => stepOf('{"Err":{"Storage":"storage: disk full"}}', "start"),
    (e) => e instanceof StorageError && e.message === "storage: disk full");
  assert.throws(() => stepOf('{"Err":{"InvalidRequest":"call: bad"}}', "start"), InvalidRequestError);
  assert.throws(
    () => stepOf('{"Err":{"InvalidJson":{"kind":"DuplicateKey","pointer":"/a","offset":18446744073709551615,"message":"m"}}}', "start"),
    (e) => e instanceof InvalidJsonError && e.json.kind === "duplicate-key" && e.json.offset === U64_MAX && e.json.pointer === "/a",
  );
  for (const [text, why] of [
    ["not json", /not the JSON form of a result<step, error>/],
    ['{"Ok":{"Dispatch":{"scope":1}}}', /grant\.scope: expected a string/],
    [grant("18446744073709551616"), /grant\.lease_until: expected an integer in u64/],
    [grant("-1"), /lease_until/],
    [grant("1.5"), /lease_until/],
    ['{"Ok":"Wait"}', /step/],
    ['{"Ok":{"Done":{}},"Err":"NotFound"}', /result: expected one case/],
    ['{"Maybe":1}', /result: no case "Maybe"/],
    ['{"Err":"Teapot"}', /error/],
    ['{"Ok":{"Done":{"scope":"s","key":"k","key_source":"Application","tool":"t","ending":{"Confirmed":{}},"effect":"Happened","repeat":"Replays"}}}', /confirmed\.receipt/],
    ['{"Ok":{"Done":{"scope":"s","key":"k","key_source":"Application","tool":"t","ending":{"NotSent":{"attempts":1}},"effect":"None","repeat":"Refused"}}}', /account\.awaits_operator/],
    ['{"Ok":{"Done":{"scope":"s","key":"k","key_source":"Nobody","tool":"t","ending":{"NotSent":{"attempts":1}},"effect":"None","repeat":"Refused"}}}', /key_source: not a key-source/],
  ]) {
    assert.throws(() => stepOf(text, "report"), (e) => e instanceof ComponentError && /^report: /.test(e.message) && why.test(e.message), text);
  }
});

/** A typed batch as jco hands it to `ledger.commit`: an absent record due at `dueAt`, a tombstone check, its event. */
const batch = (dueAt, key = "k") => ({
  puts: [
    {
      table: "operation", scope: "s", key, expected: undefined,
      row: { table: "operation", scope: "s", key, version: 1n, state: "absent", dueAt, owner: "default", body: '{"owed":true}' },
    },
    { table: "tombstone", scope: "s", key, expected: undefined, row: undefined },
  ],
  events: [{ scope: "s", key, version: 1n, at: 1796282924516n, kind: "begin", fromState: undefined, toState: "absent",
    attempt: undefined, detail: "{}" }],
  deferrable: false,
});

test("the ledger import over the package's SQLite store: a row due at i64::MAX is written, read and scanned exactly", (t) => {
  const store = new SqliteStore({ path: join(tempDir(t), "ledger.db") });
  t.after(() => store.close());
  const ledger = ledgerImports(store);
  assert.deepEqual(ledger.get("operation", "s", "k"), { tag: "missing" });
  assert.deepEqual(ledger.commit(batch(I64_MAX)), { tag: "applied" });
  assert.deepEqual(ledger.get("operation", "s", "k"), { tag: "found", val: { version: 1n, body: '{"owed":true}' } });
  // The same insert again: the row exists.
  assert.deepEqual(ledger.commit(batch(I64_MAX)), { tag: "conflict" });
  const scanned = ledger.scan("operation", ["absent"], I64_MAX, "default", 10);
  assert.equal(scanned.tag, "found");
  assert.equal(scanned.val.rows[0].dueAt, I64_MAX);
  // One before it lists nothing: the stored value is i64::MAX, not a rounding of it.
  assert.equal(ledger.scan("operation", [], I64_MAX - 1n, undefined, 10).val.rows.length, 0);
  // A row that is not its put's is refused whole, saying which; a due-at past i64 is the store's refusal.
  for (const [field, value, put] of [["table", "quota", 0], ["scope", "elsewhere", 0], ["key", "k4", 0], ["key", "k4", 2]]) {
    const stray = batch(1n, "k3");
    // A third put, writing a row of its own, so a stray row can come after a row-less put.
    stray.puts.push({ ...stray.puts[0], table: "quota", row: { ...stray.puts[0].row, table: "quota", state: undefined } });
    stray.puts[put].row[field] = value;
    const refused = ledger.commit(stray);
    assert.equal(refused.tag, "failed", `${field} of puts/${put}`);
    assert.match(refused.val.message, new RegExp(`^ledger\\.commit: puts/${put}: the row is not the put's`));
  }
  const past = ledger.commit(batch(I64_MAX + 1n, "k2"));
  assert.equal(past.tag, "failed");
  assert.match(past.val.message, /due_at 9223372036854775808 exceeds i64::MAX/);
  assert.deepEqual(ledger.get("operation", "s", "k2"), { tag: "missing" });
  for (const [table, scope, key] of [["operation", "s", "k3"], ["quota", "s", "k3"], ["operation", "elsewhere", "k3"], ["operation", "s", "k4"]]) {
    assert.deepEqual(ledger.get(table, scope, key), { tag: "missing" }, `${table}/${scope}/${key}`);
  }
  // A put with no row passes the check: a well-placed batch with one (the tombstone check) applies.
  assert.deepEqual(ledger.commit(batch(1n, "k5")), { tag: "applied" });
  assert.equal(store.counts().events, 2);
  // The JSON encoding is not this host's: it answers failed, never missing or applied.
  const json = ledgerJsonImports();
  assert.match(JSON.parse(json.get("operation", "s", "k")).Failed.message, /typed ledger only/);
  assert.match(JSON.parse(json.commit("{}", [])).Failed.message, /typed ledger only/);
});
