// One protected call on the memory ledger, then exit (the debug-log test runs it with and without JCO_DEBUG).
import { Once, sent } from "../../dist/index.js";

const once = await Once.memory();
const c = await once.call({ scope: "s", key: "k", tool: "refund_order", args: { order_id: 1 }, send: async () => sent.successJson("{}") });
console.log(`ending ${c.account.ending.tag}`);
await once.close();
