// The official TypeScript MCP client's task API (experimental, SDK 1.32.2), for tests/e2e/test_tasks_relay_e2e.py.
// Usage: node tasks_client.mjs http <url> <bearer token>   |   node tasks_client.mjs stdio <command> [args...]
// Prints one JSON line: what the client saw of one task's life, ids replaced by their roles.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [kind, ...rest] = process.argv.slice(2);
const transport =
  kind === "http"
    ? new StreamableHTTPClientTransport(new URL(rest[0]), {
        requestInit: { headers: { Authorization: `Bearer ${rest[1]}` } },
      })
    : new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "ignore" });
const client = new Client(
  { name: "bastion-ts-tasks", version: "0.0.1" },
  { capabilities: { tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } } },
);
await client.connect(transport);
const offered = client.getServerCapabilities()?.tasks ?? null;
await client.listTools();
let taskId = null;
const stream = [];
let content = null;
for await (const message of client.experimental.tasks.callToolStream(
  { name: "simulate-research-query", arguments: { topic: "gateways" } },
  undefined,
  { task: { ttl: 60000 } },
)) {
  if (message.type === "taskCreated") taskId = message.task.taskId;
  if (message.type === "result") content = message.result.content.map((item) => item.type);
  const status = message.task?.status;
  const entry = status ? `${message.type}:${status}` : message.type;
  if (stream[stream.length - 1] !== entry) stream.push(entry);
}
const got = await client.experimental.tasks.getTask(taskId);
const listed = (await client.experimental.tasks.listTasks()).tasks.map((task) => [
  task.taskId === taskId ? "<the task>" : "<another task>",
  task.status,
]);
const errorCode = async (run) => {
  try {
    await run();
    return null;
  } catch (error) {
    return error.code ?? String(error);
  }
};
const cancelDone = await errorCode(() => client.experimental.tasks.cancelTask(taskId));
const getUnknown = await errorCode(() => client.experimental.tasks.getTask("0".repeat(32)));
await client.close();
console.log(
  JSON.stringify({ offered, stream, content, status: got.status, listed, cancelDone, getUnknown }),
);
