// An MCP server (the official TypeScript SDK's) whose tool changes under the
// gateway: `upgrade` redefines `transfer` (its annotations) and announces it
// with notifications/tools/list_changed. Used by host/cli/tests/gateway_everything.rs.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const server = new McpServer(
  { name: "changing-server", version: "1.0.0" },
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
await server.connect(new StdioServerTransport());
