// The adapters against the real framework packages, with scripted models (no network):
// the Vercel AI SDK's generateText tool loop on ai 5, 6 and 7 (devDependencies `ai`, `ai6`, `ai7`:
// npm aliases of each major), each with its own mock model from `<ai>/test`, and an OpenAI Agents JS
// Runner with a scripted Model. Effects are counted in a real SQLite table.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import Database from "better-sqlite3";
import * as ai5 from "ai";
import * as ai5test from "ai/test";
import * as ai6 from "ai6";
import * as ai6test from "ai6/test";
import * as ai7 from "ai7";
import * as ai7test from "ai7/test";
import { Agent, Runner, Usage, setTracingDisabled } from "@openai/agents";
import { z } from "zod";
import { InvalidArgumentsError, Once, Rejected, sent } from "../dist/index.js";
import { protectTool } from "../dist/adapters/ai.js";
import { protectedTool } from "../dist/adapters/openai-agents.js";

setTracingDisabled(true);

const ARGS = { order_id: 1234, amount: 200 };

/** A table of effects in a real SQLite file: what the "payment provider" did, counted after the run. */
function effectsTable(t) {
  const dir = mkdtempSync(join(tmpdir(), "once-adapters-"));
  const db = new Database(join(dir, "provider.db"));
  db.exec("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id INTEGER, amount INTEGER, request_id TEXT)");
  t.after(() => {
    db.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return {
    /** Commit one refund: the effect. */
    refund: ({ order_id, amount, request_id }) =>
      db.prepare("INSERT INTO refunds (order_id, amount, request_id) VALUES (?, ?, ?)").run(order_id, amount, request_id ?? null)
        .lastInsertRowid,
    count: () => db.prepare("SELECT count(*) AS n FROM refunds").get().n,
  };
}

// Each AI SDK major with the mock model and result shapes of its provider specification.
const AI = [
  {
    major: 5,
    ai: ai5,
    Mock: ai5test.MockLanguageModelV2,
    finish: (reason) => reason,
    usage: { inputTokens: 10, outputTokens: 5, totalTokens: 15 },
  },
  {
    major: 6,
    ai: ai6,
    Mock: ai6test.MockLanguageModelV3,
    finish: (reason) => ({ unified: reason, raw: undefined }),
    usage: {
      inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
      outputTokens: { total: 5, text: 5, reasoning: 0 },
    },
  },
  {
    major: 7,
    ai: ai7,
    Mock: ai7test.MockLanguageModelV4,
    finish: (reason) => ({ unified: reason, raw: undefined }),
    usage: {
      inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
      outputTokens: { total: 5, text: 5, reasoning: 0 },
    },
  },
];

/**
 * A scripted AI SDK model: each turn is the tool-call inputs it asks for (or none: a final text), and
 * `prompts` keeps every prompt it was given, so a test can read what the model was shown.
 */
function scriptedAiModel(v, turns, idPrefix = "call") {
  const prompts = [];
  let n = 0;
  const model = new v.Mock({
    doGenerate: async ({ prompt }) => {
      prompts.push(prompt);
      const calls = turns.shift();
      const content = calls
        ? calls.map((input) => ({ type: "tool-call", toolCallId: `${idPrefix}_${++n}`, toolName: "refund_order", input: JSON.stringify(input) }))
        : [{ type: "text", text: "done" }];
      return { content, finishReason: v.finish(calls ? "tool-calls" : "stop"), usage: v.usage, warnings: [] };
    },
  });
  return { model, prompts };
}

/** Every tool result the model was shown, across its prompts, as text. */
const shownToModel = (prompts) => JSON.stringify(prompts.flat().filter((m) => m.role === "tool"));

for (const v of AI) {
  const { generateText, stepCountIs, tool } = v.ai;

  test(`AI SDK ${v.major}: a protected tool's execute runs once per application key, whatever the model's tool-call ids`, async (t) => {
    const once = await Once.memory();
    t.after(() => once.close());
    const refunds = [];
    let operation = "conversation-42/refund-1";
    const refund = protectTool(
      once,
      "refund_order",
      tool({
        description: "Refund part of an order",
        inputSchema: z.object({ order_id: z.number(), amount: z.number() }),
        execute: async (input, { toolCallId }) => (refunds.push(toolCallId), { refund_id: `r-${refunds.length}`, ...input }),
      }),
      { key: () => operation, scope: "tenant-7" },
    );
    const results = [];
    for (const id of ["a", "b"]) {
      const { model } = scriptedAiModel(v, [[ARGS]], id);
      const r = await generateText({ model, tools: { refund_order: refund }, prompt: "refund $200 of order 1234" });
      results.push(r.toolResults[0]);
    }
    assert.deepEqual(refunds, ["a_1"], "the model's second tool-call id did not make a second refund");
    assert.deepEqual(results.map((r) => r.output), [{ refund_id: "r-1", ...ARGS }, { refund_id: "r-1", ...ARGS }]);
    assert.deepEqual(results.map((r) => r.toolCallId), ["a_1", "b_1"]);
    operation = "conversation-42/refund-2"; // a new operation of the application: a new refund
    const { model } = scriptedAiModel(v, [[ARGS]], "c");
    await generateText({ model, tools: { refund_order: refund }, prompt: "refund again" });
    assert.equal(refunds.length, 2);
  });

  // The peer vector model_generated_fresh_id_after_unknown: the provider commits, the reply is lost
  // (unknown), and the model retries with a request id of its own minting. Through once, under the
  // application's key and under a key derived from the named effect fields alike, nothing is sent again,
  // the model is shown once's account (not "try again"), and the run goes on to its final answer.
  for (const keying of [
    { name: "key", options: { key: (input) => `refund-order-${input.order_id}` }, again: /ConflictError/ },
    { name: "deriveKeyFrom", options: { deriveKeyFrom: ["/order_id", "/amount"] }, again: /UnknownOutcomeError/ },
  ]) {
    test(`AI SDK ${v.major}: after an unknown outcome, the model's retry with a fresh request_id is not sent again (${keying.name})`, async (t) => {
      const once = await Once.memory();
      t.after(() => once.close());
      const provider = effectsTable(t);
      const refund = protectTool(
        once,
        "refund_order",
        tool({
          inputSchema: z.object({ order_id: z.number(), amount: z.number(), request_id: z.string() }),
          execute: async (input) => {
            provider.refund(input); // committed at the provider ...
            throw new Error("socket hang up"); // ... and the reply is lost
          },
        }),
        keying.options,
      );
      const { model, prompts } = scriptedAiModel(v, [[{ ...ARGS, request_id: "req-1" }], [{ ...ARGS, request_id: "req-2" }]]);
      const r = await generateText({ model, tools: { refund_order: refund }, prompt: "refund", stopWhen: stepCountIs(5) });
      assert.equal(provider.count(), 1, "one refund at the provider");
      // The identity the option chose is the tool's policy, as the engine applies it.
      const { policy } = once.plan("refund_order");
      assert.equal(policy.identity, keying.name === "key" ? "required" : "derived");
      assert.deepEqual(policy.effectFields, keying.name === "key" ? undefined : ["/order_id", "/amount"]);
      assert.equal(r.text, "done", "the run went on to the model's final answer");
      assert.equal(prompts.length, 3);
      const errors = r.steps.flatMap((s) => s.content.filter((p) => p.type === "tool-error"));
      assert.equal(errors.length, 2);
      assert.equal(errors[0].error.name, "UnknownOutcomeError");
      assert.match(errors[1].error.name, keying.again, errors[1].error.message);
      // What the model was shown after each call: once's own text, in the prompt of its next turn.
      for (const [i, error] of errors.entries()) {
        assert.ok(shownToModel(prompts.slice(i + 1, i + 2)).includes(JSON.stringify(error.error.message).slice(1, -1)), `turn ${i + 2}`);
      }
      assert.match(shownToModel(prompts), /the effect may or may not have happened/);
      assert.doesNotMatch(shownToModel(prompts), /try again/i);
    });
  }

  test(`AI SDK ${v.major}: an application key is required: no key at wrap time, no key from the key function at call time`, async (t) => {
    const once = await Once.memory();
    t.after(() => once.close());
    const provider = effectsTable(t);
    const make = () =>
      tool({
        inputSchema: z.object({ order_id: z.number(), amount: z.number() }),
        execute: async (input) => provider.refund(input),
      });
    assert.throws(() => protectTool(once, "refund_order", make(), {}), (e) => {
      assert.ok(e instanceof InvalidArgumentsError);
      assert.equal(e.pointer, "/key");
      assert.match(e.message, /protectTool\(refund_order\): an application key is required: give options\.key.*options\.deriveKeyFrom/);
      return true;
    });
    assert.throws(() => protectTool(once, "refund_order", make()), InvalidArgumentsError);
    assert.throws(
      () => protectTool(once, "refund_order", make(), { key: () => "k", deriveKeyFrom: ["/order_id"] }),
      /both given/,
    );
    assert.throws(() => protectTool(once, "refund_order", make(), { deriveKeyFrom: ["order_id"] }), /not a JSON pointer/);
    assert.throws(() => protectTool(once, "refund_order", make(), { deriveKeyFrom: [] }), /non-empty array/);
    assert.throws(
      () => protectTool(once, "refund_order", make(), { key: () => "k", policy: { identity: "derived" } }),
      /contradicts options\.key/,
    );
    for (const bad of [undefined, ""]) {
      const refund = protectTool(once, "refund_order", make(), { key: () => bad });
      const { model, prompts } = scriptedAiModel(v, [[ARGS]]);
      const r = await generateText({ model, tools: { refund_order: refund }, prompt: "refund", stopWhen: stepCountIs(3) });
      const error = r.steps.flatMap((s) => s.content).find((p) => p.type === "tool-error");
      assert.ok(error.error instanceof InvalidArgumentsError, String(error.error));
      assert.match(error.error.message, /options\.key returned .* it must return the application's operation key/);
      assert.match(shownToModel(prompts), /options\.key returned/);
    }
    assert.equal(provider.count(), 0, "nothing was sent without a key");
    // No call reached the engine, so the tools' configuration may still be under way: wait for it
    // (setTool calls run in order) before close, which would leave it pending forever.
    await once.setTool("refund_order", {});
  });
}

/** A Model (the @openai/agents interface) answering from a script: function calls, then a final message. */
class ScriptedModel {
  /** `calls`: one argument object per turn (each a refund_order call); `inputs` keeps what each turn was shown. */
  constructor(callId, calls = [ARGS]) {
    this.inputs = [];
    this.turns = calls.map((args, i) => [
      { type: "function_call", callId: `${callId}${i ? `_${i}` : ""}`, name: "refund_order", arguments: JSON.stringify(args), status: "completed" },
    ]);
    this.turns.push([{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "refunded" }] }]);
  }
  async getResponse(request) {
    this.inputs.push(request.input);
    return { usage: new Usage(), output: this.turns.shift() ?? [], responseId: "scripted" };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse() {
    throw new Error("the scripted model does not stream");
  }
}

/** The function-call outputs a turn's input shows the model, as text. */
const outputsShown = (input) => JSON.stringify((Array.isArray(input) ? input : []).filter((i) => i.type === "function_call_result"));

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
  // Another order, refused by the provider: the model is told so in once's words, and nothing was refunded.
  rejectNext = true;
  const model = new ScriptedModel("fc_3", [{ order_id: 99, amount: 5 }]);
  const agent = new Agent({ name: "refunds", instructions: "x", model, tools: [refund] });
  const result = await runner.run(agent, "refund order 99");
  const output = result.newItems.find((i) => i.type === "tool_call_output_item");
  assert.equal(typeof output.output, "string");
  assert.match(output.output, /^RejectedError: .*the provider refused and did nothing.*the order is closed/);
  assert.equal(refunds.length, 1);
  const view = await once.inspect("tenant-7", "refund-order-99");
  assert.equal(view.state, "failed");
  assert.match(view.error, /the order is closed/);
});

