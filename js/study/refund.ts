// The seed study's refund loop in TypeScript, through the Vercel AI SDK's real
// tool-execution path (generateText with the scripted MockLanguageModelV2 from
// ai/test: no network, no model), against examples/refund's refund-service
// behind its fault proxy. Each trial starts a fresh service (its own SQLite
// effect ledger, `unsafe` mode: it records the key and never dedupes) and, for
// protected agents, a fresh once ledger; the verdict is read from the service's
// ledger. Prints the table of `once demo`.
//
//   node dist-study/refund.js [--trials N] [--faults a,b] [--service PATH]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { type ToolSet, generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV2 } from "ai/test";
import { z } from "zod";
import { NotSent, Once, Rejected, evidence } from "once-exactly";
import { protectTool } from "once-exactly/ai";

/** The agent's retry policies (the study's). */
export const POLICIES = ["always_retry", "never_retry", "read_then_decide"] as const;
export type Policy = (typeof POLICIES)[number];
/** What the agent finally tells its user. */
type Report = "refunded" | "failed" | "unknown";

const ORDER_ID = 1234;
const AMOUNT = 200;
/** The agent's HTTP timeout (the demo's). */
const CLIENT_TIMEOUT_MS = 150;
/** How many times a retrying agent calls the refund tool. */
const RETRIES = 6;

type Answer = { ok: string } | { rejected: string } | { ambiguous: string } | { notSent: string };

/** One HTTP call as the study's client classifies it: 2xx, 4xx (a definite refusal), nothing sent, or anything else. */
async function http(url: string, init: RequestInit = {}): Promise<Answer> {
  // A timer of our own: AbortSignal.timeout's is unref'd, and undici's sockets do not keep the process alive either.
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(new Error(`no answer within ${CLIENT_TIMEOUT_MS} ms`)), CLIENT_TIMEOUT_MS);
  try {
    const r = await fetch(url, { ...init, signal: abort.signal });
    const body = await r.text();
    if (r.status >= 200 && r.status < 300) return { ok: body };
    if (r.status >= 400 && r.status < 500) return { rejected: `status ${r.status}: ${body}` };
    return { ambiguous: `status ${r.status}: ${body}` };
  } catch (e) {
    const cause = (e as { cause?: { code?: string } }).cause;
    if (cause?.code === "ECONNREFUSED") return { notSent: "connection refused" };
    return { ambiguous: e instanceof Error ? `${e.name}: ${e.message}${cause?.code ? ` (${cause.code})` : ""}` : String(e) };
  } finally {
    clearTimeout(timer);
  }
}

const postRefund = (base: string, key: string) =>
  http(`${base}/refunds`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ order_id: ORDER_ID, amount: AMOUNT, idempotency_key: key }),
  });

/** The text a tool result shows the model: its output, or its error. */
function resultText(part: { output: { type: string; value?: unknown } }): { error: boolean; text: string } {
  const { type, value } = part.output;
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return { error: type.startsWith("error"), text };
}

/**
 * A scripted model for `policy`: it reads the tool results in its prompt (the SDK's
 * real messages) and decides the next step as the study's agents do.
 */
function scriptedModel(policy: Policy, protectedAgent: boolean): MockLanguageModelV2 {
  let calls = 0;
  const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };
  const say = (text: Report) => ({ content: [{ type: "text" as const, text }], finishReason: "stop" as const, usage, warnings: [] });
  const call = (toolName: string, input: unknown) => ({
    content: [{ type: "tool-call" as const, toolCallId: `call_${++calls}`, toolName, input: JSON.stringify(input) }],
    finishReason: "tool-calls" as const,
    usage,
    warnings: [],
  });
  // Models mint a fresh idempotency key per call; once overwrites it with the provider key.
  const refund = () => call("refund_order", { order_id: ORDER_ID, amount: AMOUNT, idempotency_key: `model-${calls}-${Date.now()}` });
  return new MockLanguageModelV2({
    doGenerate: async ({ prompt }) => {
      const results = prompt
        .filter((m) => m.role === "tool")
        .flatMap((m) => m.content as unknown as { toolName: string; output: { type: string; value?: unknown } }[])
        .map((p) => ({ tool: p.toolName, ...resultText(p) }));
      const refunds = results.filter((r) => r.tool === "refund_order");
      const last = results.at(-1);
      if (!last) return refund();
      const refused = (t: string) => /^rejected|refused|not sent|nothing was sent|blocked|conflict/.test(t);
      const unknownNow = (t: string) => /may or may not|an attempt holds/.test(t);
      if (last.tool === "get_order") {
        if (last.error) return say("unknown");
        if ((JSON.parse(last.text) as { refunded: number }).refunded >= AMOUNT) return say("refunded");
        return refund();
      }
      if (!last.error) return say("refunded");
      if (refused(last.text)) return say("failed");
      switch (policy) {
        case "never_retry":
          return say(protectedAgent && unknownNow(last.text) ? "unknown" : "failed");
        case "always_retry":
          if (refunds.length < RETRIES) return refund();
          return say(protectedAgent ? "unknown" : "failed");
        case "read_then_decide":
          if (!results.some((r) => r.tool === "get_order")) return call("get_order", { order_id: ORDER_ID });
          if (protectedAgent && refunds.length < RETRIES) return refund();
          return say(protectedAgent ? "unknown" : "failed");
      }
    },
  });
}

