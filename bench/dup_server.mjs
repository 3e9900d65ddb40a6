// dup_server.mjs -- the tool server of bench/duplicates.sh: an MCP server
// (the 1.x SDK's McpServer) whose one tool has a side effect, counted by
// the server itself.
//
//   node dup_server.mjs                 stdio (started by the agent, or by
//                                       idem mcp in front of it)
//   node dup_server.mjs --http 0        Streamable HTTP on 127.0.0.1 (stateful
//                                       sessions, answers as event streams,
//                                       no event store: a cut stream cannot
//                                       be resumed), endpoint /mcp; prints
//                                       `listening PORT` when ready
//
//   create_ticket {intent_id, title, work_ms}
//       acts at once: appends one line {intent, pid, n, at} to the file
//       $DUP_EFFECTS (O_APPEND, one write: whole lines from any number of
//       server processes), then takes work_ms to answer (the ticket system
//       has the ticket; its answer is slow), whatever became of the
//       request meanwhile (a cancellation or a closed stream does not undo
//       a ticket). Answers the text `ticket T-<pid>-<n> for <intent_id>`.
//       Not annotated: a tool that acts.
//
// Every effect is a line of $DUP_EFFECTS: bench/dup_agent.mjs counts a
// tool's actions there, never from what its clients were told. Over HTTP,
// SIGTERM closes the listener and its connections, and exits once no call
// is running.
import { appendFileSync } from "node:fs";
import http from "node:http";
import { randomUUID } from "node:crypto";
import { z } from "zod";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";

const argv = process.argv.slice(2);
const HTTP = argv.includes("--http") ? Number(argv[argv.indexOf("--http") + 1]) : null;
const EFFECTS = process.env.DUP_EFFECTS;
if (!EFFECTS) {
  console.error("dup_server: DUP_EFFECTS (the effects log) is not set");
  process.exit(2);
}
let n = 0;
let running = 0;
let draining = null; // SIGTERM over HTTP: resolves the exit once idle
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function createTicket({ intent_id, work_ms }) {
  running++;
  try {
    const me = { intent: intent_id, pid: process.pid, n: ++n, at: Date.now() };
    appendFileSync(EFFECTS, JSON.stringify(me) + "\n");
    if (work_ms > 0) await sleep(work_ms);
    return { content: [{ type: "text",
      text: `ticket T-${me.pid}-${me.n} for ${intent_id}` }] };
  } finally {
    running--;
    if (running === 0 && draining) draining();
  }
}

function build() {
  const server = new McpServer({ name: "idem-dup-server", version: "1.0.0" });
  server.registerTool("create_ticket", {
    description: "Creates a ticket in the ticket system (one per call).",
    inputSchema: { intent_id: z.string(), title: z.string(),
      work_ms: z.number() },
  }, createTicket);
  return server;
}

if (HTTP === null) {
  const { StdioServerTransport } =
    await import("@modelcontextprotocol/sdk/server/stdio.js");
  await build().connect(new StdioServerTransport());
} else {
  const { StreamableHTTPServerTransport } =
    await import("@modelcontextprotocol/sdk/server/streamableHttp.js");
  const { isInitializeRequest } = await import("@modelcontextprotocol/sdk/types.js");
  const sessions = new Map();
  const json = (res, status, body) => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };
  const srv = http.createServer(async (req, res) => {
    try {
      if (new URL(req.url, "http://x").pathname !== "/mcp")
        return json(res, 404, { error: "no such path" });
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const body = Buffer.concat(chunks).toString("utf8");
      const parsed = body ? JSON.parse(body) : undefined;
      const sid = req.headers["mcp-session-id"];
      if (sid && sessions.has(sid))
        return await sessions.get(sid).handleRequest(req, res, parsed);
      if (!sid && req.method === "POST" && isInitializeRequest(parsed)) {
        const transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (id) => sessions.set(id, transport),
        });
        transport.onclose = () => {
          if (transport.sessionId) sessions.delete(transport.sessionId);
        };
        await build().connect(transport);
        return await transport.handleRequest(req, res, parsed);
      }
      json(res, sid ? 404 : 400, { jsonrpc: "2.0", id: null, error: {
        code: sid ? -32001 : -32000,
        message: sid ? "Session not found" : "Bad Request: no session" } });
    } catch (e) {
      // A client that went away mid-request: nothing to answer.
      if (!res.headersSent) json(res, 500, { error: String(e) });
      else res.end();
    }
  });
  srv.keepAliveTimeout = 60000;
  srv.listen(HTTP, "127.0.0.1", () => {
    console.log(`listening ${srv.address().port}`);
  });
  process.on("SIGTERM", () => {
    srv.close();
    srv.closeAllConnections?.();
    if (running === 0) process.exit(0);
    draining = () => process.exit(0);
  });
}