// The same peer vector through @openai/agents: before, the model was shown the SDK's "An error
// occurred while running the tool. Please try again." for an effect that may well exist.
for (const keying of [
  { name: "key", options: { key: (input) => `refund-order-${input.order_id}` }, again: /^ConflictError: .*nothing was sent/ },
  { name: "deriveKeyFrom", options: { deriveKeyFrom: ["/order_id", "/amount"] }, again: /^UnknownOutcomeError: / },
]) {
  test(`OpenAI Agents JS: after an unknown outcome, the model's retry with a fresh request_id is not sent again (${keying.name})`, async (t) => {
    const once = await Once.memory();
    t.after(() => once.close());
    const provider = effectsTable(t);
    const refund = protectedTool(once, {
      name: "refund_order",
      description: "Refund part of an order",
      parameters: z.object({ order_id: z.number(), amount: z.number(), request_id: z.string() }),
      execute: async (input) => {
        provider.refund(input); // committed at the provider ...
        throw new Error("socket hang up"); // ... and the reply is lost
      },
      ...keying.options,
    });
    const model = new ScriptedModel("fc", [{ ...ARGS, request_id: "req-1" }, { ...ARGS, request_id: "req-2" }]);
    const agent = new Agent({ name: "refunds", instructions: "Refund orders.", model, tools: [refund] });
    const result = await new Runner({ tracingDisabled: true }).run(agent, "refund $200 of order 1234");
    assert.equal(provider.count(), 1, "one refund at the provider");
    assert.equal(result.finalOutput, "refunded", "the run went on to the model's final answer");
    const outputs = result.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => i.output);
    assert.equal(outputs.length, 2);
    assert.match(outputs[0], /^UnknownOutcomeError: .*the effect may or may not have happened.*nothing is sent until it is known/);
    assert.match(outputs[1], keying.again);
    // The model's next turns were shown exactly these texts.
    assert.ok(outputsShown(model.inputs[1]).includes(JSON.stringify(outputs[0]).slice(1, -1)));
    assert.ok(outputsShown(model.inputs[2]).includes(JSON.stringify(outputs[1]).slice(1, -1)));
    assert.doesNotMatch(JSON.stringify(model.inputs), /Please try again/);
  });
}

