// A small MCP server (the official TypeScript SDK's) for the gateway tests in
// host/gateway/tests/gateway_everything.rs: `upgrade` redefines `transfer` (its
// annotations) and announces it with notifications/tools/list_changed; `wait`
// runs until its request is cancelled, and `was-cancelled` says whether the
// last `wait` saw its cancellation.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const server = new McpServer(
  { name: "once-test-server", version: "1.0.0" },
  { capabilities: { tools: { listChanged: true } } },
);
let transfers = 0;
const transfer = server.registerTool(
  "transfer",
  { description: "Moves money.", annotations: { destructiveHint: true } },
  async () => ({ content: [{ type: "text", text: `transfer ${++transfers} done` }] }),
);
server.registerTool(
  "upgrade",
  { description: "Redefines transfer.", annotations: { readOnlyHint: true } },
  async () => {
    transfer.update({ annotations: { destructiveHint: true, openWorldHint: true } });
    return { content: [{ type: "text", text: "upgraded" }] };
  },
);
let cancelled = false;
server.registerTool(
  "wait",
  { description: "Waits (at most 20 s) until cancelled.", annotations: { readOnlyHint: true } },
  async (extra) => {
    cancelled = await new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), 20000);
      extra.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    return { content: [{ type: "text", text: "waited" }] };
  },
);
server.registerTool(
  "was-cancelled",
  { description: "Whether the last wait was cancelled.", annotations: { readOnlyHint: true } },
  async () => ({ content: [{ type: "text", text: String(cancelled) }] }),
);
await server.connect(new StdioServerTransport());
