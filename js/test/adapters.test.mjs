// The adapters against the real framework packages, with scripted models (no network):
// the Vercel AI SDK's generateText tool execution with its MockLanguageModelV2 (ai/test),
// and an OpenAI Agents JS Runner with a scripted Model.
import assert from "node:assert/strict";
import { test } from "node:test";
import { generateText, tool as aiTool } from "ai";
import { MockLanguageModelV2 } from "ai/test";
import { Agent, Runner, Usage, setTracingDisabled } from "@openai/agents";
import { z } from "zod";
import { Once, Rejected } from "../dist/index.js";
import { protectTool } from "../dist/adapters/ai.js";
import { protectedTool } from "../dist/adapters/openai-agents.js";

setTracingDisabled(true);

const ARGS = { order_id: 1234, amount: 200 };

/** A model that asks for one refund_order call, with a tool-call id of its own minting. */
const toolCallingModel = (toolCallId) =>
  new MockLanguageModelV2({
    doGenerate: async () => ({
      content: [{ type: "tool-call", toolCallId, toolName: "refund_order", input: JSON.stringify(ARGS) }],
      finishReason: "tool-calls",
      usage: { inputTokens: 10, outputTokens: 5, totalTokens: 15 },
      warnings: [],
    }),
  });

test("AI SDK: a protected tool's execute runs once per application key, whatever the model's tool-call ids", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const refunds = [];
  let operation = "conversation-42/refund-1";
  const refund = protectTool(
    once,
    "refund_order",
    aiTool({
      description: "Refund part of an order",
      inputSchema: z.object({ order_id: z.number(), amount: z.number() }),
      execute: async (input, { toolCallId }) => (refunds.push(toolCallId), { refund_id: `r-${refunds.length}`, ...input }),
    }),
    { key: () => operation, scope: "tenant-7" },
  );
  const results = [];
  for (const id of ["call_a", "call_b"]) {
    const r = await generateText({ model: toolCallingModel(id), tools: { refund_order: refund }, prompt: "refund $200 of order 1234" });
    results.push(r.toolResults[0]);
  }
  assert.deepEqual(refunds, ["call_a"], "the model's second tool-call id did not make a second refund");
  assert.deepEqual(results.map((r) => r.output), [{ refund_id: "r-1", ...ARGS }, { refund_id: "r-1", ...ARGS }]);
  assert.deepEqual(results.map((r) => r.toolCallId), ["call_a", "call_b"]);
  operation = "conversation-42/refund-2"; // a new operation of the application: a new refund
  await generateText({ model: toolCallingModel("call_c"), tools: { refund_order: refund }, prompt: "refund again" });
  assert.equal(refunds.length, 2);
});

test("AI SDK: an outcome that is not a confirmed effect reaches the model as the tool's error", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const refund = protectTool(
    once,
    "refund_order",
    aiTool({
      inputSchema: z.object({ order_id: z.number(), amount: z.number() }),
      execute: async () => {
        throw new Error("socket hang up");
      },
    }),
    { key: () => "op-1" },
  );
  const r = await generateText({ model: toolCallingModel("call_x"), tools: { refund_order: refund }, prompt: "refund" });
  const error = r.content.find((p) => p.type === "tool-error");
  assert.ok(error, JSON.stringify(r.content));
  assert.equal(error.error.name, "UnknownOutcomeError");
  assert.match(String(error.error.message), /may or may not have happened/);
});

/** A Model (the @openai/agents interface) answering from a script: a function call, then a final message. */
class ScriptedModel {
  constructor(callId, args = ARGS) {
    this.turns = [
      [{ type: "function_call", callId, name: "refund_order", arguments: JSON.stringify(args), status: "completed" }],
      [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "refunded" }] }],
    ];
  }
  async getResponse() {
    return { usage: new Usage(), output: this.turns.shift() ?? [], responseId: "scripted" };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("the scripted model does not stream");
  }
}

test("OpenAI Agents JS: a protected tool() runs once per application key across runs", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const refunds = [];
  let rejectNext = false;
  const refund = protectedTool(once, {
    name: "refund_order",
    description: "Refund part of an order",
    parameters: z.object({ order_id: z.number(), amount: z.number() }),
    execute: async (input, _context, details) => {
      if (rejectNext) throw new Rejected("the order is closed");
      refunds.push(details?.toolCall?.callId);
      return { refund_id: "r-1", ...input };
    },
    key: (input) => `refund-order-${input.order_id}`,
    scope: "tenant-7",
  });
  const runner = new Runner({ tracingDisabled: true });
  for (const callId of ["fc_1", "fc_2"]) {
    const agent = new Agent({ name: "refunds", instructions: "Refund orders.", model: new ScriptedModel(callId), tools: [refund] });
    const result = await runner.run(agent, "refund $200 of order 1234");
    assert.equal(result.finalOutput, "refunded");
    const output = result.newItems.find((i) => i.type === "tool_call_output_item");
    assert.deepEqual(output.output, { refund_id: "r-1", ...ARGS });
  }
  assert.equal(refunds.length, 1);
  // Another order, refused by the provider: the model is told the tool failed, and nothing was refunded.
  rejectNext = true;
  const model = new ScriptedModel("fc_3", { order_id: 99, amount: 5 });
  const agent = new Agent({ name: "refunds", instructions: "x", model, tools: [refund] });
  const result = await runner.run(agent, "refund order 99");
  const output = result.newItems.find((i) => i.type === "tool_call_output_item");
  assert.equal(typeof output.output, "string");
  assert.match(output.output, /error/i);
  assert.equal(refunds.length, 1);
  const view = await once.inspect("tenant-7", "refund-order-99");
  assert.equal(view.state, "failed");
  assert.match(view.error, /the order is closed/);
});