test("OpenAI Agents JS: an application key is required, at wrap time and from the key function at call time", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const provider = effectsTable(t);
  const base = {
    name: "refund_order",
    description: "Refund part of an order",
    parameters: z.object({ order_id: z.number(), amount: z.number() }),
    execute: async (input) => provider.refund(input),
  };
  assert.throws(() => protectedTool(once, base), (e) => {
    assert.ok(e instanceof InvalidArgumentsError);
    assert.equal(e.pointer, "/key");
    assert.match(e.message, /protectedTool\(refund_order\): an application key is required: give options\.key/);
    return true;
  });
  assert.throws(() => protectedTool(once, { ...base, deriveKeyFrom: ["/order_id"], policy: { effectFields: ["/amount"] } }), /differ from/);
  const refund = protectedTool(once, { ...base, key: () => undefined });
  const model = new ScriptedModel("fc");
  const agent = new Agent({ name: "refunds", instructions: "x", model, tools: [refund] });
  const result = await new Runner({ tracingDisabled: true }).run(agent, "refund");
  const output = result.newItems.find((i) => i.type === "tool_call_output_item");
  assert.match(output.output, /^InvalidArgumentsError: protectedTool\(refund_order\): options\.key returned undefined/);
  assert.equal(provider.count(), 0);
  await once.setTool("refund_order", {}); // as above: the configuration settles before close
});

