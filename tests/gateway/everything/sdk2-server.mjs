// A small MCP server on the official TypeScript server SDK v2
// (`@modelcontextprotocol/server` 2.4.0, pinned in package-lock.json), for
// host/gateway/tests/gateway_sdk2_upstream.rs: the gateway in front of an upstream
// that speaks MCP 2026-07-28 (per-request `_meta` envelope) beside the 2025
// revisions, as a stdio child or at a URL (Streamable HTTP on 127.0.0.1).
//
//   node sdk2-server.mjs EFFECTS [--http]
//
// - `refund` (destructive) appends one JSON line per refund to EFFECTS (with
//   the era it was asked in: `legacy` or `modern`), fsync'd before it
//   answers: the test counts effects there, never in what the gateway says.
//   It honours no idempotency key, so every send is an effect.
// - `find_refund` (read-only) is the lookup: it reads EFFECTS for the refund
//   made under an idempotency key (linearizable: the file is the truth).
// - `refund_count` (read-only, DIRECT by its annotations) says how many
//   refunds EFFECTS holds, and which revision the request came in.
// - `refund_confirmed` (destructive) asks its client to confirm first, with an
//   MCP 2026-07-28 input request (an elicitation), and refunds only in the
//   round that carries the confirmation; each question is a line of
//   EFFECTS.asked.
// - `refund_sealed` (destructive) asks the same, keeps the refund it will
//   make in its `requestState`, and makes the one the state says.
// - `refund_header` (destructive) takes its order id in an `Mcp-Param-Order-Id`
//   header too (`x-mcp-header`), as 2026-07-28 lets a tool ask.
// - one prompt (`refund-note`) and one resource (`refunds://policy`).
//
// Faults, once per order, chosen by the order id: the first refund of an
// order whose id starts with `lose-reply` makes its effect and never answers
// (a lost reply); the first of one starting with `drop` never answers and
// makes no effect (a request lost before it acted). Later refunds of the
// same order behave. With `--http` it serves on port 0 of 127.0.0.1 and
// prints `listening on http://127.0.0.1:PORT/mcp` to stdout; otherwise it
// serves stdio.

import { createServer } from "node:http";
import { closeSync, existsSync, fsyncSync, openSync, readFileSync, writeSync } from "node:fs";
import { McpServer, acceptedContent, createMcpHandler, inputRequired } from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import { z } from "zod";

const args = process.argv.slice(2);
const effects = args.find((a) => !a.startsWith("--"));
if (!effects) {
  console.error("usage: sdk2-server.mjs EFFECTS [--http]");
  process.exit(2);
}
const http = args.includes("--http");
// The orders whose fault has fired (one process serves every request, stdio or HTTP).
const faulted = new Set();
const never = () => new Promise(() => {});

