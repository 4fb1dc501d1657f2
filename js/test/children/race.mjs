// One of several processes racing one operation key on one SQLite ledger:
//   node race.mjs LEDGER DISPATCH_LOG GO_FILE ID
// It opens the ledger, says "ready", waits for GO_FILE, then makes the call; its
// sender appends to DISPATCH_LOG (the provider's effect). Prints how the call ended.
import { appendFileSync, existsSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { Once, sent } from "../../dist/index.js";

const [ledger, log, go, id] = process.argv.slice(2);
const once = await Once.sqlite(ledger, { waitMs: 30_000 });
console.log("ready");
while (!existsSync(go)) await sleep(2);
const called = await once.call({
  scope: "race",
  key: "refund-1",
  tool: "refund_order",
  args: { order_id: 1, amount: 200 },
  send: async (d) => {
    appendFileSync(log, `${id} attempt ${d.attempt}\n`);
    await sleep(200);
    return sent.success({ refund_id: `r-${id}` });
  },
});
const e = called.account.ending;
console.log(JSON.stringify({ id, ending: e.tag, replayed: e.val?.replayed ?? null, receipt: e.val?.receipt ?? null }));
await once.close();