// The other two endings item 5 names, through @openai/agents: a call another attempt holds (in flight) and a
// call the tool's policy blocks. Before, the model was shown the SDK's "Please try again" for both.
test("OpenAI Agents JS: in flight and blocked are shown to the model in once's words, nothing is sent, the run goes on", async (t) => {
  const once = await Once.memory({ waitMs: 0 });
  t.after(() => once.close());
  const provider = effectsTable(t);
  const base = {
    description: "Refund part of an order",
    parameters: z.object({ order_id: z.number(), amount: z.number() }),
    execute: async (input) => ({ refund_id: `r-${provider.refund(input)}` }),
    key: (input) => `refund-order-${input.order_id}`,
  };
  // Another attempt holds the operation: its send waits until released.
  let entered;
  const holding = new Promise((resolve) => (entered = resolve));
  let release;
  const released = new Promise((resolve) => (release = resolve));
  const holder = once.call({
    scope: "default",
    key: "refund-order-1234",
    tool: "refund_order",
    args: ARGS,
    send: async () => (entered(), await released, sent.success({ refund_id: "r-held" })),
  });
  await holding;
  const cases = [
    { tool: protectedTool(once, { ...base, name: "refund_order" }), shown: /^InFlightError: refund_order \(scope "default", key "refund-order-1234"\): an attempt holds the operation until \d+/ },
    { tool: protectedTool(once, { ...base, name: "refund_order_blocked", policy: { route: "block" } }), shown: /^BlockedError: refund_order_blocked \(scope "default", key "[^"]*"\): blocked \(route-blocked\)/ },
  ];
  for (const { tool, shown } of cases) {
    const model = new ScriptedModel("fc", [ARGS]);
    model.turns[0][0].name = tool.name;
    const agent = new Agent({ name: "refunds", instructions: "Refund orders.", model, tools: [tool] });
    const result = await new Runner({ tracingDisabled: true }).run(agent, "refund $200 of order 1234");
    assert.equal(result.finalOutput, "refunded", "the run went on to the model's final answer");
    const outputs = result.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => i.output);
    assert.equal(outputs.length, 1);
    assert.match(outputs[0], shown);
    assert.ok(outputsShown(model.inputs[1]).includes(JSON.stringify(outputs[0]).slice(1, -1)));
    assert.doesNotMatch(JSON.stringify(model.inputs), /Please try again/);
  }
  assert.equal(provider.count(), 0, "nothing was sent while held or blocked");
  release();
  assert.equal((await holder).account.ending.tag, "confirmed");
});

