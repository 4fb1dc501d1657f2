// The official TypeScript SDK client against the official MCP reference server
// (@modelcontextprotocol/server-everything), once directly and once through
// `once gateway`: every feature is measured the same way on both, and each row
// of the printed table must read the same through the gateway as directly.
//
// Usage: node compare.mjs ONCE_BIN WORKDIR [stdio|http]   (exit 1 when a row differs)
//   stdio: the server over stdio, and `once gateway -- <server>` over stdio (the default).
//   http:  the server's own Streamable HTTP transport, and `once gateway --listen` (stateless
//          Streamable HTTP) in front of the server over stdio; the rows stateless HTTP cannot
//          carry must differ exactly as docs/gateway.md ("Over HTTP") says, and say why.
// Pinned by package-lock.json beside this file; `npm ci` installs it.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
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

/** Connect over `transport` as a client that can sample, elicit and list roots (all answered by this script). */
async function connect(transport) {
  const seen = {
    listChanged: 0, logs: [], updated: [], rootsAsked: 0, sampled: 0, elicited: 0, progress: 0, taskStatus: [],
  };
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
  const stderr = [];
  transport.stderr?.on("data", (d) => stderr.push(String(d)));
  await client.connect(transport);
  // Count progress and task status as they arrive on the wire: the SDK drops progress that it
  // handles after the call's result, which is a race of its own, not what the server sent.
  const deliver = transport.onmessage;
  transport.onmessage = (message, extra) => {
    if (message.method === "notifications/progress") seen.progress++;
    if (message.method === "notifications/tasks/status") seen.taskStatus.push(message.params);
    deliver(message, extra);
  };
  return { client, seen, stderr };
}

/** Run a task-augmented call to its end; what the client saw, in order (repeated statuses once). */
async function taskRoundTrip(client, params) {
  const seen = [];
  let taskId;
  for await (const message of client.experimental.tasks.callToolStream(params, undefined, { task: { ttl: 60000 } })) {
    const said =
      message.type === "taskCreated" ? ((taskId = message.task.taskId), `created (${message.task.status})`)
      : message.type === "taskStatus" ? `tasks/get: ${message.task.status}`
      : message.type === "result" ? `tasks/result: ${firstText(message.result).split("\n")[0]}`
      : `error ${message.error?.code ?? ""} ${String(message.error?.message ?? message.error).split("\n")[0]}`;
    if (seen.at(-1) !== said) seen.push(said);
  }
  return { taskId, said: seen.join(" → ") };
}