/** A refund service (and its fault proxy) of one trial. */
async function startService(bin: string, dir: string, fault: string) {
  const db = join(dir, "refunds.db");
  const proc = spawn(bin, ["--db", db, "--mode", "unsafe", "--fault", fault], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  const proxy = await new Promise<string>((res, rej) => {
    proc.stdout!.on("data", (d) => {
      out += d;
      const m = /proxy (http:\/\/\S+)/.exec(out);
      if (m) res(m[1]);
    });
    proc.on("exit", (code) => rej(new Error(`refund-service exited (${code}): ${out}`)));
  });
  const stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGKILL");
    await gone;
  };
  return { proxy, db, stop };
}

/** One trial: the refunds the service's ledger holds, and the agent's final report. */
export async function trial(bin: string, policy: Policy, protectedAgent: boolean, fault: string) {
  const dir = mkdtempSync(join(tmpdir(), "once-js-study-"));
  const service = await startService(bin, dir, fault);
  let once: Once | undefined;
  try {
    const base = service.proxy;
    const key = `refund-${ORDER_ID}`;
    let attempt = 0;
    const refundTool = tool({
      description: "Refund part of an order",
      inputSchema: z.object({ order_id: z.number(), amount: z.number(), idempotency_key: z.string().optional() }),
      execute: async (input) => {
        // Unprotected: a fresh request id per attempt; protected: the provider key once put in the key argument.
        const requestKey = protectedAgent ? input.idempotency_key! : `${key}-req-${process.pid}-${++attempt}`;
        const a = await postRefund(base, requestKey);
        if ("ok" in a) return JSON.parse(a.ok) as unknown;
        if ("rejected" in a) throw protectedAgent ? new Rejected(a.rejected) : new Error(`rejected: ${a.rejected}`);
        if ("notSent" in a) throw protectedAgent ? new NotSent(a.notSent) : new Error(`ambiguous: ${a.notSent}`);
        throw new Error(`ambiguous: ${a.ambiguous}`);
      },
    });
    let tools: ToolSet = {
      get_order: tool({
        description: "Read an order",
        inputSchema: z.object({ order_id: z.number() }),
        execute: async ({ order_id }) => {
          const a = await http(`${base}/orders/${order_id}`);
          if ("ok" in a) return JSON.parse(a.ok) as unknown;
          throw new Error(`read failed: ${JSON.stringify(a)}`);
        },
      }),
    };
    if (protectedAgent) {
      once = await Once.sqlite(join(dir, "once.db"), { waitMs: 5000 });
      const protectedRefund = protectTool(once, "refund_order", refundTool, {
        key: () => key, // minted by the application before the first attempt
        scope: "study",
        policy: {
          keyArgument: "idempotency_key",
          dispatchTimeoutMs: CLIENT_TIMEOUT_MS,
          maxInFlightMs: 300,
          reconcileIntervalMs: 25,
          attemptBudget: 4,
          resolveDeadlineMs: 10_000,
        },
        // The service's read by key, never the write path.
        lookup: async ({ providerKey }) => {
          const a = await http(`${base}/refunds?key=${encodeURIComponent(providerKey)}`);
          if (!("ok" in a)) return evidence.unknown(JSON.stringify(a));
          const found = JSON.parse(a.ok) as { found: boolean; refund: unknown; read_position: number };
          return found.found ? evidence.confirmed(found.refund) : evidence.absent(found.read_position);
        },
      });
      tools = { ...tools, refund_order: protectedRefund };
    } else tools = { ...tools, refund_order: refundTool };
    const result = await generateText({
      model: scriptedModel(policy, protectedAgent),
      tools,
      stopWhen: stepCountIs(20),
      prompt: `Refund $${AMOUNT} on order ${ORDER_ID}.`,
    });
    const report = result.text as Report;
    await once?.close();
    once = undefined;
    await service.stop();
    const db = new Database(service.db, { readonly: true });
    const row = db.prepare("SELECT count(*) AS n, coalesce(sum(amount_cents), 0) AS cents FROM refunds WHERE order_id = ?").get(ORDER_ID) as {
      n: number;
      cents: number;
    };
    db.close();
    return { effects: row.n, cents: row.cents, report };
  } finally {
    await once?.close();
    await service.stop().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One cell of the table. */
export interface Cell {
  trials: number;
  exactlyOnce: number;
  duplicates: number;
  omissions: number;
  falseCompletions: number;
}

/** Run every policy × protection × fault `n` times; the cells by `${policy}/${protected}/${fault}`. */
export async function study(bin: string, n: number, faults: string[]): Promise<Map<string, Cell>> {
  const cells = new Map<string, Cell>();
  for (const policy of POLICIES) {
    for (const protectedAgent of [false, true]) {
      for (const fault of faults) {
        const c: Cell = { trials: 0, exactlyOnce: 0, duplicates: 0, omissions: 0, falseCompletions: 0 };
        for (let i = 0; i < n; i++) {
          const v = await trial(bin, policy, protectedAgent, fault);
          const exactly = v.effects === 1 && v.cents === AMOUNT * 100;
          c.trials += 1;
          c.exactlyOnce += Number(exactly);
          c.duplicates += Number(v.effects > 1);
          c.omissions += Number(v.effects === 0);
          c.falseCompletions += Number((v.report === "refunded" && !exactly) || (v.report === "failed" && v.effects > 0));
        }
        cells.set(`${policy}/${protectedAgent}/${fault}`, c);
      }
    }
  }
  return cells;
}

/** The table, in `once demo`'s shape. */
export function table(cells: Map<string, Cell>, faults: string[]): string {
  let out = "each fault: exactly-once/trials  dup omit false\n";
  out += "policy".padEnd(30) + faults.map((f) => ` | ${center(f, 22)}`).join("") + "\n";
  for (const policy of POLICIES) {
    for (const protectedAgent of [false, true]) {
      out += `${policy} ${protectedAgent ? "(once)" : "(unprotected)"}`.padEnd(30);
      for (const fault of faults) {
        const c = cells.get(`${policy}/${protectedAgent}/${fault}`)!;
        const text = `${`${c.exactlyOnce}/${c.trials}`.padStart(5)} ${String(c.duplicates).padStart(3)} ${String(c.omissions).padStart(3)} ${String(c.falseCompletions).padStart(3)}`;
        out += ` | ${center(text, 22)}`;
      }
      out += "\n";
    }
  }
  return out;
}

function center(s: string, width: number): string {
  const pad = Math.max(0, width - s.length);
  return " ".repeat(Math.floor(pad / 2)) + s + " ".repeat(pad - Math.floor(pad / 2));
}

/** The refund-service binary: $ONCE_REFUND_SERVICE, else <target>/debug/refund-service. */
export function serviceBinary(): string {
  // dist-study/refund.js -> js/ -> the repository root.
  const repo = fileURLToPath(new URL("../..", import.meta.url));
  return process.env.ONCE_REFUND_SERVICE ?? join(process.env.CARGO_TARGET_DIR ?? join(repo, "target"), "debug", "refund-service");
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const opt = (name: string, dflt: string) => (args.includes(name) ? args[args.indexOf(name) + 1] : dflt);
  const n = Number(opt("--trials", "10"));
  const faults = opt("--faults", "pre_effect_disconnect,post_commit_disconnect").split(",");
  const bin = opt("--service", serviceBinary());
  const started = Date.now();
  const cells = await study(bin, n, faults);
  process.stdout.write(table(cells, faults));
  console.log(`${[...cells.values()].reduce((a, c) => a + c.trials, 0)} trials in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}
