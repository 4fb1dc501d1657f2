// A process that is SIGKILLed mid-call:  node crash.mjs LEDGER EFFECTS WHEN
// WHEN=after-effect: its sender records the effect (a line in EFFECTS), says "sent", and hangs;
// WHEN=before-effect: it says "sent" and hangs before the effect. The parent kills it there.
import { appendFileSync } from "node:fs";
import { Once } from "../../dist/index.js";
import { CALL, POLICY, lookupIn } from "./crash-call.mjs";

const [ledger, effects, when] = process.argv.slice(2);
const once = await Once.sqlite(ledger, { tools: { refund_order: { policy: POLICY, lookup: lookupIn(effects) } } });
await once.call({
  ...CALL,
  send: async (d) => {
    if (when === "after-effect") appendFileSync(effects, `${d.providerKey}\n`);
    console.log("sent");
    return new Promise(() => {});
  },
});
