// An adapter that sets a tool's identity keeps the rest of the policy the handle configured for that tool
// (a review found the JS adapters replacing it whole: a quota or attempt budget silently gone).
import assert from "node:assert/strict";
import { test } from "node:test";
import { tool } from "ai7";
import { tool as agentsTool } from "@openai/agents";
import { z } from "zod";
import { Once, evidence } from "../dist/index.js";
import { protectTool } from "../dist/adapters/ai.js";
import { protectedTool } from "../dist/adapters/openai-agents.js";

const HANDLE_POLICY = { attemptBudget: 5, verifyFirst: true, reconcileIntervalMs: 250 };

for (const [name, wrap] of [
  [
    "AI SDK",
    (once) =>
      protectTool(
        once,
        "refund_order",
        tool({ inputSchema: z.object({ order_id: z.number() }), execute: async () => ({ ok: true }) }),
        { key: (i) => `refund-${i.order_id}` },
      ),
  ],
  [
    "@openai/agents",
    (once) =>
      protectedTool(once, {
        name: "refund_order",
        description: "Refund an order",
        parameters: z.object({ order_id: z.number() }),
        execute: async () => ({ ok: true }),
        deriveKeyFrom: ["/order_id"],
      }),
  ],
]) {
  test(`${name}: the adapter's identity is added to the handle's policy for the tool, not put in its place`, async (t) => {
    const once = await Once.memory({ lookup: async () => evidence.unknown("not asked"), tools: { refund_order: { policy: HANDLE_POLICY } } });
    t.after(() => once.close());
    wrap(once);
    // The adapter's configuration is queued on the handle: one queued after it has seen it applied.
    await once.setTool("refund_order", {});
    const { policy } = once.plan("refund_order");
    assert.equal(policy.attemptBudget, 5);
    assert.equal(policy.verifyFirst, true);
    assert.equal(policy.reconcileIntervalMs, 250n);
    assert.equal(policy.identity, name === "AI SDK" ? "required" : "derived");
  });
}
