// A client on MCP 2026-07-28 (the official TypeScript client `@modelcontextprotocol/client` 2.4.0 in
// versionNegotiation mode 'auto', pinned in package-lock.json) through `once gateway` on stdio, in front
// of sdk2-server.mjs as a stdio child or at a URL: everything the upstream answers must reach it in a
// shape its SDK accepts, whichever revision the gateway spoke upstream.
//
// Usage: node relay-client.mjs ONCE_BIN CONFIG DB -- GATEWAY_UPSTREAM_ARGS…
//   (e.g. `-- node sdk2-server.mjs EFFECTS` or `--upstream-url URL`, passed to `once gateway` as given)
// Prints one JSON line: the negotiated revision, tools/list names, prompts/get, resources/read, a DIRECT
// call, a protected call and its repeat. A result the SDK rejects fails the script.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const here = fileURLToPath(new URL(".", import.meta.url));
const PINNED = "2.4.0";
const [onceBin, config, db, dashes, ...upstream] = process.argv.slice(2);
if (dashes !== "--" || upstream.length === 0) {
  console.error("usage: node relay-client.mjs ONCE_BIN CONFIG DB -- GATEWAY_UPSTREAM_ARGS…");
  process.exit(2);
}
const installed = JSON.parse(
  readFileSync(join(here, "node_modules/@modelcontextprotocol/client/package.json"), "utf8"),
).version;
if (installed !== PINNED) throw new Error(`@modelcontextprotocol/client ${installed} installed, the test pins ${PINNED}`);

const client = new Client({ name: "relay-client", version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
const gateway = ["gateway", "--config", config, "--db", db];
const args = upstream[0] === "--upstream-url" ? [...gateway, ...upstream] : [...gateway, "--", ...upstream];
await client.connect(new StdioClientTransport({ command: onceBin, args, stderr: "inherit" }));

const seen = { revision: client.getNegotiatedProtocolVersion() ?? null };
seen.tools = (await client.listTools()).tools.map((t) => t.name).sort();
seen.prompts = (await client.listPrompts()).prompts.map((p) => p.name);
seen.prompt = await client.getPrompt({ name: "refund-note" });
seen.resources = (await client.listResources()).resources.map((r) => r.uri);
seen.resource = await client.readResource({ uri: "refunds://policy" });
seen.direct = await client.callTool({ name: "refund_count", arguments: {} });
const refund = () =>
  client.callTool({ name: "refund", arguments: { order_id: "M-1", amount: 25.5 }, _meta: { "once/key": "op-m1" } });
seen.first = await refund();
seen.again = await refund();
await client.close();
console.log(JSON.stringify(seen));
