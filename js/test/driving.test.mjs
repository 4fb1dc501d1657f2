// A settle round beside a live call of the same handle (a gateway's worker beside a client's call). The call's
// reply was lost; it waits for its read to come due, then reads and sends the next attempt itself. The round's
// sweep proves the same absence and lists the dispatch owed; if the round sent it, the caller, who made one
// call, would be told its operation had already run (a replay). The round leaves what a call is driving to that
// call, and takes it once the call has returned or thrown. A real SQLite ledger file, through the built package.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Once, evidence, sent } from "../dist/index.js";
import { tempDir } from "./helpers.mjs";

const SCOPE = "tenant-7";
const TOOL = "refund_order";
const ARGS = { order_id: 1234, amount: 200 };

/**
 * A provider whose effects are kept by provider key. Its read answers "could not tell" until `readable` is set,
 * so the read made when the first reply is lost settles nothing however long that takes: the call waits.
 */
function provider() {
  const effects = new Map();
  const p = {
    readable: false,
    lookup: ({ providerKey, now }) => {
      if (!p.readable) return evidence.unknown("the provider's read is not up yet");
      return effects.has(providerKey) ? evidence.confirmed(effects.get(providerKey)) : evidence.absent(now);
    },
    /** A sender that logs each attempt as `who`: the first `lost` of them never reach the provider, and their replies are lost. */
    sender: (who, log, { lost = 0, throws = false } = {}) => (d) => {
      log.push(`${who} ${d.key} #${d.attempt}`);
      if (log.filter((l) => l.startsWith(`${who} ${d.key} `)).length <= lost) {
        if (throws) throw new Error("connection reset after the request was sent");
        return sent.ambiguous("connection reset after the request was sent");
      }
      const receipt = { refund_id: `r-${d.key}-${d.attempt}` };
      effects.set(d.providerKey, JSON.stringify(receipt));
      return sent.success(receipt);
    },
  };
  return p;
}

async function open(t, p) {
  const once = await Once.sqlite(join(tempDir(t), "once.db"), {
    lookup: p.lookup,
    tools: { [TOOL]: { policy: { maxInFlightMs: 1, reconcileIntervalMs: 1 } } },
  });
  t.after(() => once.close());
  return once;
}

/**
 * The engine's answers watched for each key's latest wait (`next`, on the ledger clock), and the first `resume`
 * of `key` (the call's step after its first wait) either held until `release()` (`reached` resolves when the
 * call gets there: it is between its steps) or, with `fail`, refused as a ledger that cannot be reached would.
 */
function intercept(once, key, { fail = false } = {}) {
  const engine = once.engine;
  const call = engine.call.bind(engine);
  const next = new Map();
  let first = true;
  let reached;
  let release;
  const at = new Promise((r) => (reached = r));
  const gate = new Promise((r) => (release = r));
  engine.call = (op, ...args) => {
    let answer;
    if (op === "resume" && args[0] === SCOPE && args[1] === key && first) {
      first = false;
      reached();
      answer = fail ? Promise.reject(new Error("storage: the ledger is unreachable")) : gate.then(() => call(op, ...args));
    } else answer = call(op, ...args);
    answer.then((step) => step?.tag === "wait" && next.set(step.val.key, Number(step.val.next)), () => {});
    return answer;
  };
  return { reached: at, release, next };
}

/** A value as JSON, its bigints (the ledger's timestamps) as numbers' text. */
const shown = (v) => JSON.stringify(v, (_, x) => (typeof x === "bigint" ? String(x) : x));

/** Until the ledger clock is past `at`: a read due then is due. */
async function past(once, at) {
  while ((await once.now()) <= at) await sleep(1);
}

