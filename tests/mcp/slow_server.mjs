// slow_server.mjs -- a small MCP server whose tools take their time and log
// their side effects, built with the 1.x SDK (McpServer) or, with
// `--sdk 2`, with the 2.x SDK (McpServer served by serveStdio, which speaks
// both the 2025 `initialize` era and the 2026-07-28 one).
//
//   act {ms, tag}  appends {pid, tag, n, id} to $EFFECTS_START (id: the
//                  JSON-RPC id the server got), waits ms, appends
//                  {pid, tag, n, id, aborted} to $EFFECTS (the side effect) and
//                  returns the text ticket-<pid>-<n> and the same as
//                  structured content. aborted says whether the SDK had
//                  cancelled the request (notifications/cancelled) by then:
//                  the tool acts anyway, as a tool that has committed does.
//   fail {tag}     appends {pid, tag, n, fail: true} to $EFFECTS and returns
//                  isError: true with the text failure-<pid>-<n>.
//
// n counts the calls of this process. Unset EFFECTS / EFFECTS_START: no log.
import { appendFileSync } from "node:fs";
import { z } from "zod";

const sdk = process.argv.includes("--sdk")
  ? process.argv[process.argv.indexOf("--sdk") + 1] : "1";
let n = 0;
const log = (file, line) => {
  if (file) appendFileSync(file, JSON.stringify(line) + "\n");
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The request's id and abort signal: extra (1.x) or ctx.mcpReq (2.x).
const req = (extra) => extra?.mcpReq ?? extra ?? {};
async function act({ ms, tag }, extra) {
  const me = { pid: process.pid, tag, n: ++n };
  const id = req(extra).requestId ?? req(extra).id;
  log(process.env.EFFECTS_START, { ...me, id });
  if (ms > 0) await sleep(ms);
  log(process.env.EFFECTS, { ...me, id,
    aborted: req(extra).signal?.aborted === true });
  const ticket = `ticket-${me.pid}-${me.n}`;
  return { content: [{ type: "text", text: ticket }],
    structuredContent: { ticket, ...me } };
}
async function fail({ tag }) {
  const me = { pid: process.pid, tag, n: ++n };
  log(process.env.EFFECTS, { ...me, fail: true });
  return { isError: true,
    content: [{ type: "text", text: `failure-${me.pid}-${me.n}` }] };
}

function register(server, shape) {
  const out = shape({ ticket: z.string(), pid: z.number(), tag: z.string(),
    n: z.number() });
  server.registerTool("act", { description: "Waits ms, then acts once.",
    inputSchema: shape({ ms: z.number(), tag: z.string() }),
    outputSchema: out }, act);
  server.registerTool("fail", { description: "Acts, then reports failure.",
    inputSchema: shape({ tag: z.string() }) }, fail);
  return server;
}

const info = { name: `idem-slow-server-sdk${sdk}`, version: "1.0.0" };
if (sdk === "2") {
  const { McpServer } = await import("@modelcontextprotocol/server");
  const { serveStdio } = await import("@modelcontextprotocol/server/stdio");
  // 2.x takes Standard Schemas (a zod object), not raw shapes.
  serveStdio(() => register(new McpServer(info,
    { capabilities: { tools: {} } }), (s) => z.object(s)));
} else {
  const { McpServer } = await import("@modelcontextprotocol/sdk/server/mcp.js");
  const { StdioServerTransport } =
    await import("@modelcontextprotocol/sdk/server/stdio.js");
  await register(new McpServer(info), (s) => s)
    .connect(new StdioServerTransport());
}
