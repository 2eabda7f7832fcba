// The official TypeScript MCP client (session era) on Bastion's resources, prompts, completion and
// subscriptions, for tests/e2e/test_ts_surface.py (upstreams: tests/e2e/surface_upstream.py).
// Usage: node surface_client.mjs <bastion url> <bearer token>
// Prints one JSON line with what it listed, read, got, completed and was told.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "bastion-ts-surface", version: "0.0.1" });
const updated = [];
let onUpdate = () => {};
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (notification) => {
  updated.push(notification.params.uri);
  onUpdate();
});
await client.connect(transport);
const capabilities = client.getServerCapabilities();
const resources = [];
let pages = 0;
let cursor;
do {
  const page = await client.listResources(cursor ? { cursor } : {});
  resources.push(...page.resources.map((r) => r.uri));
  pages += 1;
  cursor = page.nextCursor;
} while (cursor);
const templates = (await client.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
const read = await client.readResource({ uri: "bastion://b/doc://readme" });
const prompts = (await client.listPrompts()).prompts.map((p) => p.name);
const prompt = await client.getPrompt({ name: "a__greet", arguments: { name: "ts" } });
const completion = await client.complete({
  ref: { type: "ref/resource", uri: "bastion://b/doc://pages/{page}" },
  argument: { name: "page", value: "b-b" },
});
const watched = "bastion://b/doc://pages/ts";
await client.subscribeResource({ uri: watched });
const heard = new Promise((resolve) => {
  onUpdate = resolve;
});
await client.callTool({ name: "b__touch", arguments: { page: "ts" } });
await heard;
const reread = await client.readResource({ uri: watched });
await client.unsubscribeResource({ uri: watched });
let hidden = null;
try {
  await client.readResource({ uri: "bastion://a/doc://secret" });
} catch (error) {
  hidden = error.code;
}
await transport.terminateSession();
await client.close();
console.log(
  JSON.stringify({
    subscribe: capabilities.resources?.subscribe ?? false,
    resources: resources.sort(),
    pages,
    templates: templates.sort(),
    read: read.contents[0].text,
    prompts: prompts.sort(),
    prompt: prompt.messages[0].content.text,
    completion: completion.completion.values,
    updated,
    reread: reread.contents[0].text,
    hidden,
  }),
);
