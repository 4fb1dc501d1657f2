// A small MCP server (the official TypeScript SDK's) whose `refund` runs only
// as a task (`execution.taskSupport: "required"`), for the gateway test in
// host/gateway/tests/gateway_everything.rs: a protected task that outlives the
// tool's `max_in_flight`. Each task works for TASK_MS (its first argument,
// default 5000) and only then makes its effect; it cannot be stopped once
// started (`tasks/cancel` is refused and the task goes on working, as MCP
// lets a server do). `find_refund` is the lookup (read-only, linearizable);
// `effects` says how many refund tasks were started and how many refunds were
// made, the test's count of effects.

import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { InMemoryTaskStore } from "@modelcontextprotocol/sdk/experimental/tasks";
import { z } from "zod";

const TASK_MS = Number(process.argv[2] ?? 5000);

// A store that refuses to cancel: the refund, once started, goes on.
class Unstoppable extends InMemoryTaskStore {
  async updateTaskStatus(taskId, status, message, sessionId) {
    if (status === "cancelled") {
      throw new Error("a refund in progress cannot be stopped");
    }
    return super.updateTaskStatus(taskId, status, message, sessionId);
  }
}

const taskStore = new Unstoppable();
const server = new McpServer(
  { name: "once-task-server", version: "1.0.0" },
  {
    capabilities: { tools: {}, tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } },
    taskStore,
  },
);

let starts = 0;
const refunds = new Map(); // idempotency key -> the refund made
let made = 0;

server.experimental.tasks.registerToolTask(
  "refund",
  {
    description: "Refunds an order (slowly, as a task).",
    inputSchema: { order_id: z.string(), idempotency_key: z.string() },
    execution: { taskSupport: "required" },
    annotations: { destructiveHint: true },
  },
  {
    createTask: async (args, extra) => {
      starts += 1;
      const task = await extra.taskStore.createTask({ ttl: 300000, pollInterval: 200 });
      setTimeout(async () => {
        made += 1;
        const refund = { id: `re_${made}`, order_id: args.order_id };
        refunds.set(args.idempotency_key, refund);
        await extra.taskStore.storeTaskResult(task.taskId, "completed", {
          content: [{ type: "text", text: `refund ${refund.id} of order ${args.order_id} done` }],
        });
      }, TASK_MS);
      return { task };
    },
    getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
    getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
  },
);

server.registerTool(
  "find_refund",
  {
    description: "The refund made under an idempotency key, if any.",
    inputSchema: { idempotency_key: z.string() },
    annotations: { readOnlyHint: true },
  },
  async ({ idempotency_key }) => {
    const refund = refunds.get(idempotency_key);
    const answer = refund ? { found: true, refund } : { found: false };
    return { content: [{ type: "text", text: JSON.stringify(answer) }] };
  },
);

server.registerTool(
  "effects",
  { description: "Refund tasks started and refunds made.", annotations: { readOnlyHint: true } },
  async () => ({ content: [{ type: "text", text: JSON.stringify({ starts, refunds: made }) }] }),
);

await server.connect(new StdioServerTransport());