function refunds() {
  if (!existsSync(effects)) return [];
  return readFileSync(effects, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
}

function record(refund, file = effects) {
  const fd = openSync(file, "a");
  try {
    writeSync(fd, `${JSON.stringify(refund)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

const json = (value) => ({
  content: [{ type: "text", text: JSON.stringify(value) }],
  structuredContent: value,
});

// One factory serves both eras (the SDK calls it per HTTP request, or per stdio connection).
function build(context) {
  const server = new McpServer(
    { name: "once-sdk2-server", version: "1.0.0" },
    { capabilities: { tools: {}, prompts: {}, resources: {} } },
  );
  server.registerTool(
    "refund",
    {
      description: "Refunds an order. Every call refunds again.",
      inputSchema: z.object({ order_id: z.string(), amount: z.number(), idempotency_key: z.string() }),
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ order_id, amount, idempotency_key }) => {
      const fault = !faulted.has(order_id) && ["lose-reply", "drop"].find((f) => order_id.startsWith(f));
      if (fault) faulted.add(order_id);
      if (fault === "drop") return never();
      const era = context?.era ?? "unknown";
      const refund = { refund_id: `re_${refunds().length + 1}`, order_id, amount, idempotency_key, era };
      record(refund);
      // The effect is made; the answer never comes.
      if (fault === "lose-reply") return never();
      return json(refund);
    },
  );
  server.registerTool(
    "find_refund",
    {
      description: "The refund made under an idempotency key, if any.",
      inputSchema: z.object({ idempotency_key: z.string() }),
      annotations: { readOnlyHint: true },
    },
    async ({ idempotency_key }) => {
      const found = refunds().find((r) => r.idempotency_key === idempotency_key);
      return json(found ? { found: true, refund: found } : { found: false });
    },
  );
  server.registerTool(
    "refund_count",
    {
      description: "How many refunds were made.",
      inputSchema: z.object({}),
      annotations: { readOnlyHint: true },
    },
    async () => json({ refunds: refunds().length, era: context?.era ?? "unknown" }),
  );
  // A refund that asks its client to confirm first, as MCP 2026-07-28 lets a tool ask (multi-round-trip:
  // the question is the answer, and the client calls again with its answer). It refunds only on a
  // confirmation, and writes each question it asks to EFFECTS.asked.
  server.registerTool(
    "refund_confirmed",
    {
      description: "Refunds an order once the client confirms it. Every confirmed call refunds again.",
      inputSchema: z.object({ order_id: z.string(), amount: z.number(), idempotency_key: z.string() }),
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ order_id, amount, idempotency_key }, ctx) => {
      const confirmation = z.object({ confirm: z.boolean() });
      const confirmed = acceptedContent(ctx.mcpReq.inputResponses, "confirm", confirmation);
      if (confirmed?.confirm !== true) {
        record({ asked: order_id, idempotency_key, era: context?.era ?? "unknown" }, `${effects}.asked`);
        return inputRequired({
          inputRequests: {
            confirm: inputRequired.elicit({ message: `Refund ${amount} on ${order_id}?`, requestedSchema: confirmation }),
          },
          requestState: `asked:${order_id}`,
        });
      }
      const refund = { refund_id: `re_${refunds().length + 1}`, order_id, amount, idempotency_key, era: context?.era ?? "unknown" };
      record(refund);
      return json(refund);
    },
  );
  // A refund that keeps what it will do in its requestState (as the SDK's RequestStateCodec suggests: mint
  // the pending payload, read it back next round) and, once confirmed, refunds what the state says.
  server.registerTool(
    "refund_sealed",
    {
      description: "Refunds an order once the client confirms it.",
      inputSchema: z.object({ order_id: z.string(), amount: z.number(), idempotency_key: z.string() }),
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ order_id, amount, idempotency_key }, ctx) => {
      const confirmation = z.object({ confirm: z.boolean() });
      const confirmed = acceptedContent(ctx.mcpReq.inputResponses, "confirm", confirmation);
      const raw = typeof ctx.mcpReq.requestState === "function" ? await ctx.mcpReq.requestState() : ctx.mcpReq.requestState;
      const state = typeof raw === "string" ? raw : undefined;
      if (confirmed?.confirm !== true || !state) {
        return inputRequired({
          inputRequests: { confirm: inputRequired.elicit({ message: `Refund ${amount} on ${order_id}?`, requestedSchema: confirmation }) },
          requestState: `pending:${JSON.stringify({ order_id, amount, idempotency_key })}`,
        });
      }
      const pending = JSON.parse(state.slice("pending:".length));
      const refund = { refund_id: `re_${refunds().length + 1}`, ...pending, era: context?.era ?? "unknown" };
      record(refund);
      return json(refund);
    },
  );
  // A refund whose order id the client must mirror into an HTTP header (MCP 2026-07-28 `x-mcp-header`).
  server.registerTool(
    "refund_header",
    {
      description: "Refunds an order. Every call refunds again.",
      inputSchema: z.object({
        order_id: z.string().meta({ "x-mcp-header": "Order-Id" }),
        amount: z.number(),
        idempotency_key: z.string(),
      }),
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ order_id, amount, idempotency_key }) => {
      const refund = { refund_id: `re_${refunds().length + 1}`, order_id, amount, idempotency_key, era: context?.era ?? "unknown" };
      record(refund);
      return json(refund);
    },
  );
  server.registerPrompt(
    "refund-note",
    { description: "A note to the customer about a refund." },
    () => ({
      messages: [{ role: "user", content: { type: "text", text: "Tell the customer the refund is on its way." } }],
    }),
  );
  server.registerResource(
    "policy",
    "refunds://policy",
    { mimeType: "text/plain", description: "The refund policy." },
    async (uri) => ({ contents: [{ uri: uri.href, text: "Refunds within 30 days." }] }),
  );
  return server;
}

if (!http) {
  serveStdio(build);
} else {
  const handler = createMcpHandler(build);
  // node:http in front of the handler's web-standard face: one Request in, its Response streamed out.
  const listener = createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const abort = new AbortController();
    res.on("close", () => abort.abort());
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (Array.isArray(value)) value.forEach((v) => headers.append(name, v));
      else if (value !== undefined) headers.set(name, value);
    }
    const body = chunks.length > 0 && req.method !== "GET" && req.method !== "HEAD" ? Buffer.concat(chunks) : undefined;
    try {
      const request = new Request(`http://${req.headers.host}${req.url}`, {
        method: req.method,
        headers,
        body,
        signal: abort.signal,
      });
      const response = await handler.fetch(request);
      res.writeHead(response.status, Object.fromEntries(response.headers));
      if (response.body) {
        for await (const chunk of response.body) res.write(chunk);
      }
      res.end();
    } catch (e) {
      if (!res.headersSent) res.writeHead(500);
      res.end();
      if (!abort.signal.aborted) console.error(`sdk2-server: ${e?.stack ?? e}`);
    }
  });
  listener.listen(0, "127.0.0.1", () => {
    console.log(`listening on http://127.0.0.1:${listener.address().port}/mcp`);
  });
}
