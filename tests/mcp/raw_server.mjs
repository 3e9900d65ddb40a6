// raw_server.mjs -- a server that is not an MCP library: it writes every
// line it gets to $RAW_LOG as it came, and writes to standard output
// whatever the client asks it to, so that the tests see the bytes that cross
// idem mcp in both directions.
//   {"method":"emit","params":{"lines":[...]}}   writes those lines
//   {"method":"exit","params":{"code":N}}        exits with N
//   tools/list                                   two pages of tools t_*
//     (and, on the first, an unannotated tool named $RAW_EXTRA_TOOL if set)
//   tools/call "t_*"                             answers the tool's name
//   tools/call "add" {a,b}                       answers a+b
//   tools/call "cut" {text,keep}                 answers text.slice(0, keep):
//     "ok \u{1F600}" kept to 4 is "ok \ud83d", a lone surrogate
//   tools/call "ask"                             sends the client a request
//     with the same id as the call, and answers the call with the client's
//     answer to it
// On SIGTERM it logs "SIGTERM" and exits 42 (unless $RAW_STUBBORN); on the
// end of its input it logs "EOF" and exits 0 (unless $RAW_STUBBORN).
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";

const log = (s) => appendFileSync(process.env.RAW_LOG, s + "\n");
const out = (m) => process.stdout.write(
  (typeof m === "string" ? m : JSON.stringify(m)) + "\n");
const stubborn = process.env.RAW_STUBBORN === "1";
const asks = new Map();

process.on("SIGTERM", () => { log("SIGTERM"); if (!stubborn) process.exit(42); });
process.on("SIGUSR1", () => log("SIGUSR1"));
if (stubborn) setInterval(() => {}, 1000);

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  log(line);
  let m;
  try { m = JSON.parse(line); } catch { return; }
  if (Array.isArray(m) || typeof m !== "object" || m === null) return;
  if (m.method === "emit") for (const l of m.params.lines) out(l);
  else if (m.method === "exit") process.exit(m.params.code);
  else if (m.method === "initialize")
    out({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: "2025-06-18",
      capabilities: { tools: {} }, serverInfo: { name: "raw", version: "1" } } });
  else if (m.method === "tools/list" && !m.params?.cursor)
    out({ jsonrpc: "2.0", id: m.id, result: { nextCursor: "page-2", tools: [
      { name: "t_ro", inputSchema: { type: "object" },
        annotations: { readOnlyHint: true } },
      { name: "t_plain", inputSchema: { type: "object" } },
      ...(process.env.RAW_EXTRA_TOOL ? [{ name: process.env.RAW_EXTRA_TOOL,
        inputSchema: { type: "object" } }] : [])] } });
  else if (m.method === "tools/list")
    out({ jsonrpc: "2.0", id: m.id, result: { tools: [
      { name: "t_idem", inputSchema: { type: "object" },
        annotations: { idempotentHint: true } },
      { name: "t_no", inputSchema: { type: "object" },
        annotations: { readOnlyHint: false, idempotentHint: false } }] } });
  else if (m.method === "tools/call" && m.id === undefined) return;
  else if (m.method === "tools/call" && m.params.name.startsWith("t_"))
    out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text",
      text: m.params.name }] } });
  else if (m.method === "tools/call" && m.params.name === "add") {
    const { a, b } = m.params.arguments;
    out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text",
      text: String(a + b) }], structuredContent: { sum: a + b, half: 0.1 } } });
  } else if (m.method === "tools/call" && m.params.name === "cut") {
    const { text, keep } = m.params.arguments;
    out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text",
      text: text.slice(0, keep) }] } });
  } else if (m.method === "tools/call" && m.params.name === "ask") {
    asks.set(JSON.stringify(m.id), m.id);
    out({ jsonrpc: "2.0", id: m.id, method: "sampling/createMessage",
      params: { messages: [] } });
  } else if (!m.method && asks.has(JSON.stringify(m.id))) {
    asks.delete(JSON.stringify(m.id));
    out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text",
      text: "client said " + JSON.stringify(m.result) }] } });
  }
});
rl.on("close", () => { log("EOF"); if (!stubborn) process.exit(0); });
