// The official TypeScript SDK client against the official MCP reference server
// (@modelcontextprotocol/server-everything), once directly and once through
// `once gateway`: every feature is measured the same way on both, and each row
// of the printed table must read the same through the gateway as directly.
//
// Usage: node compare.mjs ONCE_BIN WORKDIR   (exit 1 when a row differs)
// Pinned by package-lock.json beside this file; `npm ci` installs it.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const server = join(here, "node_modules/@modelcontextprotocol/server-everything/dist/index.js");
const pinned = JSON.parse(readFileSync(join(here, "package.json"), "utf8")).dependencies;
const ROOT = { uri: "file:///tmp/once-gateway-root", name: "the test's root" };
const SAMPLED = "a scripted model's answer";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolve when `done()` holds, or with false after `ms`. */
async function until(done, ms) {
  const end = Date.now() + ms;
  while (!done()) {
    if (Date.now() > end) return false;
    await sleep(20);
  }
  return true;
}

const canonical = (v) =>
  v && typeof v === "object" && !Array.isArray(v)
    ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`
    : JSON.stringify(v);

const firstText = (result) => (result.content ?? []).find((c) => c.type === "text")?.text ?? "";

/** Connect to `command` as a client that can sample, elicit and list roots (all answered by this script). */
async function connect(command, args) {
  const seen = { listChanged: 0, logs: [], updated: [], rootsAsked: 0, sampled: 0, elicited: 0, progress: 0 };
  const client = new Client(
    { name: "once-gateway-compare", version: "1.0.0" },
    { capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: true } } },
  );
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => void seen.listChanged++);
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void seen.logs.push(n.params));
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void seen.updated.push(n.params.uri));
  client.setRequestHandler(CreateMessageRequestSchema, async () => {
    seen.sampled++;
    return { model: "scripted", role: "assistant", content: { type: "text", text: SAMPLED } };
  });
  client.setRequestHandler(ElicitRequestSchema, async () => {
    seen.elicited++;
    return { action: "accept", content: { name: "Ada Lovelace", check: true } };
  });
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    seen.rootsAsked++;
    return { roots: [ROOT] };
  });
  const transport = new StdioClientTransport({ command, args, stderr: "pipe" });
  const stderr = [];
  transport.stderr?.on("data", (d) => stderr.push(String(d)));
  await client.connect(transport);
  // Count progress as it arrives on the wire: the SDK drops one that it handles after the call's
  // result, which is a race of its own, not what the server sent.
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message.method === "notifications/progress") seen.progress++;
    deliver(message, extra);
  };
  return { client, seen, stderr };
}

/** Every feature of the table, measured on one connection. Each value is a short string. */
async function measure(command, args) {
  const { client, seen, stderr } = await connect(command, args);
  const row = {};
  const attempt = async (name, f) => {
    try {
      row[name] = String(await f());
    } catch (e) {
      row[name] = `error ${e.code ?? ""} ${String(e.message ?? e).split("\n")[0]}`.trim();
    }
  };
  try {
    // The server asks the client for its roots after initialization; the tools that need the
    // client's capabilities are registered then too (and announced with tools/list_changed).
    await until(() => seen.rootsAsked > 0 && seen.listChanged > 0, 5000);
    const caps = client.getServerCapabilities() ?? {};
    await attempt("capabilities", () => Object.keys(caps).sort().join(", "));
    await attempt("instructions (first line)", () => (client.getInstructions() ?? "").split("\n")[0]);
    await attempt("ping", async () => (await client.ping(), "ok"));

    const tools = (await client.listTools()).tools;
    await attempt("tools/list", () => `${tools.length} tools`);
    const needClient = ["trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"];
    await attempt("tools that need client sampling/elicitation/roots", () =>
      needClient.filter((n) => tools.some((t) => t.name === n)).join(", ") || "none",
    );
    await attempt("tools/list_changed", () => (seen.listChanged > 0 ? "received" : "none"));

    await attempt("prompts/list", async () => `${(await client.listPrompts()).prompts.length} prompts`);
    await attempt("prompts/get", async () => {
      const prompt = await client.getPrompt({ name: "args-prompt", arguments: { city: "Paris", state: "TX" } });
      return prompt.messages[0].content.text;
    });
    await attempt("completion/complete", async () => {
      const done = await client.complete({
        ref: { type: "ref/prompt", name: "completable-prompt" },
        argument: { name: "department", value: "S" },
      });
      return done.completion.values.join(", ");
    });

    const resources = (await client.listResources()).resources;
    await attempt("resources/list", () => `${resources.length} resources`);
    await attempt("resources/templates/list", async () => {
      const templates = (await client.listResourceTemplates()).resourceTemplates;
      return `${templates.length} templates`;
    });
    await attempt("resources/read", async () => {
      const read = await client.readResource({ uri: resources[0].uri });
      return `${read.contents.length} content(s), ${(read.contents[0].text ?? read.contents[0].blob ?? "").length} chars`;
    });
    await attempt("resources/subscribe + notifications/resources/updated", async () => {
      const uri = resources[0].uri;
      await client.subscribeResource({ uri });
      await client.callTool({ name: "toggle-subscriber-updates", arguments: {} });
      const got = await until(() => seen.updated.includes(uri), 7000);
      await client.unsubscribeResource({ uri });
      return got ? "updated received" : "no update";
    });

    await attempt("logging/setLevel + notifications/message", async () => {
      await client.setLoggingLevel("debug");
      const before = seen.logs.length;
      await client.callTool({ name: "toggle-simulated-logging", arguments: {} });
      // The server's simulated messages ("Info-level message", …, "Alert level-message"), one at once.
      const got = await until(() => seen.logs.slice(before).some((l) => /level.message/.test(l.data)), 7000);
      return got ? "log messages received" : "none";
    });

    await attempt("progress notifications of a long tool call", async () => {
      const before = seen.progress;
      await client.callTool(
        { name: "trigger-long-running-operation", arguments: { duration: 1.5, steps: 3 } },
        undefined,
        { onprogress: () => {} },
      );
      return `${seen.progress - before}`;
    });
    await attempt("sampling/createMessage round trip", async () => {
      const result = await client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hello" } });
      return seen.sampled === 1 && firstText(result).includes(SAMPLED) ? "answered by the client" : firstText(result);
    });
    await attempt("elicitation/create round trip", async () => {
      const result = await client.callTool({ name: "trigger-elicitation-request", arguments: {} });
      const text = (result.content ?? []).map((c) => c.text ?? "").join("\n");
      return seen.elicited === 1 && text.includes("- Name: Ada Lovelace") ? "accepted by the client" : text;
    });
    await attempt("roots/list round trip", async () => {
      const result = await client.callTool({ name: "get-roots-list", arguments: {} });
      return seen.rootsAsked > 0 && firstText(result).includes(ROOT.uri) ? "answered by the client" : firstText(result);
    });
    await attempt("tools, DIRECT calls, structured content", async () => {
      const result = await client.callTool({ name: "get-structured-content", arguments: { location: "Chicago" } });
      // JSON values, compared as values: an object's key order is not part of its meaning.
      return canonical(result.structuredContent);
    });
    await attempt("cancellation of a call", async () => {
      const abort = new AbortController();
      const call = client.callTool(
        { name: "trigger-long-running-operation", arguments: { duration: 5, steps: 5 } },
        undefined,
        { signal: abort.signal },
      );
      await sleep(300);
      abort.abort("the test cancels");
      try {
        await call;
        return "answered anyway";
      } catch {
        await client.ping();
        return "cancelled; the connection goes on";
      }
    });
  } finally {
    await client.close();
  }
  return { row, stderr: stderr.join("") };
}

const [onceBin, workdir] = process.argv.slice(2);
if (!onceBin || !workdir) {
  console.error("usage: node compare.mjs ONCE_BIN WORKDIR");
  process.exit(2);
}
const direct = await measure(process.execPath, [server, "stdio"]);
const gateway = await measure(onceBin, [
  "gateway", "--db", join(workdir, "once.db"), "--", process.execPath, server, "stdio",
]);

// The one documented difference (docs/gateway.md, "Tasks"): the gateway does not declare the
// upstream's `tasks` capability. Anything else that differs fails the test.
const documented = {
  capabilities: (d) => d.split(", ").filter((c) => c !== "tasks").join(", "),
};

let differ = 0;
const lines = [
  `| feature | direct | through \`once gateway\` | |`,
  `| --- | --- | --- | --- |`,
];
for (const feature of Object.keys(direct.row)) {
  const [d, g] = [direct.row[feature], gateway.row[feature]];
  const same = d === g;
  const known = !same && documented[feature]?.(d) === g;
  if (!same && !known) differ++;
  const cell = (s) => String(s).replaceAll("|", "\\|");
  const verdict = same ? "✓" : known ? "documented: no tasks" : "✗";
  lines.push(`| ${feature} | ${cell(d)} | ${same ? "same" : cell(g)} | ${verdict} |`);
}
console.log(
  `server-everything ${pinned["@modelcontextprotocol/server-everything"]}, ` +
    `TypeScript SDK client ${pinned["@modelcontextprotocol/sdk"]}\n`,
);
console.log(lines.join("\n"));
if (differ > 0) {
  console.error(`\n${differ} feature(s) differ through the gateway. Gateway stderr:\n${gateway.stderr}`);
  process.exit(1);
}
console.log("\ntypescript compare: ok");
