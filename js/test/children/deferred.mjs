// A process on an intent-only SQLite ledger, SIGKILLed after a success it committed deferred:
//   node deferred.mjs LEDGER REPORTED
// It calls once (the sender succeeds), writes how the call ended to REPORTED, then hangs until killed.
import { writeFileSync } from "node:fs";
import { Once, sent } from "../../dist/index.js";

const [ledger, reported] = process.argv.slice(2);
const once = await Once.sqlite(ledger, { synchronous: "intent-only" });
let providerKey = "";
const called = await once.call({
  scope: "tenant-7",
  key: "refund-1234",
  tool: "refund_order",
  args: { order_id: 1234, amount: 200 },
  send: async (d) => ((providerKey = d.providerKey), sent.success({ refund_id: "r-1234" })),
});
const e = called.account.ending;
writeFileSync(reported, JSON.stringify({ ending: e.tag, receipt: e.val.receipt, providerKey }));
setInterval(() => {}, 1000);
