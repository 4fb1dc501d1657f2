// A protected tool that asks its client first (MCP 2026-07-28 multi-round-trip input), through
// `once gateway` on stdio in front of sdk2-server.mjs at a URL, driven by the official TypeScript client
// (`@modelcontextprotocol/client` 2.4.0, pinned in package-lock.json) that confirms when asked.
//
// Usage: node rounds-client.mjs ONCE_BIN CONFIG DB URL ERA
//   ERA modern: the client in versionNegotiation mode 'auto' (server/discover, 2026-07-28). Its call of
//               `refund_confirmed` is asked to confirm, confirms, and is refunded; the same call again is
//               a replay. Prints the answers as one JSON line: {"first": …, "again": …, "asked": N}.
//   ERA legacy: the client in mode 'legacy' (initialize, 2025-11-25), which cannot take a question: the
//               call's answer says so. Prints {"first": …}.
// The caller counts the refunds in the server's own file. A call the SDK rejects fails the script.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const here = fileURLToPath(new URL(".", import.meta.url));
const PINNED = "2.4.0";
const [onceBin, config, db, url, era] = process.argv.slice(2);
if (!url || !["modern", "legacy"].includes(era)) {
  console.error("usage: node rounds-client.mjs ONCE_BIN CONFIG DB URL modern|legacy");
  process.exit(2);
}
const installed = JSON.parse(
  readFileSync(join(here, "node_modules/@modelcontextprotocol/client/package.json"), "utf8"),
).version;
if (installed !== PINNED) throw new Error(`@modelcontextprotocol/client ${installed} installed, the test pins ${PINNED}`);

let asked = 0;
const client = new Client(
  { name: "rounds-client", version: "1.0.0" },
  {
    capabilities: { elicitation: { form: {} } },
    versionNegotiation: { mode: era === "modern" ? "auto" : "legacy" },
  },
);
client.setRequestHandler("elicitation/create", async () => {
  asked += 1;
  return { action: "accept", content: { confirm: true } };
});
const transport = new StdioClientTransport({
  command: onceBin,
  args: ["gateway", "--config", config, "--db", db, "--upstream-url", url],
  env: { ...process.env, ONCE_LOG: "once=info" },
  stderr: "inherit",
});
await client.connect(transport);
const call = () =>
  client.callTool({
    name: "refund_confirmed",
    arguments: { order_id: "o-77", amount: 12.5 },
    _meta: { "once/key": "confirm-77" },
  });
const first = await call();
const answers = { first };
if (era === "modern") answers.again = await call();
answers.asked = asked;
await client.close();
console.log(JSON.stringify(answers));