/** Every feature of the table, measured on one connection. Each value is a short string. */
async function measure(transport) {
  const { client, seen, stderr } = await connect(transport);
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
    await attempt("capabilities.tasks", () => (caps.tasks ? canonical(caps.tasks) : "none"));
    await attempt("instructions (first line)", () => (client.getInstructions() ?? "").split("\n")[0]);
    await attempt("ping", async () => (await client.ping(), "ok"));

    const tools = (await client.listTools()).tools;
    await attempt("tools/list", () => `${tools.length} tools`);
    const needClient = ["trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"];
    await attempt("tools that need client sampling/elicitation/roots", () =>
      needClient.filter((n) => tools.some((t) => t.name === n)).join(", ") || "none",
    );
    await attempt("tools/list_changed", () => (seen.listChanged > 0 ? "received" : "none"));
    await attempt("tools/list execution.taskSupport", () => {
      const support = (s) => tools.filter((t) => (t.execution?.taskSupport ?? "(absent)") === s).length;
      const taking = tools.filter((t) => ["optional", "required"].includes(t.execution?.taskSupport));
      return (
        `${support("forbidden")} forbidden, ${support("(absent)")} absent; ` +
        (taking.map((t) => `${t.name}: ${t.execution.taskSupport}`).join(", ") || "none take tasks")
      );
    });

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
    // A tool the server did not list is not called (through the gateway it would be a protected call of an
    // unknown tool).
    const listed = (name) => tools.some((t) => t.name === name);
    await attempt("sampling/createMessage round trip", async () => {
      if (!listed("trigger-sampling-request")) return "the tool is not listed";
      const result = await client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hello" } });
      return seen.sampled === 1 && firstText(result).includes(SAMPLED) ? "answered by the client" : firstText(result);
    });
    await attempt("elicitation/create round trip", async () => {
      if (!listed("trigger-elicitation-request")) return "the tool is not listed";
      const result = await client.callTool({ name: "trigger-elicitation-request", arguments: {} });
      const text = (result.content ?? []).map((c) => c.text ?? "").join("\n");
      return seen.elicited === 1 && text.includes("- Name: Ada Lovelace") ? "accepted by the client" : text;
    });
    await attempt("roots/list round trip", async () => {
      if (!listed("get-roots-list")) return "the tool is not listed";
      const result = await client.callTool({ name: "get-roots-list", arguments: {} });
      return seen.rootsAsked > 0 && firstText(result).includes(ROOT.uri) ? "answered by the client" : firstText(result);
    });
    await attempt("tools, DIRECT calls, structured content", async () => {
      const result = await client.callTool({ name: "get-structured-content", arguments: { location: "Chicago" } });
      // JSON values, compared as values: an object's key order is not part of its meaning.
      return canonical(result.structuredContent);
    });
    // MCP 2025-11-25 tasks: a tool called as a task (the client polls tasks/get, then tasks/result),
    // the server's status notifications for it, tasks/list, and tasks/cancel of a second task.
    const taskTool = { name: "simulate-research-query", arguments: { topic: "python" } };
    const offersTasks = Boolean(caps.tasks?.requests?.tools?.call);
    let roundTrip;
    await attempt("tools/call as a task, tasks/get, tasks/result", async () => {
      if (!offersTasks) return "not offered (no tasks.requests.tools.call)";
      roundTrip = await taskRoundTrip(client, taskTool);
      return roundTrip.said;
    });
    await attempt("notifications/tasks/status of that task", async () => {
      if (!roundTrip?.taskId) return "no task";
      const mine = seen.taskStatus.filter((s) => s.taskId === roundTrip.taskId);
      const statuses = [...new Set(mine.map((s) => s.status))].join(", ");
      return `${mine.length} (${statuses})`;
    });
    await attempt("tasks/list", async () => {
      if (!caps.tasks?.list) return "not offered";
      const listed = (await client.experimental.tasks.listTasks()).tasks;
      const ours = listed.find((t) => t.taskId === roundTrip?.taskId);
      return `${listed.length} task(s)${ours ? `, the one above ${ours.status}` : ""}`;
    });
    await attempt("tasks/cancel", async () => {
      if (!caps.tasks?.cancel || !offersTasks) return "not offered";
      const stream = client.experimental.tasks.callToolStream(
        { name: "simulate-research-query", arguments: { topic: "a second topic" } },
        undefined,
        { task: { ttl: 60000 } },
      );
      const created = (await stream.next()).value;
      if (created?.type !== "taskCreated") return `no task: ${created?.type} ${created?.error?.message ?? ""}`;
      const cancelled = await client.experimental.tasks.cancelTask(created.task.taskId);
      await stream.return();
      const after = await client.experimental.tasks.getTask(created.task.taskId);
      return `${cancelled.status}; tasks/get then: ${after.status}`;
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

/** A free TCP port on 127.0.0.1. */
function freePort() {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

/** Start `command`, wait until a line of its output matches `ready`; the process and that match. */
function start(command, args, env, ready) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`${command} did not start:\n${seen}`)), 20000);
    const look = (d) => {
      seen += String(d);
      const found = seen.match(ready);
      if (found) {
        clearTimeout(timer);
        resolve({ child, found, output: () => seen });
      }
    };
    child.stdout.on("data", look);
    child.stderr.on("data", look);
    child.once("exit", (code) => reject(new Error(`${command} exited (${code}):\n${seen}`)));
  });
}

async function stop(child) {
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await exited;
}

