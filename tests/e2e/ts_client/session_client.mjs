// The official TypeScript MCP client (session era) against Bastion, for tests/e2e/test_ts_client.py.
// Usage: node session_client.mjs <bastion url> <bearer token>
// Prints one JSON line: the tools it saw, the progress it got, the log levels it heard, and the answers.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "bastion-ts-e2e", version: "0.0.1" });
const levels = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, (notification) => {
  levels.push(notification.params.level);
});
await client.connect(transport);
const tools = (await client.listTools()).tools.map((tool) => tool.name).sort();
const progress = [];
const slow = await client.callTool(
  { name: "up__slow", arguments: { seconds: 0.1, steps: 3 } },
  undefined,
  { onprogress: (p) => progress.push(p.progress) },
);
await client.setLoggingLevel("warning");
const chatty = await client.callTool({ name: "up__chatty", arguments: {} });
const echo = await client.callTool({ name: "up__echo", arguments: { text: "from typescript" } });
await transport.terminateSession();
await client.close();
console.log(
  JSON.stringify({
    protocolVersion: transport.protocolVersion ?? null,
    tools,
    progress,
    levels,
    slow: slow.content[0].text,
    chatty: chatty.content[0].text,
    echo: echo.content[0].text,
  }),
);
