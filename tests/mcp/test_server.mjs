// test_server.mjs -- a small MCP server (SDK, stdio) with the tools the real
// servers lack: one that appends to a file and then waits (to be killed
// mid-call), one whose result has a chosen size, one that answers a
// JSON-RPC error, one that takes an idempotency_key argument, one that
// answers a lone surrogate ("ok \u{1F600}".slice(0, 4), as JavaScript cuts a
// string between the halves of a pair), and a read-only and an idempotent
// one that count their calls.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError }
  from "@modelcontextprotocol/sdk/types.js";
import { appendFileSync, readFileSync, renameSync, writeFileSync } from "node:fs";

const obj = (properties) => ({ type: "object", properties });
const tools = [
  { name: "append", description: "Appends a line to a file, then waits.",
    inputSchema: obj({ file: { type: "string" }, text: { type: "string" },
      delay_ms: { type: "number" }, idempotency_key: { type: "string" } }) },
  { name: "big", description: "Returns bytes characters.",
    inputSchema: obj({ bytes: { type: "number" } }),
    annotations: { readOnlyHint: true } },
  { name: "cut", description: "Appends a line to a file, then answers the " +
      "first keep UTF-16 code units of text.",
    inputSchema: obj({ file: { type: "string" }, text: { type: "string" },
      keep: { type: "number" } }) },
  { name: "reject", description: "Always answers a JSON-RPC error.",
    inputSchema: obj({ n: { type: "number" } }) },
  // Each appends a line to file, as append does, under its annotation.
  { name: "lookup", description: "Reads (and counts its calls in file).",
    inputSchema: obj({ file: { type: "string" } }),
    annotations: { readOnlyHint: true } },
  { name: "touch", description: "Sets a mark (and counts its calls in file).",
    inputSchema: obj({ file: { type: "string" } }),
    annotations: { idempotentHint: true } },
];

const server = new Server({ name: "idem-test-server", version: "1.0.0" },
  { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools }));
server.setRequestHandler(CallToolRequestSchema, async (req) => {
  const a = req.params.arguments ?? {};
  switch (req.params.name) {
    case "append": {
      appendFileSync(a.file, a.text + "\n");
      const n = readFileSync(a.file, "utf8").split("\n").length - 1;
      // Whole or not at all (written aside, then renamed): a reader that
      // saw an empty file would signal pid 0, its own process group.
      writeFileSync(a.file + ".pid.tmp", String(process.pid));
      renameSync(a.file + ".pid.tmp", a.file + ".pid");
      if (a.delay_ms) await new Promise((r) => setTimeout(r, a.delay_ms));
      return { content: [{ type: "text",
        text: `appended ${a.text} as line ${n}; arguments ${JSON.stringify(a)}` }] };
    }
    case "lookup":
    case "touch": {
      appendFileSync(a.file, req.params.name + "\n");
      const n = readFileSync(a.file, "utf8").split("\n").length - 1;
      return { content: [{ type: "text", text: `${req.params.name} ${n}` }] };
    }
    case "cut": {
      appendFileSync(a.file, "cut\n");
      const n = readFileSync(a.file, "utf8").split("\n").length - 1;
      return { content: [{ type: "text", text: a.text.slice(0, a.keep) },
        { type: "text", text: `line ${n}` }] };
    }
    case "big":
      return { content: [{ type: "text", text: "y".repeat(a.bytes) }] };
    case "reject":
      throw new McpError(ErrorCode.InvalidParams, "reject: always refused");
    default:
      throw new McpError(ErrorCode.MethodNotFound, `no tool ${req.params.name}`);
  }
});
await server.connect(new StdioServerTransport());