// The dispatch timeout reaches a wrapped tool through its framework's own abort signal: once waits for the
// tool to settle before it records the outcome, so a tool that honours that signal must be told.
test("adapters: a tool is aborted at its deadline (send-by plus the dispatch timeout) through its framework's signal, which still works too", async (t) => {
  const once = await Once.memory();
  t.after(() => once.close());
  const policy = { dispatchTimeoutMs: 200 };
  const aborted = [];
  /** A provider call that hangs until its signal is aborted. */
  const hangs = (signal, who) => new Promise((_, reject) => {
    const stop = () => (aborted.push(who), reject(signal.reason));
    if (signal.aborted) stop();
    else signal.addEventListener("abort", stop);
  });
  const viaAi = protectTool(once, "refund_ai", ai5.tool({
    inputSchema: ai5.jsonSchema({ type: "object" }),
    execute: (input, { abortSignal }) => hangs(abortSignal, `ai:${input.order_id}`),
  }), { key: (i) => `ai-${i.order_id}`, policy });
  await assert.rejects(viaAi.execute({ order_id: 1 }, { toolCallId: "c1", messages: [] }), (e) => e.name === "UnknownOutcomeError");
  // The caller's own abort still reaches the tool, before the timeout.
  const own = new AbortController();
  const pending = viaAi.execute({ order_id: 2 }, { toolCallId: "c2", messages: [], abortSignal: own.signal });
  own.abort(new Error("the user stopped the run"));
  await assert.rejects(pending, (e) => e.name === "UnknownOutcomeError");
  const viaAgents = protectedTool(once, {
    name: "refund_agents",
    description: "Refund part of an order",
    parameters: z.object({ order_id: z.number() }),
    execute: (input, _context, details) => hangs(details.signal, `agents:${input.order_id}`),
    key: (i) => `agents-${i.order_id}`,
    policy,
  });
  const shown = await viaAgents.invoke(undefined, JSON.stringify({ order_id: 3 }), { toolCall: { callId: "fc_9" } });
  assert.match(String(shown), /^UnknownOutcomeError: /);
  assert.deepEqual(aborted, ["ai:1", "ai:2", "agents:3"]);
  assert.match((await once.inspect("default", "ai-1")).body, /"unknown_reason":"Error: no answer within 200 ms of send-by"/);
  assert.match((await once.inspect("default", "ai-2")).body, /"unknown_reason":"Error: the user stopped the run"/);
  assert.match((await once.inspect("default", "agents-3")).body, /"unknown_reason":"Error: no answer within 200 ms of send-by"/);
});