test("a settle beside a call whose reply was lost sends nothing of it: the call sends attempt 2 and answers executed", async (t) => {
  const p = provider();
  const once = await open(t, p);
  const log = [];
  const engine = intercept(once, "refund-1");
  const pending = once.call({ scope: SCOPE, key: "refund-1", tool: TOOL, args: ARGS, send: p.sender("call", log, { lost: 1 }) });
  await engine.reached;
  // The call is between its steps, its read due: the round reads the provider, proves the absence, lists it owed.
  p.readable = true;
  await past(once, engine.next.get("refund-1"));
  const round = await once.settle(10, p.sender("settle", log));
  assert.deepEqual(round.sweep.owed, [[SCOPE, "refund-1"]], "the round found the call's operation owed");
  assert.deepEqual(round.sent, [], "the round sent nothing of the operation the call drives");
  assert.deepEqual(log, ["call refund-1 #1"]);

  engine.release();
  const called = await pending;
  assert.equal(called.kind, "done");
  const { ending, effect } = called.account;
  assert.equal(ending.tag, "confirmed", shown(ending));
  assert.equal(effect, "happened");
  assert.equal(ending.val.replayed, false, "the caller is told it sent it, not that it already ran");
  assert.equal(ending.val.attempt, 2);
  assert.deepEqual(JSON.parse(ending.val.receipt), { refund_id: "r-refund-1-2" });
  assert.deepEqual(log, ["call refund-1 #1", "call refund-1 #2"], "two sends in all, both the call's");

  // Once the call is over, a round takes what is due again: nothing is, and nothing is sent.
  const after = await once.settle(10, p.sender("settle", log));
  assert.deepEqual([after.sweep.owed, after.sent], [[], []]);
  assert.equal(log.length, 2);
});

test("a call that returned or threw while its operation was unsettled leaves it to the next settle, which sends it", async (t) => {
  const p = provider();
  const once = await open(t, p);
  const log = [];
  const engine = intercept(once, "threw", { fail: true });
  // Its send throws (the reply lost) and it does not wait for the read: it answers unknown.
  const returned = await once.call({
    scope: SCOPE, key: "returned", tool: TOOL, args: ARGS, waitMs: 0, send: p.sender("call", log, { lost: 1, throws: true }),
  });
  assert.equal(returned.account.ending.tag, "unknown", shown(returned.account.ending));
  // Its send throws and it waits for the read, but its resume fails: the call throws.
  await assert.rejects(
    once.call({ scope: SCOPE, key: "threw", tool: TOOL, args: ARGS, send: p.sender("call", log, { lost: 1, throws: true }) }),
    /the ledger is unreachable/,
  );
  assert.deepEqual(log, ["call returned #1", "call threw #1"]);

  p.readable = true;
  await past(once, Math.max(...engine.next.values()));
  const round = await once.settle(10, p.sender("settle", log));
  assert.deepEqual(round.sweep.owed.map(([, key]) => key).sort(), ["returned", "threw"]);
  const sentBy = round.sent.map((c) => [c.account.key, c.account.ending.tag, c.account.ending.val.attempt]).sort();
  assert.deepEqual(sentBy, [["returned", "confirmed", 2], ["threw", "confirmed", 2]]);
  assert.deepEqual(log.slice(2).sort(), ["settle returned #2", "settle threw #2"]);
});

test("a send that hangs past its deadline, ignoring its signal, leaves its operation to the next settle", async (t) => {
  const p = provider();
  p.readable = true;
  const once = await Once.sqlite(join(tempDir(t), "once.db"), {
    lookup: p.lookup,
    // Send-by ~1.95 s after the grant (however slow the machine), the answer due 50 ms later.
    tools: { [TOOL]: { policy: { maxInFlightMs: 1, dispatchTimeoutMs: 50, leaseMs: 2000 } } },
  });
  t.after(() => once.close());
  const log = [];
  let inSend;
  let unhang;
  const sending = new Promise((r) => (inSend = r));
  const hangs = new Promise((r) => (unhang = r));
  // A send is the caller's code: this one never looks at its signal and answers only when the test lets it.
  const pending = once.call({
    scope: SCOPE, key: "hung", tool: TOOL, args: ARGS, waitMs: 0,
    send: async (d) => {
      log.push(`call hung #${d.attempt}`);
      inSend();
      await hangs;
      return sent.notSent();
    },
  });
  await sending;
  // Past the send's deadline and its lease, the round proves the absence and sends attempt 2.
  let round;
  for (let i = 0; i < 500; i++) {
    round = await once.settle(10, p.sender("settle", log));
    if (round.sent.length > 0) break;
    await sleep(20);
  }
  assert.deepEqual(round.sent.map((c) => [c.account.key, c.account.ending.tag, c.account.ending.val.attempt]), [["hung", "confirmed", 2]]);
  assert.deepEqual(log, ["call hung #1", "settle hung #2"]);
  unhang();
  await pending;
});