const [onceBin, workdir, mode = "stdio"] = process.argv.slice(2);
if (!onceBin || !workdir || !["stdio", "http"].includes(mode)) {
  console.error("usage: node compare.mjs ONCE_BIN WORKDIR [stdio|http]");
  process.exit(2);
}
// The reference server marks its task tool not read-only, so once would protect it, and a protected
// call is not run as a task (docs/gateway.md, "Tasks"): to measure tasks passing through, it is DIRECT.
const config = join(workdir, "once.toml");
writeFileSync(config, '[tools.simulate-research-query]\nroute = "direct"\n');
const gatewayArgs = ["--config", config, "--db", join(workdir, `once-${mode}.db`), "--", process.execPath, server, "stdio"];

let direct, gateway;
if (mode === "stdio") {
  const stdio = (command, args) => new StdioClientTransport({ command, args, stderr: "pipe" });
  direct = await measure(stdio(process.execPath, [server, "stdio"]));
  gateway = await measure(stdio(onceBin, ["gateway", ...gatewayArgs]));
} else {
  const port = await freePort();
  const own = await start(process.execPath, [server, "streamableHttp"], { PORT: String(port) }, /listening on port/);
  try {
    direct = await measure(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`)));
  } finally {
    await stop(own.child);
  }
  const listening = await start(
    onceBin, ["gateway", "--listen", "127.0.0.1:0", ...gatewayArgs], {}, /listening on (http:\/\/\S+)/,
  );
  try {
    gateway = await measure(new StreamableHTTPClientTransport(new URL(listening.found[1])));
  } finally {
    await stop(listening.child);
  }
  gateway.stderr += listening.output();
}

// What stateless Streamable HTTP cannot carry (docs/gateway.md, "Over HTTP"): each row says why, and
// what the gateway answers instead, exactly. On stdio nothing may differ.
const notRelayed = "no session stream to carry the notification";
const noClientCaps = "the upstream is every client's: no client capability is declared to it";
const noTasks = "no tasks over HTTP: one upstream serves every client and tenant";
const documented = mode === "stdio" ? {} : {
  capabilities: [noTasks, "completions, logging, prompts, resources, tools"],
  "capabilities.tasks": [noTasks, "none"],
  "tools/list": [noClientCaps, "13 tools"],
  "tools that need client sampling/elicitation/roots": [noClientCaps, "none"],
  "tools/list_changed": [notRelayed, "none"],
  "tools/list execution.taskSupport": [noTasks, "0 forbidden, 13 absent; none take tasks"],
  "resources/subscribe + notifications/resources/updated": [notRelayed, "no update"],
  "logging/setLevel + notifications/message": [notRelayed, "none"],
  "sampling/createMessage round trip": [noClientCaps, "the tool is not listed"],
  "elicitation/create round trip": [noClientCaps, "the tool is not listed"],
  "roots/list round trip": [noClientCaps, "the tool is not listed"],
  "tools/call as a task, tasks/get, tasks/result": [noTasks, "not offered (no tasks.requests.tools.call)"],
  "notifications/tasks/status of that task": [noTasks, "no task"],
  "tasks/list": [noTasks, "not offered"],
  "tasks/cancel": [noTasks, "not offered"],
};

let differ = 0;
const lines = [
  `| feature | direct | through \`once gateway${mode === "http" ? " --listen" : ""}\` | |`,
  `| --- | --- | --- | --- |`,
];
for (const feature of Object.keys(direct.row)) {
  const [d, g] = [direct.row[feature], gateway.row[feature]];
  const same = d === g;
  const [why, expected] = documented[feature] ?? [];
  const known = !same && why !== undefined && g === expected;
  if (!same && !known) differ++;
  const cell = (s) => String(s).replaceAll("|", "\\|");
  const verdict = same ? "✓" : known ? `documented: ${why}` : "✗";
  lines.push(`| ${feature} | ${cell(d)} | ${same ? "same" : cell(g)} | ${verdict} |`);
}
console.log(
  `server-everything ${pinned["@modelcontextprotocol/server-everything"]}, ` +
    `TypeScript SDK client ${pinned["@modelcontextprotocol/sdk"]}, ${mode}\n`,
);
console.log(lines.join("\n"));
if (differ > 0) {
  console.error(`\n${differ} feature(s) differ through the gateway. Gateway stderr:\n${gateway.stderr}`);
  process.exit(1);
}
console.log(`\ntypescript compare (${mode}): ok`);
