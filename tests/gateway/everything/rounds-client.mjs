// A protected tool that asks its client first (MCP 2026-07-28 multi-round-trip input), through
// `once gateway` on stdio in front of sdk2-server.mjs at a URL, driven by the official TypeScript client
// (`@modelcontextprotocol/client` 2.4.0, pinned in package-lock.json) that confirms when asked.
//
// Usage: node rounds-client.mjs ONCE_BIN CONFIG DB URL ERA
//   ERA modern: the client in versionNegotiation mode 'auto' (server/discover, 2026-07-28), which takes the
//               question itself (input_required) and calls again with its answer.
//   ERA legacy: the client in mode 'legacy' (initialize, 2025-11-25), which cannot take an input_required
//               result: the gateway asks it the question as an `elicitation/create` request.
//   ERA mute:   mode 'legacy' without the elicitation capability: nobody can be asked.
// Either way it calls `refund_confirmed` twice with one key and confirms when asked. Prints the answers as
// one JSON line: {"first": …, "again": …, "asked": N}.
// The caller counts the refunds in the server's own file. A call the SDK rejects fails the script.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const here = fileURLToPath(new URL(".", import.meta.url));
const PINNED = "2.4.0";
const [onceBin, config, db, url, era] = process.argv.slice(2);
if (!url || !["modern", "legacy", "mute"].includes(era)) {
  console.error("usage: node rounds-client.mjs ONCE_BIN CONFIG DB URL modern|legacy|mute");
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
    capabilities: era === "mute" ? {} : { elicitation: { form: {} } },
    versionNegotiation: { mode: era === "modern" ? "auto" : "legacy" },
  },
);
if (era !== "mute") client.setRequestHandler("elicitation/create", async () => {
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
const answers = { first, again: await call(), asked };
await client.close();
console.log(JSON.stringify(answers));
