// The call, policy and provider read the crash test and its child share (the record keeps
// whether its tool can be read, so the process that creates it must have the lookup too).
import { existsSync, readFileSync } from "node:fs";
import { evidence } from "../../dist/index.js";

export const POLICY = { dispatchTimeoutMs: 300, maxInFlightMs: 500, leaseMs: 1500 };
export const CALL = { scope: "crash", key: "refund-7", tool: "refund_order", args: { order_id: 7, amount: 200 } };

/** The provider's effects: one provider key a line. */
export const effectsIn = (path) => (existsSync(path) ? readFileSync(path, "utf8").split("\n").filter(Boolean) : []);

/** A linearizable read of the effects file: confirmed, or absent as of the moment the read started. */
export const lookupIn = (path) => ({ providerKey, now }) =>
  effectsIn(path).includes(providerKey) ? evidence.confirmed({ refund_id: "r-7" }) : evidence.absent(now);
